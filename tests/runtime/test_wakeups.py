"""Workers in the process hear at once of tasks submitted or answered through the app:
with a claim interval of an hour, only that wake-up can start them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import MemoryStore, SqliteStore, Store

from .support import SERVICE, eventually, parks, running, settles, worker

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


def transactions(statements: list[str]) -> list[list[str]]:
    """The write transactions in a log of SQL statements: what ran from each
    ``BEGIN IMMEDIATE`` to its ``COMMIT`` (empty ones left out)."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for statement in statements:
        if statement.startswith("BEGIN IMMEDIATE"):
            current = []
        elif statement.startswith(("COMMIT", "ROLLBACK")):
            if current and statement.startswith("COMMIT"):
                found.append(current)
            current = None
        elif current is not None:
            current.append(statement)
    return found


async def test_a_task_submitted_to_an_idle_worker_is_claimed_in_its_create_commit(
    sqlite_store: SqliteStore,
) -> None:
    """The worker is woken as the create is queued, so its claim runs in the create's
    transaction: one commit (one fsync) to create and claim a task, one to complete it."""
    app = app_on(sqlite_store)
    statements: list[str] = []
    async with running(worker(app, claim_interval=HOUR)):
        for n in range(3):
            statements.clear()
            sqlite_store._db.sql.set_trace_callback(statements.append)
            task = await app.submit("double", {"n": n})
            done = await settles(sqlite_store, task.task_id)
            sqlite_store._db.sql.set_trace_callback(None)
            assert done.status is Status.COMPLETED
            # The write transactions that touched this task (sweeps come and go beside).
            writes = [t for t in transactions(statements) if any(task.task_id in s for s in t)]
            assert len(writes) == 2, writes
            create, complete = writes
            assert any("INSERT INTO tasks" in s for s in create), create
            assert any("UPDATE tasks SET" in s for s in create), create  # the claim
            assert any("UPDATE tasks SET" in s for s in complete), complete
            actors = [e.actor for e in await sqlite_store.history(task.task_id)]
            assert actors[0] == "client", actors
            assert actors[1].startswith("worker"), actors  # the claim, right after the create


class CountedClaims(SqliteStore):
    """A SQLite store that counts the claims made on it."""

    claims = 0

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return await super().claim(*args, **kwargs)


async def test_an_idle_worker_claims_twice_per_task_at_most(tmp_path: Path) -> None:
    """No claim beyond the one that takes the task (in its create's commit) and the one
    that shares its completion's: after a claim that got fewer tasks than it asked for
    the worker waits to be woken, and an attempt's end wakes it once, not twice."""
    store = CountedClaims(tmp_path / "keel.db")
    app = app_on(store)
    quiet = {"claim_interval": HOUR, "recover_interval": HOUR, "watch_interval": HOUR}
    try:
        async with running(worker(app, **quiet)):
            first = await app.submit("double", {"n": 0})  # the worker is warmed up
            await settles(store, first.task_id)
            before = store.claims
            for n in range(10):
                task = await app.submit("double", {"n": n})
                done = await settles(store, task.task_id)
                assert done.status is Status.COMPLETED
            assert store.claims - before <= 2 * 10, store.claims - before
    finally:
        await store.close()


async def test_an_answered_task_is_claimed_in_its_answer_commit(
    sqlite_store: SqliteStore,
) -> None:
    """As for a submit: the answer that makes a task ready and the idle worker's claim of
    it are one transaction."""
    app = app_on(sqlite_store)
    statements: list[str] = []
    idle = worker(app, claim_interval=HOUR)
    async with running(idle):
        task = await app.submit("ask")
        await parks(sqlite_store, task.task_id)
        await eventually(lambda: not idle.running, "the parked attempt to end")
        sqlite_store._db.sql.set_trace_callback(statements.append)
        await app.answer(task.task_id, {"input-1": {"service": "payments"}})
        done = await settles(sqlite_store, task.task_id)
        sqlite_store._db.sql.set_trace_callback(None)
    assert done.status is Status.COMPLETED
    writes = [t for t in transactions(statements) if any(task.task_id in s for s in t)]
    assert len(writes) == 2, writes  # answer + claim, then complete
    history = await sqlite_store.history(task.task_id)
    answered = [e for e in history if e.actor == "client"][-1]
    assert history[history.index(answered) + 1].actor.startswith("worker"), history
