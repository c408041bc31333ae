"""Ten thousand tasks waiting for humans hold no lease and no worker: a worker with a
single slot still runs new work at once, and any waiting task resumes when answered."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from contract.support import FakeClock
from keel.model import InputRequest, Status
from keel.runtime import Keel, TaskContext
from keel.store import SqliteStore

from .support import APPROVAL, parks, running, settles, worker

# slow: ten thousand tasks
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PARKED = 10_000  # created already waiting, as if their handler had asked (the fast path)
PARKED_BY_WORKER = 200  # parked by a worker running their handler for real


async def test_ten_thousand_waiting_tasks_block_nothing(tmp_path: Path, clock: FakeClock) -> None:
    """10,000 waiting tasks hold no lease; a 1-slot worker runs new work; answers resume them."""
    # synchronous=normal: this test is about leases and claims, not fsync throughput.
    store = SqliteStore(tmp_path / "keel.db", clock=clock, synchronous="normal")
    app = Keel(store)

    @app.task("approve", max_attempts=1)
    async def approve(ctx: TaskContext, n: int) -> dict[str, Any]:
        answer = await ctx.elicit("Roll back the deploy?", APPROVAL)
        return {"n": n, "approved": answer["approved"]}

    @app.task("urgent")
    async def urgent(ctx: TaskContext) -> str:
        return "ran at once"

    try:
        # The handler's first request is keyed input-1: a task created waiting for
        # input-1 is exactly what a worker would have parked.
        asked = {"input-1": InputRequest("Roll back the deploy?", APPROVAL)}
        async with anyio.create_task_group() as tg:  # concurrent creates commit in groups
            for n in range(PARKED):
                create = partial(
                    store.create, name="approve", arguments={"n": n}, input_requests=asked
                )
                tg.start_soon(create)
        by_worker = [
            await app.submit("approve", {"n": PARKED + i}) for i in range(PARKED_BY_WORKER)
        ]
        async with running(worker(app, concurrency=50)):
            for task in by_worker:
                await parks(store, task.task_id)

        waiting = await store.list(status=Status.INPUT_REQUIRED, limit=2 * PARKED)
        assert len(waiting) == PARKED + PARKED_BY_WORKER
        assert all(t.lease_owner is None and t.lease_expires_at is None for t in waiting)
        assert all(t.attempt == 1 for t in waiting)
        assert await store.list(status=Status.WORKING) == []
        fences = {t.task_id: t.fence for t in waiting}

        single = worker(app, concurrency=1)
        async with running(single):
            task = await app.submit("urgent")
            done = await settles(store, task.task_id)
            assert (done.status, done.attempt, done.fence) == (Status.COMPLETED, 1, 1)

            chosen = waiting[PARKED // 2]
            await store.provide_input(chosen.task_id, {"input-1": {"approved": True}})
            resumed = await settles(store, chosen.task_id)

        assert resumed.result["structuredContent"] == {
            "n": chosen.arguments["n"],
            "approved": True,
        }
        assert resumed.attempt == 1
        still = await store.list(status=Status.INPUT_REQUIRED, limit=2 * PARKED)
        assert len(still) == PARKED + PARKED_BY_WORKER - 1
        assert all(t.fence == fences[t.task_id] and not t.leased for t in still)
    finally:
        await store.close()
