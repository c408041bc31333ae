"""The 2025-11-25 tasks protocol (spec part A) on the dual-stack server, over real HTTP.

The client is :class:`keel.mcp.client_v2025.LegacyClient` (raw JSON-RPC over the SDK's
HTTP client, since the official Python client refuses a 2025 ``CreateTaskResult``); the
server is the SDK's Streamable HTTP app under uvicorn, answering in JSON (as ``keel serve``
does) unless a test asks for SSE.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import pytest
from mcp.server import MCPServer

from keel.mcp.client_v2025 import LegacyClient, RpcError
from keel.mcp.v2025 import LIST_PAGE, RELATED_TASK
from keel.mcp.wire import TASK_CANCELLED
from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import WAIT, build_app, build_server, post, serve_http

pytestmark = pytest.mark.anyio
TASK_FIELDS = {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl"}


@pytest.mark.requirement("A1.1", "A11.4")
async def test_initialize_advertises_the_tasks_capability(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A 2025-11-25 initialize gets ``capabilities.tasks`` with cancel and tools/call;
    ``list`` only on a server that authenticates its callers."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        assert client.capabilities["tasks"] == {"cancel": {}, "requests": {"tools": {"call": {}}}}
        with pytest.raises(RpcError) as refused:
            await client.request("tasks/list")
        assert refused.value.code == -32601
    async with (
        serve_http(build_server(keel_app, auth=True)) as url,
        LegacyClient(url, token="tok-alice", timeout=WAIT) as client,
    ):
        assert client.capabilities["tasks"] == {
            "list": {},
            "cancel": {},
            "requests": {"tools": {"call": {}}},
        }


@pytest.mark.requirement("A1.2", "A1.3", "A1.4")
async def test_tools_list_marks_task_support_and_it_is_enforced(mcp_server: MCPServer[Any]) -> None:
    """Keel tools are ``optional`` or ``required``; a plain tool has no ``execution``
    (forbidden). A required tool called without ``params.task`` and a plain tool called
    with it answer -32601."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        tools = {tool["name"]: tool for tool in (await client.request("tools/list"))["tools"]}
        assert tools["quick"]["execution"] == {"taskSupport": "optional"}
        assert tools["required"]["execution"] == {"taskSupport": "required"}
        assert "execution" not in tools["declared"]
        for name, params in [("required", {}), ("declared", {"task": {}})]:
            with pytest.raises(RpcError) as refused:
                await client.request("tools/call", {"name": name, "arguments": {}, **params})
            assert refused.value.code == -32601, name
        done = await client.call_task("required", {})
        assert (await client.result(done["taskId"]))["content"][0]["text"] == "done"


