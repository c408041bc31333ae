"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, spec 2026-07-28).

So far: :mod:`keel.mcp.wire`, the mapping between Keel tasks and the extension's wire
shapes. The server extension for the official ``mcp`` SDK builds on it.
"""

from keel.mcp.wire import (
    TASKS_EXTENSION,
    create_task_result,
    detailed_task,
    input_from_wire,
    iso8601,
    ttl_ms,
)

__all__ = [
    "TASKS_EXTENSION",
    "create_task_result",
    "detailed_task",
    "input_from_wire",
    "iso8601",
    "ttl_ms",
]
