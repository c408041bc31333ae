"""Group commit for the SQL adapters: calls made together share one transaction.

A worker completing thirty tasks at once should pay for one transaction (one fsync on
SQLite, one round trip of COMMIT on PostgreSQL), not thirty. So a write does not run when
it is called: its :class:`~keel.store.base.Op` joins the queue of a :class:`Lane` (one
per event loop), and the first op of a loop iteration schedules a flush that runs
everything queued by then as one group::

    caller ─ submit(op) ─> Lane.queue ─(call_soon)─> flush ─> runner.start(ops), on the loop
                                                        │  outcomes: delivered at once
                                                        │  Wait:     runner.finish(ops) in a
                                                        │            worker thread, delivered
                                                        │            back on the loop (also
                                                        │            a group that ran and
                                                        │            only commits there)
                                                        └  Regroup:  each op alone, in a thread

While a group runs in a thread, the ops queued meanwhile wait for it, unless the lane
lets more than one group run at once (``in_flight``, PostgreSQL's ``write_groups``): then
they form the next group at once, in another thread.

The adapter supplies the :class:`GroupRunner`: how a group runs in one transaction.
This module owns the rest, once for both adapters: the queue, delivery of each result
or error to the caller waiting for it (nobody hears "done" before the COMMIT), and
regrouping. A group in which an op was refused before it wrote anything commits the
others beside it; one in which an op failed *after* writing is rolled back by the
runner, which raises :class:`Regroup`, and each op then runs in a transaction of its
own, so that only the failing one fails.

A lane given a ``timeout`` answers every caller within it (the adapter's store timeout,
:data:`DEFAULT_STORE_TIMEOUT` by default), whatever the store does meanwhile, queued
behind a group that waits for a lock or for a server that went away included: the
adapter's "unavailable" error (``late()``) then, and :func:`bounded` keeps the op from
running behind its caller's back if its group gets going after all. One timer per lane,
at the earliest deadline (callers' deadlines come in the order they called).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from keel.store.base import Op

__all__ = [
    "DEFAULT_STORE_TIMEOUT",
    "GroupRunner",
    "Lane",
    "Outcome",
    "Ran",
    "Regroup",
    "Wait",
    "bounded",
    "finish_group",
    "run_alone",
]

T = TypeVar("T")

DEFAULT_STORE_TIMEOUT = 10.0  # seconds a call waits for its answer, at most
START_MARGIN = 0.5  # seconds before its caller's timeout after which an op no longer starts


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one op of a group returned, or raised."""

    value: Any = None
    error: BaseException | None = None

    @classmethod
    def failed(cls, error: BaseException) -> Outcome:
        return cls(error=error)

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value


class Regroup(Exception):
    """Raised by a runner after it rolled back a group of several ops, one of which failed
    after writing: run each op in a transaction of its own."""


