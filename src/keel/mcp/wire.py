"""Keel tasks as the MCP tasks extension puts them on the wire (SEP-2663, 2026-07-28).

Pure functions, no I/O and no SDK: the server extension calls them, and they are tested
against the spec's shapes directly.

* ``tasks/get`` answers a *detailed task*: ``taskId``, ``status``, ``statusMessage``,
  ``createdAt`` / ``lastUpdatedAt`` (ISO 8601), ``ttlMs`` (integer or null),
  ``pollIntervalMs``, and by status ``inputRequests`` (outstanding ones only),
  ``result`` or ``error``;
* ``tools/call`` answers a flat ``CreateTaskResult``: the same, with ``resultType: "task"``;
* ``tasks/update`` carries ``inputResponses``: elicitation results, ``{action, content}``.

**One shape per outcome.** Every handler of both protocol generations answers through two
functions here, so a client sees the same thing whichever way it asked:

* :func:`rpc_error` turns a Keel error into its JSON-RPC error, by the table
  :data:`ERROR_CODES` (documented in ``docs/mcp.md``);
* :func:`tool_outcome` turns a finished task into what its ``tools/call`` would have
  answered: a ``CallToolResult`` (``isError`` results stay results) or a JSON-RPC error
  (a ``failed`` task's error, code and message kept; a ``cancelled`` task's
  :data:`TASK_CANCELLED`).

A task that failed because its handler raised an unexpected exception carries
``data.exception`` (see :func:`keel.runtime.outcomes.crash_error`); on the wire its message
says only which exception it was, unless the server exposes details: an exception's text
can hold anything (paths, hostnames, secrets), and it stays in the task's history for
operators (``keel tasks show``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from keel.errors import (
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    KeelError,
    TaskNotFound,
)
from keel.model import INTERNAL_ERROR, JsonObject, Status, Task

__all__ = [
    "ERROR_CODES",
    "INVALID_PARAMS",
    "NOT_FOUND",
    "TASKS_EXTENSION",
    "TASK_CANCELLED",
    "cancelled_error",
    "create_task_result",
    "detailed_task",
    "input_from_wire",
    "iso8601",
    "public_error",
    "rpc_error",
    "tool_outcome",
    "ttl_ms",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier, under ``capabilities.extensions``."""

INVALID_PARAMS = -32602  # JSON-RPC: the request's params are wrong
TASK_CANCELLED = -32800
"""The answer to a call whose task was cancelled (no spec defines one; -32800 is the
"request cancelled" code of the Language Server Protocol, outside JSON-RPC's reserved
range)."""
NOT_FOUND = "Failed to retrieve task: Task not found"
"""The one message for unknown, purged and other principals' tasks (the spec's text)."""

ERROR_CODES: tuple[tuple[type[KeelError], int], ...] = (
    (TaskNotFound, INVALID_PARAMS),
    (InvalidPayload, INVALID_PARAMS),  # InputRejected, PayloadTooLarge: the field is named
    (IdempotencyConflict, INVALID_PARAMS),
    (InvalidTransition, INVALID_PARAMS),  # TaskAlreadyTerminal: names the status
)
"""Keel errors that a client caused, and their JSON-RPC codes; first match wins. Any
other Keel error (a store failure, a lost lease) is the server's: ``-32603`` with a
message that shows nothing of the server's internals."""

STORE_FAILED = "the task store failed; the server's log has the details"


def rpc_error(exc: KeelError) -> JsonObject:
    """The JSON-RPC error ``{code, message}`` for a Keel error (see :data:`ERROR_CODES`)."""
    if isinstance(exc, TaskNotFound):
        return {"code": INVALID_PARAMS, "message": NOT_FOUND}
    for kind, code in ERROR_CODES:
        if isinstance(exc, kind):
            return {"code": code, "message": str(exc)}
    return {"code": INTERNAL_ERROR, "message": STORE_FAILED}


def cancelled_error(task_id: str) -> JsonObject:
    """The JSON-RPC error a cancelled task's call answers (the client helper raises it too)."""
    return {"code": TASK_CANCELLED, "message": f"task {task_id} was cancelled"}


def tool_outcome(task: Task, *, expose_crashes: bool = False) -> JsonObject:
    """What a finished task's ``tools/call`` answers: ``{"result": CallToolResult}`` for a
    completed task (``isError`` kept), else ``{"error": {code, message, data?}}``.

    Raises:
        ValueError: the task has not finished.
    """
    if task.status is Status.COMPLETED:
        return {"result": _tool_result(task.result)}
    if task.status is Status.FAILED:
        return {"error": public_error(task.error, expose_crashes=expose_crashes)}
    if task.status is Status.CANCELLED:
        return {"error": cancelled_error(task.task_id)}
    raise ValueError(f"task {task.task_id} has not finished: {task.status.value}")


