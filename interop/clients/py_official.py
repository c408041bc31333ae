"""The official Python client (``mcp`` 2.3.0's ``Client``), with Keel's tasks extension
(``--ext``) or without it: the interop matrix's Python rows. Runs in Keel's environment.

Input goes through the client's own mechanism: with the extension, Keel's
``TasksClientExtension(on_input=…)`` answers ``inputRequests`` with ``tasks/update``;
without it, the SDK's ``elicitation_callback`` answers an ``InputRequiredResult``
(2026-07-28 multi-round-trip) or an ``elicitation/create`` request.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
from common import emit, error_outcome, run_plan, text_of, wait_for_go
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, ElicitResult

from keel.mcp.client import Created, TasksClientExtension, cancel_task, get_task, resume

STEP_TIMEOUT = 30.0


class Row:
    """One connection for the row's calls; ``answer`` is what the next input gets."""

    def __init__(self, target: dict[str, Any], ext: bool) -> None:
        self.target = target
        self.ext = ext
        self.answer: dict[str, Any] | None = None

    def elicit_result(self) -> dict[str, Any]:
        if self.answer and "accept" in self.answer:
            return {"action": "accept", "content": self.answer["accept"]}
        return {"action": "decline"}

    async def on_input(self, task_id: str, requests: dict[str, Any]) -> dict[str, Any]:
        return {key: self.elicit_result() for key in requests}

    async def elicit(self, context: Any, params: Any) -> ElicitResult:
        return ElicitResult.model_validate(self.elicit_result())

    def client(self) -> Client:
        if self.target["transport"] == "http":
            server: Any = self.target["url"]
        else:
            command, *args = self.target["command"]
            server = StdioServerParameters(command=command, args=args, env=self.target.get("env"))
        if self.ext:
            tasks = TasksClientExtension(on_input=self.on_input, max_poll_interval=0.5)
            return Client(server, extensions=[tasks], read_timeout_seconds=STEP_TIMEOUT)
        return Client(server, elicitation_callback=self.elicit, read_timeout_seconds=STEP_TIMEOUT)

    async def call(self, client: Client, op: dict[str, Any]) -> dict[str, Any]:
        self.answer = op.get("answer")
        with anyio.fail_after(STEP_TIMEOUT):
            return result_outcome(await client.call_tool(op["tool"], op.get("args") or {}))

    async def cancel(self, client: Client, op: dict[str, Any]) -> dict[str, Any]:
        if not self.ext:
            return {"na": "no task handle without the extension (the call runs inline)"}
        task_id = await start_task(client, op["tool"], op.get("args") or {})
        await wait_status(client, task_id, {"working"})
        await cancel_task(client, task_id)
        final = await wait_status(client, task_id, {"completed", "failed", "cancelled"})
        return {"status": final.status, "text": str((final.model_extra or {}).get("statusMessage"))}

    async def restart(self, op: dict[str, Any]) -> dict[str, Any]:
        if not self.ext:
            # Its waiting question does survive a SIGKILL (the MRTR retry carries a
            # requestState sealed with the store's key): tests/acceptance/test_serve_http.py.
            return {"na": "no task handle to follow a running task without the extension"}
        self.answer = op.get("answer")
        ready = False
        try:  # the connection stays open while the server is killed under it
            async with self.client() as client:
                running = await start_task(client, op["running"]["tool"], op["running"]["args"])
                waiting = await start_task(client, op["waiting"]["tool"], op["waiting"]["args"])
                await wait_status(client, running, {"working"}, op["running"].get("message"))
                await wait_status(client, waiting, {"input_required"})
                emit({"event": "ready", "running": running, "waiting": waiting})
                ready = True
                await anyio.to_thread.run_sync(wait_for_go)
        except Exception:
            if not ready:
                raise
        outcomes: dict[str, Any] = {}
        async with self.client() as client:
            for name, task_id in (("running", running), ("waiting", waiting)):
                try:
                    with anyio.fail_after(STEP_TIMEOUT):
                        result = await resume(client, task_id, on_input=self.on_input)
                    outcomes[name] = result_outcome(result)
                except Exception as exc:  # reported, not raised: the other task still counts
                    outcomes[name] = error_outcome(exc)
        return outcomes


def result_outcome(result: CallToolResult) -> dict[str, Any]:
    return {"result": {"isError": bool(result.is_error), "text": text_of(result.content)}}


async def wait_status(
    client: Client, task_id: str, wanted: set[str], message: str | None = None
) -> Any:
    """Poll until the task is in one of ``wanted`` (and shows ``message``, if given)."""
    with anyio.fail_after(STEP_TIMEOUT):
        while True:
            task = await get_task(client, task_id)
            extra = task.model_extra or {}
            if task.status in wanted and message in (None, extra.get("statusMessage")):
                return task
            await anyio.sleep(0.05)


async def start_task(client: Client, tool: str, args: dict[str, Any]) -> str:
    created = await client.session.call_tool(tool, args, allow_claimed=True)
    if not isinstance(created, Created):
        raise TypeError(f"{tool} did not become a task: {created!r}"[:300])
    return created.task_id


async def main() -> None:
    await run_plan(lambda target: Row(target, "--ext" in sys.argv[2:]))


if __name__ == "__main__":
    anyio.run(main)
