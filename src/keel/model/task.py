"""The task value and its parts: frozen, pure, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from keel.model.drafts import draft_class

__all__ = [
    "DEFAULT_INPUT_KEY",
    "TERMINAL",
    "Event",
    "InputRequest",
    "JsonObject",
    "JsonValue",
    "Reclaimed",
    "Status",
    "Task",
    "event_of",
    "task_of",
]

# JSON as Python decodes it. Kept as Any: a precise recursive alias buys nothing at runtime,
# and every value is checked by encoding it before it is stored.
JsonValue: TypeAlias = Any
JsonObject: TypeAlias = dict[str, Any]

DEFAULT_INPUT_KEY = "input"
"""The key under which the seed-compatible facade stores its single input request."""


class Status(enum.StrEnum):
    """A task's status. Values are the MCP wire names."""

    WORKING = "working"
    """Accepted and not finished: waiting to be claimed, or running under a lease."""
    INPUT_REQUIRED = "input_required"
    """Parked until every outstanding input request is answered; holds no lease."""
    COMPLETED = "completed"
    """Finished with a result (which may itself report a domain error). Terminal."""
    FAILED = "failed"
    """Ended by a JSON-RPC-shaped error: crash after the last retry, deadline, reclaim. Terminal."""
    CANCELLED = "cancelled"
    """Ended on request before it finished. Terminal."""

    @property
    def terminal(self) -> bool:
        """Whether this status is final: nothing can change a task once it is reached."""
        return self in TERMINAL


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})


@dataclass(frozen=True, slots=True)
class InputRequest:
    """What a task waits for: a message for the human and the JSON Schema of the answer."""

    message: str
    schema: JsonObject

    def to_json(self) -> JsonObject:
        return {"message": self.message, "schema": self.schema}


@dataclass(frozen=True, slots=True)
class Task:
    """One task as stored: a snapshot, never a live object.

    Times are seconds since the epoch (``float``), as given by the store's clock.
    """

    task_id: str
    status: Status
    owner: str
    """The principal the task belongs to ("" when the server has no authentication)."""
    name: str | None
    """The registered work that runs it; None for facade tasks that the caller finishes."""
    arguments: JsonObject
    created_at: float
    updated_at: float
    status_message: str | None = None
    input_requests: Mapping[str, InputRequest] = field(default_factory=dict)
    """Every input request the task has made, by key, answered or not."""
    input_responses: Mapping[str, JsonValue] = field(default_factory=dict)
    """Accepted answers, by request key."""
    result: JsonValue | None = None
    error: JsonObject | None = None
    """JSON-RPC-shaped ``{code, message, data?}``; set when the task failed."""
    idempotency_key: str | None = None
    attempt: int = 1
    """The current attempt's number; waiting for input does not count as an attempt."""
    max_attempts: int = 1
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    fence: int = 0
    """Fencing token: bumped by every claim; a write must carry the current one."""
    ready_at: float = 0.0
    """A ``working`` task without a lease may be claimed from this time on (retry backoff)."""
    ttl: float | None = None
    """Seconds from ``created_at`` after which a finished task may be purged; None: kept."""
    closed_fence: int | None = None
    """The fence of the write that ended the task (None for an unleased write)."""
    request_digest: str = ""
    """SHA-256 of what created the task (name, arguments, initial input requests): a
    create that repeats the task's idempotency key must repeat this too."""
    trace_context: Mapping[str, str] | None = None
    """The W3C trace context (``traceparent``, ``tracestate``) of the span the task was
    created in, fixed at creation: its attempts, steps and polls join that trace (see
    :mod:`keel.telemetry.tracing`). None: created outside a recorded span."""
    claimed_at: float | None = None
    """When the latest attempt was claimed (None: never claimed). Kept after the attempt
    ends: whichever process records an outcome times the attempt from it."""

    @property
    def pending_input(self) -> dict[str, InputRequest]:
        """Input requests not answered yet, by key."""
        return {k: r for k, r in self.input_requests.items() if k not in self.input_responses}

    @property
    def leased(self) -> bool:
        """Whether an attempt holds the task (it may have expired and await recovery)."""
        return self.lease_owner is not None

    @property
    def expires_at(self) -> float | None:
        """When the task's record may be purged, or None if it is kept for good.

        ``ttl`` counts from creation, but never runs out under a live task: a task that is
        still waiting or working keeps its record, and one that finishes after its ttl is
        kept for ``ttl`` after it finished, so its client can still read the outcome. (A
        finished task is never written again, so ``updated_at`` is when it finished.)
        """
        if self.ttl is None:
            return None
        expiry = self.created_at + self.ttl
        if self.status.terminal and self.updated_at > expiry:
            return self.updated_at + self.ttl  # finished late: kept ttl after it finished
        return expiry


_TaskDraft = draft_class(Task)


def task_of(values: Sequence[Any]) -> Task:
    """The :class:`Task` of every field's value, in field order (no defaults, no checks:
    for values read from a store or taken from another Task; see :mod:`keel.model.drafts`:
    ~6,500 instructions, where ``Task(...)`` takes ~35,000)."""
    draft: Any = _TaskDraft()
    (draft.task_id, draft.status, draft.owner, draft.name, draft.arguments, draft.created_at,
     draft.updated_at, draft.status_message, draft.input_requests, draft.input_responses,
     draft.result, draft.error, draft.idempotency_key, draft.attempt, draft.max_attempts,
     draft.lease_owner, draft.lease_expires_at, draft.fence, draft.ready_at, draft.ttl,
     draft.closed_fence, draft.request_digest, draft.trace_context, draft.claimed_at,
     ) = values  # fmt: skip
    draft.__class__ = Task
    task: Task = draft
    return task


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a task's append-only history."""

    task_id: str
    at: float
    from_status: Status | None
    """None for the event that created the task."""
    to_status: Status
    reason: str
    actor: str
    """Who made the change: ``client``, ``worker:<id>``, ``reclaim``, ``cli`` …"""


_EventDraft = draft_class(Event)


def event_of(
    task_id: str,
    at: float,
    from_status: Status | None,
    to_status: Status,
    *,
    reason: str,
    actor: str,
) -> Event:
    """``Event(...)`` without its ``__init__`` (see :mod:`keel.model.drafts`): one per
    transition (~5,300 instructions instead of ~12,700)."""
    draft: Any = _EventDraft()
    draft.task_id, draft.at, draft.from_status = task_id, at, from_status
    draft.to_status, draft.reason, draft.actor = to_status, reason, actor
    draft.__class__ = Event
    event: Event = draft
    return event


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """One task that ``reclaim`` failed, and why."""

    task_id: str
    previous_status: Status
    idle_seconds: float
    reason: str
