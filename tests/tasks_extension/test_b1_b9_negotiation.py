"""Negotiation and fallback (spec part B1 and B9): who gets a task, who gets a plain
result, who gets -32021, over real HTTP with hand-written requests (so every ``_meta``
key and header is under the test's control) and in-process with the official client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client
from mcp.client.extension import advertise
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.wire import TASKS_EXTENSION
from keel.runtime import Keel
from tasks_extension.support import NOT_FOUND, get, post, serve_http, update, wait_for

pytestmark = pytest.mark.anyio
LEGACY_TASKS = {"tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}}


def text_of(result: dict[str, Any]) -> str:
    [content] = result["content"]
    return str(content["text"])


@pytest.mark.requirement("B1.1", "B9.6")
async def test_discover_advertises_the_extension_and_no_legacy_tasks_capability(
    mcp_server: MCPServer[Any],
) -> None:
    """server/discover lists the extension with an empty object as its settings, and no
    legacy ``capabilities.tasks``; a 2025-11-25 initialize result, where the extension
    does not exist, has the 2025 ``tasks`` capability (the dual stack) and no extension."""
    async with serve_http(mcp_server) as url:
        discovered = await post(url, "server/discover", {})
    assert discovered.status == 200
    capabilities = discovered.result["capabilities"]
    assert capabilities["extensions"][TASKS_EXTENSION] == {}
    assert "tasks" not in capabilities
    async with Client(mcp_server, mode="legacy") as legacy:
        assert legacy.protocol_version == "2025-11-25"
        capabilities = legacy.server_capabilities.model_dump(exclude_none=True)
        assert set(capabilities["tasks"]) == {"cancel", "requests"}
        assert TASKS_EXTENSION not in (capabilities.get("extensions") or {})


@pytest.mark.requirement("B1.2", "B1.7", "B9.1")
async def test_capabilities_are_read_from_each_request_alone(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A request that declares the extension gets a task; the next request from the same
    client that does not declare it gets a plain result, and -32021 on tasks/get for the
    task it created a moment ago: nothing is inferred from earlier requests."""
    async with serve_http(mcp_server) as url:
        seen = await post(url, "tools/call", {"name": "declared", "arguments": {}})
        assert json.loads(text_of(seen.result)) == [TASKS_EXTENSION]
        created = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 2}})
        assert created.result["resultType"] == "task"

        seen = await post(url, "tools/call", {"name": "declared", "arguments": {}}, declared=False)
        assert json.loads(text_of(seen.result)) == []
        inline = await post(
            url, "tools/call", {"name": "quick", "arguments": {"n": 3}}, declared=False
        )
        assert inline.status == 200
        assert inline.result["resultType"] == "complete"
        assert inline.result["structuredContent"] == {"n": 6}
        assert "taskId" not in inline.result

        refused = await post(url, "tasks/get", {"taskId": created.result["taskId"]}, declared=False)
        assert refused.error["code"] == -32021
    # The inline answer still went through a durable task; the first call made one too.
    assert len(await keel_app.store.list()) == 2


