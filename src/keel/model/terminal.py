"""The writes that end a task: completed, failed, cancelled. Terminal is absorbing: an
exact repeat of the write that ended a task returns it unchanged, any other is refused."""

from __future__ import annotations

from keel.errors import InvalidTransition, TaskAlreadyTerminal
from keel.model.machine import (
    C,
    Change,
    F,
    W,
    X,
    actor_of,
    check_error,
    check_writer,
    failure_message,
    key_list,
    move,
    same_value,
    unchanged,
)
from keel.model.task import JsonValue, Task
from keel.model.validation import DEFAULT_LIMITS, Limits, check_message, normalize

__all__ = ["cancel", "complete", "fail"]


def complete(
    task: Task,
    result: JsonValue,
    now: float,
    *,
    fence: int | None,
    actor: str = "client",
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """``working -> completed``. An exact repeat (same result, same lease) returns the task.

    Raises:
        TaskAlreadyTerminal: the task already ended any other way.
        LeaseLost: a stale attempt's write.
        InvalidTransition: the task is waiting for input, or leased and the write unleased.
        InvalidPayload, PayloadTooLarge: the result.
    """
    if task.status.terminal:
        if task.status is C and task.closed_fence == fence and same_value(task.result, result):
            return unchanged(task)
        raise TaskAlreadyTerminal(task, "complete it")
    _, result = normalize(result, "result", limits.max_result_bytes, keep_text=True)
    check_writer(task, fence, "complete it")
    if task.status is not W:
        raise InvalidTransition(
            f"cannot complete task {task.task_id}: it is {task.status.value}, waiting for input "
            f"{key_list(task.pending_input)}",
            task,
        )
    return move(
        task,
        now,
        "completed",
        actor_of(fence, task, actor),
        status=C,
        result=result,
        lease_owner=None,
        lease_expires_at=None,
        closed_fence=fence,
    )


def fail(
    task: Task,
    error: object,
    now: float,
    *,
    fence: int | None,
    actor: str = "client",
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """Non-terminal -> ``failed`` with a JSON-RPC-shaped error. Exact repeats return the task.

    Raises:
        TaskAlreadyTerminal: the task already ended any other way.
        LeaseLost: a stale attempt's write.
        InvalidTransition: the task is leased and the write unleased.
        InvalidPayload: the error is not ``{code, message, data?}``.
    """
    if task.status.terminal:
        if task.status is F and task.closed_fence == fence and same_value(task.error, error):
            return unchanged(task)
        raise TaskAlreadyTerminal(task, "fail it")
    checked = check_error(error)
    _, checked = normalize(checked, "error", limits.max_result_bytes, keep_text=True)
    check_writer(task, fence, "fail it")
    return move(
        task,
        now,
        f"failed: {checked['message']}",
        actor_of(fence, task, actor),
        status=F,
        status_message=failure_message(checked),
        error=checked,
        lease_owner=None,
        lease_expires_at=None,
        closed_fence=fence,
    )


def cancel(
    task: Task,
    now: float,
    *,
    reason: str | None,
    actor: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """Non-terminal -> ``cancelled``, running or not. Cancelling a cancelled task repeats.

    The lease is dropped with it, so anything the running attempt writes afterwards is
    refused (:class:`TaskAlreadyTerminal`).

    Raises:
        TaskAlreadyTerminal: the task completed or failed first.
        InvalidPayload: a reason that is not a string or is over the message limit.
    """
    if task.status.terminal:
        if task.status is X:
            return unchanged(task)
        raise TaskAlreadyTerminal(task, "cancel it")
    if reason is not None:
        check_message(reason, "cancel reason", limits)
    why = f"cancelled: {reason}" if reason else "cancelled"
    return move(
        task,
        now,
        why,
        actor,
        status=X,
        lease_owner=None,
        lease_expires_at=None,
        status_message=why,
        closed_fence=None,
    )
