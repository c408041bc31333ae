"""Workers in the process hear at once of tasks submitted or answered through the app:
with a claim interval of an hour, only that wake-up can start them."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import MemoryStore, Store

from .support import SERVICE, parks, running, settles, worker

pytestmark = pytest.mark.anyio
HOUR = 3600.0


def app_on(store: Store) -> Keel:
    app = Keel(store)

    @app.task("double")
    async def double(ctx: TaskContext, n: int) -> int:
        return n * 2

    @app.task("ask")
    async def ask(ctx: TaskContext) -> str:
        answer = await ctx.elicit("Which service?", SERVICE)
        return str(answer["service"])

    return app


async def test_a_submitted_task_runs_without_waiting_for_a_poll(sqlite_store: Store) -> None:
    app = app_on(sqlite_store)
    async with running(worker(app, claim_interval=HOUR)):
        # Each task is submitted after the last one finished, when the worker has gone
        # back to waiting (its claims find nothing until the wake-up).
        for n in range(5):
            task = await app.submit("double", {"n": n})
            done = await settles(sqlite_store, task.task_id)
            assert done.status is Status.COMPLETED


async def test_an_answered_task_runs_without_waiting_for_a_poll(sqlite_store: Store) -> None:
    app = app_on(sqlite_store)
    async with running(worker(app, claim_interval=HOUR)):
        task = await app.submit("ask")
        await parks(sqlite_store, task.task_id)
        answered = await app.answer(task.task_id, {"input-1": {"service": "payments"}})
        assert answered.status is Status.WORKING
        done = await settles(sqlite_store, task.task_id)
    assert done.status is Status.COMPLETED


async def test_a_submit_from_another_thread_wakes_the_worker_on_its_own_loop(
    sqlite_store: Store,
) -> None:
    """The wake-up crosses threads safely (call_soon_threadsafe onto the worker's loop)."""
    app = app_on(sqlite_store)
    submitted: list[str] = []

    def elsewhere() -> None:
        async def go() -> None:
            task = await app.submit("double", {"n": 1})
            submitted.append(task.task_id)

        anyio.run(go)

    async with running(worker(app, claim_interval=HOUR)):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        await anyio.to_thread.run_sync(thread.join)
        done = await settles(sqlite_store, submitted[0])
    assert done.status is Status.COMPLETED


class SlowClaims(MemoryStore):
    """A memory store whose claims take a while (as a busy database's do)."""

    def __init__(self) -> None:
        super().__init__()
        self.claiming = anyio.Event()

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        claimed = await super().claim(*args, **kwargs)
        self.claiming.set()  # it has looked; its answer is on its way back
        await anyio.sleep(0.2)
        return claimed


async def test_a_wake_up_during_a_claim_is_not_lost() -> None:
    """A task submitted while an (empty) claim is in flight runs without waiting for the
    claim interval (an hour here)."""
    store = SlowClaims()
    app = app_on(store)
    async with running(worker(app, claim_interval=HOUR)):
        await store.claiming.wait()  # the first claim is in flight
        task = await app.submit("double", {"n": 4})
        done = await settles(store, task.task_id)
    assert done.status is Status.COMPLETED
