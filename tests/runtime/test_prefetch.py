"""Claiming ahead (``Worker(prefetch=N)``): a worker claims beyond its free slots as many
tasks as handlers ended lately (in the last quarter of ``prefetch_wait``), at most ``N``;
they wait for a slot in turn, never more than ``concurrency`` handlers at once; one that
waits ``prefetch_wait`` seconds is given back (ready again for any worker), and the worker
then claims none ahead until handlers end again."""

from __future__ import annotations

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.runtime.worker import BUSY, PREFETCH_PER_SLOT, Worker
from keel.store import MemoryStore

from .support import WAIT, eventually, running, worker

pytestmark = pytest.mark.anyio


class Gated:
    """An app with a no-op task and a task that runs until its gate (by task id) opens;
    what entered, and how many handlers ran at once as each one entered."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.app = Keel(self.store)
        self.entered: list[str] = []
        self.at_once: list[int] = []
        self._gates: dict[str, anyio.Event] = {}
        self._arrived: dict[str, anyio.Event] = {}
        inside = 0

        @self.app.task("short")
        async def short(ctx: TaskContext) -> None:
            return None

        @self.app.task("gated")
        async def gated(ctx: TaskContext) -> None:
            nonlocal inside
            inside += 1
            self.entered.append(ctx.task_id)
            self.at_once.append(inside)
            self._event(self._arrived, ctx.task_id).set()
            try:
                await self._event(self._gates, ctx.task_id).wait()
            finally:
                inside -= 1

    @staticmethod
    def _event(events: dict[str, anyio.Event], task_id: str) -> anyio.Event:
        return events.setdefault(task_id, anyio.Event())

    async def arrival(self, task_id: str) -> None:
        """Wait (bounded) until the handler of ``task_id`` entered."""
        with anyio.fail_after(WAIT):
            await self._event(self._arrived, task_id).wait()

    def open(self, task_id: str) -> None:
        self._event(self._gates, task_id).set()

    async def completed(self, task_id: str) -> None:
        async def check() -> bool:
            return (await self.store.get(task_id)).status is Status.COMPLETED

        await eventually(check, f"{task_id} completed")

    async def warmed(self, count: int) -> None:
        """Run ``count`` short tasks: the worker then claims as many ahead."""
        for _ in range(count):
            task = await self.app.submit("short")
            await self.completed(task.task_id)


async def test_tasks_claimed_ahead_wait_for_a_slot_and_all_run() -> None:
    g = Gated()
    w = worker(g.app, concurrency=2, prefetch=2, prefetch_wait=WAIT)
    async with running(w):
        await g.warmed(2)
        ids = [(await g.app.submit("gated")).task_id for _ in range(6)]

        async def four_claimed() -> bool:
            return len(w.running) == 4 and len(g.entered) == 2

        await eventually(four_claimed, "two handlers running and two tasks claimed ahead")
        leased = [(await g.store.get(i)).lease_owner is not None for i in ids]
        assert leased.count(True) == 4  # the other two wait in the store, for any worker
        for task_id in ids:  # one gate after the other, in the order they were claimed
            await g.arrival(task_id)
            g.open(task_id)
            await g.completed(task_id)
    assert sorted(g.entered) == sorted(ids)
    assert max(g.at_once) <= 2  # never more handlers than slots


async def test_a_task_claimed_ahead_that_waits_too_long_is_given_back() -> None:
    g = Gated()
    w = worker(g.app, concurrency=1, prefetch=1, prefetch_wait=0.2)
    short = await g.app.submit("short")
    holder = await g.app.submit("gated")
    waiter = await g.app.submit("gated")
    async with running(w):
        # The short task runs first; as it ends, the freed slot and one ahead are claimed.
        await g.arrival(holder.task_id)

        async def given_back() -> bool:
            history = await g.store.history(waiter.task_id)
            return any(BUSY in e.reason for e in history)

        await eventually(given_back, "the task claimed ahead given back")
        back = await g.store.get(waiter.task_id)
        assert (g.entered, back.status, back.lease_owner, back.attempt) == (
            [holder.task_id],  # the one given back never ran...
            Status.WORKING,  # ...and is ready again, for any worker,
            None,
            1,  # not counted as an attempt
        )
        assert w._ahead == 0  # none claimed ahead until handlers end again
        assert w.running == [holder.task_id]
        g.open(holder.task_id)
        await g.completed(holder.task_id)
        await g.arrival(waiter.task_id)
        g.open(waiter.task_id)
        await g.completed(waiter.task_id)
    assert (await g.store.get(short.task_id)).status is Status.COMPLETED


async def test_claiming_ahead_follows_the_handlers_that_ended_lately() -> None:
    g = Gated()
    w = worker(g.app, concurrency=1, prefetch=3, prefetch_wait=WAIT)
    assert w._ahead == 0  # a new worker knows nothing of its handlers yet
    async with running(w):
        holder = await g.app.submit("gated")
        await g.arrival(holder.task_id)
        assert w._ahead == 0
        g.open(holder.task_id)
        await g.completed(holder.task_id)
        assert w._ahead == 1
        await g.warmed(4)
        assert w._ahead == 3  # at most prefetch


def test_the_default_prefetch_is_twice_the_concurrency() -> None:
    """None: PREFETCH_PER_SLOT tasks ahead per slot; 0 stays 0 (none claimed ahead)."""
    app = Keel(MemoryStore())
    assert Worker(app, concurrency=3).prefetch == 3 * PREFETCH_PER_SLOT == 6
    assert Worker(app, concurrency=3, prefetch=0).prefetch == 0
