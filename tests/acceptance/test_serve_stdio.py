"""`keel serve --transport stdio` with the official client's stdio transport: the server
is a real subprocess on a real SQLite store; a task asks for input, is answered through
tasks/update and completes; another is cancelled while it runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from keel.mcp.client import Created, accept, cancel_task, get_task, update_task
from keel.mcp.client import TasksClientExtension as Tasks
from keel.store import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
KEEL = Path(sys.executable).parent / "keel"
WAIT = 20.0  # seconds for any one step


async def until(client: Client, task_id: str, wanted: str) -> dict[str, Any]:
    """Poll tasks/get until the task has status ``wanted`` (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            task = await get_task(client, task_id)
            if task.status == wanted:
                return task.model_dump(by_alias=True)
            await anyio.sleep(0.05)


@pytest.mark.requirement("K6")
async def test_input_update_complete_and_cancel_over_stdio(tmp_path: Path) -> None:
    """create -> input_required -> tasks/update -> completed, and a cancel while running,
    over stdio; both outcomes are in the store file the server was given."""
    db = tmp_path / "stdio.db"
    server = StdioServerParameters(
        command=str(KEEL),
        args=["serve", "--app", "conformance", "--transport", "stdio", "--store", str(db)],
        cwd=tmp_path,
        env={**os.environ, "KEEL_STORE": ""},
    )
    async with Client(server, extensions=[Tasks()]) as client:
        assert client.protocol_version == "2026-07-28"
        created = await client.session.call_tool(
            "confirm_delete", {"filename": "stdio.log"}, allow_claimed=True
        )
        assert isinstance(created, Created)
        waiting = await until(client, created.task_id, "input_required")
        [key] = waiting["inputRequests"]
        await update_task(client, created.task_id, {key: accept({"confirm": True})})
        done = await until(client, created.task_id, "completed")
        assert done["result"]["content"][0]["text"] == "deleted stdio.log"

        running = await client.session.call_tool(
            "slow_compute", {"seconds": 60, "label": "long"}, allow_claimed=True
        )
        await until(client, running.task_id, "working")
        await cancel_task(client, running.task_id)
        await until(client, running.task_id, "cancelled")

    store = SqliteStore(db)
    try:
        stored = {task.task_id: task.status.value for task in await store.list()}
    finally:
        await store.close()
    assert stored == {created.task_id: "completed", running.task_id: "cancelled"}


async def test_the_bridge_over_stdio_diagnoses_with_a_plain_tool_beside_it(
    tmp_path: Path,
) -> None:
    """`keel serve --transport stdio` (the Bridge, sample data made on first start, fast
    pace): stdout carries only the protocol, the plain tool answers, and the diagnosis
    asks for the service, takes the answer and completes with its citations."""
    server = StdioServerParameters(
        command=str(KEEL),
        args=["serve", "--transport", "stdio", "--data-dir", str(tmp_path), "--pace", "fast"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("KEEL_")},
    )
    async with Client(server, extensions=[Tasks()]) as client:
        incident = await client.call_tool("get_incident", {"incident_id": "INC-2026-0142"})
        assert not incident.is_error
        assert incident.structured_content is not None
        assert incident.structured_content["incident"]["id"] == "INC-2026-0142"
        created = await client.session.call_tool(
            "diagnose_root_cause", {"incident_id": "INC-2026-0142"}, allow_claimed=True
        )
        assert isinstance(created, Created)
        await until(client, created.task_id, "input_required")
        await update_task(client, created.task_id, {"service": accept({"service": "payments"})})
        done = await until(client, created.task_id, "completed")
    structured = done["result"]["structuredContent"]
    assert "d-8812" in structured["conclusion"]
    assert structured["citations"]
