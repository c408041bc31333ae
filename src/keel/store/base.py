"""The logic every adapter shares: each protocol method as one transaction over ``Tx``.

An adapter supplies two things: a :class:`Tx` (a handful of row-level primitives: load,
insert, conditional update, append history …) and :meth:`TxStore._run`, which runs an
:class:`Op` (a function, and what it declares it touches) inside one transaction. The
rules come from :mod:`keel.model.transitions`, so the adapters cannot disagree about them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

from keel.errors import (
    IdempotencyConflict,
    ImportFailed,
    InvalidPayload,
    KeelError,
    StoreError,
    TaskNotFound,
)
from keel.model import Event, InputRequest, JsonObject, JsonValue, Limits, Reclaimed, Status, Task
from keel.model import transitions as tr
from keel.model.validation import check_key, check_seconds, normalize, storable
from keel.store.browse import Position, TaskFilter, TaskPage, check_limit, decode_cursor, page_of
from keel.store.changes import Change, ChangeHub
from keel.store.leases import (
    LeaseMark,
    StuckTasks,
    WorkerLeases,
    check_deadlines,
    check_stuck_limit,
    check_worker,
    lease_page,
    stuck_of,
)
from keel.store.observed import CommitObserver, Recording, committed, tell
from keel.store.protocol import Clock
from keel.store.rerun import rerun_failed

__all__ = [
    "MAX_COMPLETE_BATCH",
    "Op",
    "Picks",
    "Tx",
    "TxStore",
    "new_task_id",
]

T = TypeVar("T")

MAX_CLAIM_BATCH = 100
"""Claims are bounded: a long claim transaction blocks every other writer."""

MAX_COMPLETE_BATCH = 100
"""Tasks one :meth:`TxStore.complete_many` call completes at most (one transaction)."""


def new_task_id() -> str:
    """An unguessable, time-ordered task id: 34 URL-safe characters.

    Twelve hex digits of milliseconds since the epoch, then 128 random bits (the id is
    the bearer secret of an unauthenticated task, so it must not be guessable). Time order
    keeps new tasks together at the end of every index: a busy store updates a few hot
    pages instead of one random page per task.
    """
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_urlsafe(16)}"


class Tx(Protocol):
    """Row-level primitives, valid inside one transaction of one adapter."""

    def load(self, task_id: str) -> Task | None: ...
    def load_by_key(self, owner: str, key: str) -> Task | None: ...
    def insert(self, task: Task) -> None: ...
    def update(self, old: Task, new: Task) -> None:
        """Write ``new`` where the row still has ``old``'s status and fence."""

    def append(self, event: Event) -> None: ...
    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]: ...
    def expired(self, now: float, limit: int) -> list[Task]: ...
    def stale(self, cutoff: float) -> list[Task]: ...
    def purgeable(self, now: float, limit: int) -> list[str]: ...
    def delete(self, task_ids: Sequence[str]) -> None: ...
    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        """Record a step unless it is already recorded (the first value stands)."""

    def get_steps(self, task_id: str) -> dict[str, JsonValue]: ...
    def events(self, task_id: str) -> list[Event]: ...
    def page(
        self, status: Status | None, owner: str | None, limit: int, after: str | None
    ) -> list[Task]: ...
    def browse(self, where: TaskFilter, mark: Position | None, limit: int) -> list[Task]:
        """Up to ``limit`` tasks matching ``where``, older than ``mark``, newest first."""

    def status_of(self, task_ids: Sequence[str]) -> dict[str, tuple[Status, int]]: ...
    def counts(self) -> dict[Status, int]:
        """How many tasks are in each status (statuses with none left out)."""

    def schema_version(self) -> int:
        """The schema version the store records (0 for one that keeps none)."""

    def worker_leases(self, now: float) -> list[WorkerLeases]:
        """Live leases per worker, by worker name (see :mod:`keel.store.leases`)."""

    def leased_by(self, worker: str, mark: LeaseMark | None, limit: int) -> list[Task]:
        """Up to ``limit`` of ``worker``'s leased tasks after ``mark``, soonest expiry first."""

    def stuck(
        self, now: float, waiting_before: float, cutoffs: Mapping[str, float], limit: int
    ) -> tuple[list[Task], list[Task], list[tuple[Task, float]]]:
        """Up to ``limit`` each of expired leases, input waits not updated since
        ``waiting_before``, and leases of the tools in ``cutoffs`` claimed before their
        cutoff (with the claim's time), longest overdue first."""


