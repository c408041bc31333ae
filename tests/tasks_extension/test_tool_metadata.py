"""What a Keel server says about itself and its tools, over real HTTP: ``serverInfo.version``
is Keel's (2026-07-28 discovery and the legacy ``initialize``), descriptions are cleaned
docstrings, tools with typed results advertise an ``outputSchema`` (the Bridge's
``diagnose_root_cause`` too), and every result of such a tool, inline or read with
``tasks/get``, carries ``structuredContent`` valid against it (checked with jsonschema,
and by the official client, which validates inline results against the listed schema).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import httpx2
import jsonschema
import pytest
from mcp_types import CallToolResult
from typing_extensions import TypedDict  # pydantic's choice below Python 3.12

from keel.bridge import BridgeSettings, add_tools
from keel.bridge import build_app as build_bridge
from keel.bridge.results import Diagnosis
from keel.mcp.serving import app_server
from keel.runtime import Keel, TaskContext, ToolResult
from keel.store import SqliteStore
from tasks_extension.support import WAIT, client_as, poll, post, serve_http

pytestmark = pytest.mark.anyio
KEEL_VERSION = version("keel-tasks")


class Finding(TypedDict):
    service: str
    errors: int
    suspects: list[str]


class Scope(TypedDict):
    services: list[str]
    minutes: int


@dataclass(frozen=True, slots=True)
class Change:
    id: str
    at: datetime


def typed_app(tmp_path: Path) -> Keel:
    app = Keel(SqliteStore(tmp_path / "keel.db"))

    @app.task("find", poll_interval=0.05)
    async def find(ctx: TaskContext, service: str) -> Finding:
        """Find what is wrong with a service.

        The findings name the suspects,
        most likely first.
        """
        return {"service": service, "errors": 3, "suspects": ["db", "cache"]}

    @app.task("change", poll_interval=0.05)
    async def change(ctx: TaskContext) -> Change:
        """The last change."""
        return Change("d-8812", datetime(2026, 3, 14, 9, 41, tzinfo=UTC))

    @app.task("explain", poll_interval=0.05)
    async def explain(ctx: TaskContext) -> ToolResult[Finding]:
        """Explain, for people and programs."""
        return ToolResult(
            "payments: 3 errors", structured={"service": "payments", "errors": 3, "suspects": []}
        )

    @app.task("scoped", poll_interval=0.05)
    async def scoped(ctx: TaskContext, scope: Scope) -> dict[str, Any]:
        """An argument of a module-level type, named by a string annotation."""
        return {"seen": scope["services"]}

    @app.task("say", poll_interval=0.05)
    async def say(ctx: TaskContext) -> str:
        """Say something (text only)."""
        return "hello"

    @app.task("kinds", poll_interval=0.05)
    async def kinds(  # one parameter of each kind the two schemas must agree on
        ctx: TaskContext,
        plain,  # unannotated: published as a string
        json: int,  # shadows a pydantic method: the SDK aliases it
        mode: Literal["fast", "slow"] = "fast",
        tags: list[str] | None = None,
        when: datetime | None = None,
        **rest: Any,  # not in the schema: the tool's arguments are named
    ) -> str:
        """One parameter of each kind."""
        return "ok"

    return app


async def tools_of(url: str) -> dict[str, dict[str, Any]]:
    listed = await post(url, "tools/list", {})
    return {tool["name"]: tool for tool in listed.result["tools"]}


async def legacy_initialize(url: str) -> dict[str, Any]:
    """The 2025-11-25 handshake's result, as sent."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "keel-tests", "version": "0"},
        },
    }
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        response = await http.post(url, content=json.dumps(message), headers=headers)
    result: dict[str, Any] = response.json()["result"]
    return result


async def test_server_info_version_is_keel_s(tmp_path: Path) -> None:
    async with serve_http(app_server(typed_app(tmp_path), "keel-tests")) as url:
        discovered = await post(url, "server/discover", {})
        legacy = await legacy_initialize(url)
        async with client_as(url, None) as client:
            seen = client.server_info
    info = discovered.result["_meta"]["io.modelcontextprotocol/serverInfo"]
    assert info == {"name": "keel-tests", "version": KEEL_VERSION}
    assert legacy["serverInfo"] == {"name": "keel-tests", "version": KEEL_VERSION}
    assert seen is not None
    assert seen.version == KEEL_VERSION
    assert KEEL_VERSION


