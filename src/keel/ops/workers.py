"""Workers and health for the console's ``/workers`` page: live leases per worker, one
worker's leases a page at a time, and the tasks that are stuck.

Every part is one store read answered from an index (:mod:`keel.store.leases`), so the
page costs the same however many tasks the store holds and however many leases a worker
has: :meth:`~keel.store.Store.workers` (a line per worker), :meth:`~keel.store.Store.leased`
(the chosen worker's leases, :data:`PAGE` at a time) and :meth:`~keel.store.Store.stuck`
(at most :data:`STUCK` of each kind). A task is stuck when

- its lease has expired and no ``recover_expired`` has given it back yet (its worker
  died or stalled: heartbeats stopped),
- it has waited for input longer than the threshold (since its last update), or
- its attempt has run past its tool's deadline (``deadline_seconds``, counted from the
  claim) and is still leased: the deadline did not stop it (a handler blocking the
  worker's thread, say). Only a console that knows the app's tools knows their
  deadlines (``keel serve``'s); a task's TTL is no deadline (it is how long a finished
  task is kept).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keel.model import Task
from keel.store import Store
from keel.store.browse import TaskPage
from keel.store.leases import WorkerLeases

__all__ = ["PAGE", "STUCK", "Health", "Stuck", "health"]

PAGE = 50
"""A worker's leases shown on one page."""
STUCK = 100
"""The most stuck tasks of each kind shown (the longest overdue)."""


@dataclass(frozen=True, slots=True)
class Stuck:
    """A task that needs an operator, and why (``lease expired``, ``waiting for input``,
    ``past its deadline``) and for how long, in seconds."""

    task: Task
    why: str
    overdue: float


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/workers`` shows."""

    workers: Sequence[WorkerLeases]
    """Each worker that holds a lease, by name."""
    stuck: Sequence[Stuck]
    """Stuck tasks, the longest overdue first."""
    truncated: bool
    """More stuck tasks of a kind than :data:`STUCK`: only the longest overdue are shown."""
    deadlines: Mapping[str, float]
    """The tools' deadlines the page judges by (none known: none judged)."""
    worker: str | None = None
    """The worker whose leases are listed, if one was chosen."""
    leases: TaskPage | None = None
    """A page of that worker's leases, soonest expiry first."""


async def health(
    store: Store,
    now: float,
    *,
    wait_limit: float,
    deadlines: Mapping[str, float],
    worker: str | None = None,
    cursor: str | None = None,
) -> Health:
    """Leases per worker and stuck tasks at ``now`` (seconds since the epoch); a task
    waiting for input is stuck after ``wait_limit`` seconds, an attempt of a tool in
    ``deadlines`` after its deadline; with ``worker``, a page of its leases.

    Raises:
        InvalidPayload: a worker's cursor that no page gave.
    """
    workers = await store.workers(now=now)
    found = await store.stuck(waiting_over=wait_limit, deadlines=deadlines, now=now, limit=STUCK)
    lapsed = {t.task_id for t in found.lapsed}
    stuck = [
        *(Stuck(t, "lease expired", now - (t.lease_expires_at or now)) for t in found.lapsed),
        *(Stuck(t, "waiting for input", now - t.updated_at) for t in found.waiting),
        *(
            Stuck(t, "past its deadline", now - claimed - deadlines[t.name or ""])
            for t, claimed in found.overdue
            if t.task_id not in lapsed  # shown once, as its lease expired
        ),
    ]
    stuck.sort(key=lambda s: -s.overdue)
    leases = None if worker is None else await store.leased(worker, limit=PAGE, cursor=cursor)
    return Health(workers, stuck, found.more, deadlines, worker, leases)
