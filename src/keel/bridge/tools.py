"""The Bridge's plain tools: ``get_incident``, ``search_traces``, ``list_deploys``.

Every citation of a diagnosis names one of these tools and the arguments that resolve
it. Each tool answers with structured content and text.

An argument that is not what the tool takes is refused as Keel refuses every tool's
invalid arguments: JSON-RPC ``-32602`` naming it (``arguments.limit: …``), through the
one mapping of Keel errors (:func:`keel.mcp.answers.mcp_error`). Every argument is
bounded in the published ``inputSchema`` (lengths, ranges, types, finite numbers), which
the server checks before the tool runs (:mod:`keel.mcp.plain_tools`), and times again
here, where they are parsed: a time that is not ISO 8601, outside
:data:`FIRST_TIME`..:data:`LAST_TIME`, or a range that ends before it starts is
:class:`~keel.errors.ArgumentsRejected` naming the argument, never a crash. What the
data does not have (an unknown incident or deploy) is a tool error (``isError: true``)
saying so.
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Annotated, Any

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from keel.bridge.core import Bridge, open_bridge
from keel.bridge.errors import BadQuery, BridgeError
from keel.bridge.records import parse_time
from keel.bridge.settings import BridgeSettings
from keel.errors import ArgumentsRejected, KeelError
from keel.mcp.answers import mcp_error

__all__ = ["FIRST_TIME", "LAST_TIME", "MAX_DURATION_MS", "MAX_LIMIT", "BridgeTools", "add_tools"]

MAX_LIMIT = 1_000  # results one call may return
MAX_DURATION_MS = 365 * 86_400_000.0  # milliseconds: a year, longer than any span
MAX_TEXT = 256  # characters of a name or id argument (service, incident, trace …)
MAX_TIME_TEXT = 64  # characters of an ISO 8601 time argument
FIRST_TIME = "1970-01-01T00:00:00Z"
LAST_TIME = "2200-01-01T00:00:00Z"
"""The times a query may name (the index keeps nanoseconds in 64 bits)."""

Text = Annotated[str, Field(max_length=MAX_TEXT)]
Time = Annotated[
    str, Field(max_length=MAX_TIME_TEXT, description=f"ISO 8601, {FIRST_TIME} to {LAST_TIME}")
]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
Duration = Annotated[float, Field(ge=0, le=MAX_DURATION_MS, allow_inf_nan=False)]


def _refused(what: str, reason: str) -> ArgumentsRejected:
    return ArgumentsRejected(f"arguments.{what}", what, reason)


def _time(value: str | None, what: str) -> int | None:
    """Argument ``what`` as nanoseconds since the epoch (None when not given).

    Raises:
        ArgumentsRejected: not ISO 8601, or outside FIRST_TIME..LAST_TIME.
    """
    if value is None or value == "":
        return None
    try:
        ns = parse_time(value, what)
    except OverflowError:  # a valid date that no timestamp reaches (year 9999 - 14:00)
        ns = None
    except ValueError as exc:
        raise _refused(what, str(exc).removeprefix(f"{what} ")) from None  # named once
    if ns is None or not _TIME_RANGE[0] <= ns < _TIME_RANGE[1]:
        raise _refused(what, f"must be from {FIRST_TIME} to before {LAST_TIME}, not {value!r}")
    return ns


_TIME_RANGE = (parse_time(FIRST_TIME, "first"), parse_time(LAST_TIME, "last"))


def _range(
    start: str | None, end: str | None, names: tuple[str, str] = ("start", "end")
) -> tuple[int | None, int | None]:
    first, last = _time(start, names[0]), _time(end, names[1])
    if first is not None and last is not None and last <= first:
        raise _refused(names[1], f"bad time range: must be after {names[0]} ({start}), not {end}")
    return first, last


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise _refused("limit", f"must be between 1 and {MAX_LIMIT}, not {limit}")
    return limit


class BridgeTools:
    """The tools' logic over one :class:`Bridge`: raises ArgumentsRejected for an
    argument it cannot use, BridgeError for what the data does not have."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def get_incident(self, incident_id: str) -> dict[str, Any]:
        incident = self.bridge.incidents.get(incident_id)
        return {"incident": incident.to_json()}

    def search_traces(
        self,
        *,
        service: str | None = None,
        start: str | None = None,
        end: str | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
        errors_only: bool = False,
        min_duration_ms: float | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        first, last = _range(start, end)
        if min_duration_ms is not None and not (
            math.isfinite(min_duration_ms) and 0 <= min_duration_ms <= MAX_DURATION_MS
        ):
            raise _refused(
                "min_duration_ms", f"must be from 0 to {MAX_DURATION_MS:.0f}, not {min_duration_ms}"
            )
        spans, total = self.bridge.index.search(
            service=service,
            start=first,
            end=last,
            trace_id=trace_id.lower() if trace_id else None,
            span_id=span_id.lower() if span_id else None,
            errors_only=errors_only,
            min_duration_ns=None if min_duration_ms is None else int(min_duration_ms * 1e6),
            limit=_limit(limit),
        )
        return {
            "spans": [s.to_json() for s in spans],
            "total": total,
            "truncated": total > len(spans),
        }

    def list_deploys(
        self,
        *,
        service: str | None = None,
        since: str | None = None,
        until: str | None = None,
        deploy_id: str | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        first, last = _range(since, until, ("since", "until"))
        limit = _limit(limit)
        found = [
            d
            for d in self.bridge.deploys.all()
            if (service is None or d.service == service)
            and (deploy_id is None or d.id == deploy_id)
            and (first is None or d.deployed_at >= first)
            and (last is None or d.deployed_at < last)
        ]
        if deploy_id is not None and not found:
            raise BadQuery(f"unknown deploy: {deploy_id!r}")
        return {
            "deploys": [d.to_json() for d in found[:limit]],
            "total": len(found),
            "truncated": len(found) > limit,
        }


def _text(name: str, value: dict[str, Any]) -> str:
    if "incident" in value:
        i = value["incident"]
        service = i["service"] or "not named"
        return (
            f"{i['id']} [{i['severity']}] {i['title']}, opened {i['opened_at']}; service: "
            f"{service}; symptoms: {'; '.join(i['symptoms'])}"
        )
    if "spans" in value:
        lines = [f"{value['total']} spans match" + (" (first shown)" if value["truncated"] else "")]
        lines += [
            f"{s['start']} {s['service']} {s['name']} {s['duration_ms']:.1f} ms"
            f"{' ERROR' if s['error'] else ''} trace={s['trace_id']} span={s['span_id']}"
            for s in value["spans"]
        ]
        return "\n".join(lines)
    if "deploys" in value:
        lines = [f"{value['total']} deploys match"]
        lines += [
            f"{d['deployed_at']} {d['id']} {d['service']} {d['version']} ({d['kind']}) "
            f"by {d['author']}: {d['summary']}"
            for d in value["deploys"]
        ]
        return "\n".join(lines)
    return json.dumps(value)  # pragma: no cover - every tool returns one of the above


def add_tools(server: MCPServer[Any], settings: BridgeSettings) -> None:
    """Register ``get_incident``, ``search_traces`` and ``list_deploys`` on ``server``."""
    tools: list[BridgeTools] = []

    async def call(name: str, **kwargs: Any) -> CallToolResult:
        def run() -> dict[str, Any]:
            if not tools:
                tools.append(BridgeTools(open_bridge(settings)))
            method = getattr(tools[0], name)
            result: dict[str, Any] = method(**kwargs)
            return result

        try:
            value = await anyio.to_thread.run_sync(run)
        except ArgumentsRejected as exc:  # -32602 naming the argument, as for every tool
            raise mcp_error(exc) from exc
        except (BridgeError, KeelError) as exc:
            raise ToolError(str(exc)) from exc
        return CallToolResult(
            content=[TextContent(type="text", text=_text(name, value))], structured_content=value
        )

    async def get_incident(incident_id: Text) -> CallToolResult:
        """An incident by id: title, severity, when it was opened, symptoms, affected service."""
        return await call("get_incident", incident_id=incident_id)

    async def search_traces(  # noqa: PLR0917 - a tool's parameters are its arguments
        service: Text | None = None,
        start: Time | None = None,
        end: Time | None = None,
        trace_id: Text | None = None,
        span_id: Text | None = None,
        errors_only: bool = False,
        min_duration_ms: Duration | None = None,
        limit: Limit = 50,
    ) -> CallToolResult:
        """Spans matching every given filter, oldest first: service, time range (ISO 8601
        start/end, by span start), trace id, span id, errors only, minimum duration."""
        return await call(
            "search_traces",
            service=service,
            start=start,
            end=end,
            trace_id=trace_id,
            span_id=span_id,
            errors_only=errors_only,
            min_duration_ms=min_duration_ms,
            limit=limit,
        )

    async def list_deploys(
        service: Text | None = None,
        since: Time | None = None,
        until: Time | None = None,
        deploy_id: Text | None = None,
        limit: Limit = 100,
    ) -> CallToolResult:
        """Deploys and configuration changes, oldest first, by service, time range
        (ISO 8601 since/until) or id."""
        return await call(
            "list_deploys",
            service=service,
            since=since,
            until=until,
            deploy_id=deploy_id,
            limit=limit,
        )

    for tool in (get_incident, search_traces, list_deploys):
        # Cleaned docstrings: the SDK would publish them with their indentation.
        server.add_tool(tool, description=inspect.getdoc(tool))
