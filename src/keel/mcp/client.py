"""Client side of the tasks extension, on the official ``mcp`` client.

``TasksClientExtension`` declares ``io.modelcontextprotocol/tasks`` on every request and
claims ``CreateTaskResult`` answers: ``client.call_tool(…)`` then polls ``tasks/get``
(respecting ``pollIntervalMs``) and returns the task's final ``CallToolResult``. The
request models let callers drive a task themselves (``tasks/get``, ``tasks/update``,
``tasks/cancel`` through ``client.session.send_request``); task ids are all they need
to keep, so polling can resume after a client restart.

Still to come: answering input requests through a callback.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result, TextContent
from pydantic import ConfigDict

from keel.mcp.wire import TASKS_EXTENSION

__all__ = [
    "CancelTask",
    "Created",
    "Detailed",
    "GetTask",
    "TaskIdParams",
    "TasksClientExtension",
    "UpdateParams",
    "UpdateTask",
]


class TaskIdParams(RequestParams):
    task_id: str


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # mirrored into the Mcp-Name header


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class Created(Result):
    """A flat ``CreateTaskResult``."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class Detailed(Result):
    """A ``tasks/get`` answer (extra fields kept: result, error, inputRequests …)."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    poll_interval_ms: int | None = None


async def _resolve(created: Created, ctx: ClaimContext) -> CallToolResult:
    interval = (created.poll_interval_ms or 1000) / 1000
    while True:
        task = await ctx.session.send_request(
            GetTask(params=TaskIdParams(task_id=created.task_id)), Detailed
        )
        data = task.model_dump(by_alias=True)
        if task.status == "completed":
            return CallToolResult.model_validate(data["result"])
        if task.status in {"failed", "cancelled"}:
            error = data.get("error") or {}
            text = f"task {task.status}: {error.get('message', task.status)}"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        interval = (task.poll_interval_ms or interval * 1000) / 1000
        await anyio.sleep(interval)


class TasksClientExtension(ClientExtension):
    """Declares the tasks extension and resolves tasks by polling."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=Created, resolve=_resolve)]
