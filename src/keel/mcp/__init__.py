"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, spec 2026-07-28).

:mod:`keel.mcp.wire` maps Keel tasks to the extension's wire shapes;
:mod:`keel.mcp.server` is the server extension for the official SDK's ``MCPServer``
(``TasksExtension``, ``keel_lifespan``); :mod:`keel.mcp.push` serves push notifications
(``subscriptions/listen`` with ``taskIds``, ``TasksExtension.push()``);
:mod:`keel.mcp.client` is the client side (``TasksClientExtension``: listen or poll,
answer input through a callback, resume, cancel).
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
