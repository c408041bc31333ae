"""The Bridge over MCP, in-process through the official client: the diagnosis as a task
(input required with an enum of services, a wrong answer refused by name, the cited
conclusion), and the plain tools' answers and errors."""

from __future__ import annotations

import math
from typing import Any

import anyio
import jsonschema
import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import Result

from keel.bridge import (
    SEED_DEPLOY,
    SEED_INCIDENT,
    add_tools,
    build_app,
    open_bridge,
    run_diagnosis,
)
from keel.bridge.settings import BridgeSettings
from keel.bridge.tools import MAX_DURATION_MS, MAX_LIMIT
from keel.mcp.client import Created, Detailed, GetTask, TaskIdParams, UpdateParams, UpdateTask
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.serving import app_server
from keel.store import SqliteStore
from tasks_extension.support import post, serve_http

from .conftest import DatasetFactory

pytestmark = pytest.mark.anyio
WAIT = 60.0  # seconds a flow may take (a diagnosis at the fast pace takes well under one)


@pytest.fixture
def server(dataset: DatasetFactory, tmp_path: Any) -> MCPServer[Any]:
    """The Bridge as ``keel serve`` will assemble it: the task app and the plain tools.

    Its dataset takes seconds to generate and index (once per session), so the tests that
    use it are marked ``slow``.
    """
    settings = dataset(7)
    app = build_app(settings, SqliteStore(tmp_path / "keel.db"))
    server = app_server(app, "incident-bridge")
    add_tools(server, settings)
    return server


async def get(client: Client, task_id: str) -> Detailed:
    return await client.session.send_request(
        GetTask(params=TaskIdParams(task_id=task_id)), Detailed
    )


async def until(client: Client, task_id: str, status: str) -> dict[str, Any]:
    with anyio.fail_after(WAIT):
        while True:
            task = await get(client, task_id)
            if task.status == status:
                return task.model_dump(by_alias=True)
            assert task.status not in {"failed", "cancelled"}, task
            await anyio.sleep(0.05)


def answer(task_id: str, key: str, content: dict[str, Any]) -> UpdateTask:
    return UpdateTask(
        params=UpdateParams(
            task_id=task_id, input_responses={key: {"action": "accept", "content": content}}
        )
    )


@pytest.mark.slow
async def test_seed_incident_asks_for_the_service_refuses_a_wrong_one_and_concludes(
    server: MCPServer[Any],
) -> None:
    """The seed's incident names no service: the task asks with an enum of the known
    services; "billing" is refused with -32602 naming the field and the question stays
    open; "payments" completes it with configuration change d-8812 on top, cited; each
    citation resolves through the plain tools over the same connection."""
    async with Client(server, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "diagnose_root_cause", {"incident_id": SEED_INCIDENT}, allow_claimed=True
        )
        assert isinstance(created, Created)
        waiting = await until(client, created.task_id, "input_required")
        [(key, request)] = waiting["inputRequests"].items()
        schema = request["params"]["requestedSchema"]
        assert schema["required"] == ["service"]
        assert "payments" in schema["properties"]["service"]["enum"]
        assert SEED_INCIDENT in request["params"]["message"]

        with pytest.raises(MCPError) as info:
            await client.session.send_request(
                answer(created.task_id, key, {"service": "billing"}), Result
            )
        assert info.value.code == -32602
        assert "service" in info.value.message
        assert (await get(client, created.task_id)).status == "input_required"

        await client.session.send_request(
            answer(created.task_id, key, {"service": "payments"}), Result
        )
        done = await until(client, created.task_id, "completed")
        result = done["result"]
        assert result["isError"] is False
        conclusion = result["structuredContent"]
        [tool] = [t for t in (await client.list_tools()).tools if t.name == "diagnose_root_cause"]
        assert tool.output_schema is not None
        jsonschema.validate(conclusion, tool.output_schema)
        assert conclusion["root_cause"]["deploy_id"] == SEED_DEPLOY
        assert conclusion["root_cause"]["kind"] == "config_change"
        assert SEED_DEPLOY in result["content"][0]["text"]
        for citation in conclusion["citations"]:
            found = await client.call_tool(citation["tool"], citation["arguments"])
            assert not found.is_error, citation
            content = found.structured_content
            if citation["kind"] == "query":
                assert content["total"] > 0, citation
            else:
                assert citation["ref"].split("/")[-1] in str(content), citation


