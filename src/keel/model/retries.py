"""Attempts that end without an outcome: a retry, an expired lease recovered, a stale
task reclaimed. After the last attempt a task is dead-lettered (``failed``)."""

from __future__ import annotations

from collections.abc import Mapping

from keel.errors import INTERNAL_ERROR, InvalidTransition, TaskAlreadyTerminal
from keel.model.machine import (
    Change,
    F,
    W,
    actor_of,
    check_error,
    check_writer,
    failure_message,
    move,
    same_value,
    unchanged,
)
from keel.model.task import JsonObject, Reclaimed, Task
from keel.model.validation import DEFAULT_LIMITS, Limits, check_seconds, normalize

__all__ = ["reclaim", "recover", "retry"]


def retry(
    task: Task,
    error: object,
    now: float,
    *,
    fence: int,
    delay_seconds: float,
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """End the live attempt with an error: ready again later, or ``failed`` if none are left.

    Raises:
        TaskAlreadyTerminal, LeaseLost: see ``check_writer``.
        InvalidPayload: the error is not ``{code, message, data?}``.
    """
    if task.status.terminal:
        if (
            task.status is F
            and task.closed_fence == fence
            and isinstance(error, Mapping)
            and "message" in error
            and same_value(task.error, _dead_letter(dict(error), task.attempt))
        ):
            return unchanged(task)  # the retry that dead-lettered it, repeated
        raise TaskAlreadyTerminal(task, "retry it")
    check_writer(task, fence, "retry it")
    checked = check_error(error)
    _, checked = normalize(checked, "error", limits.max_result_bytes, keep_text=True)
    delay = check_seconds(delay_seconds, "retry delay")
    return _end_attempt(
        task,
        now,
        checked,
        f"attempt {task.attempt}/{task.max_attempts} failed: {checked['message']}",
        actor=actor_of(fence, task, "worker"),
        delay=delay,
        fence=fence,
    )


def recover(task: Task, now: float) -> Change:
    """An expired lease (the worker crashed or hung): retry, or dead-letter after the last.

    Raises:
        InvalidTransition: the task holds no expired lease (adapters select only those).
    """
    expires = task.lease_expires_at
    if task.status is not W or task.lease_owner is None or expires is None or expires >= now:
        raise InvalidTransition(f"task {task.task_id} holds no expired lease", task)
    why = (
        f"lease of {task.lease_owner} expired {now - expires:.1f}s ago on attempt "
        f"{task.attempt}/{task.max_attempts}"
    )
    # The history names the worker (host and pid) for operators; the error, which
    # clients see, does not.
    message = (
        f"the worker running attempt {task.attempt}/{task.max_attempts} stopped renewing its lease"
    )
    error = {"code": INTERNAL_ERROR, "message": message}
    return _end_attempt(task, now, error, why, actor="recovery", delay=0.0, fence=None)


def _dead_letter(error: JsonObject, attempts: int) -> JsonObject:
    return {**error, "message": f"dead letter after {attempts} attempt(s): {error['message']}"}


def _end_attempt(
    task: Task,
    now: float,
    error: JsonObject,
    why: str,
    *,
    actor: str,
    delay: float,
    fence: int | None,
) -> Change:
    if task.attempt >= task.max_attempts:
        dead = _dead_letter(error, task.attempt)
        return move(
            task,
            now,
            f"{why}; no attempts left",
            actor,
            status=F,
            status_message=failure_message(dead),
            error=dead,
            lease_owner=None,
            lease_expires_at=None,
            closed_fence=fence,
        )
    return move(
        task,
        now,
        f"{why}; retrying in {delay:g}s",
        actor,
        attempt=task.attempt + 1,
        lease_owner=None,
        lease_expires_at=None,
        ready_at=now + delay,
    )


def reclaim(
    task: Task, now: float, *, timeout_seconds: float, actor: str = "reclaim"
) -> tuple[Change, Reclaimed]:
    """A non-terminal task idle longer than the timeout becomes ``failed`` (the seed's exercise).

    Raises:
        InvalidTransition: the task is terminal or not idle that long (adapters select only those).
    """
    idle = now - task.updated_at
    if task.status.terminal or idle <= timeout_seconds:
        raise InvalidTransition(f"task {task.task_id} is not stale", task)
    reason = (
        f"reclaimed: no update for {idle:.0f}s while {task.status.value} "
        f"(timeout {timeout_seconds:g}s)"
    )
    change = move(
        task,
        now,
        reason,
        actor,
        status=F,
        status_message=failure_message({"message": reason}),
        error={"code": INTERNAL_ERROR, "message": reason},
        lease_owner=None,
        lease_expires_at=None,
        closed_fence=None,
    )
    return change, Reclaimed(task.task_id, task.status, idle, reason)
