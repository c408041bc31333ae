"""Plain (non-task) tools refuse arguments they do not take, and arguments their schema
does not allow, as task tools do.

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

The arguments are then validated against that ``inputSchema`` (types, bounds, lengths,
required arguments; NaN and infinities always refused) by the same function as a task's
(:func:`keel.model.validation.validate_arguments`): ``-32602`` ``arguments.limit: 100000
is greater than the maximum of 1000``, where the SDK alone would answer a result with
``isError`` and pydantic's text (``Error executing tool …: 1 validation error …``). A
tool may refuse further values itself by raising
:class:`~keel.errors.ArgumentsRejected` through :func:`~keel.mcp.answers.mcp_error`
(the Bridge's times out of range).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from mcp.server import MCPServer, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware

from keel.errors import ArgumentsRejected
from keel.mcp.answers import mcp_error
from keel.model import JsonObject
from keel.model.validation import validate_arguments
from keel.runtime.arguments import refuse_unknown

__all__ = ["plain_tool_arguments"]


def plain_tool_arguments(
    server: MCPServer[Any], tasks: Collection[str] = ()
) -> ServerMiddleware[Any]:
    """A middleware for ``server`` (append it to ``server.middleware``) that refuses a
    ``tools/call`` of a plain tool with an argument the tool does not take, or one its
    ``inputSchema`` does not allow (see the module docstring). ``tasks``: the names of
    Keel's task tools, which check their arguments themselves (``Keel.submit``) and are
    passed on unchecked."""

    async def check_plain_arguments(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        params = ctx.params or {}
        name = params.get("name")
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}  # as the SDK takes it
        if (
            ctx.method == "tools/call"
            and isinstance(name, str)
            and name not in tasks
            and isinstance(arguments, Mapping)
        ):
            schema = await _schema(server, name)
            if schema is not None:
                try:
                    _check(name, schema, arguments)
                except ArgumentsRejected as exc:
                    raise mcp_error(exc) from exc
        return await call_next(ctx)

    return check_plain_arguments


def _check(name: str, schema: JsonObject, arguments: Mapping[str, Any]) -> None:
    """Raises ArgumentsRejected: an argument tool ``name`` does not take (its schema
    closed), or one that ``schema`` does not allow."""
    if schema.get("additionalProperties", False) is False:
        properties = schema.get("properties")
        takes = list(properties) if isinstance(properties, Mapping) else []
        refuse_unknown(f"tool {name!r}", takes, arguments)
    validate_arguments(schema, dict(arguments))


async def _schema(server: MCPServer[Any], name: str) -> JsonObject | None:
    """Tool ``name``'s published ``inputSchema``; None for a tool the server does not have
    (the SDK answers that)."""
    for tool in await server.list_tools():
        if tool.name == name:
            return dict(tool.input_schema or {})
    return None