def iso8601(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC, to the millisecond: ``…T10:30:00.000Z``."""
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ttl_ms(task: Task, now: float) -> int | None:
    """``ttlMs``: how long after creation the record may be deleted; null when kept for good.

    A live task keeps its record whatever its ttl, so past its ttl the reported value
    grows with it (the spec lets ``ttlMs`` change over a task's life): a ttl from now,
    the earliest it could then expire. A finished task reports when it really expires.
    """
    if task.ttl is None:
        return None
    expires = task.expires_at
    assert expires is not None
    if not task.status.terminal and now > expires:
        # It may still finish now, and would then be kept a ttl from now (Task.expires_at).
        expires = now + task.ttl
    return max(0, math.ceil((expires - task.created_at) * 1000))


def public_error(error: Mapping[str, Any] | None, *, expose_crashes: bool = False) -> JsonObject:
    """The error as clients see it: a crash's message reduced to its exception type."""
    shown: JsonObject = dict(error or {"code": -32603, "message": "failed"})
    data = shown.get("data")
    exception = data.get("exception") if isinstance(data, Mapping) else None
    if isinstance(exception, str) and not expose_crashes:
        shown["message"] = (
            f"the task handler raised {exception} (details are in the server's task history)"
        )
    return shown


def detailed_task(
    task: Task, *, now: float, poll_interval: float, expose_crashes: bool = False
) -> JsonObject:
    """The ``tasks/get`` result body (without ``resultType``, which the server stamps)."""
    wire: JsonObject = {
        "taskId": task.task_id,
        "status": task.status.value,
        "createdAt": iso8601(task.created_at),
        "lastUpdatedAt": iso8601(task.updated_at),
        "ttlMs": ttl_ms(task, now),
        "pollIntervalMs": max(1, round(poll_interval * 1000)),
    }
    if task.status_message:
        wire["statusMessage"] = task.status_message
    if task.status is Status.INPUT_REQUIRED:
        wire["inputRequests"] = {
            key: {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": request.message,
                    "requestedSchema": request.schema,
                },
            }
            for key, request in task.pending_input.items()
        }
    elif task.status is Status.COMPLETED:
        wire.update(tool_outcome(task))
    elif task.status is Status.FAILED:
        wire.update(tool_outcome(task, expose_crashes=expose_crashes))
        if wire["error"] != task.error:
            wire["statusMessage"] = f"failed: {wire['error']['message']}"
    return wire


def create_task_result(
    task: Task, *, now: float, poll_interval: float, expose_crashes: bool = False
) -> JsonObject:
    """The flat ``CreateTaskResult`` a ``tools/call`` answers with."""
    detailed = detailed_task(
        task, now=now, poll_interval=poll_interval, expose_crashes=expose_crashes
    )
    return {"resultType": "task", **detailed}


def _tool_result(result: Any) -> JsonObject:
    # Runtime tasks store a CallToolResult already; a task finished through the store's
    # own API may hold any JSON, which goes out as text (and as structured content when
    # it is an object).
    if isinstance(result, Mapping) and isinstance(result.get("content"), list):
        return {**result, "resultType": "complete"}
    wrapped: JsonObject = {
        "resultType": "complete",
        "content": [{"type": "text", "text": json.dumps(result, ensure_ascii=False)}],
        "isError": False,
    }
    if isinstance(result, Mapping):
        wrapped["structuredContent"] = dict(result)
    return wrapped


def input_from_wire(responses: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Split ``inputResponses`` into accepted answers and declined keys.

    Each response is an elicitation result: ``{"action": "accept", "content": {…}}``,
    or ``{"action": "decline" | "cancel"}``. Returns ``(answers, declined)`` ready for
    :meth:`keel.store.Store.provide_input`.

    Raises:
        InvalidPayload: not an object of objects, or an unknown action, naming the key.
    """
    if not isinstance(responses, Mapping):
        raise InvalidPayload("inputResponses must be an object keyed by input request")
    answers: dict[str, Any] = {}
    declined: dict[str, str] = {}
    for key, response in responses.items():
        if not isinstance(response, Mapping):
            raise InvalidPayload(f"inputResponses[{key!r}] must be an elicitation result object")
        action = response.get("action")
        if action == "accept":
            answers[key] = response.get("content", {})
        elif action in {"decline", "cancel"}:
            declined[key] = str(action)
        else:
            raise InvalidPayload(
                f"inputResponses[{key!r}].action must be accept, decline or cancel, not {action!r}"
            )
    return answers, declined