class Picks(Enum):
    """How an operation finds the tasks it writes: what group commit and planning must
    know about it without running it."""

    NAMED = "named"
    """Only tasks it names (:attr:`Op.touches`), a task it inserts, or one it finds by
    idempotency key."""
    READY = "ready"
    """Ready tasks chosen by a condition (a claim): which ones, only running it tells."""
    SWEEP = "sweep"
    """Tasks chosen by a scan (expired leases, stale tasks, purgeable ones)."""


@dataclass(frozen=True, slots=True)
class Op(Generic[T]):
    """One protocol call as a unit of work for :meth:`TxStore._run`.

    Adapters may run several ops in one transaction (group commit) and must learn what
    each touches before they run it: PostgreSQL locks the named tasks of a group in one
    statement, SQLite plans named writes together and each claim on its own. The store
    method that builds an op declares that here, where the closure is written.
    """

    run: Callable[[Any], T]
    """The work, given the adapter's :class:`Tx`; all of it commits, or none."""
    touches: tuple[str, ...] = ()
    """Existing tasks it reads by id, first ones first."""
    picks: Picks = Picks.NAMED


def _known(task_id: object) -> TypeGuard[str]:
    """Whether ``task_id`` could name a stored task: a string every store can hold.

    An id that is not one (not a string; NUL or a lone surrogate in it, which no task id
    has) is an unknown task on every adapter alike, and never reaches a driver (which
    would refuse it, each in its own way)."""
    if not isinstance(task_id, str):
        return False
    return (task_id.isascii() and "\x00" not in task_id) or storable(task_id)


def _check_completions(results: object) -> None:
    """Refuse what :meth:`TxStore.complete_many` cannot take: not a list of
    ``(task_id, result, fence)``, or more than :data:`MAX_COMPLETE_BATCH` of them.

    Raises:
        InvalidPayload: naming the first item that is not a triple.
    """
    if isinstance(results, str | bytes) or not isinstance(results, Sequence):
        raise InvalidPayload(
            f"complete_many takes a list of (task_id, result, fence), not {results!r:.80}"
        )
    if len(results) > MAX_COMPLETE_BATCH:
        raise InvalidPayload(
            f"complete_many takes at most {MAX_COMPLETE_BATCH} tasks, not {len(results)}"
        )
    for n, item in enumerate(results):
        if not isinstance(item, tuple | list) or len(item) != 3:
            raise InvalidPayload(
                f"complete_many: item {n} is not (task_id, result, fence): {item!r:.80}"
            )


def _named(task_id: object) -> tuple[str, ...]:
    """``touches`` of an op on ``task_id`` (an id that names no task, see :func:`_known`,
    touches nothing: the op raises TaskNotFound)."""
    return (task_id,) if _known(task_id) else ()


def _apply(tx: Tx, old: Task, change: tr.Change) -> Task:
    if change.changed:
        tx.update(old, change.task)
    if change.event is not None:
        tx.append(change.event)
    return change.task


def _require(tx: Tx, task_id: str, owner: str | None = None) -> Task:
    task = tx.load(task_id) if _known(task_id) else None
    if task is None or (owner is not None and task.owner != owner):
        # Another owner's task must be indistinguishable from a missing one.
        raise TaskNotFound(str(task_id))
    return task


