"""keel serve over real HTTP with the official client, the server SIGKILLed and restarted
between the steps of a task's life: the task id keeps working."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult, Result

from keel.mcp.client import (
    CancelTask,
    Created,
    Detailed,
    GetTask,
    TaskIdParams,
    UpdateParams,
    UpdateTask,
)
from keel.mcp.client import TasksClientExtension as Tasks
from keel.store import SqliteStore
from keel_serve import KeelServe

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
WAIT = 20.0  # seconds for any one step


class Server(KeelServe):
    """``keel serve --app conformance`` on ``folder/keel.db`` as a real process, killed
    and restarted at will (its output in ``folder/keel-serve-N.log``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        # Two servers may share a folder (and a store): each its own log.
        log = folder / f"keel-serve-{len(list(folder.glob('keel-serve-*.log'))) + 1}.log"
        log.touch()
        super().__init__(
            ["--app", "conformance", "--store", str(folder / "keel.db")],
            cwd=folder,
            env={**os.environ, "KEEL_STORE": ""},
            log=log,
        )


def running_server(folder: Path) -> Iterator[Server]:
    """A keel serve started in ``folder``, stopped when the generator closes (the body
    of the ``server`` fixtures)."""
    running = Server(folder)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A running keel serve, stopped at the end of the test."""
    yield from running_server(tmp_path)


async def test_a_taken_port_is_left_for_another(tmp_path: Path) -> None:
    """Another process listens on the port picked for keel serve before it can bind it
    (the race of a port picked free and released): keel serve starts again on another
    port, and the other listener is never taken for it."""
    server = Server(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server.port = taken.getsockname()[1]
        server.start()
        try:
            await server.ready()
            assert server.port != taken.getsockname()[1]
            assert server.alive
            assert "address already in use" in server.output().lower()
            async with Client(server.url) as client:
                assert "confirm_delete" in {t.name for t in (await client.list_tools()).tools}
        finally:
            server.stop()


async def restart(server: Server) -> None:
    """The routine deploy: SIGKILL the server, start a new process on the same store."""
    server.kill()
    server.start()
    await server.ready()


async def status(url: str, task_id: str) -> dict[str, Any]:
    """tasks/get from a fresh client (a client may restart too)."""
    async with Client(url, extensions=[Tasks()]) as client:
        task = await client.session.send_request(
            GetTask(params=TaskIdParams(task_id=task_id)), Detailed
        )
        return task.model_dump(by_alias=True)


async def until(url: str, task_id: str, wanted: str) -> dict[str, Any]:
    """Poll until the task has status ``wanted`` (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            task = await status(url, task_id)
            if task["status"] == wanted:
                return task
            await anyio.sleep(0.1)


@pytest.mark.requirement("B4.4", "B8.5")
async def test_a_task_survives_server_kills_between_every_step(server: Server) -> None:
    """create -> input_required -> (kill) -> update -> (kill) -> completed, one task id."""
    await server.ready()
    async with Client(server.url, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "confirm_delete", {"filename": "incident.log"}, allow_claimed=True
        )
    assert isinstance(created, Created)
    waiting = await until(server.url, created.task_id, "input_required")
    [key] = waiting["inputRequests"]

    await restart(server)
    assert (await status(server.url, created.task_id))["status"] == "input_required"
    async with Client(server.url, extensions=[Tasks()]) as client:
        answer = {key: {"action": "accept", "content": {"confirm": True}}}
        await client.session.send_request(
            UpdateTask(params=UpdateParams(task_id=created.task_id, input_responses=answer)),
            Result,
        )

    await restart(server)
    done = await until(server.url, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "deleted incident.log"


@pytest.mark.requirement("B4.16")
async def test_cancel_while_running_over_http(server: Server) -> None:
    """tasks/cancel over HTTP settles a running task to cancelled."""
    await server.ready()
    async with Client(server.url, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "slow_compute", {"seconds": 60, "label": "long"}, allow_claimed=True
        )
        await until(server.url, created.task_id, "working")
        await client.session.send_request(
            CancelTask(params=TaskIdParams(task_id=created.task_id)), Result
        )
    await until(server.url, created.task_id, "cancelled")


async def test_a_graceful_stop_gives_running_tasks_back_at_once(server: Server) -> None:
    """A deploy that stops keel serve with SIGTERM: the running task's lease is released
    (not left to expire, not counted as a failed attempt), and the next server process
    runs it again at once."""
    await server.ready()
    async with Client(server.url, extensions=[Tasks()]) as client:
        created = await client.session.call_tool(
            "slow_compute", {"seconds": 2, "label": "deploy"}, allow_claimed=True
        )
    assert isinstance(created, Created)
    db = SqliteStore(server.folder / "keel.db")
    try:
        with anyio.fail_after(WAIT):
            while True:
                if (await db.get(created.task_id)).lease_owner is not None:
                    break
                await anyio.sleep(0.02)
        assert server.process is not None
        server.process.terminate()
        # uvicorn shuts down gracefully, then re-raises SIGTERM to exit with it.
        assert server.process.wait(timeout=WAIT) in {0, -signal.SIGTERM}
        released = await db.get(created.task_id)
        assert released.status.value == "working"
        assert released.lease_owner is None
        assert released.attempt == 1
        history = await db.history(created.task_id)
        assert any("shutting down" in e.reason for e in history)
    finally:
        await db.close()
    server.start()
    await server.ready()
    done = await until(server.url, created.task_id, "completed")
    assert done["result"]["content"][0]["text"] == "computed deploy after 2s"


async def test_a_plain_client_answers_across_a_sigkill(server: Server) -> None:
    """A client without the tasks extension is asked (an input-required result); keel
    serve is SIGKILLed and restarted; the client's retry with the same requestState is
    accepted (its sealing key is kept beside the store) and completes that same task."""
    await server.ready()
    async with Client(server.url) as client:
        asked = await client.session.call_tool(
            "confirm_delete", {"filename": "a.txt"}, allow_input_required=True
        )
    assert isinstance(asked, InputRequiredResult)
    assert asked.input_requests is not None
    assert list(asked.input_requests) == ["confirm"]
    await restart(server)
    async with Client(server.url) as client:
        done = await client.session.call_tool(
            "confirm_delete",
            {"filename": "a.txt"},
            input_responses={"confirm": ElicitResult(action="accept", content={"confirm": True})},
            request_state=asked.request_state,
        )
    assert isinstance(done, CallToolResult)
    assert done.content[0].text == "deleted a.txt"  # type: ignore[union-attr]
    tasks = await SqliteStore(server.folder / "keel.db").list()
    assert [t.status.value for t in tasks] == ["completed"]  # the same task, no second one