@pytest.mark.requirement("B1.6", "B1.8", "B9.1")
async def test_a_task_only_tool_refuses_an_undeclared_client_with_minus_32021(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A tool that can only run as a task, called without the extension: HTTP 400,
    -32021 with data.requiredCapabilities naming the extension, and no task created."""
    async with serve_http(mcp_server) as url:
        refused = await post(
            url, "tools/call", {"name": "required", "arguments": {}}, declared=False
        )
    assert refused.status == 400
    assert refused.error["code"] == -32021
    assert refused.error["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXTENSION: {}}}
    assert await keel_app.store.list() == []


@pytest.mark.requirement("B1.7", "B1.8")
async def test_tasks_methods_refuse_an_undeclared_client_and_change_nothing(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """tasks/get, tasks/update and tasks/cancel without the extension: HTTP 400 and
    -32021 even for a real task id, and the update and cancel were not applied."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "I"}})
        task_id = created.result["taskId"]
        async with Client(url, extensions=[Tasks()]) as client:
            await wait_for(client, task_id, "input_required")
        answer = {"service": {"action": "accept", "content": {"service": "db"}}}
        for method, params in [
            ("tasks/get", {"taskId": task_id}),
            ("tasks/update", {"taskId": task_id, "inputResponses": answer}),
            ("tasks/cancel", {"taskId": task_id}),
        ]:
            refused = await post(url, method, params, declared=False)
            assert refused.status == 400, method
            assert refused.error["code"] == -32021, method
            extensions = refused.error["data"]["requiredCapabilities"]["extensions"]
            assert extensions == {TASKS_EXTENSION: {}}
    stored = await keel_app.store.get(task_id)
    assert stored.status.value == "input_required"
    assert stored.input_responses == {}


@pytest.mark.requirement("B9.2", "B9.6")
async def test_at_2025_11_25_a_declared_extension_enables_no_tasks(
    mcp_server: MCPServer[Any],
) -> None:
    """A legacy (initialize) client that declares the extension: the server sees the
    declaration, yet answers task tools inline (no CreateTaskResult) and does not serve
    the extension's tasks/update; tasks/get is the 2025-11-25 one (the dual stack)."""
    async with Client(mcp_server, mode="legacy", extensions=[advertise(TASKS_EXTENSION)]) as c:
        assert c.protocol_version == "2025-11-25"
        seen = await c.call_tool("declared", {})
        assert json.loads(seen.content[0].text) == [TASKS_EXTENSION]  # type: ignore[union-attr]
        result = await c.call_tool("quick", {"n": 4})
        assert result.structured_content == {"n": 8}
        with pytest.raises(MCPError) as info:
            await update(c, "any-task", {})
        assert info.value.code == -32601
        with pytest.raises(MCPError) as info:
            await get(c, "any-task")
        assert (info.value.code, info.value.message) == (-32602, NOT_FOUND)


@pytest.mark.requirement("B9.3")
async def test_at_2026_07_28_a_legacy_tasks_capability_alone_is_non_declaring(
    mcp_server: MCPServer[Any],
) -> None:
    """capabilities.tasks (the 2025-11-25 capability) without the extension: inline
    results, -32021 for a task-only tool and for tasks/get."""
    async with serve_http(mcp_server) as url:
        inline = await post(
            url, "tools/call", {"name": "quick", "arguments": {"n": 5}}, capabilities=LEGACY_TASKS
        )
        assert inline.result["resultType"] == "complete"
        assert inline.result["structuredContent"] == {"n": 10}
        refused = await post(
            url, "tools/call", {"name": "required", "arguments": {}}, capabilities=LEGACY_TASKS
        )
        assert (refused.status, refused.error["code"]) == (400, -32021)
        refused = await post(url, "tasks/get", {"taskId": "x"}, capabilities=LEGACY_TASKS)
        assert (refused.status, refused.error["code"]) == (400, -32021)


@pytest.mark.requirement("B9.5")
async def test_a_task_param_on_tools_call_is_ignored(mcp_server: MCPServer[Any]) -> None:
    """The V1 ``params.task`` opts nothing in: a plain tool answers plainly, an undeclared
    client still gets the result inline, and a declared client's task keeps the server's
    TTL, not the one asked for."""
    legacy = {"ttl": 1000}
    async with serve_http(mcp_server) as url:
        plain = await post(url, "tools/call", {"name": "declared", "arguments": {}, "task": legacy})
        assert plain.result["resultType"] == "complete"
        inline = await post(
            url,
            "tools/call",
            {"name": "quick", "arguments": {"n": 1}, "task": legacy},
            declared=False,
        )
        assert inline.result["resultType"] == "complete"
        assert inline.result["structuredContent"] == {"n": 2}
        created = await post(
            url, "tools/call", {"name": "quick", "arguments": {"n": 1}, "task": legacy}
        )
        assert created.result["resultType"] == "task"
        assert created.result["ttlMs"] == 7 * 86_400 * 1000  # the task's own ttl


@pytest.mark.requirement("B1.4")
async def test_a_task_answer_to_another_request_type_is_an_invalid_response(
    keel_app: Keel,
) -> None:
    """keel.mcp.client claims ``resultType: "task"`` on tools/call only: a server that
    answers prompts/get with a CreateTaskResult gets its answer refused by the client."""

    async def prompts_answer_with_a_task(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "prompts/get":
            return {
                "resultType": "task",
                "taskId": "t-1",
                "status": "working",
                "createdAt": "2026-07-28T00:00:00.000Z",
                "lastUpdatedAt": "2026-07-28T00:00:00.000Z",
                "ttlMs": None,
            }
        return await call_next(ctx)

    server: MCPServer[Any] = MCPServer(
        "rogue",
        extensions=[TasksExtension(keel_app)],
        lifespan=keel_lifespan(keel_app),
        middleware=[prompts_answer_with_a_task],
    )

    @server.prompt()
    def hello() -> str:
        """A prompt."""
        return "hello"

    async with Client(server, extensions=[Tasks()]) as client:
        with pytest.raises(ValidationError):
            await client.get_prompt("hello")