async def test_descriptions_and_output_schemas_are_listed(tmp_path: Path) -> None:
    """Cleaned docstrings; an outputSchema for each typed result (equal to the one Keel
    makes its results match), none for text."""
    app = typed_app(tmp_path)
    async with serve_http(app_server(app, "keel-tests")) as url:
        tools = await tools_of(url)
    assert tools["find"]["description"] == (
        "Find what is wrong with a service.\n\nThe findings name the suspects,\nmost likely first."
    )
    for name in ("find", "change", "explain"):
        output = app.tasks[name].output
        assert output is not None
        assert tools[name]["outputSchema"] == output.schema, name
        jsonschema.Draft202012Validator.check_schema(tools[name]["outputSchema"])
    assert tools["find"]["outputSchema"]["required"] == ["service", "errors", "suspects"]
    assert tools["change"]["outputSchema"]["properties"]["at"]["format"] == "date-time"
    assert "outputSchema" not in tools["say"]
    # The handler's annotations are strings (from __future__ import annotations): the
    # tool's signature carries them evaluated, or pydantic could not resolve Scope.
    scope = tools["scoped"]["inputSchema"]["$defs"]["Scope"]
    assert scope["required"] == ["services", "minutes"]
    assert tools["scoped"]["outputSchema"] == {"additionalProperties": True, "type": "object"}


@pytest.mark.slow
async def test_results_inline_and_from_tasks_get_match_the_output_schema(
    tmp_path: Path,
) -> None:
    """Inline (a client without the extension) and through tasks/get (one with it), the
    result's structuredContent validates against the listed outputSchema; text results
    carry none."""
    app = typed_app(tmp_path)
    calls = {"find": {"service": "payments"}, "change": {}, "explain": {}}
    async with serve_http(app_server(app, "keel-tests")) as url:
        schemas = {name: tool.get("outputSchema") for name, tool in (await tools_of(url)).items()}
        inline: dict[str, dict[str, Any]] = {}
        polled: dict[str, dict[str, Any]] = {}
        for name, arguments in calls.items():
            answer = await post(
                url, "tools/call", {"name": name, "arguments": arguments}, declared=False
            )
            inline[name] = answer.result
            created = await post(url, "tools/call", {"name": name, "arguments": arguments})
            assert created.result["resultType"] == "task"
            done = await poll(url, created.result["taskId"], "completed", "failed")
            polled[name] = done["result"]
        said = await post(url, "tools/call", {"name": "say", "arguments": {}}, declared=False)
        # The official client validates an inline result against the listed schema itself.
        async with client_as(url, None, declared=False) as client:
            checked = await client.call_tool("find", {"service": "ledger"})
    for name in calls:
        for result in (inline[name], polled[name]):
            assert result["isError"] is False
            jsonschema.validate(result["structuredContent"], schemas[name])
        assert inline[name]["structuredContent"] == polled[name]["structuredContent"]
    assert inline["change"]["structuredContent"] == {"id": "d-8812", "at": "2026-03-14T09:41:00Z"}
    assert json.loads(inline["find"]["content"][0]["text"]) == inline["find"]["structuredContent"]
    assert polled["explain"]["content"][0]["text"] == "payments: 3 errors"
    assert said.result["content"] == [{"type": "text", "text": "hello"}]
    assert "structuredContent" not in said.result
    assert isinstance(checked, CallToolResult)
    assert checked.structured_content == {
        "service": "ledger",
        "errors": 3,
        "suspects": ["db", "cache"],
    }


async def test_the_bridge_lists_diagnose_root_cause_with_its_output_schema(
    tmp_path: Path,
) -> None:
    """The Bridge as keel serve builds it: diagnose_root_cause's outputSchema is its
    Diagnosis type's; every tool's description is clean (no docstring indentation)."""
    settings = BridgeSettings(data_dir=tmp_path / "bridge", pace="fast")
    bridge = build_bridge(settings, SqliteStore(tmp_path / "keel.db"))
    server = app_server(bridge, "incident-bridge")
    add_tools(server, settings)
    async with serve_http(server) as url:
        tools = await tools_of(url)
        discovered = await post(url, "server/discover", {})
    info = discovered.result["_meta"]["io.modelcontextprotocol/serverInfo"]
    assert info == {"name": "incident-bridge", "version": KEEL_VERSION}
    schema = tools["diagnose_root_cause"]["outputSchema"]
    output = bridge.tasks["diagnose_root_cause"].output
    assert output is not None
    assert output.type is Diagnosis
    assert schema == output.schema
    assert {"conclusion", "confidence", "root_cause", "citations"} <= set(schema["required"])
    assert sorted(tools) == ["diagnose_root_cause", "get_incident", "list_deploys", "search_traces"]
    for name, tool in tools.items():
        assert "\n " not in tool["description"], name
    assert tools["list_deploys"]["description"] == (
        "Deploys and configuration changes, oldest first, by service, time range\n"
        "(ISO 8601 since/until) or id."
    )
