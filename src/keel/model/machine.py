"""The state machine: the transition table as data, and what every write shares.

The writes themselves live by concern beside this module (:mod:`keel.model.creation`,
:mod:`keel.model.input`, :mod:`keel.model.leases`, :mod:`keel.model.terminal`,
:mod:`keel.model.retries`); :mod:`keel.model.transitions` gathers them. Each either
raises a :mod:`keel.errors` error (and nothing is written) or returns a :class:`Change`.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from keel.errors import (
    INTERNAL_ERROR,
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    TaskAlreadyTerminal,
)
from keel.model.drafts import draft_class
from keel.model.task import (
    Event,
    InputRequest,
    JsonObject,
    JsonValue,
    Status,
    Task,
    event_of,
    task_of,
)
from keel.model.validation import (
    Limits,
    canonical,
    check_key,
    check_message,
    check_schema,
    normalize,
)

__all__ = [
    "ALLOWED",
    "DECLINED",
    "FAILURE_MESSAGE_CHARS",
    "INTERNAL_ERROR",
    "Change",
    "actor_of",
    "can_move",
    "check_error",
    "check_requests",
    "check_writer",
    "event",
    "failure_message",
    "first_message",
    "key_list",
    "move",
    "replace",
    "same_value",
    "unchanged",
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


_ChangeDraft = draft_class(Change)


def same_value(stored: JsonValue, given: object) -> bool:
    """Whether ``given`` is the very JSON value stored (an exact repeat of a write)."""
    try:
        return canonical(stored) == canonical(given)
    except (TypeError, ValueError):
        return False  # not even JSON: certainly not what was stored


def unchanged(task: Task) -> Change:
    return Change(task, None, changed=False)


def event(old: Task | None, new: Task, now: float, reason: str, actor: str) -> Event:
    from_status = None if old is None else old.status
    return event_of(new.task_id, now, from_status, new.status, reason=reason, actor=actor)


def replace(task: Task, **changes: Any) -> Task:
    """``dataclasses.replace`` without re-running ``__init__``: a hot path of every write."""
    values = list(_task_values(task))
    for name, value in changes.items():
        values[_FIELD_INDEX[name]] = value
    return task_of(values)


_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(Task))
_task_values = operator.attrgetter(*_TASK_FIELDS)
_FIELD_INDEX = {name: index for index, name in enumerate(_TASK_FIELDS)}


def move(task: Task, now: float, reason: str, actor: str, **changes: Any) -> Change:
    new = replace(task, updated_at=now, **changes)
    if not can_move(task.status, new.status):  # pragma: no cover - guarded by callers
        raise InvalidTransition(
            f"task {task.task_id} cannot go from {task.status.value} to {new.status.value}", task
        )
    change: Any = _ChangeDraft()  # Change(new, event) without its __init__: keel.model.drafts
    change.task, change.event, change.changed = new, event(task, new, now, reason, actor), True
    change.__class__ = Change
    moved: Change = change
    return moved


def check_writer(task: Task, fence: int | None, attempted: str) -> None:
    """Refuse writes to terminal tasks, stale fenced writes, and unleased writes to leased tasks.

    Raises:
        TaskAlreadyTerminal: the task ended.
        LeaseLost: a fenced write from an attempt that no longer holds the task.
        InvalidTransition: an unleased write to a leased task.
    """
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


def actor_of(fence: int | None, task: Task, default: str) -> str:
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


FAILURE_MESSAGE_CHARS = 500
"""A failed task's status message is its error's message, cut to this many characters."""


def failure_message(error: Mapping[str, Any]) -> str:
    """The status message of a task that failed with ``error`` (the spec's SHOULD: a
    failed task says why in ``statusMessage``)."""
    message = str(error.get("message", ""))
    if len(message) > FAILURE_MESSAGE_CHARS:
        message = message[: FAILURE_MESSAGE_CHARS - 1] + "…"
    return f"failed: {message}"


def check_requests(requests: Mapping[str, InputRequest], limits: Limits) -> dict[str, InputRequest]:
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


def key_list(requests: Iterable[str]) -> str:
    return ", ".join(repr(k) for k in requests)


def first_message(requests: Mapping[str, InputRequest]) -> str | None:
    for request in requests.values():
        if request.message:
            return request.message
    return None