@pytest.mark.requirement("A2.1", "A3.1", "A10.1")
async def test_params_task_answers_a_create_task_result_committed_first(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """``tools/call`` with ``params.task`` answers ``{"task": Task}``: every required
    field, ``ttl`` and ``pollInterval`` in ms; the task is in the store by the time the
    answer arrives."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        task = await client.call_task("slow", {}, ttl_ms=60_000)
        stored = await keel_app.store.get(task["taskId"])
        assert stored.status.value == task["status"] == "working"
        assert set(task) >= TASK_FIELDS
        assert task["ttl"] == 7 * 86_400 * 1000  # the task's own ttl (the server may override)
        assert task["pollInterval"] == 50
        kept = await client.call_task("kept", {})
        assert kept["ttl"] is None
        got = await client.get(task["taskId"])
        assert set(got) >= TASK_FIELDS
        assert got["taskId"] == task["taskId"]
        await client.cancel(task["taskId"])


@pytest.mark.requirement("A4.1", "A4.2", "A5.1", "A8.1")
async def test_tasks_result_blocks_until_the_task_ends_then_answers_the_call(
    mcp_server: MCPServer[Any],
) -> None:
    """tasks/result answers a finished task's CallToolResult with the related-task
    ``_meta``; on a running task it waits (the answer comes only once the task is
    cancelled, as that call's error); unknown ids are -32602 on get, result and cancel."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        quick = await client.call_task("quick", {"n": 21})
        result = await client.result(quick["taskId"])
        assert result["structuredContent"] == {"n": 42}
        assert result["isError"] is False
        assert result["_meta"][RELATED_TASK] == {"taskId": quick["taskId"]}
        assert "resultType" not in result

        slow = await client.call_task("slow", {})
        outcome: list[Any] = []

        async def wait_for_result() -> None:
            try:
                outcome.append(await client.result(slow["taskId"]))
            except RpcError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_result)
            running = await client.until(slow["taskId"], "working", limit=WAIT)
            while running.get("statusMessage") != "working on it":
                running = await client.get(slow["taskId"])
                await anyio.sleep(0.02)
            assert outcome == []  # the handler is running: tasks/result has not answered
            cancelled = await client.cancel(slow["taskId"])
            assert cancelled["status"] == "cancelled"
        [error] = outcome
        assert isinstance(error, RpcError)
        assert error.code == TASK_CANCELLED

        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            with pytest.raises(RpcError) as unknown:
                await client.request(method, {"taskId": "no-such-task"})
            assert unknown.value.code == -32602, method


@pytest.mark.requirement("A8.3", "A9.2")
async def test_tasks_cancel_answers_the_cancelled_task_and_refuses_a_finished_one(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A running task is cancelled before the answer leaves (the answer and the store
    say ``cancelled``); cancelling it again, or a completed task, is -32602."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        slow = await client.call_task("slow", {})
        cancelled = await client.cancel(slow["taskId"])
        assert cancelled["status"] == "cancelled"
        assert (await keel_app.store.get(slow["taskId"])).status.value == "cancelled"
        quick = await client.call_task("quick", {"n": 1})
        await client.until(quick["taskId"], "completed", limit=WAIT)
        for task_id, status in [(slow["taskId"], "cancelled"), (quick["taskId"], "completed")]:
            with pytest.raises(RpcError) as refused:
                await client.cancel(task_id)
            assert refused.value.code == -32602
            assert status in str(refused.value)
        assert (await keel_app.store.get(quick["taskId"])).status.value == "completed"


@pytest.mark.requirement("A4.3", "A4.4", "A8.2", "A11.1", "A11.2")
@pytest.mark.slow
async def test_tasks_list_pages_the_callers_own_tasks_only(tmp_path: Any) -> None:
    """Alice's tasks come in pages of LIST_PAGE with a nextCursor while more remain, and
    all of them exactly once; Bob sees only his; a bad cursor (or Alice's cursor for Bob)
    is -32602; Bob cannot get, await or cancel Alice's task."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    async with serve_http(build_server(app, auth=True)) as url:
        async with LegacyClient(url, token="tok-alice", timeout=WAIT) as alice:
            mine = [(await alice.call_task("kept", {}))["taskId"] for _ in range(LIST_PAGE + 3)]
            first = await alice.request("tasks/list")
            assert len(first["tasks"]) == LIST_PAGE
            second = await alice.request("tasks/list", {"cursor": first["nextCursor"]})
            assert "nextCursor" not in second
            listed = [task["taskId"] for task in first["tasks"] + second["tasks"]]
            assert listed == mine
            assert all(set(task) >= TASK_FIELDS for task in first["tasks"])
            with pytest.raises(RpcError) as bad:
                await alice.request("tasks/list", {"cursor": "not-a-cursor"})
            assert bad.value.code == -32602
        async with LegacyClient(url, token="tok-bob", timeout=WAIT) as bob:
            his = (await bob.call_task("kept", {}))["taskId"]
            listed_for_bob = await bob.request("tasks/list")
            assert [task["taskId"] for task in listed_for_bob["tasks"]] == [his]
            assert "nextCursor" not in listed_for_bob
            with pytest.raises(RpcError) as bad:
                await bob.request("tasks/list", {"cursor": first["nextCursor"]})
            assert bad.value.code == -32602
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                with pytest.raises(RpcError) as hidden:
                    await bob.request(method, {"taskId": mine[0]})
                assert (hidden.value.code, hidden.value.error["message"]) == (
                    -32602,
                    "Failed to retrieve task: Task not found",
                ), method
    assert (await app.store.get(mine[0])).status.value == "completed"


@pytest.mark.requirement("A6.1", "B9.4")
async def test_an_is_error_result_is_failed_on_2025_and_completed_on_2026(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """One stored truth, two wires: a tool error is stored ``completed`` with ``isError``;
    2025-11-25 shows it ``failed`` (tasks/get, tasks/list order aside) and tasks/result
    answers the isError result; a 2026-07-28 client reads the same task ``completed``
    with the result. A 2026 client can cancel a task created over 2025-11-25."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        created = await client.call_task("tool_error", {})
        shown = await client.until(created["taskId"], "failed", "completed", limit=WAIT)
        assert shown["status"] == "failed"
        assert shown["statusMessage"] == "the tool returned an error: no such incident"
        result = await client.result(created["taskId"])
        assert result["isError"] is True
        assert result["content"][0]["text"] == "no such incident"
        stored = await keel_app.store.get(created["taskId"])
        assert stored.status.value == "completed"
        modern = (await post(url, "tasks/get", {"taskId": created["taskId"]})).result
        assert modern["status"] == "completed"
        assert modern["result"]["isError"] is True

        slow = await client.call_task("slow", {})
        assert (await post(url, "tasks/cancel", {"taskId": slow["taskId"]})).result == {
            "resultType": "complete",
            "_meta": modern["_meta"],
        }
        assert (await client.get(slow["taskId"]))["status"] == "cancelled"


@pytest.mark.requirement("A4.2")
async def test_a_failed_task_answers_tasks_result_with_its_json_rpc_error(
    mcp_server: MCPServer[Any],
) -> None:
    """A task that failed with a JSON-RPC error (-32001) shows ``failed`` and tasks/result
    answers that same error."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        created = await client.call_task("protocol_error", {})
        with pytest.raises(RpcError) as failed:
            await client.result(created["taskId"])
        assert failed.value.code == -32001
        assert "upstream API refused the request" in str(failed.value)
        shown = await client.get(created["taskId"])
        assert shown["status"] == "failed"
        assert "upstream API refused the request" in shown["statusMessage"]


@pytest.mark.requirement("A1.1")
async def test_an_older_handshake_version_gets_no_tasks(mcp_server: MCPServer[Any]) -> None:
    """At 2025-06-18 (no tasks in that protocol) initialize declares no ``tasks``,
    tools/list has no ``execution``, and a task tool answers its result inline even if
    the call carries a ``task`` param."""
    async with serve_http(mcp_server) as url, httpx2.AsyncClient(timeout=WAIT) as http:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }

        async def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
            message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            answer = await http.post(url, content=json.dumps(message), headers=headers)
            headers.setdefault("mcp-session-id", answer.headers.get("mcp-session-id", ""))
            headers["MCP-Protocol-Version"] = "2025-06-18"
            body: dict[str, Any] = answer.json()
            return body

        init = await rpc(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        )
        assert init["result"]["protocolVersion"] == "2025-06-18"
        assert "tasks" not in init["result"]["capabilities"]
        await http.post(
            url,
            content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            headers=headers,
        )
        tools = (await rpc("tools/list", {}))["result"]["tools"]
        assert all("execution" not in tool for tool in tools)
        called = await rpc("tools/call", {"name": "quick", "arguments": {"n": 3}, "task": {}})
        assert called["result"]["structuredContent"] == {"n": 6}
