"""Input: a running task asks for it and parks; answers bring it back to work."""

from __future__ import annotations

from collections.abc import Mapping

from keel.errors import InvalidPayload, InvalidTransition, TaskAlreadyTerminal
from keel.model.machine import (
    DECLINED,
    IR,
    Change,
    W,
    actor_of,
    check_requests,
    check_writer,
    first_message,
    key_list,
    move,
    unchanged,
)
from keel.model.task import InputRequest, JsonValue, Task
from keel.model.validation import DEFAULT_LIMITS, Limits, field_path, normalize, validate_input

__all__ = ["provide_input", "request_input"]


def request_input(
    task: Task,
    requests: Mapping[str, InputRequest],
    now: float,
    *,
    fence: int | None,
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """``working -> input_required``: persist the requests and release the lease.

    Raises:
        TaskAlreadyTerminal, LeaseLost, InvalidTransition: see ``check_writer``.
        InvalidPayload: no requests, a bad schema, or a key the task already used.
    """
    check_writer(task, fence, "request input")
    if task.status is not W:
        raise InvalidTransition(
            f"task {task.task_id} cannot request input while {task.status.value}", task
        )
    if not requests:
        raise InvalidPayload("request_input needs at least one input request")
    checked = check_requests(requests, limits)
    reused = [k for k in checked if k in task.input_requests]
    if reused:
        raise InvalidPayload(
            f"input key {reused[0]!r} was already used by task {task.task_id}; keys are unique "
            "over a task's lifetime"
        )
    return move(
        task,
        now,
        f"waiting for input {key_list(checked)}",
        actor_of(fence, task, "client"),
        status=IR,
        input_requests={**task.input_requests, **checked},
        lease_owner=None,
        lease_expires_at=None,
        status_message=first_message(checked),
    )


def provide_input(
    task: Task,
    responses: Mapping[str, JsonValue],
    now: float,
    *,
    actor: str,
    declined: Mapping[str, str] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Change:
    """Accept answers to outstanding requests; ``input_required -> working`` once all are in.

    Keys that are unknown or already answered are ignored (an answer that arrives twice
    changes nothing). Every answer is validated before any is accepted. ``declined`` maps
    keys the user refused to ``"decline"`` or ``"cancel"``: they count as answered, and are
    stored as ``{DECLINED: action}`` for the handler to see (as an InputDeclined error).

    Raises:
        TaskAlreadyTerminal: the task ended.
        InvalidTransition: the task is not waiting for input.
        InputRejected: an answer violates its schema (nothing is accepted).
        UnstorableText: NUL or a lone surrogate in an answer (``input.KEY.field: …``).
        PayloadTooLarge: an answer over the limit.
    """
    if task.status.terminal:
        raise TaskAlreadyTerminal(task, "provide input")
    if task.status is not IR:
        raise InvalidTransition(
            f"task is not waiting for input: {task.status.value} (task {task.task_id})", task
        )
    if not isinstance(responses, Mapping):
        raise InvalidPayload(f"input must be an object keyed by request, not {responses!r}")
    pending = task.pending_input
    accepted: dict[str, JsonValue] = {}
    for key, action in (declined or {}).items():
        if action not in {"decline", "cancel"}:
            raise InvalidPayload(f"a declined input is 'decline' or 'cancel', not {action!r}")
        if key in pending:
            accepted[key] = {DECLINED: action}
    for key, raw in responses.items():
        if key in accepted:
            continue
        request = pending.get(key)
        if request is None:
            continue
        _, value = normalize(raw, field_path("input", [key]), limits.max_input_bytes)
        validate_input(task.task_id, key, request.schema, value)
        accepted[key] = value
    if not accepted:
        return unchanged(task)
    answered = {**task.input_responses, **accepted}
    still = [k for k in pending if k not in accepted]
    if still:
        return move(
            task,
            now,
            f"input {key_list(accepted)} received; still waiting for {key_list(still)}",
            actor,
            input_responses=answered,
        )
    return move(
        task,
        now,
        f"input {key_list(accepted)} received; ready to resume",
        actor,
        status=W,
        input_responses=answered,
        ready_at=now,
        status_message=None,
    )
