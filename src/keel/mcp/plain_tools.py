"""Plain (non-task) tools refuse arguments they do not take, as task tools do.

The official SDK validates a plain tool's arguments with a pydantic model of its
function's signature, which ignores a name it does not know: ``search_traces(service=…,
bogus=1)`` runs as if ``bogus`` had not been sent, and the caller never learns that it
was misspelt. Keel's task tools refuse such an argument before anything is stored
(:mod:`keel.runtime.arguments`); :func:`plain_tool_arguments` refuses it for every
other tool of the server the same way, through the same function
(:func:`keel.runtime.arguments.refuse_unknown`): ``-32602`` ``arguments.bogus: tool
'search_traces' takes no argument 'bogus' (it takes: …)``, and the tool does not run.

The seam, for the SDK (``mcp`` 2.3.0, pinned): the SDK has no hook for the arguments of
a plain tool, and its tool registry is private. The lowest public seam is the server's
middleware chain (``MCPServer.middleware``, public, provisional), which sees every
``tools/call`` before its handler; what a tool takes is read from ``MCPServer.list_tools()``
(public): the ``properties`` of its published ``inputSchema``, which the SDK derives
from the very signature it calls the function with. A schema that allows other
properties (``additionalProperties`` not false) is left to its tool.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from mcp.server import MCPServer, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware

from keel.errors import ArgumentsRejected
from keel.mcp.answers import mcp_error
from keel.runtime.arguments import refuse_unknown

__all__ = ["plain_tool_arguments"]


def plain_tool_arguments(
    server: MCPServer[Any], tasks: Collection[str] = ()
) -> ServerMiddleware[Any]:
    """A middleware for ``server`` (append it to ``server.middleware``) that refuses a
    ``tools/call`` of a plain tool with an argument the tool does not take (see the module
    docstring). ``tasks``: the names of Keel's task tools, which refuse such arguments
    themselves (``Keel.submit``) and are passed on unchecked."""

    async def refuse_unknown_arguments(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        params = ctx.params or {}
        name = params.get("name")
        arguments = params.get("arguments")
        if (
            ctx.method == "tools/call"
            and isinstance(name, str)
            and name not in tasks
            and isinstance(arguments, Mapping)
            and arguments
        ):
            takes = await _takes(server, name)
            if takes is not None:
                try:
                    refuse_unknown(f"tool {name!r}", takes, arguments)
                except ArgumentsRejected as exc:
                    raise mcp_error(exc) from exc
        return await call_next(ctx)

    return refuse_unknown_arguments


async def _takes(server: MCPServer[Any], name: str) -> list[str] | None:
    """The arguments tool ``name`` takes, from its published ``inputSchema``; None for a
    tool the server does not have (the SDK answers that) or whose schema is open."""
    for tool in await server.list_tools():
        if tool.name == name:
            schema = tool.input_schema or {}
            if schema.get("additionalProperties", False) is not False:
                return None
            properties = schema.get("properties")
            return list(properties) if isinstance(properties, Mapping) else []
    return None