class TxStore:
    """Implements :class:`keel.store.Store` over an adapter's transactions."""

    def __init__(self, *, clock: Clock | None = None, limits: Limits | None = None) -> None:
        self._clock: Clock = clock or time.time
        self.limits = limits or Limits()
        self._claims_full: set[tuple[str, ...]] = set()  # task names whose last claim filled up
        self.change_hub = ChangeHub(self._start_changes)
        """This store's change feed (see :mod:`keel.store.changes`)."""
        self.observer: CommitObserver | None = None
        """Told of every committed write (see :mod:`keel.store.observed`)."""

    def _start_changes(self) -> int | None:
        """Start the source of the change feed (on its first listener); its position."""
        return None

    def changes(self, *, after: int | None = None) -> AsyncIterator[Change]:
        """Committed task changes from now on (see :mod:`keel.store.changes`)."""
        return self.change_hub.changes(after=after)

    def _now(self) -> float:
        return self._clock()

    def _writes_queued(self) -> bool:
        """Whether writes made on this event loop wait to run as a group (or to commit): a
        claim made now joins the next group rather than look first (the look could not see
        them)."""
        return False

    async def _run(self, op: Op[T], *, write: bool) -> T:
        """Run ``op`` in one transaction: all its writes commit together, or none do."""
        raise NotImplementedError

    async def _write(self, op: Op[T], what: str) -> T:
        """Run the write ``op`` (the store method ``what``); tell the observer, if there
        is one, what it committed (see :mod:`keel.store.observed`)."""
        observer = self.observer
        if observer is None:
            return await self._run(op, write=True)
        record = Recording()
        started = time.perf_counter()
        out = await self._run(Op(record.wrap(op.run), op.touches, op.picks), write=True)
        seconds = time.perf_counter() - started
        tell(observer, committed(what, tuple(record.transitions), out, seconds))
        return out

    async def read_schema_version(self) -> int:
        """The schema version, read from the store now (what readiness checks)."""
        return await self._run(Op(lambda tx: tx.schema_version()), write=False)

    async def close(self) -> None:
        """Release resources. Safe to call twice."""

    # --- reads ---------------------------------------------------------------------

    async def get(self, task_id: str, *, owner: str | None = None) -> Task:
        return await self._run(
            Op(lambda tx: _require(tx, task_id, owner), _named(task_id)), write=False
        )

    async def list(
        self,
        *,
        status: Status | None = None,
        owner: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> Sequence[Task]:
        status = None if status is None else Status(status)
        if not all(storable(text) for text in (owner, after) if isinstance(text, str)):
            return []  # no task has such an owner or id (and an unknown `after` ends a list)
        return await self._run(
            Op(lambda tx: tx.page(status, owner, max(0, limit), after)), write=False
        )

    async def browse(
        self, where: TaskFilter | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> TaskPage:
        checked = (where or TaskFilter()).checked()
        mark, limit = decode_cursor(cursor), check_limit(limit)
        found = await self._run(Op(lambda tx: tx.browse(checked, mark, limit + 1)), write=False)
        return page_of(found, limit)

    async def statuses(self, task_ids: Collection[str]) -> Mapping[str, tuple[Status, int]]:
        ids = [task_id for task_id in dict.fromkeys(task_ids) if _known(task_id)]
        if not ids:
            return {}
        return await self._run(Op(lambda tx: tx.status_of(ids)), write=False)

    async def counts(self) -> Mapping[Status, int]:
        counted = await self._run(Op(lambda tx: tx.counts()), write=False)
        return {status: counted.get(status, 0) for status in Status}

    async def workers(self, *, now: float | None = None) -> Sequence[WorkerLeases]:
        at = self._now() if now is None else check_seconds(now, "now")
        return await self._run(Op(lambda tx: tx.worker_leases(at)), write=False)

    async def leased(self, worker: str, *, limit: int = 50, cursor: str | None = None) -> TaskPage:
        worker, limit, mark = check_worker(worker), check_limit(limit), LeaseMark.decode(cursor)
        found = await self._run(Op(lambda tx: tx.leased_by(worker, mark, limit + 1)), write=False)
        return lease_page(found, limit)

    async def stuck(
        self,
        *,
        waiting_over: float,
        deadlines: Mapping[str, float] | None = None,
        now: float | None = None,
        limit: int = 100,
    ) -> StuckTasks:
        at = self._now() if now is None else check_seconds(now, "now")
        before = at - check_seconds(waiting_over, "waiting_over")
        cutoffs = {k: at - v for k, v in check_deadlines(deadlines or {}).items()}
        limit = check_stuck_limit(limit)
        lapsed, waiting, overdue = await self._run(
            Op(lambda tx: tx.stuck(at, before, cutoffs, limit + 1)), write=False
        )
        return stuck_of(lapsed, waiting, overdue, limit)

    async def history(self, task_id: str, *, owner: str | None = None) -> Sequence[Event]:
        def op(tx: Tx) -> list[Event]:
            _require(tx, task_id, owner)
            return tx.events(task_id)

        return await self._run(Op(op, _named(task_id)), write=False)

    async def steps(self, task_id: str, *, owner: str | None = None) -> Mapping[str, JsonValue]:
        def op(tx: Tx) -> dict[str, JsonValue]:
            _require(tx, task_id, owner)
            return tx.get_steps(task_id)

        return await self._run(Op(op, _named(task_id)), write=False)

    # --- client writes -------------------------------------------------------------

    async def create(
        self,
        *,
        name: str | None = None,
        arguments: Mapping[str, JsonValue] | None = None,
        owner: str = "",
        idempotency_key: str | None = None,
        input_requests: Mapping[str, InputRequest] | None = None,
        ttl: float | None = None,
        max_attempts: int = 1,
        actor: str = "client",
        input_responses: Mapping[str, JsonValue] | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> Task:
        if not isinstance(owner, str):
            raise InvalidPayload(f"owner must be a string, not {owner!r}")
        task_id = new_task_id()

        def op(tx: Tx) -> Task:
            change = tr.new_task(
                task_id,
                self._now(),
                name=name,
                arguments={} if arguments is None else arguments,
                owner=owner,
                idempotency_key=idempotency_key,
                input_requests=input_requests,
                ttl=ttl,
                max_attempts=max_attempts,
                actor=actor,
                input_responses=input_responses,
                limits=self.limits,
                trace_context=trace_context,
            )
            if idempotency_key is not None:
                existing = tx.load_by_key(owner, idempotency_key)
                if existing is not None:
                    difference = tr.same_request(existing, change.task)
                    if difference is not None:
                        raise IdempotencyConflict(idempotency_key, existing.task_id, difference)
                    return existing
            tx.insert(change.task)
            assert change.event is not None
            tx.append(change.event)
            return change.task

        return await self._write(Op(op), "create")

    async def provide_input(
        self,
        task_id: str,
        responses: Mapping[str, JsonValue],
        *,
        owner: str | None = None,
        actor: str = "client",
        declined: Mapping[str, str] | None = None,
    ) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id, owner)
            change = tr.provide_input(
                task, responses, self._now(), actor=actor, declined=declined, limits=self.limits
            )
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "provide_input")

    async def complete(
        self, task_id: str, result: JsonValue, *, fence: int | None = None, actor: str = "client"
    ) -> Task:
        def op(tx: Tx) -> Task:
            return _apply(
                tx, *self._completion(tx, task_id, result, self._now(), fence=fence, actor=actor)
            )

        return await self._write(Op(op, _named(task_id)), "complete")

    def _completion(
        self, tx: Tx, task_id: str, result: JsonValue, now: float, *, fence: int | None, actor: str
    ) -> tuple[Task, tr.Change]:
        """The stored task and its change to completed, or the KeelError that refuses it
        (raised before anything is written): the one body of :meth:`complete` and
        :meth:`complete_many`."""
        task = _require(tx, task_id)
        return task, tr.complete(task, result, now, fence=fence, actor=actor, limits=self.limits)

    async def complete_many(
        self, results: Sequence[tuple[str, JsonValue, int | None]], *, actor: str = "client"
    ) -> Sequence[Task | KeelError]:
        def op(tx: Tx) -> Sequence[Task | KeelError]:
            now, done = self._now(), list[Task | KeelError]()
            for task_id, result, fence in results:
                try:
                    task, change = self._completion(
                        tx, task_id, result, now, fence=fence, actor=actor
                    )
                except StoreError:
                    raise
                except KeelError as refused:  # before anything of it was written
                    done.append(refused)
                    continue
                done.append(_apply(tx, task, change))
            return done

        _check_completions(results)
        if not results:
            return []
        touched = tuple(task_id for task_id, _, _ in results if _known(task_id))
        return await self._write(Op(op, touched), "complete")

    async def fail(
        self, task_id: str, error: JsonObject, *, fence: int | None = None, actor: str = "client"
    ) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id)
            change = tr.fail(task, error, self._now(), fence=fence, actor=actor, limits=self.limits)
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "fail")

    async def cancel(
        self,
        task_id: str,
        *,
        reason: str | None = None,
        owner: str | None = None,
        actor: str = "client",
    ) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id, owner)
            change = tr.cancel(task, self._now(), reason=reason, actor=actor, limits=self.limits)
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "cancel")

    async def rerun(self, task_id: str, *, actor: str = "operator") -> Task:
        def op(tx: Tx) -> Task:  # see keel.store.rerun
            new_id, now, limits = new_task_id(), self._now(), self.limits
            return rerun_failed(
                tx, _require(tx, task_id), new_id=new_id, now=now, actor=actor, limits=limits
            )

        return await self._run(Op(op, _named(task_id)), write=True)

    # --- worker writes -------------------------------------------------------------

    async def request_input(
        self, task_id: str, requests: Mapping[str, InputRequest], *, fence: int | None
    ) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id)
            change = tr.request_input(task, requests, self._now(), fence=fence, limits=self.limits)
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "request_input")

    def _claim_request(
        self, names: Collection[str], worker: str, lease_seconds: float
    ) -> tuple[tuple[str, ...], float]:
        """A claim's arguments checked: the task names, sorted, and the lease.

        Raises:
            InvalidPayload: names given as one string, a bad worker id or lease.
        """
        if isinstance(names, str):
            raise InvalidPayload(
                f"names must be a collection of task names, not the string {names!r}"
            )
        check_key(worker, "worker id", self.limits)
        lease = check_seconds(lease_seconds, "lease", allow_zero=False)
        return tuple(sorted(set(names))), lease

    async def claim(
        self, names: Collection[str], *, worker: str, lease_seconds: float, limit: int = 1
    ) -> Sequence[Task]:
        wanted, lease = self._claim_request(names, worker, lease_seconds)
        if not wanted or limit < 1:
            return []

        def op(tx: Tx) -> list[Task]:
            now = self._now()
            claimed = []
            for task in tx.ready(wanted, now, min(limit, MAX_CLAIM_BATCH)):
                change = tr.claim(task, now, worker=worker, lease_seconds=lease)
                claimed.append(_apply(tx, task, change))
            return claimed

        # Idle workers poll: look first with a read, which never queues for the write lock,
        # and take the lock only when there is something to claim (the claim re-checks).
        # After a claim that filled its batch there is likely more: skip the look then;
        # and when writes wait to commit as a group (a create, say), whose lock the claim
        # shares: it runs after them, in their transaction, and sees what they wrote.
        looked = wanted in self._claims_full or self._writes_queued()
        if not looked and not await self._run(
            Op(lambda tx: tx.ready(wanted, self._now(), 1), picks=Picks.READY), write=False
        ):
            return []
        claimed = await self._write(Op(op, picks=Picks.READY), "claim")
        if len(claimed) >= min(limit, MAX_CLAIM_BATCH):
            self._claims_full.add(wanted)
        else:
            self._claims_full.discard(wanted)
        return claimed

    async def renew(self, task_id: str, *, fence: int, lease_seconds: float) -> Task:
        lease = check_seconds(lease_seconds, "lease", allow_zero=False)

        def op(tx: Tx) -> Task:
            task = _require(tx, task_id)
            change = tr.renew(task, self._now(), fence=fence, lease_seconds=lease)
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "renew")

    async def release(self, task_id: str, *, fence: int, reason: str) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id)
            return _apply(tx, task, tr.release(task, self._now(), fence=fence, reason=reason))

        return await self._write(Op(op, _named(task_id)), "release")

    async def retry(
        self, task_id: str, error: JsonObject, *, fence: int, delay_seconds: float
    ) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id)
            change = tr.retry(
                task,
                error,
                self._now(),
                fence=fence,
                delay_seconds=delay_seconds,
                limits=self.limits,
            )
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "retry")

    async def set_status_message(
        self, task_id: str, message: str | None, *, fence: int | None = None
    ) -> Task:
        def op(tx: Tx) -> Task:
            task = _require(tx, task_id)
            change = tr.set_status_message(
                task, message, self._now(), fence=fence, limits=self.limits
            )
            return _apply(tx, task, change)

        return await self._write(Op(op, _named(task_id)), "set_status_message")

    async def save_step(self, task_id: str, step: str, value: JsonValue, *, fence: int) -> None:
        def op(tx: Tx) -> None:
            task = _require(tx, task_id)
            tr.check_step(task, fence)  # a finished or stale attempt hears that first
            check_key(step, "step name", self.limits)
            text, _ = normalize(value, f"step {step!r}", self.limits.max_step_bytes)
            tx.put_step(task_id, step, text, self._now())

        await self._write(Op(op, _named(task_id)), "save_step")

    # --- maintenance ---------------------------------------------------------------

    async def recover_expired(self, *, limit: int = 100) -> Sequence[Task]:
        def op(tx: Tx) -> list[Task]:
            now = self._now()
            return [
                _apply(tx, task, tr.recover(task, now))
                for task in tx.expired(now, min(max(limit, 0), MAX_CLAIM_BATCH))
            ]

        # Every worker sweeps often; a read first keeps an idle sweep off the write lock.
        if not await self._run(
            Op(lambda tx: tx.expired(self._now(), 1), picks=Picks.SWEEP), write=False
        ):
            return []
        return await self._write(Op(op, picks=Picks.SWEEP), "recover_expired")

    async def reclaim(
        self, timeout_seconds: float, *, actor: str = "reclaim"
    ) -> Sequence[Reclaimed]:
        timeout = check_seconds(timeout_seconds, "reclaim timeout")

        def op(tx: Tx) -> list[Reclaimed]:
            now = self._now()
            done = []
            for task in tx.stale(now - timeout):
                change, why = tr.reclaim(task, now, timeout_seconds=timeout, actor=actor)
                _apply(tx, task, change)
                done.append(why)
            return done

        return await self._write(Op(op, picks=Picks.SWEEP), "reclaim")

    async def purge(self, *, limit: int = 1000) -> Sequence[str]:
        def op(tx: Tx) -> list[str]:
            ids = tx.purgeable(self._now(), max(0, limit))
            tx.delete(ids)
            return ids

        return await self._write(Op(op, picks=Picks.SWEEP), "purge")

    async def import_tasks(
        self,
        tasks: Sequence[Task],
        *,
        actor: str = "import",
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        checked: list[Task] = []
        for task in tasks:
            try:
                checked.append(tr.check_imported(task, self.limits))
            except InvalidPayload as exc:
                raise InvalidPayload(f"task {task.task_id!r}: {exc}") from exc

        def op(tx: Tx) -> None:
            now = self._now()
            problems = []
            ids: set[str] = set()
            keys: set[tuple[str, str]] = set()
            for task in checked:
                key = None if task.idempotency_key is None else (task.owner, task.idempotency_key)
                if task.task_id in ids:
                    problems.append(f"task {task.task_id} appears twice")
                elif key in keys:
                    problems.append(
                        f"idempotency key {task.idempotency_key!r} is bound to two tasks"
                    )
                elif tx.load(task.task_id) is not None:
                    problems.append(f"task {task.task_id} already exists in the store")
                elif key is not None and tx.load_by_key(*key):
                    problems.append(
                        f"idempotency key {task.idempotency_key!r} of task {task.task_id} "
                        "is already bound in the store"
                    )
                ids.add(task.task_id)
                if key is not None:
                    keys.add(key)
            if problems:
                raise ImportFailed("the store", problems)
            for task in checked:
                tx.insert(task)
                why = (reasons or {}).get(task.task_id, "imported")
                tx.append(Event(task.task_id, now, None, task.status, why, actor))

        await self._write(Op(op, tuple(t.task_id for t in checked)), "import_tasks")
