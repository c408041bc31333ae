"""How a handler's ending becomes the task's outcome, through a running worker.

A value -> ``completed`` with a tool result; ToolError -> ``completed`` with ``isError``;
TaskFailed -> ``failed`` with that error at once; anything else -> retried with backoff
(in store-clock time) and finally dead-lettered, with a history entry for each attempt.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest

from contract.support import FakeClock
from keel.model import INTERNAL_ERROR, Limits, Status
from keel.runtime import Keel, TaskContext, TaskFailed, ToolError, ToolResult
from keel.store import Store

from .support import Gates, running, scheduled, settles, worker

pytestmark = pytest.mark.anyio


async def test_returned_values_become_tool_results(store: Store) -> None:
    """A dict, a string and a ToolResult each end the task completed with MCP content."""
    app = Keel(store)

    @app.task("as_dict")
    async def as_dict(ctx: TaskContext, service: str) -> dict[str, Any]:
        return {"service": service, "healthy": False}

    @app.task("as_text")
    async def as_text(ctx: TaskContext) -> str:
        return "all good"

    @app.task("as_result")
    async def as_result(ctx: TaskContext) -> ToolResult:
        return ToolResult("2 deploys", structured={"deploys": 2})

    d = await app.submit("as_dict", {"service": "payments"})
    t = await app.submit("as_text")
    r = await app.submit("as_result")
    async with running(worker(app)):
        done = [await settles(store, task.task_id) for task in (d, t, r)]
    assert [task.status for task in done] == [Status.COMPLETED] * 3
    assert done[0].result == {
        "content": [{"type": "text", "text": '{"service": "payments", "healthy": false}'}],
        "isError": False,
        "structuredContent": {"service": "payments", "healthy": False},
    }
    assert done[1].result == {"content": [{"type": "text", "text": "all good"}], "isError": False}
    assert done[2].result["structuredContent"] == {"deploys": 2}
    assert done[2].result["content"][0] == {"type": "text", "text": "2 deploys"}
    assert all(task.attempt == 1 and task.lease_owner is None for task in done)


async def test_tool_error_completes_with_is_error(store: Store) -> None:
    """ToolError ends the task completed with ``isError: true`` and its content; no retry."""
    app = Keel(store)
    calls = 0

    @app.task("lookup", max_attempts=3)
    async def lookup(ctx: TaskContext) -> None:
        nonlocal calls
        calls += 1
        raise ToolError("incident INC-9 does not exist", structured={"incident": "INC-9"})

    task = await app.submit("lookup")
    async with running(worker(app)):
        done = await settles(store, task.task_id)
    assert done.status is Status.COMPLETED
    assert done.result == {
        "content": [{"type": "text", "text": "incident INC-9 does not exist"}],
        "isError": True,
        "structuredContent": {"incident": "INC-9"},
    }
    assert (done.error, done.attempt, calls) == (None, 1, 1)


async def test_task_failed_fails_at_once_with_that_error(store: Store) -> None:
    """TaskFailed ends the task failed with exactly its JSON-RPC error, without a retry."""
    app = Keel(store)
    calls = 0

    @app.task("guarded", max_attempts=3)
    async def guarded(ctx: TaskContext) -> None:
        nonlocal calls
        calls += 1
        raise TaskFailed("quota exhausted", code=-32001, data={"retry_after": 60})

    task = await app.submit("guarded")
    async with running(worker(app)):
        done = await settles(store, task.task_id)
    assert done.status is Status.FAILED
    assert done.error == {"code": -32001, "message": "quota exhausted", "data": {"retry_after": 60}}
    assert (done.attempt, calls) == (1, 1)
    history = await store.history(task.task_id)
    assert history[-1].reason == "failed: quota exhausted"
    assert history[-1].actor.startswith("worker:")


async def test_crashes_are_retried_with_backoff_then_dead_lettered(
    store: Store, clock: FakeClock
) -> None:
    """Crashes are retried after capped, jittered backoff, then dead-lettered, all in history."""
    app = Keel(store)
    calls: list[int] = []

    @app.task("flaky", max_attempts=3, retry_base=10.0, retry_cap=15.0)
    async def flaky(ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError(f"boom {ctx.attempt}")

    task = await app.submit("flaky")
    async with running(worker(app, rng=random.Random(7))):
        # The backoff ceiling doubles from retry_base and is capped; the delay is drawn
        # from [ceiling / 2, ceiling].
        for attempt, ceiling in ((1, 10.0), (2, 15.0)):
            waiting = await scheduled(store, task.task_id, attempt + 1)
            delay = waiting.ready_at - clock.now
            assert ceiling / 2 <= delay <= ceiling
            # Not ready before the backoff ran out: nobody can claim it yet.
            assert await store.claim(["flaky"], worker="probe", lease_seconds=5) == []
            assert calls == list(range(1, attempt + 1))
            clock.advance(delay)
        done = await settles(store, task.task_id)

    assert calls == [1, 2, 3]
    assert done.status is Status.FAILED
    assert done.error == {
        "code": INTERNAL_ERROR,
        "message": "dead letter after 3 attempt(s): RuntimeError: boom 3",
        "data": {"exception": "RuntimeError"},
    }
    assert done.status_message == "failed: dead letter after 3 attempt(s): RuntimeError: boom 3"
    reasons = [e.reason for e in await store.history(task.task_id)]
    failures = [r for r in reasons if " failed: " in r]
    assert failures[0].startswith("attempt 1/3 failed: RuntimeError: boom 1; retrying in ")
    assert failures[1].startswith("attempt 2/3 failed: RuntimeError: boom 2; retrying in ")
    assert failures[2] == "attempt 3/3 failed: RuntimeError: boom 3; no attempts left"
    assert sum(r.startswith("claimed by ") for r in reasons) == 3


async def test_status_messages_show_in_the_snapshot(store: Store) -> None:
    """``ctx.status`` sets the snapshot's status message while the handler runs."""
    app = Keel(store)
    gates = Gates()

    @app.task("diagnose")
    async def diagnose(ctx: TaskContext) -> str:
        await ctx.status("correlating deploys of payments")
        gates.open("shown")
        await gates.wait("go on")
        await ctx.status("reading logs")
        gates.open("shown again")
        await gates.wait("finish")
        return "done"

    task = await app.submit("diagnose")
    async with running(worker(app)):
        await gates.wait("shown")
        assert (await store.get(task.task_id)).status_message == "correlating deploys of payments"
        gates.open("go on")
        await gates.wait("shown again")
        snapshot = await store.get(task.task_id)
        assert (snapshot.status, snapshot.status_message) == (Status.WORKING, "reading logs")
        gates.open("finish")
        assert (await settles(store, task.task_id)).status is Status.COMPLETED


