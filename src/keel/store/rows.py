"""Tasks and history rows as column values: the one codec every adapter reads and writes.

JSON columns are stored as text (compact, non-ASCII kept); an update re-encodes only the
JSON columns whose value is not the very object it was read as.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keel.model import Event, InputRequest, Status, Task
from keel.model.task import task_of
from keel.model.validation import encoded_text

__all__ = [
    "MUTABLE_COLUMNS",
    "TASK_COLUMNS",
    "compact_json",
    "event_from_row",
    "task_from_row",
    "task_reader",
    "task_to_row",
]

MUTABLE_COLUMNS = (
    "status", "updated_at", "status_message", "input_requests", "input_responses", "result",
    "error", "attempt", "lease_owner", "lease_expires_at", "fence", "ready_at", "ttl",
    "closed_fence", "expires_at", "claimed_at",
)  # fmt: skip
"""The columns a transition may change; the rest are fixed when the task is created."""


compact_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


_JSON_COLUMNS = ("input_requests", "input_responses", "result", "error")


def _encode_column(task: Task, column: str) -> str | None:
    if column == "input_requests":
        requests = task.input_requests
        return compact_json({k: r.to_json() for k, r in requests.items()}) if requests else "{}"
    if column == "input_responses":
        return compact_json(dict(task.input_responses)) if task.input_responses else "{}"
    value = getattr(task, column)
    if value is None:
        return None
    return encoded_text(value) or compact_json(value)


def _encode_trace(task: Task) -> str | None:
    carrier = task.trace_context
    return None if carrier is None else compact_json(dict(carrier))


def event_from_row(row: Mapping[str, Any]) -> Event:
    """A history row (any mapping of the ``task_events`` columns) as an :class:`Event`."""
    return Event(
        task_id=row["task_id"],
        at=row["at"],
        from_status=None if row["from_status"] is None else Status(row["from_status"]),
        to_status=Status(row["to_status"]),
        reason=row["reason"],
        actor=row["actor"],
    )


def task_to_row(
    task: Task,
    *,
    mutable_only: bool = False,
    previous: tuple[Task, Any] | None = None,
) -> dict[str, Any]:
    """The task as column values (JSON columns as text).

    Args:
        mutable_only: just :data:`MUTABLE_COLUMNS`, what an update writes.
        previous: the task this one was derived from and its stored row (any mapping of
            column names, such as ``sqlite3.Row``): JSON columns
            whose value is the very same object are not encoded again.
    """
    row: dict[str, Any] = {
        "status": task.status.value,
        "updated_at": task.updated_at,
        "status_message": task.status_message,
        "attempt": task.attempt,
        "lease_owner": task.lease_owner,
        "lease_expires_at": task.lease_expires_at,
        "fence": task.fence,
        "ready_at": task.ready_at,
        "ttl": task.ttl,
        "closed_fence": task.closed_fence,
        "expires_at": task.expires_at,
        "claimed_at": task.claimed_at,
    }
    for column in _JSON_COLUMNS:
        if previous is not None and getattr(task, column) is getattr(previous[0], column):
            row[column] = previous[1][column]
        else:
            row[column] = _encode_column(task, column)
    if not mutable_only:
        row.update(
            task_id=task.task_id,
            owner=task.owner,
            name=task.name,
            arguments=encoded_text(task.arguments) or compact_json(task.arguments),
            created_at=task.created_at,
            idempotency_key=task.idempotency_key,
            max_attempts=task.max_attempts,
            request_digest=task.request_digest,
            trace_context=_encode_trace(task),
        )
    return row


def _loads(text: str) -> Any:
    return {} if text == "{}" else json.loads(text)


def _maybe_loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


_STATUS = {status.value: status for status in Status}

TASK_COLUMNS = tuple(field.name for field in dataclasses.fields(Task))
"""The columns a :class:`Task` is read from: its fields, by name, in their order."""

_task_values = operator.itemgetter(*TASK_COLUMNS)


def task_from_row(row: Mapping[str, Any]) -> Task:
    """The inverse of :func:`task_to_row`."""
    return _task(_task_values(row))


def task_reader(columns: Sequence[str]) -> Callable[[Sequence[Any]], Task]:
    """:func:`task_from_row` for rows given as sequences of ``columns``' values (a driver's
    tuples): each column is found by name once per result, not once per row, and no
    mapping is built per row."""
    pick = operator.itemgetter(*(columns.index(name) for name in TASK_COLUMNS))
    return lambda values: _task(pick(values))


def _task(values: Sequence[Any]) -> Task:
    """A task from its :data:`TASK_COLUMNS`' values, in that order."""
    (task_id, status, owner, name, arguments, created_at, updated_at, status_message,
     requests, responses, result, error, idempotency_key, attempt, max_attempts,
     lease_owner, lease_expires_at, fence, ready_at, ttl, closed_fence, request_digest,
     trace_context, claimed_at) = values  # fmt: skip
    # In Task's field order, without its __init__: the hot path of every read.
    return task_of(
        (
            task_id,
            _STATUS[status],
            owner,
            name,
            _loads(arguments),
            created_at,
            updated_at,
            status_message,
            {}
            if requests == "{}"
            else {
                k: InputRequest(r["message"], r["schema"]) for k, r in json.loads(requests).items()
            },
            _loads(responses),
            _maybe_loads(result),
            _maybe_loads(error),
            idempotency_key,
            attempt,
            max_attempts,
            lease_owner,
            lease_expires_at,
            fence,
            ready_at,
            ttl,
            closed_fence,
            request_digest,
            _maybe_loads(trace_context),
            claimed_at,
        )
    )
