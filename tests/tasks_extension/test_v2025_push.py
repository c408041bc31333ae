"""2025-11-25 clients get ``notifications/tasks/status`` for the tasks they asked about,
on their session's GET stream, as the task changes: no ``tasks/result`` has to wait.

The client is :class:`keel.mcp.client_v2025.LegacyClient` over real HTTP (it keeps the
session's GET stream open when it can answer questions, and records every notification).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp.server import MCPServer

from keel.mcp.client_v2025 import LegacyClient
from keel.runtime import Keel
from tasks_extension.support import WAIT, serve_http

pytestmark = pytest.mark.anyio


async def pushed(client: LegacyClient, task_id: str, status: str) -> dict[str, Any]:
    """The first notifications/tasks/status of the task with ``status`` (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            for note in client.notifications:
                params = note.get("params") or {}
                if (
                    note["method"] == "notifications/tasks/status"
                    and params.get("taskId") == task_id
                    and params.get("status") == status
                ):
                    return params
            await anyio.sleep(0.01)  # the GET stream's reader appends to a list


async def no_input(message: str, schema: dict[str, Any], task_id: str | None) -> None:
    return None  # pragma: no cover - nothing is asked here


@pytest.mark.requirement("A4.6")
async def test_a_session_that_polled_a_task_is_pushed_its_changes(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """A 2025-11-25 session asks tasks/get once, then only waits: the task's next
    statusMessage and its cancellation reach it as notifications/tasks/status (the full
    2025 Task, equal to what tasks/get answers then) on the GET stream."""
    task = await keel_app.store.create(arguments={})
    async with (
        serve_http(mcp_server) as url,
        LegacyClient(url, on_input=no_input, timeout=WAIT) as client,
    ):
        assert (await client.get(task.task_id))["status"] == "working"
        await keel_app.store.set_status_message(task.task_id, "step 1")
        step = await pushed(client, task.task_id, "working")
        assert step["statusMessage"] == "step 1"
        await keel_app.store.cancel(task.task_id, reason="test")
        cancelled = await pushed(client, task.task_id, "cancelled")
        now = await client.get(task.task_id)
    assert {k: v for k, v in cancelled.items() if k != "_meta"} == {
        k: v for k, v in now.items() if k != "_meta"
    }
    assert {"createdAt", "lastUpdatedAt", "ttl", "pollInterval"} <= set(cancelled)
    statuses = [
        n["params"]["status"]
        for n in client.notifications
        if n["method"] == "notifications/tasks/status"
    ]
    assert statuses == ["working", "cancelled"]
