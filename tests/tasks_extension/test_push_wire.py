"""Push notifications on the wire (the notification section of the tasks extension):
``subscriptions/listen`` with ``notifications.taskIds`` and ``notifications/tasks``.

Raw HTTP and SSE against a real server, so the assertions are on the exact frames the
server writes: the acknowledgement first, only the caller's own tasks confirmed, each
change of a listened task as the full detailed task ``tasks/get`` answers, the
subscription id on every frame, ``-32021`` for a client without the extension, and the
SDK's core events still delivered through Keel's bus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.server import MCPServer
from mcp.server.mcpserver import Context

from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import (
    Listen,
    build_app,
    build_server,
    listen,
    poll,
    post,
    serve_http,
)

pytestmark = pytest.mark.anyio
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ALICE, BOB = "tok-alice", "tok-bob"
TERMINAL = {"completed", "failed", "cancelled"}


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


def task_of(frame: dict[str, Any]) -> dict[str, Any]:
    """A ``notifications/tasks`` frame's task, as ``tasks/get`` would answer it."""
    assert frame["method"] == "notifications/tasks", frame
    params = dict(frame["params"])
    params.pop("_meta")
    return {"resultType": "complete", **params}


def answered(result: dict[str, Any]) -> dict[str, Any]:
    """A tasks/get result without its ``_meta`` (the server's info, not the task's)."""
    return {k: v for k, v in result.items() if k != "_meta"}


async def until(stream: Listen, task_id: str, *statuses: str) -> dict[str, Any]:
    """Read the stream's frames up to the task's first one in ``statuses``; every frame
    on the way must be a notifications/tasks of that task (nothing else is sent)."""
    while True:
        frame = await stream.notification()
        task = task_of(frame)
        assert task["taskId"] == task_id
        if task["status"] in statuses:
            return frame


@pytest.mark.requirement("B4.17", "B4.22", "B4.23", "B4.24", "B4.25", "B4.19")
async def test_a_listener_gets_each_change_of_its_own_tasks_only(tmp_path: Path) -> None:
    """Alice listens to her task, Bob's and an unknown id: the first frame is the ack,
    confirming her task alone; then her task's current state (input_required, with its
    input requests), each change after her answer, and its terminal state with the
    result, every one equal to what tasks/get answers then and stamped with the listen's
    id. Bob's task finishing meanwhile sends her nothing, and nothing but task frames
    (no progress, no log message) comes."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    async with serve_http(build_server(app, auth=True)) as url:
        mine = await post(
            url, "tools/call", {"name": "ask", "arguments": {"incident_id": "1"}}, token=ALICE
        )
        theirs = await post(
            url, "tools/call", {"name": "ask", "arguments": {"incident_id": "2"}}, token=BOB
        )
        mine_id, theirs_id = mine.result["taskId"], theirs.result["taskId"]
        waiting = await poll(url, mine_id, "input_required", token=ALICE)
        await poll(url, theirs_id, "input_required", token=BOB)
        requested = [mine_id, theirs_id, "no-such-task"]
        async with listen(url, {"taskIds": requested}, request_id=7, token=ALICE) as stream:
            assert (stream.status, stream.content_type) == (200, "text/event-stream")
            ack = await stream.notification()
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"]["notifications"] == {"taskIds": [mine_id]}
            assert ack["params"]["_meta"] == {SUBSCRIPTION_ID: 7}

            first = await stream.notification()
            assert first["params"]["_meta"] == {SUBSCRIPTION_ID: 7}
            assert task_of(first) == answered(waiting)
            assert set(task_of(first)["inputRequests"]) == {"service"}

            answer = {"taskId": theirs_id, "inputResponses": {"service": accept(service="x")}}
            await post(url, "tasks/update", answer, token=BOB)
            await poll(url, theirs_id, "completed", token=BOB)
            answer = {"taskId": mine_id, "inputResponses": {"service": accept(service="db")}}
            await post(url, "tasks/update", answer, token=ALICE)
            last = await until(stream, mine_id, *TERMINAL)
            assert last["params"]["_meta"] == {SUBSCRIPTION_ID: 7}
            done = await post(url, "tasks/get", {"taskId": mine_id}, token=ALICE)
            assert task_of(last) == answered(done.result)
            assert done.result["status"] == "completed"
            assert done.result["result"]["structuredContent"] == {"incident": "1", "service": "db"}


@pytest.mark.requirement("B4.22", "B4.24")
async def test_status_messages_and_cancellation_are_pushed(mcp_server: MCPServer[Any]) -> None:
    """A running task's statusMessage arrives as a notification (the task as tasks/get
    shows it), and so does its cancellation; after the terminal state of its only task
    the stream ends gracefully: its last frame is the listen's result."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "slow", "arguments": {}})
        task_id = created.result["taskId"]
        async with listen(url, {"taskIds": [task_id]}, request_id="s-1") as stream:
            ack = await stream.notification()
            assert ack["params"]["notifications"]["taskIds"] == [task_id]
            frame = await stream.notification()
            while task_of(frame).get("statusMessage") != "working on it":
                frame = await stream.notification()
            assert task_of(frame)["status"] == "working"
            now = await post(url, "tasks/get", {"taskId": task_id})
            assert task_of(frame) == answered(now.result)

            await post(url, "tasks/cancel", {"taskId": task_id})
            last = await until(stream, task_id, *TERMINAL)
            assert last["params"]["_meta"] == {SUBSCRIPTION_ID: "s-1"}
            assert task_of(last)["status"] == "cancelled"
            now = await post(url, "tasks/get", {"taskId": task_id})
            assert task_of(last) == answered(now.result)
            end = await stream.frame()
            assert end is not None
            assert (end["id"], end["result"]["_meta"]) == ("s-1", {SUBSCRIPTION_ID: "s-1"})
            assert await stream.frame() is None


