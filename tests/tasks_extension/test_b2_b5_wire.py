"""The task's life on the wire (spec part B2-B5, B8.4): CreateTaskResult, DetailedTask
variants, tasks/update and tasks/cancel semantics, input only through inputRequests.

Over real HTTP with hand-written requests, so the assertions are on the exact JSON the
server sends; in-process with the official client where the client side matters."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer

from keel.mcp.client import TasksClientExtension as Tasks
from keel.runtime import Keel
from tasks_extension.support import (
    SERVICE,
    get,
    poll,
    post,
    serve_http,
    update,
    wait_for,
)

pytestmark = pytest.mark.anyio
STATUSES = {"working", "input_required", "completed", "failed", "cancelled"}
TERMINAL = {"completed", "failed", "cancelled"}
ACK_KEYS = {"resultType", "_meta"}


def assert_task_fields(task: dict[str, Any]) -> None:
    """The fields every task on the wire has, with their wire types (B3.1, B3.2)."""
    assert isinstance(task["taskId"], str)
    assert task["taskId"]
    assert task["status"] in STATUSES
    for stamp in ("createdAt", "lastUpdatedAt"):
        assert task[stamp].endswith("Z")
        assert datetime.fromisoformat(task[stamp]).tzinfo is not None
    assert task["ttlMs"] is None or (type(task["ttlMs"]) is int and task["ttlMs"] >= 0)
    assert type(task["pollIntervalMs"]) is int
    assert task["pollIntervalMs"] > 0
    assert "ttl" not in task
    assert "pollInterval" not in task
    assert "requestState" not in task


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


@pytest.mark.requirement("B2.1", "B2.3", "B2.4", "B3.1", "B3.2", "B7.1")
async def test_a_create_task_result_is_flat_typed_and_readable_at_once(
    mcp_server: MCPServer[Any],
) -> None:
    """tools/call answers a flat CreateTaskResult (resultType "task", the task's fields at
    the top level), and a tasks/get sent the moment it arrives resolves. ttlMs is the
    task's ttl in integer milliseconds from createdAt, null for a task kept for good."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "1"}})
        result = created.result
        assert result["resultType"] == "task"
        assert "task" not in result
        assert_task_fields(result)
        assert result["ttlMs"] == 7 * 86_400 * 1000
        assert result["pollIntervalMs"] == 50
        at_once = await post(url, "tasks/get", {"taskId": result["taskId"]})
        assert at_once.status == 200
        assert at_once.result["taskId"] == result["taskId"]
        assert at_once.result["createdAt"] == result["createdAt"]

        kept = await post(url, "tools/call", {"name": "kept", "arguments": {}})
        assert kept.result["ttlMs"] is None
        done = await poll(url, kept.result["taskId"], "completed")
        assert done["ttlMs"] is None
        assert_task_fields(done)


@pytest.mark.requirement("B2.2", "B4.6", "B4.10", "B4.14")
async def test_only_a_create_task_result_says_task(mcp_server: MCPServer[Any]) -> None:
    """tasks/get answers resultType "complete"; the tasks/update and tasks/cancel acks are
    empty (resultType "complete" and nothing of the task); inline and plain tool results
    are "complete" too, and so is the CallToolResult inside a completed task (the
    2026-07-28 CallToolResult requires it: the TypeScript ext-tasks client refuses a task
    result without it)."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "2"}})
        task_id = created.result["taskId"]
        waiting = await poll(url, task_id, "input_required")
        assert waiting["resultType"] == "complete"

        ack = await post(
            url,
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"service": accept(service="db")}},
        )
        assert (ack.status, set(ack.result), ack.result["resultType"]) == (
            200,
            ACK_KEYS,
            "complete",
        )
        done = await poll(url, task_id, "completed")
        assert done["resultType"] == "complete"
        assert done["result"]["resultType"] == "complete"

        ack = await post(url, "tasks/cancel", {"taskId": task_id})
        assert (ack.status, set(ack.result), ack.result["resultType"]) == (
            200,
            ACK_KEYS,
            "complete",
        )

        inline = await post(
            url, "tools/call", {"name": "quick", "arguments": {"n": 1}}, declared=False
        )
        assert inline.result["resultType"] == "complete"
        plain = await post(url, "tools/call", {"name": "declared", "arguments": {}})
        assert plain.result["resultType"] == "complete"


@pytest.mark.requirement("B2.5", "B2.6")
async def test_mrtr_is_settled_before_the_task_exists(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A tool that asks first: round 1 is a synchronous input-required result and creates
    nothing; round 2 carries the answer and gets a CreateTaskResult without requestState
    or inputRequests; the task never asks the same question again."""
    async with serve_http(mcp_server) as url:
        first = await post(url, "tools/call", {"name": "ask_first", "arguments": {}})
        assert first.result["resultType"] == "input_required"
        assert set(first.result["inputRequests"]) == {"user_name"}
        assert await keel_app.store.list() == []

        second = await post(
            url,
            "tools/call",
            {
                "name": "ask_first",
                "arguments": {},
                "inputResponses": {"user_name": accept(service="Ada")},
                "requestState": first.result["requestState"],
            },
        )
        created = second.result
        assert created["resultType"] == "task"
        assert "requestState" not in created
        assert "inputRequests" not in created
        done = await poll(url, created["taskId"], "completed", "input_required")
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "hello Ada"
    assert "requestState" not in done


