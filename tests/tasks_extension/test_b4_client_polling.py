"""keel.mcp.client on the official client, over real HTTP (spec B1.3, B4): it takes
either result shape, polls no faster than pollIntervalMs until the task ends, and its
request models send the routing headers SEP-2663 asks for.

Every HTTP request the client sends is recorded (an httpx2 request hook), so the
assertions are on what went over the wire and when it was sent.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.client import accept
from keel.runtime import Keel, TaskContext
from keel.store import SqliteStore
from tasks_extension.support import (
    SERVICE,
    WAIT,
    build_app,
    build_server,
    cancel,
    get,
    serve_http,
    update,
    wait_for,
)

pytestmark = pytest.mark.anyio
POLL = 0.05  # seconds: the gated task's pollIntervalMs is 50
CLOCK_SLACK = 0.002  # seconds an event loop may wake early (its clock resolution)


class Sent:
    """Every request the client sends: (monotonic time, headers, JSON body).

    ``polled`` is set once ``enough`` tasks/get requests have gone out.
    """

    def __init__(self, enough: int = 5) -> None:
        self.requests: list[tuple[float, dict[str, str], dict[str, Any]]] = []
        self.enough = enough
        self.polled = anyio.Event()

    async def hook(self, request: httpx2.Request) -> None:
        body = json.loads(request.content) if request.content else {}
        self.requests.append((time.monotonic(), dict(request.headers), body))
        if len(self.of("tasks/get")) >= self.enough:
            self.polled.set()

    def of(self, method: str) -> list[tuple[float, dict[str, str], dict[str, Any]]]:
        return [r for r in self.requests if r[2].get("method") == method]


@asynccontextmanager
async def recording_client(
    url: str, sent: Sent, tasks: Tasks | None = None
) -> AsyncIterator[Client]:
    """The official client with ``tasks`` (default: polling only, these tests are about
    polling), every request it sends recorded in ``sent``."""
    extension = Tasks(listen=False) if tasks is None else tasks
    async with (
        httpx2.AsyncClient(event_hooks={"request": [sent.hook]}, timeout=WAIT) as http,
        Client(streamable_http_client(url, http_client=http), extensions=[extension]) as client,
    ):
        yield client


@pytest.fixture
def gate() -> anyio.Event:
    """Set by a test to let the ``gated`` task finish."""
    return anyio.Event()


@pytest.fixture
def gated_app(tmp_path: Path, gate: anyio.Event) -> Keel:
    """The test tasks, plus ``gated``: a task that finishes when the test opens the gate."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))

    @app.task("gated", poll_interval=POLL, max_attempts=1)
    async def gated(ctx: TaskContext) -> dict[str, str]:
        await gate.wait()
        return {"gate": "opened"}

    return app


@pytest.mark.requirement("B1.3", "B4.1", "B4.3")
async def test_call_tool_polls_no_faster_than_asked_until_the_task_ends(
    gated_app: Keel, gate: anyio.Event
) -> None:
    """call_tool on a task tool polls tasks/get, never sooner than pollIntervalMs after
    the previous poll, and returns the final result only once the task completed; on a
    plain tool it returns the plain result."""
    sent = Sent()
    async with serve_http(build_server(gated_app)) as url, recording_client(url, sent) as client:
        plain = await client.call_tool("declared", {})
        assert plain.content[0].text  # type: ignore[union-attr]
        result: Any = None

        async def call() -> None:
            nonlocal result
            result = await client.call_tool("gated", {})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(WAIT):
                await sent.polled.wait()
            gate.set()
    assert result is not None
    assert result.structured_content == {"gate": "opened"}
    polls = [at for at, _, _ in sent.of("tasks/get")]
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert len(gaps) >= 4
    assert min(gaps) >= POLL - CLOCK_SLACK, gaps


@pytest.mark.requirement("B4.20", "B4.13")
async def test_tasks_requests_carry_the_routing_headers(gated_app: Keel, gate: anyio.Event) -> None:
    """tasks/get, tasks/update and tasks/cancel sent with keel.mcp.client's models carry
    Mcp-Method = the method and Mcp-Name = params.taskId; cancelling never sends
    notifications/cancelled."""
    sent = Sent()
    async with serve_http(build_server(gated_app)) as url, recording_client(url, sent) as client:
        asking = await client.session.call_tool("ask", {"incident_id": "9"}, allow_claimed=True)
        waiting = await wait_for(client, asking.task_id, "input_required")
        [key] = waiting["inputRequests"]
        await update(
            client, asking.task_id, {key: {"action": "accept", "content": {"service": "db"}}}
        )
        running = await client.session.call_tool("slow", {}, allow_claimed=True)
        await get(client, running.task_id)
        await cancel(client, running.task_id)
        await wait_for(client, running.task_id, "cancelled")
        gate.set()
    seen = set()
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        for _, headers, body in sent.of(method):
            assert headers["mcp-method"] == method
            assert headers["mcp-name"] == body["params"]["taskId"]
            seen.add(method)
    assert seen == {"tasks/get", "tasks/update", "tasks/cancel"}
    assert sent.of("notifications/cancelled") == []


@pytest.mark.requirement("B4.1", "B4.2")
@pytest.mark.slow
async def test_call_tool_completes_against_a_rate_limited_server(tmp_path: Path) -> None:
    """A client that answers input at once, against a server that rate-limits polls
    (pollIntervalMs 1000, so a poll sooner than 500 ms after the last is refused), on a
    task that asks twice (still live right after the first answer): call_tool still
    returns the task's result (polls respect pollIntervalMs, or a refused poll is
    retried after retryAfterMs)."""
    app = Keel(SqliteStore(tmp_path / "keel.db"))

    @app.task("twice", poll_interval=1.0, max_attempts=1)
    async def twice(ctx: TaskContext) -> dict[str, Any]:
        first = await ctx.elicit("Which service?", SERVICE)
        second = await ctx.elicit("Which other service?", SERVICE)
        return {"first": first["service"], "second": second["service"]}

    async def answer(task_id: str, requests: dict[str, Any]) -> dict[str, Any]:
        return {key: accept({"service": f"svc-{key}"}) for key in requests}

    tasks = Tasks(on_input=answer)
    async with (
        serve_http(build_server(app, rate_limit_polls=True)) as url,
        Client(url, extensions=[tasks]) as client,
    ):
        with anyio.fail_after(WAIT):
            result = await client.call_tool("twice", {})
    assert result.structured_content == {"first": "svc-input-1", "second": "svc-input-2"}