@pytest.mark.requirement("B4.22", "B4.25")
async def test_a_finished_task_is_sent_once_at_once(mcp_server: MCPServer[Any]) -> None:
    """Listening to a task that already finished (a client that reconnects) gets the ack
    and then its terminal state with the result, at once: a terminal state is never
    missed however late the listen comes."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 4}})
        task_id = created.result["taskId"]
        done = await poll(url, task_id, "completed")
        async with listen(url, {"taskIds": [task_id, task_id]}) as stream:
            ack = await stream.notification()
            assert ack["params"]["notifications"]["taskIds"] == [task_id]
            assert task_of(await stream.notification()) == answered(done)
            assert done["result"]["structuredContent"] == {"n": 8}


@pytest.mark.requirement("B4.18")
async def test_a_client_without_the_extension_asking_for_tasks_gets_32021(
    mcp_server: MCPServer[Any],
) -> None:
    """A listen naming task ids from a client that did not declare the extension is
    refused with -32021 (HTTP 400) before any stream opens, naming the extension; the
    same client listening for core events only is served as before."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "slow", "arguments": {}})
        task_id = created.result["taskId"]
        async with listen(url, {"taskIds": [task_id]}, declared=False) as stream:
            assert stream.status == 400
            body = await stream.body()
        assert body["error"]["code"] == -32021
        assert "io.modelcontextprotocol/tasks" in body["error"]["message"]
        async with listen(url, {"toolsListChanged": True}, declared=False) as stream:
            ack = await stream.notification()
            assert ack["params"]["notifications"] == {"toolsListChanged": True}


async def test_malformed_task_ids_are_refused_naming_the_field(
    mcp_server: MCPServer[Any],
) -> None:
    """taskIds that is not an array of strings answers -32602 naming it."""
    async with serve_http(mcp_server) as url, listen(url, {"taskIds": "not-a-list"}) as stream:
        body = await stream.body()
    assert body["error"]["code"] == -32602
    assert "taskIds" in body["error"]["message"]


@pytest.mark.requirement("B4.26", "B4.24")
async def test_core_events_still_reach_listeners_through_keels_bus(
    mcp_server: MCPServer[Any],
) -> None:
    """The SDK's core events (here tools/list_changed, published by a tool through
    ``ctx.notify_tools_changed``) reach a stream that asked for them, stamped with its
    id, next to task notifications on the same stream; a stream that asked only for a
    task gets no core event."""

    @mcp_server.tool()
    async def touch(ctx: Context) -> str:
        """Publish a tools list change."""
        await ctx.notify_tools_changed()
        return "ok"

    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "slow", "arguments": {}})
        task_id = created.result["taskId"]
        await poll(url, task_id, "working")
        both = {"toolsListChanged": True, "taskIds": [task_id]}
        async with (
            listen(url, both, request_id="both") as stream,
            listen(url, {"taskIds": [task_id]}, request_id="tasks-only") as only,
        ):
            ack = await stream.notification()
            assert ack["params"]["notifications"] == both
            assert task_of(await stream.notification())["taskId"] == task_id
            assert (await only.notification())["method"].endswith("acknowledged")
            await post(url, "tools/call", {"name": "touch", "arguments": {}})
            frame = await stream.notification()
            while frame["method"] == "notifications/tasks":
                frame = await stream.notification()
            assert frame["method"] == "notifications/tools/list_changed"
            assert frame["params"]["_meta"] == {SUBSCRIPTION_ID: "both"}

            await post(url, "tasks/cancel", {"taskId": task_id})
            await until(only, task_id, *TERMINAL)  # no tools/list_changed on the way


@pytest.mark.requirement("B4.22")
async def test_a_write_that_changes_nothing_a_client_sees_sends_nothing(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A write that moves only lastUpdatedAt (as a lease renewal does; here the same
    statusMessage set again) sends no notification: the next frame is the next change
    a client can see, carrying the current lastUpdatedAt."""
    task = await keel_app.store.create(arguments={})
    async with serve_http(mcp_server) as url:
        await keel_app.store.set_status_message(task.task_id, "step 1")
        async with listen(url, {"taskIds": [task.task_id]}) as stream:
            await stream.notification()  # the ack
            assert task_of(await stream.notification())["statusMessage"] == "step 1"
            await keel_app.store.set_status_message(task.task_id, "step 1")
            await keel_app.store.set_status_message(task.task_id, "step 2")
            frame = task_of(await stream.notification())
            assert frame["statusMessage"] == "step 2"
            now = await post(url, "tasks/get", {"taskId": task.task_id})
            assert frame == answered(now.result)