@pytest.mark.slow
async def test_a_diagnosis_answered_inline_matches_the_output_schema(
    server: MCPServer[Any], dataset: DatasetFactory
) -> None:
    """A client without the tasks extension that names the service gets the diagnosis
    inline; the official client checks it against the listed outputSchema, and the
    structured content is the whole diagnosis: no key of it is left out by the type."""
    async with Client(server) as client:
        result = await client.call_tool(
            "diagnose_root_cause", {"incident_id": SEED_INCIDENT, "service": "payments"}
        )
        [tool] = [t for t in (await client.list_tools()).tools if t.name == "diagnose_root_cause"]
    assert not result.is_error
    assert tool.output_schema is not None
    jsonschema.validate(result.structured_content, tool.output_schema)
    bridge = open_bridge(dataset(7))
    assert result.structured_content == run_diagnosis(bridge, SEED_INCIDENT, "payments")


@pytest.mark.slow
async def test_unknown_incident_ends_the_task_with_a_tool_error(server: MCPServer[Any]) -> None:
    """An unknown incident id: completed with isError and a message naming it."""
    async with Client(server, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "diagnose_root_cause", {"incident_id": "INC-0000-NOPE"}, allow_claimed=True
        )
        done = await until(client, created.task_id, "completed")
        assert done["result"]["isError"] is True
        assert "unknown incident: 'INC-0000-NOPE'" in done["result"]["content"][0]["text"]


@pytest.mark.slow
async def test_unknown_service_argument_is_a_tool_error(server: MCPServer[Any]) -> None:
    """A service argument that no span names: completed with isError listing the known."""
    async with Client(server, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "diagnose_root_cause",
            {"incident_id": SEED_INCIDENT, "service": "billing"},
            allow_claimed=True,
        )
        done = await until(client, created.task_id, "completed")
        text = done["result"]["content"][0]["text"]
        assert done["result"]["isError"] is True
        assert "unknown service: 'billing'" in text
        assert "payments" in text


@pytest.mark.slow
async def test_plain_tools_answer_and_refuse_bad_input(server: MCPServer[Any]) -> None:
    """get_incident, search_traces and list_deploys answer with structured content and
    text; an unknown incident is a tool error saying so; a bad time range, a garbled time
    and a limit over the maximum are -32602 naming the argument (the official client
    raises them as MCPError)."""
    async with Client(server) as client:
        incident = await client.call_tool("get_incident", {"incident_id": SEED_INCIDENT})
        assert incident.structured_content["incident"]["service"] is None
        assert "Checkout failing" in incident.content[0].text

        missing = await client.call_tool("get_incident", {"incident_id": "INC-0000-NOPE"})
        assert missing.is_error
        assert "unknown incident: 'INC-0000-NOPE'" in missing.content[0].text

        deploys = await client.call_tool("list_deploys", {"deploy_id": SEED_DEPLOY})
        [deploy] = deploys.structured_content["deploys"]
        assert deploy["service"] == "payments"
        assert deploy["kind"] == "config"

        spans = await client.call_tool(
            "search_traces",
            {
                "service": "payments",
                "start": "2026-03-14T09:42:00Z",
                "end": "2026-03-14T09:45:00Z",
                "errors_only": True,
                "limit": 5,
            },
        )
        found = spans.structured_content
        assert 0 < len(found["spans"]) <= 5
        assert all(s["error"] and s["service"] == "payments" for s in found["spans"])

        refusals = {
            "arguments.end: bad time range: must be after start (2026-03-14T10:00:00Z), not "
            "2026-03-14T09:00:00Z": (
                "search_traces",
                {"start": "2026-03-14T10:00:00Z", "end": "2026-03-14T09:00:00Z"},
            ),
            "arguments.since: is not an ISO 8601 time: 'yesterday-ish' (e.g. ": (
                "list_deploys",
                {"since": "yesterday-ish"},
            ),
            "arguments.limit: 100000 is greater than the maximum of 1000": (
                "search_traces",
                {"limit": 100_000},
            ),
        }
        for message, (name, arguments) in refusals.items():
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, arguments)
            assert refused.value.error.code == -32602, refused.value.error
            assert refused.value.error.message.startswith(message), refused.value.error