async def test_a_non_json_result_fails_the_task_not_the_worker(store: Store) -> None:
    """A handler returning something JSON cannot hold fails its task; the worker carries on."""
    app = Keel(store)

    @app.task("odd", max_attempts=1)
    async def odd(ctx: TaskContext) -> object:
        return {1, 2}

    @app.task("fine")
    async def fine(ctx: TaskContext) -> str:
        return "ok"

    bad = await app.submit("odd")
    async with running(worker(app, concurrency=1)):
        failed = await settles(store, bad.task_id)
        good = await app.submit("fine")
        assert (await settles(store, good.task_id)).status is Status.COMPLETED
    assert failed.status is Status.FAILED
    assert failed.error is not None
    assert "JSON" in failed.error["message"]


async def test_an_oversized_result_fails_the_task_not_the_worker(make_store: Any) -> None:
    """A result over the size limit fails its task with a clear error; the worker carries on."""
    store = make_store(limits=Limits(max_result_bytes=200))
    app = Keel(store)

    @app.task("verbose", max_attempts=1)
    async def verbose(ctx: TaskContext) -> str:
        return "x" * 1000

    @app.task("fine")
    async def fine(ctx: TaskContext) -> str:
        return "ok"

    big = await app.submit("verbose")
    async with running(worker(app, concurrency=1)):
        failed = await settles(store, big.task_id)
        good = await app.submit("fine")
        assert (await settles(store, good.task_id)).status is Status.COMPLETED
    assert failed.status is Status.FAILED
    assert failed.error is not None
    assert "limit" in failed.error["message"]


async def test_a_blocking_step_does_not_stall_the_worker(store: Store) -> None:
    """A plain step function runs in a thread: while it blocks, the same worker's event
    loop still runs another task to completion; then the step finishes and is recorded."""
    app = Keel(store)
    gate = threading.Event()
    entered = threading.Event()

    def crunch() -> dict[str, int]:
        entered.set()
        if not gate.wait(30):  # bounded: a hung test fails instead of hanging
            raise TimeoutError("the gate never opened")
        return {"spans": 1_000_000}

    @app.task("slow")
    async def slow(ctx: TaskContext) -> dict[str, int]:
        return await ctx.step("crunch", crunch)

    @app.task("quick")
    async def quick(ctx: TaskContext) -> str:
        return "done"

    async with running(worker(app, concurrency=2)):
        first = await app.submit("slow")
        with anyio.fail_after(10):
            await anyio.to_thread.run_sync(entered.wait)
        second = await app.submit("quick")
        assert (await settles(store, second.task_id)).status is Status.COMPLETED
        assert (await store.get(first.task_id)).status is Status.WORKING  # still in its step
        gate.set()
        done = await settles(store, first.task_id)
    assert done.status is Status.COMPLETED
    assert done.result["structuredContent"] == {"spans": 1_000_000}
    assert await store.steps(first.task_id) == {"crunch": {"spans": 1_000_000}}
