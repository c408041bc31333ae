"""Recorded steps are read on a handler's first ``ctx.step`` (a handler that takes none
costs no read), also when the handler runs steps concurrently on a replay."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import Store

from .support import SERVICE, parks, running, settles, worker

pytestmark = pytest.mark.anyio


async def test_concurrent_steps_on_a_replay_never_rerun_a_recorded_step(
    sqlite_store: Store,
) -> None:
    app = Keel(sqlite_store)
    ran: Counter[str] = Counter()

    def effect(name: str) -> str:
        ran[name] += 1
        return f"{name} done"

    @app.task("flow")
    async def flow(ctx: TaskContext) -> dict[str, str]:
        first = await ctx.step("a", effect, "a")
        answer = await ctx.elicit("Which service?", SERVICE)
        results: dict[str, str] = {"first": first, "service": str(answer["service"])}

        async def one(name: str) -> None:
            results[name] = await ctx.step(name, effect, name)

        async with anyio.create_task_group() as tg:  # "a" again (recorded) and "b", at once
            tg.start_soon(one, "a")
            tg.start_soon(one, "b")
        results["again"] = await ctx.step("b", effect, "b")
        return results

    async with running(worker(app)):
        task = await app.submit("flow")
        await parks(sqlite_store, task.task_id)
        await app.answer(task.task_id, {"input-1": {"service": "payments"}})
        done = await settles(sqlite_store, task.task_id)
    assert done.status is Status.COMPLETED
    assert ran == Counter({"a": 1, "b": 1})
    assert done.result is not None
    assert done.result["structuredContent"] == {
        "first": "a done",
        "service": "payments",
        "a": "a done",
        "b": "b done",
        "again": "b done",
    }