@pytest.mark.requirement("B4.5", "B4.12", "B3.1")
async def test_tasks_get_answers_the_variant_of_the_status(mcp_server: MCPServer[Any]) -> None:
    """input_required carries every outstanding request (elicitation/create, form mode,
    the requested schema); after a partial answer only the other one is outstanding and
    the task still waits; completed carries the result."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "two", "arguments": {}})
        task_id = created.result["taskId"]
        waiting = await poll(url, task_id, "input_required")
        assert_task_fields(waiting)
        assert set(waiting["inputRequests"]) == {"service", "confirm"}
        service = waiting["inputRequests"]["service"]
        assert service["method"] == "elicitation/create"
        assert service["params"]["mode"] == "form"
        assert service["params"]["requestedSchema"] == SERVICE
        assert "result" not in waiting
        assert "error" not in waiting

        await post(
            url,
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"service": accept(service="db")}},
        )
        partial = await post(url, "tasks/get", {"taskId": task_id})
        assert partial.result["status"] == "input_required"
        assert set(partial.result["inputRequests"]) == {"confirm"}

        await post(
            url,
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"confirm": accept(confirm=True)}},
        )
        done = await poll(url, task_id, "completed")
    assert_task_fields(done)
    assert done["result"]["structuredContent"] == {"service": "db", "confirm": True}
    assert "inputRequests" not in done
    assert "error" not in done


@pytest.mark.requirement("B3.3", "B3.4", "B6.6")
async def test_tool_errors_complete_and_json_rpc_errors_fail(mcp_server: MCPServer[Any]) -> None:
    """A tool error ends completed with isError: true in the result (not failed); a
    JSON-RPC error ends failed with error {code, message} (and no result)."""
    async with serve_http(mcp_server) as url:
        tool = await post(url, "tools/call", {"name": "tool_error", "arguments": {}})
        protocol = await post(url, "tools/call", {"name": "protocol_error", "arguments": {}})
        completed = await poll(url, tool.result["taskId"], *TERMINAL)
        failed = await poll(url, protocol.result["taskId"], *TERMINAL)
    assert completed["status"] == "completed"
    assert completed["result"]["isError"] is True
    assert "no such incident" in completed["result"]["content"][0]["text"]
    assert "error" not in completed
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": -32001, "message": "upstream API refused the request"}
    assert "result" not in failed


@pytest.mark.requirement("B6.7")
async def test_a_failed_task_has_a_status_message(mcp_server: MCPServer[Any]) -> None:
    """A task ended by a JSON-RPC error says why in its statusMessage too."""
    async with serve_http(mcp_server) as url:
        protocol = await post(url, "tools/call", {"name": "protocol_error", "arguments": {}})
        failed = await poll(url, protocol.result["taskId"], *TERMINAL)
    assert failed["status"] == "failed"
    assert failed.get("statusMessage")


@pytest.mark.requirement("B4.7", "B4.11", "B5.2")
async def test_input_keys_are_never_reused_and_stale_answers_are_ignored(
    mcp_server: MCPServer[Any],
) -> None:
    """Two questions asked one after the other get two keys; answering the first key
    again, or a key never issued, is acked and ignored; the task leaves input_required
    once the outstanding request is answered."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "sequence", "arguments": {}})
        task_id = created.result["taskId"]
        first = await poll(url, task_id, "input_required")
        [first_key] = first["inputRequests"]
        await post(
            url,
            "tasks/update",
            {"taskId": task_id, "inputResponses": {first_key: accept(service="db")}},
        )

        # The answer moved the task to working at once; it waits again for the second.
        second = await poll(url, task_id, "input_required", *TERMINAL)
        [second_key] = second["inputRequests"]
        assert second_key != first_key
        assert second["inputRequests"][second_key]["params"]["message"] == "Restart it?"

        stale = {first_key: accept(service="WRONG"), "never-issued": {"ignored": True}}
        ack = await post(url, "tasks/update", {"taskId": task_id, "inputResponses": stale})
        assert (ack.status, ack.result["resultType"]) == (200, "complete")
        still = await post(url, "tasks/get", {"taskId": task_id})
        assert still.result["status"] == "input_required"
        assert set(still.result["inputRequests"]) == {second_key}

        await post(
            url,
            "tasks/update",
            {"taskId": task_id, "inputResponses": {second_key: accept(confirm=False)}},
        )
        after = await post(url, "tasks/get", {"taskId": task_id})
        assert after.result["status"] != "input_required"
        done = await poll(url, task_id, *TERMINAL)
    assert done["result"]["structuredContent"] == {"service": "db", "restart": False}


