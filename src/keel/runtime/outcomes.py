"""How a handler's ending becomes a task's outcome.

* a returned value -> ``completed`` with a tool result (``content`` + ``structuredContent``);
* :class:`ToolError` -> ``completed`` with ``isError: true``: a domain error the model
  should see, as MCP asks (not a failure of the task machinery);
* :class:`TaskFailed` -> ``failed`` at once with that JSON-RPC error (no retry);
* any other exception -> retried with jittered backoff, then ``failed`` (dead letter).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from keel.errors import KeelError
from keel.model import INTERNAL_ERROR, JsonObject, JsonValue

__all__ = ["InputDeclined", "TaskFailed", "ToolError", "ToolResult", "backoff", "tool_result"]


class ToolError(Exception):
    """Raise from a handler to end the task ``completed`` with ``isError: true``."""

    def __init__(self, message: str, *, structured: JsonObject | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.structured = structured


class TaskFailed(Exception):
    """Raise from a handler to end the task ``failed`` with a JSON-RPC error, no retry."""

    def __init__(self, message: str, *, code: int = INTERNAL_ERROR, data: JsonValue = None):
        super().__init__(message)
        self.error: JsonObject = {"code": code, "message": message}
        if data is not None:
            self.error["data"] = data


class InputDeclined(KeelError):
    """The user declined (or cancelled) an input request; a handler may catch it."""

    def __init__(self, key: str, action: str) -> None:
        done = {"decline": "declined", "cancel": "cancelled"}.get(action, action)
        super().__init__(f"input request {key!r} was {done} by the user")
        self.key = key
        self.action = action


@dataclass(frozen=True, slots=True)
class ToolResult:
    """An explicit tool result: text for people, structured content for programs."""

    text: str
    structured: JsonObject | None = None
    extra_content: list[JsonObject] = field(default_factory=list)


def tool_result(value: Any) -> JsonObject:
    """A handler's return value as a tool result (MCP ``CallToolResult`` shape)."""
    if isinstance(value, ToolResult):
        result: JsonObject = {
            "content": [{"type": "text", "text": value.text}, *value.extra_content],
            "isError": False,
        }
        if value.structured is not None:
            result["structuredContent"] = value.structured
        return result
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}], "isError": False}
    text = json.dumps(value, ensure_ascii=False)
    result = {"content": [{"type": "text", "text": text}], "isError": False}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


def error_result(error: ToolError) -> JsonObject:
    """A :class:`ToolError` as a tool result with ``isError: true``."""
    result: JsonObject = {"content": [{"type": "text", "text": error.message}], "isError": True}
    if error.structured is not None:
        result["structuredContent"] = error.structured
    return result


def crash_error(exc: BaseException) -> JsonObject:
    """An unexpected exception as a JSON-RPC error: its type and message (no traceback),
    and ``data.exception``, the type's name, which marks it as a crash: the MCP layer
    shows clients only the type (see :func:`keel.mcp.wire.public_error`)."""
    return {
        "code": INTERNAL_ERROR,
        "message": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
        "data": {"exception": type(exc).__name__},
    }


def backoff(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential, capped, full jitter."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)
