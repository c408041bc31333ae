"""The fixture server the official MCP conformance suite calls (``keel serve --app
conformance``), built with Keel's public API only.

| tool | behaviour |
|---|---|
| ``greet`` | a plain tool, never a task |
| ``slow_compute`` | a task that sleeps ``seconds`` and returns a label; cancellable |
| ``failing_job`` | a task that ends ``completed`` with ``isError: true`` after about 1 s |
| ``protocol_error_job`` | a task that ends ``failed`` with a JSON-RPC error |
| ``confirm_delete`` | a task that asks for one confirmation, then completes |
| ``multi_input`` | a task that asks two questions at once |
| ``test_tool_with_task`` | asks for ``user_name`` synchronously first, then becomes a task |
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from keel.runtime import Keel, TaskContext, TaskFailed, ToolError

if TYPE_CHECKING:  # keel serve imports this module to read its options (--help too): the
    # MCP SDK, a second or more to import, is imported when it serves
    from keel.mcp.serving import Served, ServeSettings

__all__ = ["app", "build_server"]

app = Keel()

CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "description": "Really delete it?"}},
    "required": ["confirm"],
}
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
USER_NAME = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}


@app.task("slow_compute", poll_interval=0.1, max_attempts=1)
async def slow_compute(ctx: TaskContext, seconds: float = 1.0, label: str = "result") -> str:
    """Sleep for `seconds`, then return the label."""
    await ctx.status(f"computing {label}")
    await anyio.sleep(seconds)
    return f"computed {label} after {seconds:g}s"


@app.task("failing_job", poll_interval=0.1, max_attempts=1, task_mode="required")
async def failing_job(ctx: TaskContext) -> str:
    """Fail as a tool (isError: true) after about a second."""
    await anyio.sleep(1)
    raise ToolError("the job failed: simulated tool error")


@app.task("protocol_error_job", poll_interval=0.1, max_attempts=1)
async def protocol_error_job(ctx: TaskContext) -> str:
    """Fail with a JSON-RPC error."""
    raise TaskFailed("simulated protocol error", code=-32603)


# Tasks that only ask and answer are safe to run again: a server killed while one runs
# leaves its lease to expire (LEASE seconds), then another attempt finishes it.
LEASE = 5.0


@app.task("confirm_delete", poll_interval=0.1, lease_seconds=LEASE)
async def confirm_delete(ctx: TaskContext, filename: str = "file.txt") -> str:
    """Ask for confirmation before deleting `filename`."""
    answer = await ctx.elicit(f"Delete {filename}?", CONFIRM, key="confirm")
    return f"deleted {filename}" if answer.get("confirm") else f"kept {filename}"


@app.task("multi_input", poll_interval=0.1, lease_seconds=LEASE)
async def multi_input(ctx: TaskContext) -> str:
    """Ask two questions at once."""
    answers = await ctx.elicit_many(
        {"name": ("What is your name?", NAME), "confirm": ("Proceed?", CONFIRM)}
    )
    return f"name={answers['name'].get('name')} confirm={answers['confirm'].get('confirm')}"


@app.task(
    "test_tool_with_task",
    poll_interval=0.1,
    max_attempts=1,
    task_mode="required",
    ask_first={"user_name": ("What is your name?", USER_NAME)},
)
async def test_tool_with_task(ctx: TaskContext) -> str:
    """Ask for a name synchronously, then run as a task greeting it."""
    answer = await ctx.elicit("What is your name?", USER_NAME, key="user_name")
    return f"Hello, {answer.get('name')}! (from a task)"


def build_server(settings: ServeSettings) -> Served:
    """The conformance server over :data:`app` on ``settings.store`` (``keel serve --app
    conformance``: see :mod:`keel.mcp.serving` for this seam); it takes no options of its
    own.

    Raises:
        KeelError: the store or the request-state key cannot be used.
    """
    from keel.mcp.serving import Served

    app.use_store(settings.store)
    server = settings.server_for(app, "keel-conformance")

    @server.tool()
    def greet(name: str) -> str:
        """Say hello."""
        return f"Hello, {name}!"

    return Served(app, server, "app conformance")
