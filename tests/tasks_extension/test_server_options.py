"""TasksExtension options: fast tasks answered inline (inline_within) and poll rate
limiting (rate_limit_polls), through the official client in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from keel.errors import ConfigurationError
from keel.mcp.client import Created, Detailed, get_task
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.server import PollLimiter, TasksExtension, keel_lifespan
from keel.mcp.wire import RATE_LIMITED
from keel.runtime import Keel, TaskContext, TaskFailed

pytestmark = pytest.mark.anyio
WAIT = 10.0


def build(tmp_path: Path, *, rate_limit: bool = False) -> tuple[Keel, MCPServer[Any]]:
    app = Keel(tmp_path / "keel.db")
    gate = anyio.Event()

    @app.task("double", inline_within=1.0)
    async def double(ctx: TaskContext, n: int) -> dict[str, int]:
        return {"n": n * 2}

    @app.task("broken", inline_within=1.0, max_attempts=1)
    async def broken(ctx: TaskContext) -> None:
        raise TaskFailed("it broke", code=-32603)

    @app.task("gated", inline_within=0.05, poll_interval=1.0)
    async def gated(ctx: TaskContext) -> str:
        await gate.wait()
        return "opened"

    server = MCPServer(
        "t",
        extensions=[TasksExtension(app, rate_limit_polls=rate_limit)],
        lifespan=keel_lifespan(app),
    )
    server.gate = gate  # type: ignore[attr-defined]
    return app, server


async def test_a_task_done_within_the_window_is_answered_inline(tmp_path: Path) -> None:
    """A declared client gets the CallToolResult itself, and the task exists, completed."""
    app, server = build(tmp_path)
    async with Client(server, extensions=[Tasks()]) as client:
        with anyio.fail_after(WAIT):
            result = await client.session.call_tool("double", {"n": 21}, allow_claimed=True)
    assert isinstance(result, CallToolResult)
    assert result.structured_content == {"n": 42}
    [task] = await app.store.list()
    assert task.status.value == "completed"


async def test_a_failed_fast_task_is_its_json_rpc_error_inline(tmp_path: Path) -> None:
    _, server = build(tmp_path)
    async with Client(server, extensions=[Tasks()]) as client:
        with anyio.fail_after(WAIT), pytest.raises(MCPError) as info:
            await client.session.call_tool("broken", {}, allow_claimed=True)
    assert info.value.error.code == -32603
    assert "it broke" in info.value.error.message


async def test_a_task_still_running_after_the_window_gets_a_handle(tmp_path: Path) -> None:
    _, server = build(tmp_path)
    async with Client(server, extensions=[Tasks()]) as client:
        with anyio.fail_after(WAIT):
            created = await client.session.call_tool("gated", {}, allow_claimed=True)
            assert isinstance(created, Created)
            server.gate.set()  # type: ignore[attr-defined]
            while True:
                task = await get_task(client, created.task_id)
                if task.status == "completed":
                    break
                await anyio.sleep(0.01)
    assert isinstance(task, Detailed)
    assert task.model_extra is not None
    assert task.model_extra["result"]["content"][0]["text"] == "opened"


@pytest.mark.requirement("B4.2")
async def test_polls_faster_than_the_interval_are_refused_with_retry_after(
    tmp_path: Path,
) -> None:
    """With rate_limit_polls, a second tasks/get within half of pollIntervalMs (1 s here)
    is refused with -32000 and data.retryAfterMs; the task is untouched."""
    _, server = build(tmp_path, rate_limit=True)
    async with Client(server, extensions=[Tasks()]) as client:
        with anyio.fail_after(WAIT):
            created = await client.session.call_tool("gated", {}, allow_claimed=True)
            assert isinstance(created, Created)
            first = await get_task(client, created.task_id)
            with pytest.raises(MCPError) as info:
                await get_task(client, created.task_id)
            server.gate.set()  # type: ignore[attr-defined]
    assert first.status == "working"
    assert info.value.error.code == RATE_LIMITED
    assert "polling too fast" in info.value.error.message
    assert 0 < info.value.error.data["retryAfterMs"] <= 500


async def test_without_rate_limiting_fast_polls_are_answered(tmp_path: Path) -> None:
    _, server = build(tmp_path)
    async with Client(server, extensions=[Tasks()]) as client:
        with anyio.fail_after(WAIT):
            created = await client.session.call_tool("gated", {}, allow_claimed=True)
            assert isinstance(created, Created)
            for _ in range(5):
                assert (await get_task(client, created.task_id)).status == "working"
            server.gate.set()  # type: ignore[attr-defined]


def test_the_limiter_allows_one_poll_per_half_interval_and_forgets_the_oldest() -> None:
    limiter = PollLimiter(capacity=2)
    assert limiter.wait_needed(("", "a"), 1.0, now=100.0) == 0
    assert limiter.wait_needed(("", "a"), 1.0, now=100.2) == pytest.approx(0.3)
    assert limiter.wait_needed(("", "a"), 1.0, now=100.5) == 0  # allowed, recorded
    assert limiter.wait_needed(("", "a"), 1.0, now=100.6) == pytest.approx(0.4)
    limiter.wait_needed(("", "b"), 1.0, now=100.6)
    limiter.wait_needed(("", "c"), 1.0, now=100.6)  # "a" is forgotten
    assert limiter.wait_needed(("", "a"), 1.0, now=100.7) == 0


def test_inline_within_is_bounded(tmp_path: Path) -> None:
    app = Keel(tmp_path / "keel.db")
    with pytest.raises(ConfigurationError, match="inline_within"):

        @app.task("x", inline_within=5)
        async def x(ctx: TaskContext) -> None: ...


def build_crashing(tmp_path: Path, *, expose: bool) -> tuple[Keel, MCPServer[Any]]:
    app = Keel(tmp_path / "keel.db")

    @app.task("crash", max_attempts=1, poll_interval=0.02)
    async def crash(ctx: TaskContext) -> None:
        raise RuntimeError("password=hunter2 at db.internal:5432")

    server = MCPServer(
        "t", extensions=[TasksExtension(app, expose_crashes=expose)], lifespan=keel_lifespan(app)
    )
    return app, server


async def failed_task(server: MCPServer[Any]) -> dict[str, Any]:
    async with Client(server, extensions=[Tasks()]) as client:
        with anyio.fail_after(WAIT):
            created = await client.session.call_tool("crash", {}, allow_claimed=True)
            assert isinstance(created, Created)
            while True:
                task = await get_task(client, created.task_id)
                if task.status == "failed":
                    return task.model_dump(by_alias=True)
                await anyio.sleep(0.01)


async def test_a_crash_shows_clients_its_exception_type_only(tmp_path: Path) -> None:
    """A handler's unexpected exception: the client sees RuntimeError, in error and in
    statusMessage, never its text; the history keeps the text for operators."""
    app, server = build_crashing(tmp_path, expose=False)
    task = await failed_task(server)
    assert task["error"]["code"] == -32603
    assert "RuntimeError" in task["error"]["message"]
    assert "hunter2" not in json.dumps(task)
    assert task["statusMessage"].startswith("failed: the task handler raised RuntimeError")
    history = await app.store.history(task["taskId"])
    assert any("hunter2" in event.reason for event in history)


async def test_expose_crashes_shows_the_text(tmp_path: Path) -> None:
    _, server = build_crashing(tmp_path, expose=True)
    task = await failed_task(server)
    assert "RuntimeError: password=hunter2" in task["error"]["message"]
    assert "RuntimeError: password=hunter2" in task["statusMessage"]