@pytest.mark.slow
async def test_plain_tools_bound_every_argument_and_name_the_one_out_of_range(
    server: MCPServer[Any],
) -> None:
    """Times outside the index's range, NaN, infinities, huge durations and limits, wrong
    types, over long strings, a missing required argument: JSON-RPC -32602 naming the
    argument, as every tool's invalid arguments (task tools', and arguments a plain tool
    does not take), never an ``isError`` result with the SDK's pydantic text nor a bare
    "Error executing tool"; the tool does not run. The published schema carries the
    bounds. Through the official client over HTTP, and raw JSON-RPC for NaN and the
    infinities (which the SDK's client would send as null)."""
    cases = [
        ("search_traces", {"start": "9999-12-31T23:59:59Z"}, "arguments.start: must be from 1970"),
        ("search_traces", {"end": "9999-12-31T23:59:59-14:00"}, "arguments.end: must be from 1970"),
        ("search_traces", {"start": "0001-01-01T00:00:00Z"}, "arguments.start: must be from 1970"),
        ("list_deploys", {"until": "2300-01-01T00:00:00Z"}, "arguments.until: must be from 1970"),
        ("search_traces", {"start": 5}, "arguments.start: 5 is not valid under any"),
        (
            "search_traces",
            {"min_duration_ms": 1e300},
            "arguments.min_duration_ms: 1e+300 is greater than the maximum of",
        ),
        ("search_traces", {"min_duration_ms": -1}, "arguments.min_duration_ms: -1 is less than"),
        ("search_traces", {"limit": 2**70}, f"arguments.limit: {2**70} is greater than the max"),
        ("search_traces", {"limit": "ten"}, "arguments.limit: 'ten' is not of type 'integer'"),
        ("search_traces", {"errors_only": "yes"}, "arguments.errors_only: 'yes' is not of type"),
        ("list_deploys", {"limit": 0}, "arguments.limit: 0 is less than the minimum of 1"),
        ("search_traces", {"service": "x" * 300}, "arguments.service: 'xxxx"),
        ("get_incident", {"incident_id": "x" * 300}, "arguments.incident_id: 'xxxx"),
        ("get_incident", {}, "arguments.incident_id: 'incident_id' is a required property"),
    ]
    raw_only = [
        ("search_traces", {"min_duration_ms": math.nan}, "arguments.min_duration_ms: nan is not"),
        ("search_traces", {"min_duration_ms": math.inf}, "arguments.min_duration_ms: inf is not"),
        ("search_traces", {"min_duration_ms": -math.inf}, "arguments.min_duration_ms: -inf is"),
    ]
    async with serve_http(server) as url:
        tools = {t["name"]: t for t in (await post(url, "tools/list", {})).result["tools"]}
        async with Client(url) as client:
            for name, arguments, named in cases:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(name, arguments)
                error = refused.value.error
                assert error.code == -32602, (name, arguments, error)
                assert error.message.startswith(named), (name, arguments, error)
        for name, arguments, named in raw_only:
            answer = await post(url, "tools/call", {"name": name, "arguments": arguments})
            assert answer.error["code"] == -32602, (name, arguments, answer.body)
            assert answer.error["message"].startswith(named), (name, arguments, answer.body)
        for name in ("get_incident", "search_traces", "list_deploys"):
            # An argument a tool does not take: refused by name (the SDK alone drops it).
            refused = await post(url, "tools/call", {"name": name, "arguments": {"bogus": 1}})
            assert refused.error["code"] == -32602, (name, refused.body)
            assert refused.error["message"].startswith(
                f"arguments.bogus: tool {name!r} takes no argument 'bogus' (it takes: "
            ), refused.error
    duration = tools["search_traces"]["inputSchema"]["properties"]["min_duration_ms"]["anyOf"][0]
    assert (duration["minimum"], duration["maximum"]) == (0, MAX_DURATION_MS)
    limit = tools["list_deploys"]["inputSchema"]["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"]) == (1, MAX_LIMIT)


async def test_settings_refuse_a_bad_pace() -> None:
    """An unknown pace name is a configuration error naming the choices."""
    from keel.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown Bridge pace 'glacial'"):
        BridgeSettings(pace="glacial")
    assert BridgeSettings(pace="fast").pace_seconds == 0
    assert BridgeSettings(pace=2.5).pace_seconds == 2.5
    assert BridgeSettings().pace_seconds == BridgeSettings(pace="demo").pace_seconds
