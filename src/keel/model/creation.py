"""Tasks entering the store whole: a new task, and a task imported from elsewhere."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, cast

from keel.errors import InvalidPayload
from keel.model.machine import (
    IR,
    Change,
    F,
    W,
    check_error,
    check_requests,
    event,
    first_message,
    key_list,
    replace,
)
from keel.model.task import InputRequest, JsonObject, JsonValue, Status, Task
from keel.model.validation import (
    DEFAULT_LIMITS,
    Limits,
    canonical,
    check_key,
    check_message,
    check_seconds,
    field_path,
    normalize,
    validate_input,
)

__all__ = [
    "MAX_TRACE_CONTEXT_BYTES",
    "check_imported",
    "check_trace_context",
    "new_task",
    "request_digest",
    "same_request",
]

MAX_TRACE_CONTEXT_BYTES = 4096
"""A stored trace context's bound, encoded: a ``traceparent`` is 55 characters, and W3C
asks that at least 512 of a ``tracestate`` be passed on."""


def new_task(
    task_id: str,
    now: float,
    *,
    name: str | None,
    arguments: object,
    owner: str,
    idempotency_key: str | None,
    input_requests: Mapping[str, InputRequest] | None,
    ttl: float | None,
    max_attempts: int,
    actor: str,
    input_responses: Mapping[str, JsonValue] | None = None,
    limits: Limits = DEFAULT_LIMITS,
    trace_context: Mapping[str, str] | None = None,
) -> Change:
    """A new task: ``input_required`` if it starts with unanswered input requests, else
    ``working``. ``input_responses`` answers some of them at once (input asked for before
    the task existed, such as an MCP client's synchronous answers); each is validated.
    ``trace_context`` is kept with it (see :func:`check_trace_context`).

    Raises:
        InputRejected: an answer that violates its request's schema.
        InvalidPayload: arguments not a JSON object, a bad schema, key, ttl or max_attempts.
        UnstorableText: NUL or a lone surrogate in the arguments, an answer, the name, owner
            or idempotency key (the error names the field: ``arguments.note: …``).
        PayloadTooLarge: arguments over the limit.
    """
    carrier = check_trace_context(trace_context)
    if name is not None:
        check_key(name, "task name", limits)
    if not isinstance(arguments, Mapping):
        raise InvalidPayload(f"arguments must be a JSON object, not {type(arguments).__name__}")
    _, args = normalize(arguments, "arguments", limits.max_arguments_bytes, keep_text=True)
    if owner != "":
        check_key(owner, "owner", limits)
    if idempotency_key is not None:
        check_key(idempotency_key, "idempotency key", limits)
    if ttl is not None:
        ttl = check_seconds(ttl, "ttl")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidPayload(f"max_attempts must be an integer >= 1, not {max_attempts!r}")
    requests = check_requests(input_requests or {}, limits)
    answered: dict[str, JsonValue] = {}
    for key, raw in (input_responses or {}).items():
        if key not in requests:
            raise InvalidPayload(f"input {key!r} answers no input request of the new task")
        _, value = normalize(raw, field_path("input", [key]), limits.max_input_bytes)
        validate_input(task_id, key, requests[key].schema, value)
        answered[key] = value
    pending = {k: r for k, r in requests.items() if k not in answered}
    task = Task(
        task_id=task_id,
        status=IR if pending else W,
        owner=owner,
        name=name,
        arguments=args,
        created_at=now,
        updated_at=now,
        input_requests=requests,
        input_responses=answered,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        ready_at=now,
        ttl=ttl,
        status_message=first_message(pending),
        request_digest=request_digest(name, args, requests),
        trace_context=carrier,
    )
    why = f"created; waiting for input {key_list(pending)}" if pending else "created"
    if answered:
        why += f" (input {key_list(answered)} given with it)"
    return Change(task, event(None, task, now, why, actor))


def request_digest(
    name: str | None, arguments: JsonObject, input_requests: Mapping[str, InputRequest]
) -> str:
    """The fingerprint of a create request (see :attr:`Task.request_digest`)."""
    requests = {k: r.to_json() for k, r in input_requests.items()}
    text = canonical({"name": name, "arguments": arguments, "input_requests": requests})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def same_request(existing: Task, candidate: Task) -> str | None:
    """Why a create with an already-bound idempotency key conflicts, or None if it repeats.

    It compares the fingerprints of the two create requests, so requests the task made
    after it was created (a handler asking for input) do not count.
    """
    if existing.request_digest == candidate.request_digest:
        return None
    if existing.name != candidate.name:
        return "task name"
    if canonical(existing.arguments) != canonical(candidate.arguments):
        return "arguments"
    return "input requests"


def check_imported(task: Task, limits: Limits = DEFAULT_LIMITS) -> Task:
    """Check a whole task brought from elsewhere, and return it as the store keeps it.

    Raises:
        InvalidPayload: a payload that is not JSON or over its limit, or a task that could
            not exist (a finished task holding a lease, a failure without an error …).
    """
    check_key(task.task_id, "task id", limits)
    if not isinstance(task.status, Status):
        raise InvalidPayload(f"status must be a Status, not {task.status!r}")
    if task.name is not None:
        check_key(task.name, "task name", limits)
    if task.owner != "":
        check_key(task.owner, "owner", limits)
    if task.idempotency_key is not None:
        check_key(task.idempotency_key, "idempotency key", limits)
    if not isinstance(task.arguments, Mapping):
        raise InvalidPayload("arguments must be a JSON object")
    _, arguments = normalize(task.arguments, "arguments", limits.max_arguments_bytes)
    requests = check_requests(task.input_requests, limits)
    if not isinstance(task.input_responses, Mapping):
        raise InvalidPayload("input responses must be an object keyed by request")
    _, responses = normalize(dict(task.input_responses), "input", limits.max_input_bytes)
    _, result = normalize(task.result, "result", limits.max_result_bytes)
    error = None
    if task.error is not None:
        _, error = normalize(check_error(task.error), "error", limits.max_result_bytes)
    if task.status_message is not None:
        check_message(task.status_message, "status message", limits)
    for what in ("created_at", "updated_at", "ready_at"):
        check_seconds(getattr(task, what), what)
    if task.ttl is not None:
        check_seconds(task.ttl, "ttl")
    _check_shape(task, requests, responses)
    return replace(
        task,
        arguments=arguments,
        input_requests=requests,
        input_responses=responses,
        result=result,
        error=error,
        request_digest=task.request_digest or request_digest(task.name, arguments, requests),
        trace_context=check_trace_context(task.trace_context),
    )


def check_trace_context(carrier: object) -> dict[str, str] | None:
    """A trace context to keep with a task (W3C headers: ``traceparent``, ``tracestate``),
    as a private copy; None for none (an empty one included).

    Raises:
        InvalidPayload: not an object of strings, or over :data:`MAX_TRACE_CONTEXT_BYTES`.
        UnstorableText: NUL or a lone surrogate in it.
    """
    if carrier is None:
        return None
    if not isinstance(carrier, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()
    ):
        raise InvalidPayload(f"a trace context must be an object of strings, not {carrier!r:.80}")
    if not carrier:
        return None
    _, copy = normalize(dict(carrier), "trace context", MAX_TRACE_CONTEXT_BYTES)
    return cast(dict[str, str], copy)


def _check_shape(
    task: Task, requests: Mapping[str, InputRequest], responses: Mapping[str, Any]
) -> None:
    counters = (task.attempt, task.max_attempts, task.fence)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in counters):
        raise InvalidPayload("attempt, max_attempts and fence must be integers")
    if task.attempt < 1 or task.max_attempts < 1 or task.fence < 0:
        raise InvalidPayload("attempt and max_attempts must be >= 1 and fence >= 0")
    if (task.lease_owner is None) != (task.lease_expires_at is None):
        raise InvalidPayload("a lease needs both an owner and an expiry")
    if task.lease_owner is not None and task.status is not W:
        raise InvalidPayload(f"a {task.status.value} task cannot hold a lease")
    if (task.error is not None) != (task.status is F):
        raise InvalidPayload("a failed task, and only a failed task, carries an error")
    unknown = [k for k in responses if k not in requests]
    if unknown:
        raise InvalidPayload(f"input {unknown[0]!r} answers no input request")
    if task.status is IR and all(k in responses for k in requests):
        raise InvalidPayload("an input_required task needs an unanswered input request")
