"""The task state machine: the transition table as data, and one pure function per write.

Adapters do no reasoning of their own. Inside one transaction they read the task, call
the function here, and persist what it returns with a conditional ``UPDATE`` (status and
fence unchanged since the read). So every adapter refuses the same writes with the same
errors, and the rules are tested without a database.

Every function either raises a :mod:`keel.errors` error (and nothing is written) or
returns a :class:`Change`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from keel.errors import InvalidPayload, InvalidTransition, LeaseLost, TaskAlreadyTerminal
from keel.model.task import Event, InputRequest, JsonObject, JsonValue, Reclaimed, Status, Task
from keel.model.validation import (
    DEFAULT_LIMITS,
    Limits,
    canonical,
    check_key,
    check_message,
    check_schema,
    check_seconds,
    normalize,
    validate_input,
)

__all__ = [
    "ALLOWED",
    "DECLINED",
    "INTERNAL_ERROR",
    "Change",
    "can_move",
]

W, IR = Status.WORKING, Status.INPUT_REQUIRED
C, F, X = Status.COMPLETED, Status.FAILED, Status.CANCELLED

ALLOWED: Mapping[Status, frozenset[Status]] = {
    # working -> working is a claim, a retry or a recovery: recorded in history too.
    W: frozenset({W, IR, C, F, X}),
    IR: frozenset({W, IR, F, X}),
    C: frozenset(),
    F: frozenset(),
    X: frozenset(),
}
"""Which status may follow which. Terminal statuses have no way out."""

DECLINED = "$keel.declined"
"""The key of the stored answer to an input request the user declined or cancelled."""

INTERNAL_ERROR = -32603
"""JSON-RPC "internal error": crashes, dead letters, deadlines and reclaims are stored with it."""


def can_move(src: Status, dst: Status) -> bool:
    """Whether the table allows ``src -> dst``."""
    return dst in ALLOWED[src]


@dataclass(frozen=True, slots=True)
class Change:
    """The outcome of a write: the task as it must be stored, and the history entry.

    ``changed`` is False for an exact repeat of the write that ended a task: nothing is
    stored and the caller gets the stored snapshot back.
    """

    task: Task
    event: Event | None
    changed: bool = True


def _same(stored: JsonValue, given: object) -> bool:
    """Whether ``given`` is the very JSON value stored (an exact repeat of a write)."""
    try:
        return canonical(stored) == canonical(given)
    except (TypeError, ValueError):
        return False  # not even JSON: certainly not what was stored


def _unchanged(task: Task) -> Change:
    return Change(task, None, changed=False)


def _event(old: Task | None, new: Task, now: float, reason: str, actor: str) -> Event:
    return Event(
        task_id=new.task_id,
        at=now,
        from_status=None if old is None else old.status,
        to_status=new.status,
        reason=reason,
        actor=actor,
    )


def _replace(task: Task, **changes: Any) -> Task:
    """``dataclasses.replace`` without re-running ``__init__``: a hot path of every write."""
    new = object.__new__(Task)
    for name in _TASK_FIELDS:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(task, name))
    return new


_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(Task))


def _move(task: Task, now: float, reason: str, actor: str, **changes: Any) -> Change:
    new = _replace(task, updated_at=now, **changes)
    if not can_move(task.status, new.status):  # pragma: no cover - guarded by callers
        raise InvalidTransition(
            f"task {task.task_id} cannot go from {task.status.value} to {new.status.value}", task
        )
    return Change(new, _event(task, new, now, reason, actor))


def _check_writer(task: Task, fence: int | None, attempted: str) -> None:
    """Refuse writes to terminal tasks, stale fenced writes, and unleased writes to leased tasks."""
    if task.status.terminal:
        raise TaskAlreadyTerminal(task, attempted)
    if fence is None:
        if task.lease_owner is not None:
            raise InvalidTransition(
                f"task {task.task_id} is running on {task.lease_owner} (fence {task.fence}); "
                f"an unleased write cannot {attempted}",
                task,
            )
    elif task.lease_owner is None:
        why = "the task holds no lease" if task.fence == fence else "the task was claimed again"
        raise LeaseLost(task.task_id, fence, task.fence, why)
    elif task.fence != fence:
        raise LeaseLost(task.task_id, fence, task.fence, "the task was claimed again")


def _actor(fence: int | None, task: Task, default: str) -> str:
    return f"worker:{task.lease_owner}" if fence is not None and task.lease_owner else default


def check_error(error: object) -> JsonObject:
    """Check a JSON-RPC-shaped error ``{code: int, message: str, data?: any}``.

    Raises:
        InvalidPayload: another shape.
    """
    if not isinstance(error, Mapping):
        raise InvalidPayload(f"error must be an object {{code, message, data?}}, not {error!r}")
    code, message = error.get("code"), error.get("message")
    if isinstance(code, bool) or not isinstance(code, int):
        raise InvalidPayload(f"error.code must be an integer, not {code!r}")
    if not isinstance(message, str) or not message:
        raise InvalidPayload(f"error.message must be a non-empty string, not {message!r}")
    extra = set(error) - {"code", "message", "data"}
    if extra:
        raise InvalidPayload(f"error has unknown fields: {', '.join(sorted(extra))}")
    return dict(error)


# --- creation ------------------------------------------------------------------------


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
) -> Change:
    """A new task: ``input_required`` if it starts with unanswered input requests, else
    ``working``. ``input_responses`` answers some of them at once (input asked for before
    the task existed, such as an MCP client's synchronous answers); each is validated.

    Raises:
        InputRejected: an answer that violates its request's schema.
        InvalidPayload: arguments not a JSON object, a bad schema, key, ttl or max_attempts.
        PayloadTooLarge: arguments over the limit.
    """
    if name is not None:
        check_key(name, "task name", limits)
    if not isinstance(arguments, Mapping):
        raise InvalidPayload(f"arguments must be a JSON object, not {type(arguments).__name__}")
    _, args = normalize(arguments, "arguments", limits.max_arguments_bytes)
    if owner != "":
        check_key(owner, "owner", limits)
    if idempotency_key is not None:
        check_key(idempotency_key, "idempotency key", limits)
    if ttl is not None:
        ttl = check_seconds(ttl, "ttl")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidPayload(f"max_attempts must be an integer >= 1, not {max_attempts!r}")
    requests = _check_requests(input_requests or {}, limits)
    answered: dict[str, JsonValue] = {}
    for key, raw in (input_responses or {}).items():
        if key not in requests:
            raise InvalidPayload(f"input {key!r} answers no input request of the new task")
        _, value = normalize(raw, f"input {key!r}", limits.max_input_bytes)
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
        status_message=_first_message(pending),
        request_digest=request_digest(name, args, requests),
    )
    why = f"created; waiting for input {_keys(pending)}" if pending else "created"
    if answered:
        why += f" (input {_keys(answered)} given with it)"
    return Change(task, _event(None, task, now, why, actor))


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


def _check_requests(
    requests: Mapping[str, InputRequest], limits: Limits
) -> dict[str, InputRequest]:
    checked: dict[str, InputRequest] = {}
    for key, request in requests.items():
        check_key(key, "input key", limits)
        if not isinstance(request, InputRequest):
            raise InvalidPayload(f"input request {key!r} must be an InputRequest")
        message = check_message(request.message, f"message of input request {key!r}", limits)
        schema = check_schema(request.schema, f"schema of input request {key!r}")
        _, schema = normalize(schema, f"schema of input request {key!r}", limits.max_input_bytes)
        checked[key] = InputRequest(message, schema)
    return checked


def _keys(requests: Iterable[str]) -> str:
    return ", ".join(repr(k) for k in requests)


def _first_message(requests: Mapping[str, InputRequest]) -> str | None:
    for request in requests.values():
        if request.message:
            return request.message
    return None


# --- input -----------------------------------------------------------------------------


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
        TaskAlreadyTerminal, LeaseLost, InvalidTransition: see :func:`_check_writer`.
        InvalidPayload: no requests, a bad schema, or a key the task already used.
    """
    _check_writer(task, fence, "request input")
    if task.status is not W:
        raise InvalidTransition(
            f"task {task.task_id} cannot request input while {task.status.value}", task
        )
    if not requests:
        raise InvalidPayload("request_input needs at least one input request")
    checked = _check_requests(requests, limits)
    reused = [k for k in checked if k in task.input_requests]
    if reused:
        raise InvalidPayload(
            f"input key {reused[0]!r} was already used by task {task.task_id}; keys are unique "
            "over a task's lifetime"
        )
    return _move(
        task,
        now,
        f"waiting for input {_keys(checked)}",
        _actor(fence, task, "client"),
        status=IR,
        input_requests={**task.input_requests, **checked},
        lease_owner=None,
        lease_expires_at=None,
        status_message=_first_message(checked),
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
        _, value = normalize(raw, f"input {key!r}", limits.max_input_bytes)
        validate_input(task.task_id, key, request.schema, value)
        accepted[key] = value
    if not accepted:
        return _unchanged(task)
    answered = {**task.input_responses, **accepted}
    still = [k for k in pending if k not in accepted]
    if still:
        return _move(
            task,
            now,
            f"input {_keys(accepted)} received; still waiting for {_keys(still)}",
            actor,
            input_responses=answered,
        )
    return _move(
        task,
        now,
        f"input {_keys(accepted)} received; ready to resume",
        actor,
        status=W,
        input_responses=answered,
        ready_at=now,
        status_message=None,
    )


# --- outcomes --------------------------------------------------------------------------


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
        if task.status is C and task.closed_fence == fence and _same(task.result, result):
            return _unchanged(task)
        raise TaskAlreadyTerminal(task, "complete it")
    _, result = normalize(result, "result", limits.max_result_bytes)
    _check_writer(task, fence, "complete it")
    if task.status is not W:
        raise InvalidTransition(
            f"cannot complete task {task.task_id}: it is {task.status.value}, waiting for input "
            f"{_keys(task.pending_input)}",
            task,
        )
    return _move(
        task,
        now,
        "completed",
        _actor(fence, task, actor),
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
        if task.status is F and task.closed_fence == fence and _same(task.error, error):
            return _unchanged(task)
        raise TaskAlreadyTerminal(task, "fail it")
    checked = check_error(error)
    _, checked = normalize(checked, "error", limits.max_result_bytes)
    _check_writer(task, fence, "fail it")
    return _move(
        task,
        now,
        f"failed: {checked['message']}",
        _actor(fence, task, actor),
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
            return _unchanged(task)
        raise TaskAlreadyTerminal(task, "cancel it")
    if reason is not None:
        check_message(reason, "cancel reason", limits)
    why = f"cancelled: {reason}" if reason else "cancelled"
    return _move(
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


# --- leases ----------------------------------------------------------------------------


def claim(task: Task, now: float, *, worker: str, lease_seconds: float) -> Change:
    """A ready ``working`` task gets a lease and a new fencing token.

    Raises:
        InvalidTransition: the task is not ready (adapters select only ready tasks).
    """
    if task.status is not W or task.lease_owner is not None or task.ready_at > now:
        raise InvalidTransition(f"task {task.task_id} is not ready to be claimed", task)
    fence = task.fence + 1
    return _move(
        task,
        now,
        f"claimed by {worker} (attempt {task.attempt}/{task.max_attempts}, fence {fence})",
        f"worker:{worker}",
        lease_owner=worker,
        lease_expires_at=now + lease_seconds,
        fence=fence,
    )


def release(task: Task, now: float, *, fence: int, reason: str) -> Change:
    """The live attempt gives the task back unfinished (a worker shutting down): ready again
    at once, and it does not count as a failed attempt.

    Raises:
        TaskAlreadyTerminal, LeaseLost: see :func:`_check_writer`.
    """
    _check_writer(task, fence, "release it")
    return _move(
        task,
        now,
        f"released by {task.lease_owner}: {reason}",
        _actor(fence, task, "worker"),
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
    _check_writer(task, fence, "renew its lease")
    new = _replace(task, updated_at=now, lease_expires_at=now + lease_seconds)
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
        TaskAlreadyTerminal, LeaseLost, InvalidTransition: see :func:`_check_writer`.
    """
    _check_writer(task, fence, "set its status message")
    if message is not None:
        check_message(message, "status message", limits)
    return Change(_replace(task, updated_at=now, status_message=message), None)


def check_step(task: Task, fence: int) -> None:
    """A checkpoint may be written only by the attempt that holds the task.

    Raises:
        TaskAlreadyTerminal, LeaseLost: see :func:`_check_writer`.
    """
    _check_writer(task, fence, "record a step")


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
        TaskAlreadyTerminal, LeaseLost: see :func:`_check_writer`.
        InvalidPayload: the error is not ``{code, message, data?}``.
    """
    if task.status.terminal:
        if (
            task.status is F
            and task.closed_fence == fence
            and isinstance(error, Mapping)
            and "message" in error
            and _same(task.error, _dead_letter(dict(error), task.attempt))
        ):
            return _unchanged(task)  # the retry that dead-lettered it, repeated
        raise TaskAlreadyTerminal(task, "retry it")
    _check_writer(task, fence, "retry it")
    checked = check_error(error)
    _, checked = normalize(checked, "error", limits.max_result_bytes)
    delay = check_seconds(delay_seconds, "retry delay")
    return _end_attempt(
        task,
        now,
        checked,
        f"attempt {task.attempt}/{task.max_attempts} failed: {checked['message']}",
        actor=_actor(fence, task, "worker"),
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


FAILURE_MESSAGE_CHARS = 500
"""A failed task's status message is its error's message, cut to this many characters."""


def failure_message(error: Mapping[str, Any]) -> str:
    """The status message of a task that failed with ``error`` (the spec's SHOULD: a
    failed task says why in ``statusMessage``)."""
    message = str(error.get("message", ""))
    if len(message) > FAILURE_MESSAGE_CHARS:
        message = message[: FAILURE_MESSAGE_CHARS - 1] + "…"
    return f"failed: {message}"


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
        return _move(
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
    return _move(
        task,
        now,
        f"{why}; retrying in {delay:g}s",
        actor,
        attempt=task.attempt + 1,
        lease_owner=None,
        lease_expires_at=None,
        ready_at=now + delay,
    )


def reclaim(task: Task, now: float, *, timeout_seconds: float) -> tuple[Change, Reclaimed]:
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
    change = _move(
        task,
        now,
        reason,
        "reclaim",
        status=F,
        status_message=failure_message({"message": reason}),
        error={"code": INTERNAL_ERROR, "message": reason},
        lease_owner=None,
        lease_expires_at=None,
        closed_fence=None,
    )
    return change, Reclaimed(task.task_id, task.status, idle, reason)


# --- import ----------------------------------------------------------------------------


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
    requests = _check_requests(task.input_requests, limits)
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
    return _replace(
        task,
        arguments=arguments,
        input_requests=requests,
        input_responses=responses,
        result=result,
        error=error,
        request_digest=task.request_digest or request_digest(task.name, arguments, requests),
    )


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