@pytest.mark.requirement("B3.6", "B4.15")
@pytest.mark.slow
async def test_terminal_tasks_never_change_and_cancel_acks_them_the_same(
    mcp_server: MCPServer[Any],
) -> None:
    """A completed, a failed and a cancelled task: tasks/cancel answers the same empty ack
    as for a live task, tasks/update is acked, and neither changes anything."""
    async with serve_http(mcp_server) as url:
        ids = []
        for name, arguments in [("quick", {"n": 1}), ("protocol_error", {}), ("slow", {})]:
            created = await post(url, "tools/call", {"name": name, "arguments": arguments})
            ids.append(created.result["taskId"])
        await poll(url, ids[2], "working")
        await post(url, "tasks/cancel", {"taskId": ids[2]})
        before = [await poll(url, task_id, *TERMINAL) for task_id in ids]
        assert [t["status"] for t in before] == ["completed", "failed", "cancelled"]
        for task_id in ids:
            ack = await post(url, "tasks/cancel", {"taskId": task_id})
            assert (ack.status, set(ack.result)) == (200, ACK_KEYS)
            answer = {"service": accept(service="db")}
            ack = await post(url, "tasks/update", {"taskId": task_id, "inputResponses": answer})
            assert (ack.status, set(ack.result)) == (200, ACK_KEYS)
        after = [(await post(url, "tasks/get", {"taskId": task_id})).result for task_id in ids]
    assert after == before


@pytest.mark.requirement("B4.13")
async def test_notifications_cancelled_does_not_cancel_a_task(
    mcp_server: MCPServer[Any],
) -> None:
    """notifications/cancelled naming the tools/call that created a task leaves the task
    running: only tasks/cancel cancels tasks."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "slow", "arguments": {}})
        task_id = created.result["taskId"]
        await poll(url, task_id, "working")
        async with Client(url, extensions=[Tasks()]) as client:
            from mcp_types import CancelledNotification, CancelledNotificationParams

            await client.session.send_notification(
                CancelledNotification(params=CancelledNotificationParams(request_id=1))
            )
            assert (await get(client, task_id))["status"] == "working"
        after = await post(url, "tasks/get", {"taskId": task_id})
        assert after.result["status"] == "working"
        await post(url, "tasks/cancel", {"taskId": task_id})
        assert (await poll(url, task_id, *TERMINAL))["status"] == "cancelled"


@pytest.mark.requirement("B5.1", "B4.19")
async def test_input_comes_only_through_input_requests(mcp_server: MCPServer[Any]) -> None:
    """While a task waits for input and runs to completion, the server sends the client no
    elicitation or sampling request, and no progress or log notification."""
    asked: list[Any] = []
    notified: list[Any] = []

    async def elicitation(context: Any, params: Any) -> Any:  # pragma: no cover - must not run
        asked.append(params)
        raise AssertionError("the server sent an elicitation request")

    async def progress(done: float, total: float | None, message: str | None) -> None:
        notified.append(("progress", done, message))  # pragma: no cover - must not run

    async def log(params: Any) -> None:
        notified.append(("log", params))  # pragma: no cover - must not run

    async with (
        serve_http(mcp_server) as url,
        Client(
            url,
            extensions=[Tasks()],
            elicitation_callback=elicitation,
            logging_callback=log,
            log_level="debug",
        ) as client,
    ):
        created = await client.session.call_tool(
            "ask", {"incident_id": "5"}, progress_callback=progress, allow_claimed=True
        )
        waiting = await wait_for(client, created.task_id, "input_required")
        [key] = waiting["inputRequests"]
        await update(client, created.task_id, {key: accept(service="api")})
        done = await wait_for(client, created.task_id, *TERMINAL)
        resolved = await client.call_tool("quick", {"n": 3}, progress_callback=progress)
    assert done["status"] == "completed"
    assert resolved.structured_content == {"n": 6}
    assert asked == []
    assert notified == []


@pytest.mark.requirement("B8.4")
async def test_tasks_get_is_a_pure_read(mcp_server: MCPServer[Any], keel_app: Keel) -> None:
    """Reading a task twice answers the same and writes nothing: the stored task and its
    history are as they were."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "6"}})
        task_id = created.result["taskId"]
        await poll(url, task_id, "input_required")
        stored = await keel_app.store.get(task_id)
        history = await keel_app.store.history(task_id)
        reads = [(await post(url, "tasks/get", {"taskId": task_id})).result for _ in range(3)]
    assert reads[0] == reads[1] == reads[2]
    assert await keel_app.store.get(task_id) == stored
    assert await keel_app.store.history(task_id) == history
