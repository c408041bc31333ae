"""Minimal SEP-2663 tasks extension sketch on mcp==2.3.0 (MCPServer + Extension, no monkeypatching).

Run:  /tmp/mcpv2/bin/python /tmp/mcp-sketch/server.py PORT
Serves Streamable HTTP at http://127.0.0.1:PORT/mcp (json_response=True so errors get HTTP 400/404 bodies).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

import anyio
import anyio.abc
from mcp_types import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    RequestParams,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp.server import MCPServer, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.extension import Extension, MethodBinding, ToolBinding
from mcp.server.mcpserver import authenticated_principal, require_client_extension
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value

TASKS = "io.modelcontextprotocol/tasks"
MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)  # {"2026-07-28"}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


# ---- wire params for the new methods (subclass RequestParams so `_meta` parses) ----
class TaskIdParams(RequestParams):
    task_id: str  # MCPModel uses camelCase aliases -> wire "taskId"


class UpdateTaskParams(TaskIdParams):
    # NOT `InputResponses`: typed values would turn a stray/unknown key like {"ignored": true} into a generic
    # -32602 before the handler runs; the spec says ignore keys that are not outstanding. Validate per key ourselves.
    input_responses: dict[str, Any]  # wire "inputResponses"


# ---- the tool the extension turns into a task ----
async def slow_compute(seconds: float = 1.0, label: str = "x") -> str:
    """Sleeps `seconds` then returns a label (task-supporting)."""
    await anyio.sleep(seconds)
    return f"computed {label}"


# Same conversion MCPServer applies (text content + structuredContent matching the advertised outputSchema)
SLOW_COMPUTE_META = Tool.from_function(slow_compute).fn_metadata


class TasksExtension(Extension):
    identifier = TASKS

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}  # in-memory "store" (sketch only)
        self.scopes: dict[str, anyio.CancelScope] = {}  # running work, kept OUT of the wire dict
        self.tg: anyio.abc.TaskGroup | None = None  # set by the server lifespan (Extension has no lifespan hook)

    # (a) capability: advertised as capabilities.extensions[TASKS] = settings()
    def settings(self) -> dict[str, Any]:
        return {}

    # contribute the task tool so it is in tools/list with its input schema
    def tools(self) -> list[ToolBinding]:
        return [ToolBinding(slow_compute)]

    # (b) new request methods, restricted to the 2026 wire (legacy versions get -32601)
    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get, protocol_versions=MODERN),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=MODERN),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, protocol_versions=MODERN),
        ]

    # ---- helpers ----
    @staticmethod
    def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
        caps = ctx.session.client_capabilities
        return ctx.protocol_version in MODERN and bool(caps and caps.extensions and TASKS in caps.extensions)

    @staticmethod
    def _check_mcp_name(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
        # The SDK only checks Mcp-Name for tools/call, prompts/get, resources/read; tasks/* is ours.
        request = ctx.request  # starlette Request on HTTP, None on stdio
        if request is None:
            return
        if decode_header_value(request.headers.get(MCP_NAME_HEADER)) != task_id:
            raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")

    def _lookup(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> dict[str, Any]:
        task = self.tasks.get(task_id)
        if task is None or task["owner"] != authenticated_principal(ctx):
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        return task

    # ---- tasks/* handlers: (ctx, typed params) -> dict | BaseModel | None ----
    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS)  # -32021 + data.requiredCapabilities, HTTP 400
        self._check_mcp_name(ctx, params.task_id)  # -32020, HTTP 400
        task = self._lookup(ctx, params.task_id)  # -32602, HTTP 400
        return {k: v for k, v in task.items() if k != "owner"}  # resultType "complete" is stamped by the runner

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS)
        self._check_mcp_name(ctx, params.task_id)
        self._lookup(ctx, params.task_id)
        return {}  # empty ack -> {"resultType": "complete", "_meta": {serverInfo}}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS)
        self._check_mcp_name(ctx, params.task_id)
        task = self._lookup(ctx, params.task_id)
        if task["status"] not in ("completed", "failed", "cancelled"):
            task["status"], task["lastUpdatedAt"] = "cancelled", _now()
            scope = self.scopes.pop(params.task_id, None)
            if scope is not None:
                scope.cancel()
        return {}

    # (c) intercept tools/call
    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name == "need_name":
            # MRTR round 1 -> InputRequiredResult; round 2 carries input_responses + (unsealed) request_state
            if not params.input_responses:
                return InputRequiredResult(
                    input_requests={
                        "user_name": {
                            "method": "elicitation/create",
                            "params": {
                                "mode": "form",
                                "message": "Name?",
                                "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
                            },
                        }
                    },
                    request_state="round-1",
                )
            answer = params.input_responses["user_name"]
            return CallToolResult(
                content=[TextContent(type="text", text=f"hi {answer.content} state={params.request_state}")]
            )
        if params.name != "slow_compute":
            return await call_next(ctx)
        if not self._declared(ctx):
            return await call_next(ctx)  # 'optional' mode: plain synchronous CallToolResult
        task_id = secrets.token_urlsafe(24)  # >= 128 bits
        now = _now()
        task: dict[str, Any] = {
            "taskId": task_id,
            "status": "working",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": 600_000,
            "pollIntervalMs": 200,
            "owner": authenticated_principal(ctx),
        }
        self.tasks[task_id] = task  # "durably created" before we answer
        assert self.tg is not None, "start the extension's task group in the server lifespan"
        self.tg.start_soon(self._run, task, dict(params.arguments or {}))
        # flat CreateTaskResult; runner does not sieve non-core resultType at 2026-07-28, stamps serverInfo _meta
        return {"resultType": "task", **{k: v for k, v in task.items() if k != "owner"}}

    async def _run(self, task: dict[str, Any], arguments: dict[str, Any]) -> None:
        with anyio.CancelScope() as scope:
            self.scopes[task["taskId"]] = scope
            try:
                value = await slow_compute(**arguments)
            except Exception as exc:  # sketch: a crash -> failed with a JSON-RPC-shaped error
                task.update(status="failed", error={"code": -32603, "message": str(exc)}, lastUpdatedAt=_now())
                return
            finally:
                self.scopes.pop(task["taskId"], None)
            if task["status"] == "working":
                result = SLOW_COMPUTE_META.convert_result(value)
                task.update(
                    status="completed",
                    result=result.model_dump(by_alias=True, mode="json", exclude_none=True),
                    lastUpdatedAt=_now(),
                )


ext = TasksExtension()


@asynccontextmanager
async def lifespan(_app: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
    async with anyio.create_task_group() as tg:
        ext.tg = tg
        yield {}
        tg.cancel_scope.cancel()


mcp = MCPServer("tasks-sketch", extensions=[ext], lifespan=lifespan)


@mcp.tool()
def greet(name: str) -> str:
    return f"Hello, {name}!"


@mcp.tool(structured_output=False)  # else the client demands structuredContent matching {"result": str}
def need_name() -> str:  # body never runs: the interceptor answers it
    return "unreachable"


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if port:
        mcp.run("streamable-http", host="127.0.0.1", port=port, json_response=True)
    else:
        mcp.run("stdio")
