"""Durable creation and a shared store, with real `keel serve` processes over HTTP.

A CreateTaskResult is only sent once the task is committed: SIGKILL the server the
moment the answers arrive, start a new one, and every task id still resolves. Two
server processes on one store answer for each other's tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from acceptance.test_serve_http import Server, status, until
from keel.mcp.client import Created, accept, cancel_task, update_task
from keel.mcp.client import TasksClientExtension as Tasks

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    """Two `keel serve` processes on the same SQLite file, stopped after the test."""
    running = [Server(tmp_path), Server(tmp_path)]
    try:
        for server in running:
            server.start()
        yield running
    finally:
        for server in running:
            server.stop()


@pytest.mark.requirement("B2.4", "B8.5")
async def test_every_task_handed_out_survives_a_kill_right_after(tmp_path: Path) -> None:
    """Five tasks created back to back, the server SIGKILLed as soon as the last
    CreateTaskResult arrived: after a restart every id resolves, and cancels."""
    server = Server(tmp_path)
    server.start()
    try:
        await server.ready()
        async with Client(server.url, extensions=[Tasks()]) as client:
            created = [
                await client.session.call_tool(
                    "slow_compute", {"seconds": 60, "label": f"t{n}"}, allow_claimed=True
                )
                for n in range(5)
            ]
        server.kill()
        assert all(isinstance(c, Created) for c in created)
        server.start()
        await server.ready()
        for task in created:
            assert (await status(server.url, task.task_id))["taskId"] == task.task_id
        async with Client(server.url, extensions=[Tasks()]) as client:
            for task in created:
                await cancel_task(client, task.task_id)
        for task in created:
            await until(server.url, task.task_id, "cancelled")
    finally:
        server.stop()


@pytest.mark.requirement("K7")
async def test_two_servers_on_one_store_answer_for_each_others_tasks(
    servers: list[Server],
) -> None:
    """A task created through one server is read, answered and finished through the
    other; a task created through the second is cancelled through the first."""
    first, second = servers
    for server in servers:
        await server.ready()
    async with Client(first.url, extensions=[Tasks()]) as client:
        asking = await client.session.call_tool(
            "confirm_delete", {"filename": "shared.log"}, allow_claimed=True
        )
    waiting = await until(second.url, asking.task_id, "input_required")
    [key] = waiting["inputRequests"]
    async with Client(second.url, extensions=[Tasks()]) as client:
        await update_task(client, asking.task_id, {key: accept({"confirm": False})})
        running = await client.session.call_tool(
            "slow_compute", {"seconds": 60, "label": "shared"}, allow_claimed=True
        )
    done = await until(first.url, asking.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "kept shared.log"
    await until(first.url, running.task_id, "working")
    async with Client(first.url, extensions=[Tasks()]) as client:
        await cancel_task(client, running.task_id)
    await until(second.url, running.task_id, "cancelled")
