"""Live leases as an operator reads them: per worker, a worker's tasks a page at a time,
and the tasks that are stuck.

Three store reads behind the console's ``/workers`` page, each answered from an index on
every SQL adapter (migrations ``0004_leases`` for SQLite, ``0003_leases`` for PostgreSQL),
so that the page costs the same on a store of a million finished tasks as on an empty
one, and a worker holding thousands of leases is shown a page at a time:

- :meth:`~keel.store.Store.workers`: one :class:`WorkerLeases` per worker that holds a
  lease (``lease_owner``): how many, how many have expired, the newest and the oldest
  renewal (a heartbeat moves the task's ``updated_at``), the soonest expiry. One scan of
  the leases index (``lease_owner, lease_expires_at, task_id``).
- :meth:`~keel.store.Store.leased`: the tasks one worker holds, soonest expiry first, a
  keyset page (cursor) at a time.
- :meth:`~keel.store.Store.stuck`: the tasks an operator must look at, as
  :class:`StuckTasks`: leases expired and not recovered yet (a dead or stalled worker),
  input waits older than a threshold, and leased attempts running past their tool's
  deadline. A task's TTL is not a deadline: it says how long a *finished* task is kept
  (see :attr:`keel.model.Task.expires_at`), and never runs out under a live task. The
  deadline is ``TaskOptions.deadline_seconds``, a limit on one attempt's running time
  that the store does not keep: the caller passes it per tool name. An attempt runs from
  its claim, which is the latest history entry of a leased task (no other write records
  an entry while the lease is held).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keel.errors import InvalidPayload
from keel.model import Event, Status, Task
from keel.model.validation import check_seconds, storable
from keel.store.browse import Position, TaskPage, decode_cursor
from keel.store.rows import task_from_row

__all__ = [
    "MAX_STUCK",
    "LeaseMark",
    "SqlLeaseReads",
    "StuckTasks",
    "WorkerLeases",
    "check_deadlines",
    "check_stuck_limit",
    "check_worker",
    "lease_page",
    "memory_leased",
    "memory_stuck",
    "memory_workers",
    "stuck_of",
]

MAX_STUCK = 500
"""The most tasks of each kind one :meth:`~keel.store.Store.stuck` read returns."""


@dataclass(frozen=True, slots=True)
class WorkerLeases:
    """The live leases one worker holds (as :meth:`~keel.store.Store.workers` sees them)."""

    worker: str
    """Its ``lease_owner`` name."""
    leases: int
    expired: int
    """How many of them are past their expiry (not recovered yet)."""
    last_renewal: float
    """The newest update of its leased tasks: its last heartbeat."""
    oldest_renewal: float
    """The oldest update of its leased tasks: the lease renewed least recently."""
    next_expiry: float
    """The soonest expiry of its leases (in the past when one has expired)."""


@dataclass(frozen=True, slots=True)
class StuckTasks:
    """What :meth:`~keel.store.Store.stuck` found, each kind longest overdue first."""

    lapsed: tuple[Task, ...]
    """Leased tasks whose lease has expired and that no ``recover_expired`` gave back."""
    waiting: tuple[Task, ...]
    """``input_required`` tasks not updated since before the threshold."""
    overdue: tuple[tuple[Task, float], ...]
    """Leased tasks running past their tool's deadline, each with when its lease was
    claimed (the attempt's start)."""
    more: bool
    """A kind had more than the limit: not all of them were read."""


@dataclass(frozen=True, slots=True)
class LeaseMark:
    """A position in one worker's leases, soonest expiry first: tasks after it expire later."""

    expires_at: float
    task_id: str

    def before(self, row: Mapping[str, Any]) -> bool:
        """Whether the row comes after this mark."""
        return (row["lease_expires_at"], row["task_id"]) > (self.expires_at, self.task_id)

    @staticmethod
    def decode(cursor: str | None) -> LeaseMark | None:
        """The position a cursor of :meth:`~keel.store.Store.leased` names.

        Raises:
            InvalidPayload: not a cursor a page gave.
        """
        mark = decode_cursor(cursor)  # the same encoding as browse's: (time, task id)
        return None if mark is None else LeaseMark(mark.created_at, mark.task_id)


def check_worker(worker: object) -> str:
    """A worker name to read the leases of.

    Raises:
        InvalidPayload: not a string a store can hold.
    """
    if not isinstance(worker, str) or not worker or not storable(worker):
        raise InvalidPayload(f"worker must be a non-empty string, not {worker!r}")
    return worker


def check_deadlines(deadlines: Mapping[str, float]) -> dict[str, float]:
    """Deadlines by tool name, in seconds.

    Raises:
        InvalidPayload: a name that is not a string, or a deadline that is not a finite
            number of seconds above 0.
    """
    checked = {}
    for name, seconds in deadlines.items():
        if not isinstance(name, str) or not storable(name):
            raise InvalidPayload(f"a deadline's tool name must be a string, not {name!r}")
        checked[name] = check_seconds(seconds, f"deadline of {name!r}", allow_zero=False)
    return checked


def check_stuck_limit(limit: object) -> int:
    """How many of each kind :meth:`~keel.store.Store.stuck` reads, 1 to :data:`MAX_STUCK`.

    Raises:
        InvalidPayload: not an integer in that range.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_STUCK:
        raise InvalidPayload(f"stuck limit must be an integer from 1 to {MAX_STUCK}, not {limit!r}")
    return limit


def lease_page(found: Sequence[Task], limit: int) -> TaskPage:
    """A page of ``limit`` leased tasks from ``limit + 1`` found."""
    tasks = tuple(found[:limit])
    if len(found) <= limit or not tasks:
        return TaskPage(tasks, None)
    last = tasks[-1]
    assert last.lease_expires_at is not None  # leased tasks only
    return TaskPage(tasks, Position(last.lease_expires_at, last.task_id).encode())


def stuck_of(
    lapsed: Sequence[Task],
    waiting: Sequence[Task],
    overdue: Sequence[tuple[Task, float]],
    limit: int,
) -> StuckTasks:
    """The answer from ``limit + 1`` of each kind found (one more says there is more)."""
    more = any(len(kind) > limit for kind in (lapsed, waiting, overdue))
    return StuckTasks(tuple(lapsed[:limit]), tuple(waiting[:limit]), tuple(overdue[:limit]), more)


# --- the memory adapter's scans (the SQL adapters run the same in SQL) --------------


def _leased_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["lease_owner"] is not None]


def memory_workers(rows: Iterable[Mapping[str, Any]], now: float) -> list[WorkerLeases]:
    """:class:`WorkerLeases` of live rows, by worker name."""
    held: dict[str, list[Mapping[str, Any]]] = {}
    for row in _leased_rows(rows):
        held.setdefault(row["lease_owner"], []).append(row)
    return [
        WorkerLeases(
            worker,
            len(mine),
            sum(1 for r in mine if r["lease_expires_at"] < now),
            max(r["updated_at"] for r in mine),
            min(r["updated_at"] for r in mine),
            min(r["lease_expires_at"] for r in mine),
        )
        for worker, mine in sorted(held.items())
    ]


def memory_leased(
    rows: Iterable[Mapping[str, Any]], worker: str, mark: LeaseMark | None, limit: int
) -> list[Task]:
    """Up to ``limit`` of ``worker``'s leased rows after ``mark``, soonest expiry first."""
    mine = [
        r
        for r in _leased_rows(rows)
        if r["lease_owner"] == worker and (mark is None or mark.before(r))
    ]
    mine.sort(key=lambda r: (r["lease_expires_at"], r["task_id"]))
    return [task_from_row(r) for r in mine[:limit]]


def memory_stuck(
    rows: Iterable[Mapping[str, Any]],
    events: Mapping[str, Sequence[Event]],
    now: float,
    waiting_before: float,
    cutoffs: Mapping[str, float],
    *,
    limit: int,
) -> tuple[list[Task], list[Task], list[tuple[Task, float]]]:
    """The three kinds of :class:`StuckTasks` among live rows, ``limit`` of each at most;
    ``cutoffs``: by tool name, the time before which a lease claimed is past its deadline."""
    live = list(rows)
    lapsed = [r for r in _leased_rows(live) if r["lease_expires_at"] < now]
    lapsed.sort(key=lambda r: (r["lease_expires_at"], r["task_id"]))
    waiting = [
        r
        for r in live
        if r["status"] == Status.INPUT_REQUIRED.value and r["updated_at"] < waiting_before
    ]
    waiting.sort(key=lambda r: (r["updated_at"], r["task_id"]))
    overdue = []
    for row in _leased_rows(live):
        cutoff = cutoffs.get(row["name"])
        if cutoff is not None and events[row["task_id"]]:
            claimed = events[row["task_id"]][-1].at
            if claimed < cutoff:
                overdue.append((cutoff - claimed, row["task_id"], row, claimed))
    overdue.sort(key=lambda found: (-found[0], found[1]))
    return (
        [task_from_row(r) for r in lapsed[:limit]],
        [task_from_row(r) for r in waiting[:limit]],
        [(task_from_row(r), claimed) for _, _, r, claimed in overdue[:limit]],
    )


class SqlLeaseReads:
    """The three reads as an SQL adapter's transaction runs them (a mixin of its ``Tx``):
    each adapter supplies how a named statement of its ``leases.sql`` is run
    (:meth:`_rows`) and how per-tool deadlines are passed to ``claimed_before``
    (:meth:`_deadline_params`); the rest is the same on every SQL store."""

    def _rows(self, query: str, params: dict[str, Any]) -> list[Mapping[str, Any]]:
        raise NotImplementedError

    def _deadline_params(self, cutoffs: Mapping[str, float]) -> dict[str, Any]:
        raise NotImplementedError

    def _tasks(self, query: str, params: dict[str, Any]) -> list[Task]:
        return [task_from_row(r) for r in self._rows(query, params)]

    def worker_leases(self, now: float) -> list[WorkerLeases]:
        return [
            WorkerLeases(
                r["worker"],
                int(r["leases"]),
                int(r["expired"]),
                r["last_renewal"],
                r["oldest_renewal"],
                r["next_expiry"],
            )
            for r in self._rows("worker_leases", {"now": now})
        ]

    def leased_by(self, worker: str, mark: LeaseMark | None, limit: int) -> list[Task]:
        if mark is None:
            return self._tasks("leased_by", {"worker": worker, "limit": limit})
        params = {"worker": worker, "mark_at": mark.expires_at, "mark_id": mark.task_id}
        return self._tasks("leased_by_after", {**params, "limit": limit})

    def stuck(
        self, now: float, waiting_before: float, cutoffs: Mapping[str, float], limit: int
    ) -> tuple[list[Task], list[Task], list[tuple[Task, float]]]:
        lapsed = self._tasks("lapsed_leases", {"now": now, "limit": limit})
        waiting = self._tasks("waiting_since", {"before": waiting_before, "limit": limit})
        overdue = []
        if cutoffs:
            params = {**self._deadline_params(cutoffs), "limit": limit}
            rows = self._rows("claimed_before", params)
            overdue = [(task_from_row(r), float(r["claimed_at"])) for r in rows]
        return lapsed, waiting, overdue
