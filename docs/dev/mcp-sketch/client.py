"""Official-client side of the sketch: ClientExtension with a ResultClaim for resultType "task",
custom Request classes for tasks/* (name_param -> Mcp-Name header), and raw session.send_request.

Run:  /tmp/mcpv2/bin/python /tmp/mcp-sketch/client.py URL
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import anyio
from mcp_types import CallToolResult, ElicitResult, RequestParams, Result, TextContent
from pydantic import ConfigDict

from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientRequestContext
from mcp_types import Request

TASKS = "io.modelcontextprotocol/tasks"


class TaskIdParams(RequestParams):
    task_id: str


class GetTaskRequest(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # session.send_request mirrors params.taskId into the Mcp-Name header


class CancelTaskRequest(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class CreateTaskResult(Result):
    """Flat CreateTaskResult; the claim model must pin result_type to Literal['task']."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class DetailedTask(Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    poll_interval_ms: int | None = None


async def resolve_task(created: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
    """Poll tasks/get until terminal; return the final CallToolResult (what Client.call_tool returns)."""
    while True:
        task = await ctx.session.send_request(
            GetTaskRequest(params=TaskIdParams(task_id=created.task_id)), DetailedTask
        )
        if task.status == "completed":
            return CallToolResult.model_validate(task.result)
        if task.status in ("failed", "cancelled"):
            return CallToolResult(content=[TextContent(type="text", text=f"task {task.status}: {task.error}")], is_error=True)
        await anyio.sleep((task.poll_interval_ms or 500) / 1000)


class TasksClientExtension(ClientExtension):
    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve_task)]


async def on_elicit(ctx: ClientRequestContext, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"name": "Luca"})


async def main(url: str) -> None:
    # 1) client that declares the extension: transparent task resolution via the claim
    async with Client(url, extensions=[TasksClientExtension()], elicitation_callback=on_elicit) as client:
        print("protocol", client.protocol_version)
        print("server caps.extensions", client.server_capabilities.extensions)
        print("greet ->", (await client.call_tool("greet", {"name": "Ada"})).content[0].text)
        final = await client.call_tool("slow_compute", {"seconds": 0.5, "label": "L"})
        print("slow_compute (claimed task, resolved) ->", final.content[0].text)
        # Raw: get the CreateTaskResult yourself, then poll / cancel with custom requests
        raw = await client.session.call_tool("slow_compute", {"seconds": 5, "label": "C"}, allow_claimed=True)
        print("raw claimed result ->", type(raw).__name__, raw.model_dump(by_alias=True, exclude_none=True))
        ack = await client.session.send_request(
            CancelTaskRequest(params=TaskIdParams(task_id=raw.task_id)), Result
        )
        print("cancel ack ->", ack.model_dump(by_alias=True, exclude_none=True))
        got = await client.session.send_request(GetTaskRequest(params=TaskIdParams(task_id=raw.task_id)), DetailedTask)
        print("after cancel ->", got.status)
        # MRTR round trip handled by the client's elicitation callback
        print("need_name (MRTR) ->", (await client.call_tool("need_name", {})).content[0].text)
    # 2) client that does NOT declare: optional-mode task tool answers synchronously
    async with Client(url) as client:
        r = await client.call_tool("slow_compute", {"seconds": 0.1, "label": "sync"})
        print("undeclared slow_compute ->", r.content[0].text)
        try:
            await client.session.send_request(GetTaskRequest(params=TaskIdParams(task_id="nope")), DetailedTask)
        except Exception as e:
            print("undeclared tasks/get ->", type(e).__name__, getattr(e, "code", None), e)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
