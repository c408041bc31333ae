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
  :data:`TASK_CANCELLED`); :func:`legacy_outcome` is the same for 2025-11-25.

Every other error a handler answers (a protocol condition rather than a Keel error: a
poll too soon, a tool that must be called as a task, a client that cannot be asked …)
is built by a function of the last section here, so that its code and text have one home.
A completed task's result is read only through :class:`keel.runtime.outcomes.ToolOutput`.

A task that failed because its handler raised an unexpected exception carries
``data.exception`` (see :func:`keel.runtime.outcomes.crash_error`); on the wire its message
says only which exception it was, unless the server exposes details: an exception's text
can hold anything (paths, hostnames, secrets), and it stays in the task's history for
operators (``keel tasks show``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from keel.errors import (
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    KeelError,
    StoreDamaged,
    StoreUnavailable,
    TaskNotFound,
)
from keel.model import INTERNAL_ERROR, JsonObject, Status, Task
from keel.runtime.outcomes import ToolOutput

__all__ = [
    "AUTH_UNAVAILABLE",
    "CANNOT_ASK",
    "ERROR_CODES",
    "HEADER_MISMATCH",
    "INVALID_PARAMS",
    "METHOD_NOT_FOUND",
    "NOT_FOUND",
    "RATE_LIMITED",
    "RELATED_TASK",
    "STORE_DAMAGED",
    "STORE_UNAVAILABLE",
    "TASKS_EXTENSION",
    "TASK_CANCELLED",
    "call_tool_result",
    "cancelled_error",
    "cannot_start",
    "create_task_result",
    "declined_before_start",
    "detailed_task",
    "foreign_request_state",
    "header_mismatch",
    "input_from_wire",
    "input_request",
    "invalid_cursor",
    "iso8601",
    "legacy_outcome",
    "legacy_task",
    "list_not_served",
    "listen_refused",
    "method_not_found",
    "not_a_task_tool",
    "poll_too_soon",
    "public_error",
    "rpc_error",
    "stored_output",
    "stranded",
    "task_required",
    "tool_outcome",
    "ttl_ms",
    "unknown_failure",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier, under ``capabilities.extensions``."""

INVALID_PARAMS = -32602  # JSON-RPC: the request's params are wrong
METHOD_NOT_FOUND = -32601  # JSON-RPC: no such method (or not for this tool)
RATE_LIMITED = -32000  # JSON-RPC's implementation-defined server error range: a poll too soon
HEADER_MISMATCH = -32020  # MCP: an Mcp-Name header that disagrees with the params
CANNOT_ASK = -32021
"""MCP's "missing required client capability": a task needs input and the client cannot
be asked (no form elicitation capability, or no channel to ask on), or a client without
the tasks extension calls a ``task_mode="required"`` tool. ``data`` says what is missing."""
RELATED_TASK = "io.modelcontextprotocol/related-task"
"""The ``_meta`` key that ties a 2025-11-25 message to its task."""
TASK_CANCELLED = -32800
"""The answer to a call whose task was cancelled (no spec defines one; -32800 is the
"request cancelled" code of the Language Server Protocol, outside JSON-RPC's reserved
range)."""
STORE_UNAVAILABLE = -32050
"""The store cannot serve for now (down, unreachable, locked, out of disk, read-only): the
message names the store and the cause, ``data.retryAfterMs`` when to try again. A code
of JSON-RPC's implementation-defined server error range that no MCP spec uses."""
STORE_DAMAGED = -32051
"""The store is damaged (a corrupt page or header met while serving, a failed check):
the message names the store and what to do (restore it from a backup); trying again
will not help until someone does, so no ``retryAfterMs``. The code after
:data:`STORE_UNAVAILABLE`, in the same implementation-defined range."""
SESSIONS_FULL = -32052
"""No room for another 2025-11-25 session (``keel serve --max-sessions``), HTTP 503:
``data.retryAfterMs`` says when to try again (``keel.mcp.access``)."""
AUTH_UNAVAILABLE = -32053
"""A token that could not be checked because what checking it needs is down (the
authorization server's JWKS unreachable, ``keel serve --auth jwt``), HTTP 503 with
``Retry-After``: the server's trouble, not the token's, which a 401 would claim
(``keel.mcp.access``); ``data.retryAfterMs`` says when to try again."""
NOT_FOUND = "Failed to retrieve task: Task not found"
"""The one message for unknown, purged and other principals' tasks (the spec's text)."""

ERROR_CODES: tuple[tuple[type[KeelError], int], ...] = (
    (TaskNotFound, INVALID_PARAMS),
    (InvalidPayload, INVALID_PARAMS),  # InputRejected, PayloadTooLarge: the field is named
    (IdempotencyConflict, INVALID_PARAMS),
    (InvalidTransition, INVALID_PARAMS),  # TaskAlreadyTerminal: names the status
    (StoreUnavailable, STORE_UNAVAILABLE),  # names the store and the cause; data.retryAfterMs
    (StoreDamaged, STORE_DAMAGED),  # StoreCorrupt: names the store and says to restore it
)
"""Keel errors that a client caused (or may wait out: a store unavailable for now), and
their JSON-RPC codes; first match wins. Any other Keel error (an I/O error of the store,
a lost lease) is the server's: ``-32603`` with a message that shows nothing of the server's
internals."""

STORE_FAILED = "the task store failed; the server's log has the details"


def rpc_error(exc: KeelError) -> JsonObject:
    """The JSON-RPC error ``{code, message}`` for a Keel error (see :data:`ERROR_CODES`)."""
    if isinstance(exc, TaskNotFound):
        return {"code": INVALID_PARAMS, "message": NOT_FOUND}
    for kind, code in ERROR_CODES:
        if isinstance(exc, kind):
            error: JsonObject = {"code": code, "message": str(exc)}
            if isinstance(exc, StoreUnavailable):
                error["data"] = {"retryAfterMs": max(1, round(exc.retry_after * 1000))}
            return error
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
        return {"result": {"resultType": "complete", **call_tool_result(stored_output(task))}}
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
            key: input_request(request.message, request.schema)
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


def stored_output(task: Task) -> ToolOutput:
    """A completed task's result as a tool result: what the runtime stored, or (a task
    finished through the store's own API may hold any JSON) that JSON as text, and as
    structured content when it is an object."""
    output = ToolOutput.from_json(task.result)
    return ToolOutput.of_json(task.result) if output is None else output


def call_tool_result(output: ToolOutput) -> JsonObject:
    """A ``CallToolResult`` (without the 2026 ``resultType``): the stored form is one
    already (see :class:`ToolOutput`), so it has one home there."""
    return output.to_json()


def input_request(message: str, schema: JsonObject) -> JsonObject:
    """One entry of ``inputRequests``: a form ``elicitation/create`` request."""
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": schema},
    }


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
        elif action in ("decline", "cancel"):  # a tuple: the action may be unhashable
            declined[key] = str(action)
        else:
            raise InvalidPayload(
                f"inputResponses[{key!r}].action must be accept, decline or cancel, not {action!r}"
            )
    return answers, declined


# --- 2025-11-25 ---------------------------------------------------------------------------


def legacy_task(
    task: Task, *, now: float, poll_interval: float, expose_crashes: bool = False
) -> JsonObject:
    """The 2025-11-25 ``Task``: ``ttl`` and ``pollInterval`` in ms; a result with
    ``isError`` is ``failed`` (stored ``completed``, as the 2026 wire shows it)."""
    status = task.status.value
    message = task.status_message
    if task.status is Status.FAILED:
        message = f"failed: {public_error(task.error, expose_crashes=expose_crashes)['message']}"
    elif task.status is Status.COMPLETED:
        output = stored_output(task)
        if output.is_error:
            status = "failed"
            texts = [b.get("text") for b in output.content if b.get("text")]
            message = f"the tool returned an error: {texts[0]}" if texts else "isError result"
    wire: JsonObject = {
        "taskId": task.task_id,
        "status": status,
        "createdAt": iso8601(task.created_at),
        "lastUpdatedAt": iso8601(task.updated_at),
        "ttl": ttl_ms(task, now),
        "pollInterval": max(1, round(poll_interval * 1000)),
    }
    if message:
        wire["statusMessage"] = message
    return wire


def legacy_outcome(task: Task, *, related: bool, expose_crashes: bool = False) -> JsonObject:
    """:func:`tool_outcome` for 2025-11-25: the ``CallToolResult`` has no ``resultType``,
    and answering ``tasks/result`` (``related``) it carries the related-task ``_meta``."""
    outcome = tool_outcome(task, expose_crashes=expose_crashes)
    if "error" in outcome:
        return outcome
    result = call_tool_result(stored_output(task))
    if related:
        result["_meta"] = {**(result.get("_meta") or {}), RELATED_TASK: {"taskId": task.task_id}}
    return {"result": result}


# --- protocol errors (not Keel errors: conditions of the protocol itself) ----------------


def header_mismatch() -> JsonObject:
    """A present ``Mcp-Name`` header that is not the request's ``taskId``."""
    return {"code": HEADER_MISMATCH, "message": "Mcp-Name header does not match params.taskId"}


def listen_refused(reason: str) -> JsonObject:
    """A ``subscriptions/listen`` whose ``notifications`` filter is malformed."""
    return {"code": INVALID_PARAMS, "message": f"Invalid subscriptions/listen: {reason}"}


def poll_too_soon(wait_ms: int, poll_interval_ms: int) -> JsonObject:
    """A ``tasks/get`` that came sooner than the task's poll interval allows."""
    return {
        "code": RATE_LIMITED,
        "message": f"polling too fast: wait {wait_ms} ms (pollIntervalMs is {poll_interval_ms})",
        "data": {"retryAfterMs": wait_ms},
    }


def declined_before_start(key: str, action: str) -> JsonObject:
    """Input a task asks for before it starts was declined: no task is created."""
    return {"code": INVALID_PARAMS, "message": f"input {key!r} was {action}: cannot start"}


def foreign_request_state(task_name: str | None, tool: str) -> JsonObject:
    """A retry whose ``requestState`` names a task of another tool."""
    return {
        "code": INVALID_PARAMS,
        "message": f"requestState belongs to a call of {task_name!r}, not {tool!r}",
    }


def invalid_cursor() -> JsonObject:
    """A ``tasks/list`` cursor that names none of the caller's tasks."""
    return {"code": INVALID_PARAMS, "message": "Invalid cursor"}


def method_not_found() -> JsonObject:
    """A request for a method the receiver does not serve."""
    return {"code": METHOD_NOT_FOUND, "message": "Method not found"}


def not_a_task_tool(tool: object) -> JsonObject:
    """A 2025-11-25 task-augmented call of a tool that is no Keel task (``forbidden``)."""
    return {"code": METHOD_NOT_FOUND, "message": f"tool {tool!r} cannot be called as a task"}


def task_required(tool: str) -> JsonObject:
    """A 2025-11-25 plain call of a ``task_mode="required"`` tool."""
    return {
        "code": METHOD_NOT_FOUND,
        "message": f"tool {tool!r} must be called as a task (params.task)",
    }


def list_not_served() -> JsonObject:
    """``tasks/list`` on a server that cannot tell its callers apart."""
    return {
        "code": METHOD_NOT_FOUND,
        "message": "tasks/list is served only by servers that authenticate their "
        "callers (the tasks capability does not declare list here)",
    }


def _elicitation_form() -> JsonObject:
    return {"elicitation": {"form": {}}}


def cannot_start(tool: str, keys: list[str], why: str) -> JsonObject:
    """:data:`CANNOT_ASK` for a task that asks before it starts (none is created)."""
    return {
        "code": CANNOT_ASK,
        "message": f"tool {tool!r} needs input ({', '.join(keys)}) before it starts "
        f"and its client cannot be asked: {why}; no task was created",
        "data": {"inputRequests": keys, "requiredCapabilities": _elicitation_form()},
    }


def stranded(task_id: str, keys: list[str], reason: str) -> JsonObject:
    """:data:`CANNOT_ASK` for a task cancelled because its client cannot give its input."""
    return {
        "code": CANNOT_ASK,
        "message": f"task {task_id} was cancelled: {reason}",
        "data": {
            "taskId": task_id,
            "inputRequests": keys,
            "requiredCapabilities": _elicitation_form(),
        },
    }


def unknown_failure(task_id: str) -> JsonObject:
    """What a client reports for a failed task whose error it was not shown."""
    return {"code": INTERNAL_ERROR, "message": f"task {task_id} failed"}
