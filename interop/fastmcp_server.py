"""FastMCP 4.1.4 + fastmcp_tasks serving the conformance fixture tools, for the interop
matrix's "Keel's client against FastMCP's server" row. Runs in the FastMCP environment:

    .venv-fastmcp/bin/python fastmcp_server.py --port N     (INTEROP_REDIS_URL: Docket's Redis)

In-task input uses FastMCP's guard pattern (return an ``InputRequiredResult``, read
``ctx.input_responses`` when the task runs again), as its docs require.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from datetime import timedelta
from typing import Any

import mcp_types
import uvicorn
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError

POLL = timedelta(milliseconds=100)
CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "description": "Really delete it?"}},
    "required": ["confirm"],
}

mcp = FastMCP("fastmcp-interop")


@mcp.tool()
def greet(name: str) -> str:
    """Say hello."""
    return f"Hello, {name}!"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def slow_compute(seconds: float = 1.0, label: str = "result") -> str:
    """Sleep for `seconds`, then return the label."""
    await asyncio.sleep(seconds)
    return f"computed {label} after {seconds:g}s"


@mcp.tool(task=TaskConfig(mode="required", poll_interval=POLL))
async def failing_job() -> str:
    """Fail as a tool (isError: true)."""
    await asyncio.sleep(0.2)
    raise ToolError("the job failed: simulated tool error")


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def protocol_error_job() -> str:
    """Fail with a JSON-RPC error."""
    raise MCPError(-32603, "simulated protocol error")


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def confirm_delete(ctx: Context, filename: str = "file.txt") -> Any:
    """Ask for confirmation before deleting `filename`."""
    answer = (ctx.input_responses or {}).get("confirm")
    if answer is None:
        request = mcp_types.ElicitRequest(
            params=mcp_types.ElicitRequestFormParams(
                message=f"Delete {filename}?", requested_schema=CONFIRM
            )
        )
        return mcp_types.InputRequiredResult(input_requests={"confirm": request})
    if _field(answer, "action") != "accept":
        raise ToolError("input request 'confirm' was declined by the user")
    content = _field(answer, "content") or {}
    return f"deleted {filename}" if content.get("confirm") else f"kept {filename}"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def long_step(seconds: float = 2.0) -> str:
    """Sleep `seconds`, then finish (safe to run again)."""
    await asyncio.sleep(seconds)
    return f"long_step done after {seconds:g}s"


@mcp.tool(task=TaskConfig(mode="optional", poll_interval=POLL))
async def ask(ctx: Context) -> Any:
    """Ask for a confirmation, then finish with the answer."""
    answer = (ctx.input_responses or {}).get("confirm")
    if answer is None:
        request = mcp_types.ElicitRequest(
            params=mcp_types.ElicitRequestFormParams(message="Go on?", requested_schema=CONFIRM)
        )
        return mcp_types.InputRequiredResult(input_requests={"confirm": request})
    content = _field(answer, "content") or {}
    return f"ask answered confirm={content.get('confirm')}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    url = os.environ.get("INTEROP_REDIS_URL", "redis://127.0.0.1:6379/7")
    # Docket redelivers a task whose worker died after redelivery_timeout (300 s by
    # default): two seconds here, like the short lease of Keel's interop app.
    extension = TasksExtension(
        url=url,
        name=f"keel-interop-{port}",
        concurrency=4,
        redelivery_timeout=timedelta(seconds=2),
    )
    mcp.add_extension(extension)
    uvicorn.run(mcp.http_app(path="/mcp"), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
