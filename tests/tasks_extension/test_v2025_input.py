"""Input on the 2025-11-25 wire (spec part A7): the task asks through
``elicitation/create`` while ``tasks/result`` (or a plain ``tools/call``) waits, and a
client that cannot be asked never strands a task."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp_types import ElicitRequestParams, ElicitResult

from keel.mcp.client_v2025 import LegacyClient, RpcError
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.v2025 import CANNOT_ASK, RELATED_TASK
from keel.runtime import Keel
from tasks_extension.support import WAIT, serve_http

pytestmark = pytest.mark.anyio


def answers(**by_message: dict[str, Any]) -> Any:
    """An ``on_input`` that answers each question (by its message) from ``by_message``."""

    async def on_input(message: str, schema: dict[str, Any], task_id: str | None) -> Any:
        return by_message[message]

    return on_input


@pytest.mark.requirement("A5.2", "A7.1", "A7.2")
@pytest.mark.parametrize(
    ("json_response", "stream"), [(False, "tasks/result"), (True, "GET")], ids=["sse", "json"]
)
async def test_input_is_asked_on_the_tasks_result_stream_and_the_task_goes_on(
    mcp_server: MCPServer[Any], keel_app: Keel, json_response: bool, stream: str
) -> None:
    """A task that asks two questions in turn: each comes as an ``elicitation/create``
    carrying the related-task ``_meta``, on the tasks/result SSE stream (or the GET
    stream of a server that answers in JSON); the answers reach the task, which leaves
    input_required and completes; tasks/result answers its result."""
    on_input = answers(
        **{"Which service?": {"service": "payments"}, "Restart it?": {"confirm": True}}
    )
    async with (
        serve_http(mcp_server, json_response=json_response) as url,
        LegacyClient(url, on_input=on_input, timeout=WAIT) as client,
    ):
        created = await client.call_task("sequence", {})
        waiting = await client.until(created["taskId"], "input_required", limit=WAIT)
        assert waiting["status"] == "input_required"
        result = await client.result(created["taskId"])
        assert result["structuredContent"] == {"service": "payments", "restart": True}
        assert [(via, q["message"]) for via, q in client.questions] == [
            (stream, "Which service?"),
            (stream, "Restart it?"),
        ]
        for _, question in client.questions:
            assert question["_meta"][RELATED_TASK] == {"taskId": created["taskId"]}
            assert question["requestedSchema"]["type"] == "object"
    history = await keel_app.store.history(created["taskId"])
    statuses = [event.to_status.value for event in history]
    assert statuses.count("input_required") == 2
    assert statuses[-1] == "completed"


@pytest.mark.requirement("A7.1")
async def test_a_plain_tools_call_asks_on_its_own_stream(mcp_server: MCPServer[Any]) -> None:
    """Without ``params.task`` the call waits for the task and asks its questions (both
    at once here) on the call's own stream, then answers the result inline."""
    on_input = answers(**{"Which service?": {"service": "search"}, "Proceed?": {"confirm": False}})
    async with (
        serve_http(mcp_server, json_response=False) as url,
        LegacyClient(url, on_input=on_input, timeout=WAIT) as client,
    ):
        result = await client.request("tools/call", {"name": "two", "arguments": {}})
        assert result["structuredContent"] == {"service": "search", "confirm": False}
        assert sorted(q["message"] for _, q in client.questions) == ["Proceed?", "Which service?"]
        assert {via for via, _ in client.questions} == {"tools/call"}


@pytest.mark.requirement("K20")
@pytest.mark.parametrize("augmented", [True, False], ids=["tasks-result", "plain-call"])
async def test_a_client_that_cannot_be_asked_gets_minus_32021_and_the_task_is_cancelled(
    mcp_server: MCPServer[Any], keel_app: Keel, augmented: bool
) -> None:
    """A client without the elicitation capability waiting on a task that needs input
    gets -32021 (naming the task and the capability it lacks), not -32603; the task is
    cancelled with the reason in its history, never left waiting."""
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as client:
        arguments = {"incident_id": "INC-7"}
        if augmented:
            created = await client.call_task("ask", arguments)
            with pytest.raises(RpcError) as refused:
                await client.result(created["taskId"])
        else:
            with pytest.raises(RpcError) as refused:
                await client.request("tools/call", {"name": "ask", "arguments": arguments})
        assert refused.value.code == CANNOT_ASK
        task_id = refused.value.data["taskId"]
        assert refused.value.data["requiredCapabilities"] == {"elicitation": {"form": {}}}
        shown = await client.get(task_id)
        assert shown["status"] == "cancelled"
        assert "elicitation" in shown["statusMessage"]
    [*_, last] = await keel_app.store.history(task_id)
    assert (last.from_status.value, last.to_status.value) == ("input_required", "cancelled")
    assert last.reason is not None
    assert "no form elicitation capability" in last.reason


