"""FastMCP 4.1.4's ``Client`` with ``fastmcp_tasks`` imported (its tasks client): an
interop matrix row. Runs in the separate FastMCP environment (``requirements.txt``).

Input goes through FastMCP's own mechanism, the ``elicitation_handler``: its task
resolver answers a task's ``inputRequests`` with it (``tasks/update``), and the SDK
answers a multi-round-trip ``InputRequiredResult`` with it. ``call_tool_task`` gives
the handle used to cancel a task and to follow one across a restart.
"""

from __future__ import annotations

from typing import Any

import anyio
import fastmcp_tasks  # noqa: F401 - registers the tasks client extension on every Client
from common import emit, error_outcome, run_plan, text_of, wait_for_go
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp.client.transports import StdioTransport
from fastmcp_tasks.client import ToolTask, call_tool_task

STEP_TIMEOUT = 30.0


class Row:
    """One connection for the row's calls; ``answer`` is what the next input gets."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target
        self.answer: dict[str, Any] | None = None

    async def on_elicit(self, message: str, response_type: Any, params: Any, context: Any) -> Any:
        if self.answer and "accept" in self.answer:
            return ElicitResult(action="accept", content=self.answer["accept"])
        return ElicitResult(action="decline")

    def client(self) -> Client:
        if self.target["transport"] == "http":
            transport: Any = self.target["url"]
        else:
            command, *args = self.target["command"]
            transport = StdioTransport(command=command, args=args, env=self.target.get("env"))
        return Client(transport, elicitation_handler=self.on_elicit, timeout=STEP_TIMEOUT)

    async def call(self, client: Client, op: dict[str, Any]) -> dict[str, Any]:
        self.answer = op.get("answer")
        with anyio.fail_after(STEP_TIMEOUT):
            result = await client.call_tool(op["tool"], op.get("args") or {}, raise_on_error=False)
            return result_outcome(result)

    async def cancel(self, client: Client, op: dict[str, Any]) -> dict[str, Any]:
        task = await call_tool_task(client, op["tool"], op.get("args") or {})
        await wait_state(task, "working")
        await task.cancel()
        with anyio.fail_after(STEP_TIMEOUT):
            final = await task.wait()
        return {"status": final.status, "text": str(final.status_message)}

    async def restart(self, op: dict[str, Any]) -> dict[str, Any]:
        self.answer = op.get("answer")
        ready = False
        try:  # the connection stays open while the server is killed under it
            async with self.client() as client:
                running = await call_tool_task(client, op["running"]["tool"], op["running"]["args"])
                waiting = await call_tool_task(client, op["waiting"]["tool"], op["waiting"]["args"])
                await wait_state(running, "working", op["running"].get("message"))
                await wait_state(waiting, "input_required")
                emit({"event": "ready", "running": running.task_id, "waiting": waiting.task_id})
                ready = True
                await anyio.to_thread.run_sync(wait_for_go)
        except Exception:
            if not ready:
                raise
        outcomes: dict[str, Any] = {}
        async with self.client() as client:
            for name, old, tool in (
                ("running", running, op["running"]["tool"]),
                ("waiting", waiting, op["waiting"]["tool"]),
            ):
                # A new handle on the new connection, from what the first one kept.
                task = ToolTask(client, tool, old.create_result, raise_on_error=False)
                try:
                    with anyio.fail_after(STEP_TIMEOUT):
                        outcomes[name] = result_outcome(await task.result())
                except Exception as exc:
                    outcomes[name] = error_outcome(exc)
        return outcomes


def result_outcome(result: Any) -> dict[str, Any]:
    return {"result": {"isError": bool(result.is_error), "text": text_of(result.content)}}


async def wait_state(task: ToolTask, state: str, message: str | None = None) -> None:
    with anyio.fail_after(STEP_TIMEOUT):
        while True:
            current = await task.status()
            if current.status == state and message in (None, current.status_message):
                return
            await anyio.sleep(0.05)


async def main() -> None:
    await run_plan(Row)


if __name__ == "__main__":
    anyio.run(main)
