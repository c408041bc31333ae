"""Workers and health for the console's ``/workers`` page: live leases per worker, and
the tasks that are stuck.

It reads the store with :meth:`~keel.store.Store.browse` filtered by status (one index
range scan per page on every adapter), so it walks only the live tasks (``working`` and
``input_required``), never the finished ones, and at most :data:`SCAN` of each status
(the page says when it stopped there). A task is stuck when

- its lease has expired and no ``recover_expired`` has given it back yet (its worker
  died or stalled: heartbeats stopped),
- it has waited for input longer than the threshold (since its last update), or
- it is past its TTL (``created_at + ttl``) and still not finished.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keel.model import Status, Task
from keel.store import Store
from keel.store.browse import MAX_PAGE, TaskFilter

__all__ = ["SCAN", "Health", "Stuck", "health"]

SCAN = 10_000
"""The most tasks of each live status one page of health reads."""


@dataclass(frozen=True, slots=True)
class Stuck:
    """A task that needs an operator, and why (``lease expired``, ``waiting for input``,
    ``past its TTL``) and for how long, in seconds."""

    task: Task
    why: str
    overdue: float


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/workers`` shows."""

    leases: Mapping[str, Sequence[Task]]
    """Leased ``working`` tasks per worker (``lease_owner``), soonest lease expiry first."""
    stuck: Sequence[Stuck]
    """Stuck tasks, the longest overdue first."""
    truncated: bool
    """More live tasks than :data:`SCAN` of one status: not all of them were read."""


async def _live(store: Store, status: Status) -> tuple[list[Task], bool]:
    found: list[Task] = []
    cursor: str | None = None
    while len(found) < SCAN:
        page = await store.browse(TaskFilter(status=status), limit=MAX_PAGE, cursor=cursor)
        found.extend(page.tasks)
        cursor = page.next_cursor
        if cursor is None:
            return found, False
    return found, True


def _why(task: Task, now: float, wait_limit: float) -> Stuck | None:
    if task.lease_expires_at is not None and task.lease_expires_at <= now:
        return Stuck(task, "lease expired", now - task.lease_expires_at)
    if task.status is Status.INPUT_REQUIRED and now - task.updated_at > wait_limit:
        return Stuck(task, "waiting for input", now - task.updated_at)
    if task.ttl is not None and now > task.created_at + task.ttl:
        return Stuck(task, "past its TTL", now - (task.created_at + task.ttl))
    return None


async def health(store: Store, now: float, *, wait_limit: float) -> Health:
    """Leases per worker and stuck tasks at ``now`` (seconds since the epoch); a task
    waiting for input is stuck after ``wait_limit`` seconds."""
    working, more_working = await _live(store, Status.WORKING)
    waiting, more_waiting = await _live(store, Status.INPUT_REQUIRED)
    leases: defaultdict[str, list[Task]] = defaultdict(list)
    for task in working:
        if task.lease_owner is not None:
            leases[task.lease_owner].append(task)
    for held in leases.values():
        held.sort(key=lambda t: t.lease_expires_at or 0.0)
    stuck = [s for t in (*working, *waiting) if (s := _why(t, now, wait_limit)) is not None]
    stuck.sort(key=lambda s: -s.overdue)
    return Health(dict(sorted(leases.items())), stuck, more_working or more_waiting)