@pytest.mark.requirement("A4.5")
async def test_tasks_result_streams_each_status_change_as_a_notification(
    mcp_server: MCPServer[Any],
) -> None:
    """While tasks/result waits on an SSE stream, each change of the task's status comes
    as ``notifications/tasks/status`` carrying the whole 2025 Task (no related-task
    ``_meta``), the terminal one last."""
    on_input = answers(
        **{"Which service?": {"service": "payments"}, "Restart it?": {"confirm": True}}
    )
    async with (
        serve_http(mcp_server, json_response=False) as url,
        LegacyClient(url, on_input=on_input, timeout=WAIT) as client,
    ):
        created = await client.call_task("sequence", {})
        await client.result(created["taskId"])
    notes = [n for n in client.notifications if n["method"] == "notifications/tasks/status"]
    statuses = [note["params"]["status"] for note in notes]
    assert statuses.count("input_required") == 2
    assert statuses[-1] == "completed"
    for note in notes:
        assert note["params"]["taskId"] == created["taskId"]
        assert {"createdAt", "lastUpdatedAt", "ttl"} <= set(note["params"])
        assert RELATED_TASK not in (note["params"].get("_meta") or {})


@pytest.mark.requirement("K20")
async def test_without_the_middleware_a_legacy_client_is_still_never_stranded(
    keel_app: Keel,
) -> None:
    """A server built without ``TasksExtension.middleware()`` cannot ask a 2025-11-25
    client: its plain call answers the same -32021 and the task is cancelled."""
    server: MCPServer[Any] = MCPServer(
        "no-middleware",
        extensions=[TasksExtension(keel_app)],
        lifespan=keel_lifespan(keel_app),
    )
    on_input = answers(**{"Which service is affected?": {"service": "payments"}})
    async with serve_http(server) as url, LegacyClient(url, on_input=on_input, timeout=WAIT) as c:
        with pytest.raises(RpcError) as refused:
            await c.request("tools/call", {"name": "ask", "arguments": {"incident_id": "INC-8"}})
        assert refused.value.code == CANNOT_ASK
        assert refused.value.data["inputRequests"] == ["service"]
        assert c.questions == []
    task = await keel_app.store.get(refused.value.data["taskId"])
    assert task.status.value == "cancelled"


@pytest.mark.requirement("A7.1", "K20")
async def test_a_task_that_asks_first_asks_on_the_call_before_it_is_created(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A tool that asks before it starts (``ask_first``) asks on the ``tools/call``
    stream itself, then answers the created task; a client that cannot be asked gets
    -32021 and no task is created."""
    on_input = answers(**{"What is your name?": {"service": "ada"}})
    async with (
        serve_http(mcp_server, json_response=False) as url,
        LegacyClient(url, on_input=on_input, timeout=WAIT) as client,
    ):
        created = await client.call_task("ask_first", {})
        assert [(via, q["message"]) for via, q in client.questions] == [
            ("tools/call", "What is your name?")
        ]
        assert RELATED_TASK not in (client.questions[0][1].get("_meta") or {})
        result = await client.result(created["taskId"])
        assert result["content"][0]["text"] == "hello ada"
    async with serve_http(mcp_server) as url, LegacyClient(url, timeout=WAIT) as plain:
        with pytest.raises(RpcError) as refused:
            await plain.call_task("ask_first", {})
        assert refused.value.code == CANNOT_ASK
        assert refused.value.data["inputRequests"] == ["user_name"]
    assert [task.task_id for task in await keel_app.store.list()] == [created["taskId"]]


@pytest.mark.requirement("A7.1")
async def test_the_official_client_in_legacy_mode_is_asked_through_its_callback(
    mcp_server: MCPServer[Any],
) -> None:
    """The official Python client at 2025-11-25 (in process, no params.task): its
    elicitation callback gets the task's question, and call_tool returns the result."""
    questions: list[str] = []

    async def on_elicit(_ctx: Any, params: ElicitRequestParams) -> ElicitResult:
        questions.append(params.message)
        return ElicitResult(action="accept", content={"service": "payments"})

    async with Client(mcp_server, mode="legacy", elicitation_callback=on_elicit) as client:
        assert client.protocol_version == "2025-11-25"
        result = await client.call_tool("ask", {"incident_id": "5"})
    assert questions == ["Which service is affected?"]
    assert result.structured_content == {"incident": "5", "service": "payments"}
