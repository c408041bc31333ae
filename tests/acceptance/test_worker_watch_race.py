"""Regression: a task claimed while the watch loop's status read is in flight keeps running.

Under CPU load, ``test_worker_crash`` once saw a worker that was never killed claim a
task, run none of it, and leave its lease to expire (recovered with ``attempt + 1``).
The cause was ``Worker._watch_loop``: it read the statuses of the tasks running when the
read started, then judged every task running when the read returned, so a task claimed
during the read was missing from the answer and stopped as "task no longer exists": its
handler cancelled, nothing written, the task leased to a worker no longer running it
until the lease expired (with ``max_attempts=1``, a dead letter for a task that never
failed). Fixed in the worker (the loop judges only what it read); this test forces the
interleaving in one process: a store wrapper holds the watch loop's read until a second
task has been claimed and started.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext, Worker
from keel.store import SqliteStore

from .apps.harness import eventually

pytestmark = pytest.mark.anyio

WAIT = 10.0  # seconds for any one step of the interleaving


class HeldStatuses:
    """A store whose ``statuses`` read, once armed, waits for ``let_go`` before it
    answers (the read itself happens first, as a slow read would)."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.armed = False
        self.holding = anyio.Event()
        self.let_go = anyio.Event()
        self.answered: list[set[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def statuses(self, task_ids: Collection[str]) -> Mapping[str, tuple[Status, int]]:
        seen = await self.inner.statuses(task_ids)
        if self.armed:
            self.armed = False
            self.holding.set()
            await self.let_go.wait()
        self.answered.append(set(seen))
        return seen


async def test_task_claimed_during_a_watch_read_keeps_running(tmp_path: Path) -> None:
    """Task A runs; the watch loop's read of A's status is held; meanwhile task B is
    claimed and its handler starts; the read is released. B must keep running: the
    answer said nothing about B, so it is no evidence that B was cancelled or taken
    over. (With the bug, B's handler was cancelled at once and B stayed leased.)"""
    store = HeldStatuses(SqliteStore(tmp_path / "keel.db"))
    app = Keel(store)  # type: ignore[arg-type]  # duck-typed: a wrapper of a real store
    started: set[str] = set()
    stopped: set[str] = set()

    @app.task("hold", lease_seconds=30)
    async def hold(ctx: TaskContext) -> None:
        started.add(ctx.task_id)
        try:
            await anyio.sleep_forever()
        finally:
            stopped.add(ctx.task_id)

    async def until(what: str, condition: Callable[[], bool]) -> None:
        async def probe() -> bool | None:
            return True if condition() else None

        await eventually(probe, within=WAIT, what=what, every=0.005)

    worker = Worker(app, concurrency=2, claim_interval=0.01, watch_interval=0.01)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: worker.run(stop=stop))
            a = await app.submit("hold")
            await until("A to start", lambda: a.task_id in started)
            store.armed = True
            with anyio.fail_after(WAIT):
                await store.holding.wait()  # the watch loop has read A's status only
            b = await app.submit("hold")
            await until("B to start", lambda: b.task_id in started)
            passes = len(store.answered)
            store.let_go.set()
            # The held answer is used, then one more watch pass runs.
            await until("two watch passes", lambda: len(store.answered) >= passes + 2)
            b_stopped, b_running = b.task_id in stopped, b.task_id in worker.running
            stop.set()
    finally:
        await store.inner.close()
    assert not b_stopped, "B was stopped by a read that never looked at it"
    assert b_running