@dataclass(frozen=True, slots=True)
class Ran:
    """A group that ran in a worker thread: its outcomes, in the order of its ops."""

    outcomes: list[Outcome]
    after: Callable[[], None] | None = None
    """Run in the thread once the outcomes are on their way (PostgreSQL's NOTIFY)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """The group cannot run on the event loop without waiting: finish it in a thread."""

    handoff: Any = None
    """What the runner worked out on the loop, for :meth:`GroupRunner.finish`."""
    committing: bool = False
    """The group ran on the loop and only its COMMIT is left (the disk's fsync): reads wait
    for it (:meth:`Lane.written`). Only for a lane that runs one group at a time
    (``in_flight=1``, as SQLite's do)."""
    abandon: Callable[[], None] | None = None
    """Undo what the runner holds for ``handoff`` (a transaction, a lock) if the group
    cannot be handed to a thread after all (the executor is shut down)."""


class GroupRunner(Protocol):
    """An adapter's way of running a group of ops as one transaction."""

    def start(self, ops: Sequence[Op[Any]]) -> list[Outcome] | Wait:
        """On the event loop: run the group if that needs no waiting, else say Wait.

        Raises:
            Regroup: it ran, failed after writing, and was rolled back.
        """
        ...

    def finish(self, ops: Sequence[Op[Any]], handoff: Any) -> Ran:
        """In a worker thread, where waiting (for a lock, a connection) is allowed.

        Raises:
            Regroup: as for :meth:`start` (never for a single op, which fails alone).
        """
        ...

    def closed(self) -> Exception:
        """The error for ops that find the store closed."""
        ...


def finish_group(
    runner: GroupRunner, ops: Sequence[Op[Any]], handoff: Any = None, *, regroup: bool = False
) -> Ran:
    """Run a group in a worker thread; after a :class:`Regroup`, each op on its own."""
    if not regroup:
        try:
            return runner.finish(ops, handoff)
        except Regroup:
            pass
    outcomes: list[Outcome] = []
    afters: list[Callable[[], None]] = []
    for op in ops:
        ran = runner.finish([op], None)
        outcomes.extend(ran.outcomes)
        if ran.after is not None:
            afters.append(ran.after)

    def after() -> None:
        for each in afters:
            each()

    return Ran(outcomes, after if afters else None)


def run_alone(runner: GroupRunner, op: Op[Any]) -> Any:
    """Run one op as a group of its own, in a worker thread; its value, or raise."""
    ran = runner.finish([op], None)
    if ran.after is not None:
        ran.after()
    return ran.outcomes[0].unwrap()


def bounded(op: Op[T], timeout: float, late: Callable[[], Exception]) -> Op[T]:
    """``op``, refused with ``late()`` if it would start less than :data:`START_MARGIN`
    before its caller's ``timeout`` (from now) runs out: by then the caller is being told
    that the store is unavailable, so the op must not write behind its back (it raises
    before it touches anything, so its group goes on without it)."""
    deadline = time.monotonic() + max(timeout - min(START_MARGIN, timeout / 2), 0.0)
    work = op.run

    def run(tx: Any) -> T:
        if time.monotonic() >= deadline:
            raise late()
        return work(tx)

    return Op(run, op.touches, op.picks)


_Queued = tuple[Op[Any], "asyncio.Future[Any]"]


class Lane:
    """The ops queued on one event loop, run in groups by ``runner``.

    Args:
        max_group: ops in one group at most (None: everything queued).
        executor: where groups wait (None: the loop's default executor).
        timeout: seconds a caller waits for its answer at most, then gets ``late()``
            (None: as long as it takes).
        in_flight: groups running in worker threads at once. With more than one, ops
            queued while a group runs form the next group at once, on another thread
            (and, for PostgreSQL, another connection and transaction): callers still hear
            of an op only once its group committed, but two groups may commit in either
            order, so ops of different groups must not depend on each other's order
            (one caller's ops do not: each waits for its answer before the next). Writes
            to the same rows are ordered by the database's row locks.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        runner: GroupRunner,
        *,
        max_group: int | None = None,
        executor: Executor | None = None,
        timeout: float | None = None,
        late: Callable[[], Exception] | None = None,
        in_flight: int = 1,
    ) -> None:
        self.loop = loop
        self._in_flight = in_flight
        self._runner = runner
        self._max_group = max_group
        self._executor = executor
        self._timeout = timeout
        self._late = late or runner.closed
        self._deadlines: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._queue: list[_Queued] = []
        self._scheduled = False
        self._committing: list[_Queued] = []
        self._delivered: list[_Queued] = []  # committed, callers told but not yet run
        self.running = 0
        """Groups running in worker threads (the next waits while ``in_flight`` do)."""
        self.inflight: set[asyncio.Future[Any]] = set()
        """Futures of ops submitted and not answered yet."""

    @property
    def queued(self) -> bool:
        """Ops wait for the next group (not yet running)."""
        return bool(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued or running: the lane may be dropped."""
        return not self.inflight and not self.running and not self._scheduled

    @property
    def flushing(self) -> bool:
        """Whether a group is running in a worker thread."""
        return self.running > 0

    def submit(self, op: Op[Any]) -> asyncio.Future[Any]:
        """Queue ``op`` (on the lane's loop); the future gets its value or error."""
        if self._timeout is not None:
            op = bounded(op, self._timeout, self._late)
        future: asyncio.Future[Any] = self.loop.create_future()
        self._queue.append((op, future))
        self.inflight.add(future)
        future.add_done_callback(self.inflight.discard)
        if not self._scheduled and self.running < self._in_flight:
            self._scheduled = True
            self.loop.call_soon(self._flush)
        if self._timeout is not None:
            self._deadlines.append((self.loop.time() + self._timeout, future))
            if self._timer is None:
                self._arm()
        return future

    def _arm(self) -> None:
        """Set the timer for the earliest deadline of a caller still waiting."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()
        self._timer = self.loop.call_at(deadlines[0][0], self._expire) if deadlines else None

    def _answered(self) -> None:
        """Drop the deadlines of callers answered (at the front: callers are answered in
        about the order they called). Kept until the timer reached them, their futures and
        results stayed alive for the whole timeout: a worker completing a few thousand
        tasks a second held tens of thousands of tasks, which the garbage collector's full
        collections scanned again and again (a quarter of the worker's CPU)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()

    def _expire(self) -> None:
        """Answer the callers whose time is up with ``late()`` (their ops, if still
        queued, are left out of the next group; if running, :func:`bounded` stops them)."""
        now = self.loop.time()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, future = self._deadlines.popleft()
            if not future.done():
                future.set_exception(self._late())
        self._arm()

    async def written(self, task_ids: Sequence[str], *, queued_for: float) -> None:
        """Before a read on this loop: wait for writes in this process that it should see.

        * The group being committed (:attr:`Wait.committing`): the read would see its
          writes before their callers heard of them (a worker would take its own attempt's
          write for another's). Waited for to the end (the disk's fsync): its ops that
          touch ``task_ids``, or all of them for a read that names no task.
        * Ops queued for the next group that touch ``task_ids``, unless a group waits for
          another process's lock: for ``queued_for`` seconds at most, so that a poll sent
          right after a write sees it instead of asking again.
        """
        wanted = set(task_ids)
        committed = [
            future
            for op, future in (*self._committing, *self._delivered)
            if not wanted or not wanted.isdisjoint(op.touches)
        ]
        if committed:
            pending = [future for future in committed if not future.done()]
            if pending:
                await asyncio.wait(pending)  # their callers are woken first
            else:
                await asyncio.sleep(0)  # delivered: their callers are woken first
        if not wanted or (self.flushing and not self._committing):
            return  # nothing named, or the queue could wait as long as a lock
        queued = [
            future
            for op, future in self._queue
            if not future.done() and not wanted.isdisjoint(op.touches)
        ]
        if queued:
            await asyncio.wait(queued, timeout=queued_for)

    def _forget(self, batch: list[_Queued]) -> None:
        if self._delivered is batch:
            self._delivered = []

    async def drain(self) -> None:
        """Wait until every op submitted so far has its answer."""
        if self.inflight:
            await asyncio.wait(list(self.inflight))

    def _take(self) -> list[_Queued]:
        while self._queue:
            size = len(self._queue) if self._max_group is None else self._max_group
            batch = [(op, f) for op, f in self._queue[:size] if not f.done()]
            self._queue = self._queue[size:]
            if batch:
                return batch
        return []

    def _flush(self) -> None:
        self._scheduled = False
        batch = self._take()
        if not batch:
            return
        ops = [op for op, _ in batch]
        wait = Wait()
        regroup = False
        try:
            started = self._runner.start(ops)
        except Regroup:
            regroup = True
        except Exception as exc:
            self._done_on_loop(batch, [Outcome.failed(exc)] * len(batch))
            return
        else:
            if not isinstance(started, Wait):
                self._done_on_loop(batch, started)
                return
            wait = started
        if wait.committing:
            self._committing = batch
        self.running += 1
        try:
            self.loop.run_in_executor(self._executor, self._finish, batch, wait.handoff, regroup)
        except RuntimeError:  # the executor was shut down: the store is closed
            self.running -= 1
            self._committing = []
            if wait.abandon is not None:
                wait.abandon()
            self._done_on_loop(batch, [Outcome.failed(self._runner.closed())] * len(batch))

    def _done_on_loop(self, batch: list[_Queued], outcomes: list[Outcome]) -> None:
        """Deliver a group that ended on the loop; what is still queued (beyond
        ``max_group``) is the next group."""
        _deliver(batch, outcomes)
        self._answered()
        if self._queue and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)

    def _finish(self, batch: list[_Queued], handoff: Any, regroup: bool) -> None:
        """In a worker thread: run the group, then hand the outcomes back to the loop."""
        ops = [op for op, _ in batch]
        try:
            ran = finish_group(self._runner, ops, handoff, regroup=regroup)
        except Exception as exc:
            ran = Ran([Outcome.failed(exc)] * len(batch))
        try:
            self.loop.call_soon_threadsafe(self._flushed, batch, ran.outcomes)
        except RuntimeError:  # pragma: no cover - the loop closed with calls in flight
            return
        if ran.after is not None:
            ran.after()

    def _flushed(self, batch: list[_Queued], outcomes: list[Outcome]) -> None:
        if self._committing:
            self._committing = []
            self._delivered = batch
            self.loop.call_soon(self._forget, batch)  # once its callers have run
        _deliver(batch, outcomes)
        self._answered()
        self.running -= 1
        if self._queue and not self._scheduled:
            self._scheduled = True
            self._flush()


def _deliver(batch: Sequence[_Queued], outcomes: Sequence[Outcome]) -> None:
    for (_, future), outcome in zip(batch, outcomes, strict=True):
        if future.done():
            continue  # the caller gave up waiting; the write itself stands
        if outcome.error is None:
            future.set_result(outcome.value)
        else:
            future.set_exception(outcome.error)
