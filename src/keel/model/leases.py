"""Leases: a worker claims a ready task, renews its lease, writes under it, gives it back."""

from __future__ import annotations

from keel.errors import InvalidTransition
from keel.model.machine import Change, W, actor_of, check_writer, move, replace
from keel.model.task import Task
from keel.model.validation import DEFAULT_LIMITS, Limits, check_message

__all__ = ["check_step", "claim", "release", "renew", "set_status_message"]


def claim(task: Task, now: float, *, worker: str, lease_seconds: float) -> Change:
    """A ready ``working`` task gets a lease, a new fencing token and its claim time.

    Raises:
        InvalidTransition: the task is not ready (adapters select only ready tasks).
    """
    if task.status is not W or task.lease_owner is not None or task.ready_at > now:
        raise InvalidTransition(f"task {task.task_id} is not ready to be claimed", task)
    fence = task.fence + 1
    return move(
        task,
        now,
        f"claimed by {worker} (attempt {task.attempt}/{task.max_attempts}, fence {fence})",
        f"worker:{worker}",
        lease_owner=worker,
        lease_expires_at=now + lease_seconds,
        fence=fence,
        claimed_at=now,
    )


def release(task: Task, now: float, *, fence: int, reason: str) -> Change:
    """The live attempt gives the task back unfinished (a worker shutting down): ready again
    at once, and it does not count as a failed attempt.

    Raises:
        TaskAlreadyTerminal, LeaseLost: see ``check_writer``.
    """
    check_writer(task, fence, "release it")
    return move(
        task,
        now,
        f"released by {task.lease_owner}: {reason}",
        actor_of(fence, task, "worker"),
        lease_owner=None,
        lease_expires_at=None,
        ready_at=now,
    )


def renew(task: Task, now: float, *, fence: int, lease_seconds: float) -> Change:
    """Extend the live attempt's lease. No history entry: heartbeats are not events.

    Raises:
        TaskAlreadyTerminal: the task ended (cancelled, most likely): stop the attempt.
        LeaseLost: the attempt no longer owns the task.
    """
    check_writer(task, fence, "renew its lease")
    new = replace(task, updated_at=now, lease_expires_at=now + lease_seconds)
    return Change(new, None)


def set_status_message(
    task: Task,
    message: str | None,
    now: float,
    *,
    fence: int | None,
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """Set the human-readable progress line shown in snapshots. No history entry.

    Raises:
        TaskAlreadyTerminal, LeaseLost, InvalidTransition: see ``check_writer``.
    """
    check_writer(task, fence, "set its status message")
    if message is not None:
        check_message(message, "status message", limits)
    return Change(replace(task, updated_at=now, status_message=message), None)


def check_step(task: Task, fence: int) -> None:
    """A checkpoint may be written only by the attempt that holds the task.

    Raises:
        TaskAlreadyTerminal, LeaseLost: see ``check_writer``.
    """
    check_writer(task, fence, "record a step")
