"""The tasks extension on the official SDK, through the official client (in-process).

Create, input required, update, complete; cancel; inline answers for a client that did
not declare the extension; -32021 / -32602 error paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import Result

from keel.mcp.client import (
    CancelTask,
    Created,
    Detailed,
    GetTask,
    TaskIdParams,
    UpdateParams,
    UpdateTask,
)
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.runtime import Keel, TaskContext, ToolError
from keel.store import SqliteStore

pytestmark = pytest.mark.anyio
WAIT = 10.0  # seconds any one flow may take

SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}


@pytest.fixture
def server(tmp_path: Path) -> MCPServer[Any]:
    """A server whose Keel app has a diagnosis that asks for a service, a slow job, and a
    job reporting a domain error, with workers in its lifespan."""
    app = Keel(SqliteStore(tmp_path / "keel.db"))

    @app.task("diagnose", poll_interval=0.05)
    async def diagnose(ctx: TaskContext, incident_id: str) -> dict[str, str]:
        answer = await ctx.elicit("Which service is affected?", SERVICE)
        return {"incident": incident_id, "service": answer["service"]}

    @app.task("slow", poll_interval=0.05)
    async def slow(ctx: TaskContext) -> str:
        await anyio.sleep_forever()
        return "never"  # pragma: no cover

    @app.task("quick")
    async def quick(ctx: TaskContext, n: int) -> dict[str, int]:
        return {"n": n * 2}

    @app.task("refuse", task_mode="required")
    async def refuse(ctx: TaskContext) -> None:
        raise ToolError("no such incident")

    return MCPServer(
        "keel-test", extensions=[TasksExtension(app)], lifespan=keel_lifespan(app, concurrency=4)
    )


async def get(client: Client, task_id: str) -> Detailed:
    """tasks/get through the official client's session."""
    return await client.session.send_request(
        GetTask(params=TaskIdParams(task_id=task_id)), Detailed
    )


async def until(client: Client, task_id: str, status: str) -> dict[str, Any]:
    """Poll tasks/get until the task has ``status`` (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            task = await get(client, task_id)
            if task.status == status:
                return task.model_dump(by_alias=True)
            await anyio.sleep(0.02)


@pytest.mark.requirement("B2.1", "B4.5", "B5.2")
async def test_create_input_update_complete(server: MCPServer[Any]) -> None:
    """A declared client gets a task, sees input_required with an elicitation request,
    answers through tasks/update, and reads the completed tool result."""
    async with Client(server, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "diagnose", {"incident_id": "INC-7"}, allow_claimed=True
        )
        assert isinstance(created, Created)
        waiting = await until(client, created.task_id, "input_required")
        [(key, request)] = waiting["inputRequests"].items()
        assert request["method"] == "elicitation/create"
        assert request["params"]["requestedSchema"] == SERVICE
        ack = await client.session.send_request(
            UpdateTask(
                params=UpdateParams(
                    task_id=created.task_id,
                    input_responses={key: {"action": "accept", "content": {"service": "payments"}}},
                )
            ),
            Result,
        )
        assert ack.model_dump(exclude_none=True).get("task_id") is None
        done = await until(client, created.task_id, "completed")
        assert done["result"]["structuredContent"] == {"incident": "INC-7", "service": "payments"}


@pytest.mark.requirement("K5")
async def test_an_answer_violating_the_schema_is_refused_naming_the_field(
    server: MCPServer[Any],
) -> None:
    """tasks/update with content that violates the requested schema: -32602 naming the
    field, and the request stays outstanding."""
    async with Client(server, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "diagnose", {"incident_id": "INC-8"}, allow_claimed=True
        )
        waiting = await until(client, created.task_id, "input_required")
        [key] = waiting["inputRequests"]
        bad = {key: {"action": "accept", "content": {"svc": "x"}}}
        with pytest.raises(MCPError) as info:
            await client.session.send_request(
                UpdateTask(params=UpdateParams(task_id=created.task_id, input_responses=bad)),
                Result,
            )
        assert info.value.code == -32602
        assert "service" in info.value.message
        assert (await get(client, created.task_id)).status == "input_required"


@pytest.mark.requirement("B4.16")
async def test_cancel_reaches_a_running_task_and_is_idempotent(server: MCPServer[Any]) -> None:
    """tasks/cancel settles a running task to cancelled; cancelling again acks the same."""
    async with Client(server, extensions=[Tasks()]) as client:
        created = await client.session.call_tool("slow", {}, allow_claimed=True)
        await until(client, created.task_id, "working")
        for _ in range(2):
            await client.session.send_request(
                CancelTask(params=TaskIdParams(task_id=created.task_id)), Result
            )
        await until(client, created.task_id, "cancelled")


@pytest.mark.requirement("B1.6", "B1.7", "B9.1")
async def test_an_undeclared_client_gets_optional_tasks_inline_and_required_refused(
    server: MCPServer[Any],
) -> None:
    """Without the extension: an optional task answers inline; a required one is -32021;
    tasks/get is -32021."""
    async with Client(server) as client:
        result = await client.call_tool("quick", {"n": 21})
        assert result.structured_content == {"n": 42}
        with pytest.raises(MCPError) as info:
            await client.call_tool("refuse", {})
        assert info.value.code == -32021
        with pytest.raises(MCPError) as info:
            await get(client, "anything")
        assert info.value.code == -32021


@pytest.mark.requirement("B6.1")
async def test_unknown_tasks_and_invalid_arguments_are_minus_32602(
    server: MCPServer[Any],
) -> None:
    """An unknown task id and arguments that violate the schema both answer -32602."""
    async with Client(server, extensions=[Tasks()]) as client:
        with pytest.raises(MCPError) as info:
            await get(client, "no-such-task")
        assert info.value.code == -32602
        with pytest.raises(MCPError) as info:
            await client.session.call_tool("quick", {"n": "not a number"}, allow_claimed=True)
        assert info.value.code == -32602


@pytest.mark.requirement("B2.7", "B4.3")
@pytest.mark.slow
async def test_the_client_extension_resolves_a_task_to_its_result(
    server: MCPServer[Any],
) -> None:
    """With keel.mcp.client's extension, call_tool on a task tool polls the task and returns
    the final CallToolResult; a domain error comes back with isError."""
    from keel.mcp.client import TasksClientExtension

    async with Client(server, extensions=[TasksClientExtension()]) as client:
        with anyio.fail_after(WAIT):
            result = await client.call_tool("quick", {"n": 5})
            refused = await client.call_tool("refuse", {})
    assert result.structured_content == {"n": 10}
    assert refused.is_error
    assert "no such incident" in refused.content[0].text
