"""Workers: claim ready tasks, run their handlers, keep their leases, write their outcomes.

One worker runs up to ``concurrency`` attempts at once, beside five small loops:

* **claim**: takes ready tasks whose names the app registers (each claim bumps the
  task's fencing token), whenever a slot is free; woken at once when a slot frees up;
* **heartbeat**: renews every running attempt's lease at a third of its length, from
  outside the handlers; an attempt whose lease cannot be renewed is stopped (it fences
  itself: it no longer owns the task);
* **watch**: reads the status and fence of the running tasks every ``watch_interval``
  and stops an attempt whose task was cancelled or taken over (cancels made through the
  same app in this process stop it at once);
* **recover**: returns tasks whose lease expired (a crashed or hung worker anywhere) to
  the queue, or dead-letters them after their last attempt;
* **purge** (the sweeper): deletes finished tasks past their TTL, never a live one.

Every write an attempt makes carries its fence, so a stopped or stale attempt's writes
are refused by the store and change nothing.

**A store outage is not a lost lease.** While the store is unavailable
(:class:`~keel.errors.StoreUnavailable`), an attempt's outcome is written again and again
(jittered backoff up to :data:`OUTCOME_RETRY_CAP`) until the store takes it or refuses it
by its fence; an attempt whose lease ran out unrenewed meanwhile is stopped (another
worker may legitimately run the task by now) and gives the task back when the store
returns, uncounted. And after an outage a worker recovers no expired lease for one lease
length, so that the owners, alive, renew or finish first: only an attempt that really
lost its lease (its fence moved on) is retried by recovery.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass, field

import anyio
import anyio.abc
from opentelemetry.context import Context

from keel.errors import (
    InvalidPayload,
    KeelError,
    LeaseLost,
    StoreError,
    StoreUnavailable,
    TaskAlreadyTerminal,
    TaskNotFound,
)
from keel.model import INTERNAL_ERROR, Task
from keel.runtime.app import DEFAULT_LEASE, Keel
from keel.runtime.completions import Completions
from keel.runtime.context import Parking, TaskContext
from keel.runtime.outcomes import (
    AttemptOutcome,
    Completed,
    Failed,
    InputDeclined,
    Parked,
    Retry,
    Stopped,
    TaskFailed,
    ToolError,
    ToolOutput,
    backoff,
    crash_error,
    deadline_error,
    error_result,
    tool_result,
    traced_end,
)
from keel.runtime.slots import Slots
from keel.store import Store
from keel.store.base import MAX_CLAIM_BATCH
from keel.store.protocol import WakeUps
from keel.telemetry import tracing
from keel.telemetry.health import worker_started, worker_stopped

__all__ = ["SHUTDOWN_GRACE", "Worker"]

log = logging.getLogger("keel.worker")

CLAIM_INTERVAL = 0.5  # seconds between claims when the queue was empty
WATCH_INTERVAL = 0.2  # seconds between cancellation checks of running tasks
RECOVER_INTERVAL = 0.5  # seconds between sweeps for expired leases (a read when none)
PURGE_INTERVAL = 60.0  # seconds between purges of finished tasks past their TTL
SHUTDOWN_GRACE = 5.0  # seconds a stopping worker waits for its attempts to give tasks back
SHUTTING_DOWN = "worker shutting down"
"""Why an attempt stopped when its worker stops: its task is given back (released)."""
UNRENEWED = "lease could not be renewed before it expired"
"""Why an attempt stopped when the store was unavailable for longer than its lease: its
task is given back (released) when the store returns, not counted as a failed attempt."""
BUSY = "waited too long for a free slot of its worker"
"""Why an attempt claimed ahead (``prefetch``) stopped before its handler ran: its task is
given back (released, uncounted) for any worker to take."""
GIVE_BACK = frozenset({SHUTTING_DOWN, UNRENEWED, BUSY})
PREFETCH_WAIT = 1.0  # seconds an attempt claimed ahead waits for a slot before it gives back
PREFETCH_PER_SLOT = 2
"""The default ``prefetch``: tasks claimed ahead at most per handler slot. With short
handlers the tasks in hand then fill both of the store's write transactions in flight
(PostgreSQL's ``write_groups``): at one PostgreSQL worker process of concurrency 32,
6,407 -> 6,996 no-op tasks/s against one slot each, with a third fewer transactions
(docs/benchmarks.md, "Two write groups in flight")."""
OUTCOME_RETRY_BASE = 0.05  # seconds before the second try of an outcome write
OUTCOME_RETRY_CAP = 1.0  # seconds at most between tries: written soon after the store returns


@dataclass(eq=False)
class _Attempt:
    task: Task
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    renewed: float = field(default_factory=time.monotonic)
    stop_reason: str | None = None
    traced: bool = False
    """Whether spans are recorded (looked up once per claimed batch, not per attempt)."""
    trace_parent: Context | None = None
    handled: bool = False
    """The handler is done: the attempt is writing its outcome, which nothing interrupts."""
    slot: bool = False
    """It holds one of the worker's handler slots (see :mod:`keel.runtime.slots`)."""
    waiting_since: float | None = None
    """time.monotonic() when it began to wait for a slot (claimed ahead), while it waits."""

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.scope.cancel()


class Worker:
    """Runs an app's tasks from its store.

    Args:
        app: the :class:`~keel.runtime.Keel` whose task names this worker claims.
        concurrency: handlers run at once.
        prefetch: tasks claimed beyond the free slots, each waiting for a slot, so that
            short handlers run while the outcomes of the last ones are being written
            (see :meth:`_ahead`; None: twice ``concurrency``, :data:`PREFETCH_PER_SLOT`);
            0 claims only for free slots.
        prefetch_wait: seconds a task claimed ahead waits for a slot before it is given back.
        worker_id: how leases and history name this worker (default host:pid:random).
        shutdown_grace: seconds a stop waits for running attempts to give their tasks
            back, before it leaves the rest to their leases.
    """

    def __init__(
        self,
        app: Keel,
        *,
        concurrency: int = 4,
        prefetch: int | None = None,
        worker_id: str | None = None,
        claim_interval: float = CLAIM_INTERVAL,
        watch_interval: float = WATCH_INTERVAL,
        recover_interval: float = RECOVER_INTERVAL,
        purge_interval: float = PURGE_INTERVAL,
        shutdown_grace: float = SHUTDOWN_GRACE,
        prefetch_wait: float = PREFETCH_WAIT,
        rng: random.Random | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if prefetch is None:
            prefetch = PREFETCH_PER_SLOT * concurrency
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        self.app = app
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.prefetch_wait = prefetch_wait
        self._slots = Slots(concurrency)
        self._ends: deque[float] = deque()  # when handlers ended, lately (see _ahead)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.claim_interval = claim_interval
        self.watch_interval = watch_interval
        self.recover_interval = recover_interval
        self.purge_interval = purge_interval
        self.shutdown_grace = shutdown_grace
        # Jitter for retry backoff: spreading retries needs no cryptographic randomness.
        self._rng = rng or random.Random()  # noqa: S311
        self._running: dict[str, _Attempt] = {}
        self._completions: Completions  # the outcomes Completed, written together (see run)
        self._attempts: dict[asyncio.Task[None], _Attempt] = {}  # see _start_attempt
        self._crashed: BaseException | None = None
        self._loops: anyio.abc.TaskGroup | None = None  # the task group of the loops below
        self._finishing = 0  # attempts whose handler is done and whose outcome is being written
        self._wake = anyio.Event()
        self._stopping = False
        self._claims_done = anyio.Event()
        self._outage_seen = -float("inf")  # time.monotonic() of the last StoreUnavailable
        self.started = anyio.Event()
        """Set once the worker's loops run (tests and ``keel serve`` wait on it)."""

    @property
    def running(self) -> list[str]:
        """Ids of the tasks this worker is running now."""
        return list(self._running)

    @property
    def stopping(self) -> bool:
        """Whether the worker was told to stop (it claims nothing more)."""
        return self._stopping

    def _leases(self) -> list[float]:
        """The lease lengths the app's task definitions ask for."""
        return [d.options.lease_seconds for d in self.app.tasks.values()] or [DEFAULT_LEASE]

    @property
    def _lease(self) -> float:
        return min(self._leases())

    def _saw(self, exc: StoreError) -> None:
        """Note a store outage (see :meth:`_recover_loop`)."""
        if isinstance(exc, StoreUnavailable):
            self._outage_seen = time.monotonic()

    @property
    def _ahead(self) -> int:
        """Tasks to claim beyond the free slots: as many handlers as ended in the last
        quarter of ``prefetch_wait``, at most ``prefetch``. At that pace a task claimed
        ahead gets its slot in about a quarter of ``prefetch_wait``, long before it would
        be given back. A worker whose slots are taken by long handlers claims none ahead:
        it holds no task that other workers could run now, and never claims and gives back
        in a loop (after a give-back, none until handlers end again)."""
        ends, since = self._ends, time.monotonic() - self.prefetch_wait / 4
        while ends and ends[0] < since:
            ends.popleft()
        return min(len(ends), self.prefetch)

    @property
    def _busy(self) -> int:
        """Slots taken: attempts whose handler still runs (an attempt writing its outcome
        has given its slot back, so the next claim can share that write's commit)."""
        return len(self._running) - self._finishing

    def _poke(self) -> None:
        self._wake.set()

    def _cancelled_here(self, task_id: str) -> None:
        attempt = self._running.get(task_id)
        if attempt is not None:
            attempt.stop("cancelled")

    async def run(self, *, stop: anyio.Event | None = None) -> None:
        """Run until ``stop`` is set (or the surrounding scope is cancelled).

        On stop, running attempts are stopped and their tasks released (ready again at
        once, without counting as a failed attempt).
        """
        names = sorted(self.app.tasks)
        if not names:
            raise KeelError("the app registers no tasks: nothing to run")
        self.app.store  # noqa: B018 - open it now: a store that cannot open fails here, once
        unlisten = self.app.events.listen(self._cancelled_here, self._poke)
        # Optional store capability (PostgreSQL LISTEN/NOTIFY): wake-ups from other
        # processes. A hint only: the polling below still finds everything.
        store = self.app.store
        self._completions = Completions(store)
        unsubscribe = (
            store.subscribe(names, on_ready=self._poke, on_cancel=self._cancelled_here)
            if isinstance(store, WakeUps)
            else None
        )
        try:
            async with anyio.create_task_group() as tg:
                self._loops = tg
                tg.start_soon(self._claim_loop, names)
                tg.start_soon(self._heartbeat_loop)
                tg.start_soon(self._watch_loop)
                tg.start_soon(self._recover_loop)
                tg.start_soon(self._purge_loop)
                self.started.set()
                worker_started(self)  # readiness: this process runs a worker
                if stop is None:
                    await anyio.sleep_forever()
                else:
                    await stop.wait()
                await self._shut_down()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._reap()
            worker_stopped(self)
            unlisten()
            if unsubscribe is not None:
                unsubscribe()
        if self._crashed is not None:
            raise self._crashed

    async def _shut_down(self) -> None:
        """Stop claiming, stop every running attempt and give its task back (released:
        ready again at once, its recorded steps kept), within ``shutdown_grace`` seconds.
        An attempt still running then (a handler that ignores cancellation) is left to
        its lease, which expires and is recovered by any worker."""
        self._stopping = True
        self._poke()
        with anyio.move_on_after(self.shutdown_grace) as grace:
            # A claim in flight finishes first (and gives back what it got), so no task is
            # left leased by a worker that is gone.
            await self._claims_done.wait()
            for attempt in list(self._running.values()):
                attempt.stop(SHUTTING_DOWN)
            while self._running:
                self._wake = anyio.Event()
                await self._wake.wait()
        if grace.cancelled_caught:
            log.warning(
                "%d attempt(s) did not stop within %g s; their leases will expire: %s",
                len(self._running),
                self.shutdown_grace,
                ", ".join(self._running),
            )

    # --- loops -----------------------------------------------------------------------

    async def _claim_loop(self, names: list[str]) -> None:
        store = self.app.store
        try:
            await self._claims(names, store)
        finally:
            self._claims_done.set()

    async def _claims(self, names: list[str], store: Store) -> None:
        groups = self._lease_groups(names)
        turn = 0
        while not self._stopping:
            # A wake-up that comes while the claim below is in flight must not be lost:
            # the event it sets is the one waited on afterwards.
            wake = self._wake = anyio.Event()
            room = self.concurrency + self._ahead
            free = room - self._busy
            claimed: list[Task] = []
            if free > 0:
                turn = (turn + 1) % max(len(groups), 1)  # no group waits behind others
                claimed = await self._claim(store, groups[turn:] + groups[:turn], free)
            traced = bool(claimed) and tracing.enabled()
            for task in claimed:
                if self.stopping:  # the claim committed as we stopped: give it straight back
                    await self._release(task, SHUTTING_DOWN)
                    continue
                stale = self._running.get(task.task_id)
                if stale is not None:  # our own earlier attempt lost its lease: stop it
                    stale.stop("task was taken over by another attempt")
                parent = tracing.parent_of(task.trace_context) if traced else None
                attempt = _Attempt(task, traced=traced, trace_parent=parent)
                self._running[task.task_id] = attempt
                self._start_attempt(attempt)
            if len(claimed) >= min(free, MAX_CLAIM_BATCH) > 0 and self._busy < room:
                continue  # it took all it asked for: there may be more ready right now
            if self.stopping:
                break
            with anyio.move_on_after(self.claim_interval):
                await wake.wait()

    def _lease_groups(self, names: list[str]) -> list[tuple[float, list[str]]]:
        """``names`` by the lease their definitions ask for: one group in the usual app."""
        groups: dict[float, list[str]] = {}
        for name in names:
            groups.setdefault(self.app.definition(name).options.lease_seconds, []).append(name)
        return sorted(groups.items())

    async def _claim(
        self, store: Store, groups: list[tuple[float, list[str]]], free: int
    ) -> list[Task]:
        """Up to ``free`` ready tasks, each claimed with the lease its own definition asks
        for (a task of 30 s is never claimed with another task's 5 s, which a restart or
        a pause of the loop longer than 5 s would see expire). What was claimed before a
        store error is kept: those tasks are leased to this worker and must run."""
        claimed: list[Task] = []
        for lease, group in groups:
            if len(claimed) >= free:
                break
            try:
                claimed += await store.claim(
                    group, worker=self.worker_id, lease_seconds=lease, limit=free - len(claimed)
                )
            except StoreError as exc:
                self._saw(exc)
                log.warning("claim failed, retrying: %s", exc)
                break
        return claimed

    async def _release(self, task: Task, reason: str) -> None:
        try:
            await self.app.store.release(task.task_id, fence=task.fence, reason=reason)
        except KeelError as exc:
            log.info("could not release %s: %s", task.task_id, exc)

    async def _heartbeat_loop(self) -> None:
        store = self.app.store
        while True:
            lease = self._lease
            await anyio.sleep(lease / 3)
            # Renewed together, so that the store commits them as one group (one fsync).
            async with anyio.create_task_group() as renewals:
                for task_id, attempt in list(self._running.items()):
                    renewals.start_soon(self._renew, store, task_id, attempt)

    async def _renew(self, store: Store, task_id: str, attempt: _Attempt) -> None:
        own = self.app.definition(attempt.task.name or "").options.lease_seconds
        try:
            await store.renew(task_id, fence=attempt.task.fence, lease_seconds=own)
            attempt.renewed = time.monotonic()
        except TaskAlreadyTerminal as exc:
            attempt.stop(f"task is {exc.task.status.value}")
        except (LeaseLost, TaskNotFound) as exc:
            attempt.stop(str(exc))
        except StoreError as exc:
            self._saw(exc)
            log.warning("cannot renew lease of %s: %s", task_id, exc)
            if time.monotonic() - attempt.renewed > own:
                attempt.stop(UNRENEWED)

    async def _watch_loop(self) -> None:
        store = self.app.store
        while True:
            await anyio.sleep(self.watch_interval)
            self._give_back_waiting()
            watched = dict(self._running)  # attempts claimed during the read are not judged
            if not watched:
                continue
            try:
                seen = await store.statuses(list(watched))
            except StoreError as exc:
                self._saw(exc)
                log.warning("cannot watch running tasks: %s", exc)
                continue
            for task_id, attempt in watched.items():
                status, fence = seen.get(task_id, (None, None))
                if status is None:
                    attempt.stop("task no longer exists")
                elif status.terminal:
                    attempt.stop(f"task is {status.value}")
                elif fence != attempt.task.fence:
                    # Only another fence means another attempt. A live task at the
                    # attempt's own fence is its own: working, or waiting for input
                    # because this very attempt asked (only the lease holder can), its
                    # handler on its way out; stopping that one would cancel its way out
                    # and record the attempt as stopped instead of parked.
                    attempt.stop("task was taken over by another attempt")

    async def _recover_loop(self) -> None:
        store = self.app.store
        while True:
            if time.monotonic() - self._outage_seen < max(self._leases()):
                # The store was unavailable a moment ago: the leases that expired meanwhile
                # are most likely those of live workers, which renew or finish first.
                await anyio.sleep(self.recover_interval)
                continue
            try:
                for task in await store.recover_expired():
                    log.info(
                        "recovered %s: now %s (attempt %s)",
                        task.task_id,
                        task.status.value,
                        task.attempt,
                    )
                    self._poke()
            except StoreError as exc:
                self._saw(exc)
                log.warning("recovery sweep failed: %s", exc)
            await anyio.sleep(self.recover_interval)

    async def _purge_loop(self) -> None:
        # The sweeper: finished tasks past their TTL go, with their history and steps.
        # The store never purges a live task, whatever its TTL: it lives until it ends.
        store = self.app.store
        while True:
            await anyio.sleep(self.purge_interval)
            try:
                purged = await store.purge()
                if purged:
                    log.info("purged %d finished task(s) past their TTL", len(purged))
            except StoreError as exc:
                log.warning("purge failed: %s", exc)

    # --- one attempt -------------------------------------------------------------------

    def _start_attempt(self, attempt: _Attempt) -> None:
        """Run ``attempt`` in an asyncio task of its own, started now (so that its outcome
        can share the commit of the claim its freed slot wakes).

        A plain asyncio task, not one of the loops' anyio task group: anyio's
        ``start_soon`` builds a task handle, a cancel scope and an event per task (a
        sixth of a busy worker's time at a thousand no-op tasks a second). What the task
        group gave is kept by hand: an attempt that raises past its handler (a
        ``BaseException`` such as ``SystemExit``) stops the worker, which raises it
        (:meth:`_attempt_done`); a worker whose ``run`` is cancelled from outside cancels
        the attempts still in their handler and waits for them all (:meth:`_reap`); an
        attempt writing its outcome is never interrupted (what the shield did).
        """
        running = asyncio.get_running_loop().create_task(self._run_attempt(attempt))
        self._attempts[running] = attempt
        running.add_done_callback(self._attempt_done)

    def _attempt_done(self, running: asyncio.Task[None]) -> None:
        self._attempts.pop(running, None)
        if running.cancelled():
            return
        error = running.exception()
        if error is not None and self._crashed is None:
            self._crashed = error
            if self._loops is not None:
                self._loops.cancel_scope.cancel()

    async def _reap(self) -> None:
        """Once the loops ended: cancel the attempts still in their handler (the worker was
        cancelled from outside, or a handler ignored its stop past the grace) and wait for
        every attempt to end, as the task group did. Through the attempt's own scope, so
        that a handler sees cancellation at each await until it ends, as anyio delivers
        it. Its outcome is then what its stop reason says: given back if the worker was
        stopping, else nothing written (its lease expires and recovery retries it)."""
        for attempt in self._attempts.values():
            if not attempt.handled:
                attempt.scope.cancel()
        if self._attempts:
            await asyncio.wait(list(self._attempts))

    async def _run_attempt(self, attempt: _Attempt) -> None:
        """Run the handler once (in its span if spans are recorded), free its slot, then
        write its outcome. A claim woken by the freed slot is queued before the outcome's
        write is flushed: both share one transaction."""
        task = attempt.task
        try:
            outcome = await (self._traced(attempt) if attempt.traced else self._outcome(attempt))
            attempt.handled = True  # its slot is freed (and claimed into) from here on
            self._free_slot(attempt)
            self._finishing += 1
            self._poke()
            try:
                await self._finish(attempt, outcome)
            finally:
                self._finishing -= 1
        finally:
            if attempt.slot:
                self._free_slot(attempt)
            if self._running.get(task.task_id) is attempt:
                del self._running[task.task_id]
            if self._stopping or not attempt.handled:
                self._poke()  # a stop waits for the last attempt; a slot freed only now

    async def _traced(self, attempt: _Attempt) -> AttemptOutcome:
        """:meth:`_outcome` in the attempt's span."""
        with tracing.attempt_span(attempt.task, self.worker_id, attempt.trace_parent) as span:
            outcome = await self._outcome(attempt)
            traced_end(span, attempt.task, outcome)
        return outcome

    async def _outcome(self, attempt: _Attempt) -> AttemptOutcome:
        """How the handler's run ended. An attempt stopped from outside (its scope
        cancelled, or a stop reason set while it ran) is :class:`Stopped`, whatever the
        handler did meanwhile."""
        outcome: AttemptOutcome | None = None
        with attempt.scope:
            if not self._slots.try_take():
                await self._wait_for_slot(attempt)
            attempt.slot = True
            outcome = await self._handle(attempt)
        if outcome is None or attempt.scope.cancelled_caught or attempt.stop_reason:
            reason = attempt.stop_reason or "cancelled"
            outcome = Stopped(reason, release=reason in GIVE_BACK)
        return outcome

    async def _wait_for_slot(self, attempt: _Attempt) -> None:
        """Wait (claimed ahead) until a handler ends; :meth:`_give_back_waiting` stops the
        wait if it lasts."""
        attempt.waiting_since = time.monotonic()
        try:
            await self._slots.take()
        finally:
            attempt.waiting_since = None

    def _free_slot(self, attempt: _Attempt) -> None:
        """Its handler ended: the slot goes to the next attempt waiting, the end is counted
        (see :attr:`_ahead`; an attempt stopped before its handler ran had no slot)."""
        if attempt.slot:
            attempt.slot = False
            self._slots.free()
            if self.prefetch:
                self._ends.append(time.monotonic())

    def _give_back_waiting(self) -> None:
        """Stop the attempts claimed ahead that waited ``prefetch_wait`` seconds for a slot
        (their tasks are given back), and claim ahead no more for now (see :meth:`_ahead`)."""
        if not self._slots.waiting:
            return
        now = time.monotonic()
        for attempt in self._running.values():
            since = attempt.waiting_since
            if since is not None and now - since >= self.prefetch_wait:
                attempt.stop(BUSY)
                self._ends.clear()

    async def _handle(self, attempt: _Attempt) -> AttemptOutcome | None:
        """The handler's own ending, or None when it found it no longer owns the task."""
        task = attempt.task
        definition = self.app.definition(task.name or "")
        options = definition.options
        ctx = TaskContext(
            self.app.store,
            task,
            worker=self.worker_id,
            trace_parent=attempt.trace_parent,
            traced=attempt.traced,
        )
        try:
            if options.deadline_seconds is None:  # no scope of its own: one less per attempt
                value = await definition.handler(ctx, **task.arguments)
            else:
                with anyio.move_on_after(options.deadline_seconds) as deadline:
                    value = await definition.handler(ctx, **task.arguments)
                if deadline.cancelled_caught:
                    return Retry(deadline_error(options.deadline_seconds))
            return Completed(tool_result(value, definition.output))
        except Parking as parked:
            return Parked(tuple(parked.keys))
        except ToolError as exc:
            return Completed(error_result(exc, definition.output))
        except InputDeclined as exc:
            # The user said no; asking again on a retry would get the same answer.
            return Completed(ToolOutput.of_error(str(exc)))
        except TaskFailed as exc:
            return Failed(exc.error)
        except (LeaseLost, TaskAlreadyTerminal, TaskNotFound) as exc:
            attempt.stop(str(exc))
            return None
        except Exception as exc:
            log.warning("task %s attempt %s raised %r", task.task_id, task.attempt, exc)
            return Retry(crash_error(exc))

    async def _finish(self, attempt: _Attempt, outcome: AttemptOutcome) -> None:
        """Write the outcome; while the store is unavailable, again after a backoff, until
        the store takes it or refuses it by its fence (or the worker stops: the lease then
        expires and recovery retries the task)."""
        tries = 0
        while True:
            tries += 1
            try:
                await self._write(attempt, outcome)
            except StoreUnavailable as exc:
                self._saw(exc)
                if self._stopping:
                    log.warning("outcome of %s not written: %s", attempt.task.task_id, exc)
                    return
                pause = backoff(
                    tries, base=OUTCOME_RETRY_BASE, cap=OUTCOME_RETRY_CAP, rng=self._rng
                )
                log.warning("cannot record the outcome of %s yet (%s); again in %.2fs",
                            attempt.task.task_id, exc, pause)  # fmt: skip
                await anyio.sleep(pause)
            else:
                return

    async def _write(self, attempt: _Attempt, outcome: AttemptOutcome) -> None:
        """Write the outcome once.

        Raises:
            StoreUnavailable: the store cannot take it now (:meth:`_finish` tries again).
        """
        task, store = attempt.task, self.app.store
        options = self.app.definition(task.name or "").options
        try:
            match outcome:
                case Completed(output):
                    await self._completions.complete(task, output.to_json())
                case Failed(error):
                    await store.fail(task.task_id, error, fence=task.fence)
                case Retry(error):
                    delay = backoff(
                        task.attempt, base=options.retry_base, cap=options.retry_cap, rng=self._rng
                    )
                    await store.retry(task.task_id, error, fence=task.fence, delay_seconds=delay)
                case Stopped(reason, release=True):
                    await store.release(task.task_id, fence=task.fence, reason=reason)
                case Stopped() | Parked():
                    pass  # nothing to write: the task is someone else's, or waits for input
        except (LeaseLost, TaskAlreadyTerminal, TaskNotFound) as exc:
            log.info("outcome of stale attempt on %s discarded: %s", task.task_id, exc)
        except InvalidPayload as exc:
            # A result the store cannot hold (not JSON, too large): the task fails, saying so.
            log.warning("result of %s cannot be stored: %s", task.task_id, exc)
            error = {"code": INTERNAL_ERROR, "message": f"the result could not be stored: {exc}"}
            try:
                await store.fail(task.task_id, error, fence=task.fence)
            except StoreUnavailable:
                raise
            except KeelError as again:
                log.warning("cannot record the failure of %s: %s", task.task_id, again)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            # The lease will expire and recovery will run the task again.
            log.warning("cannot record the outcome of %s: %s", task.task_id, exc)
