"""Transient failures on PostgreSQL, caused for real: backends terminated with
``pg_terminate_backend`` mid-run, and a COMMIT whose reply never reaches Keel.

A write retried after a lost COMMIT reply must not apply twice: the store finds its
operation id in ``keel_write_log`` and returns the first try's outcome.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
import psycopg.sql
import pytest

from keel import StoreError
from keel.errors import LeaseLost
from keel.model import InputRequest, Status
from keel.store import PostgresStore

from .pg import admin, store_url

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

SCHEMA = {"type": "object", "required": ["s"], "properties": {"s": {"type": "string"}}}
WAIT = 10.0  # seconds


def _wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)  # polling another connection's state under a deadline


def terminate(app_name: str) -> int:
    """End every backend of ``app_name``; return how many, once they are gone."""
    with admin() as conn:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,)
            )
        ]
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

        def gone() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            return row == (0,)

        _wait_for(gone, "terminated backends to exit")
    return len(pids)


class LostReply(PostgresStore):
    """Sends the next ``lose`` COMMITs, waits until the server has committed, and drops
    the connection without reading the reply: to Keel, the answer was lost."""

    lose = 0
    committed_then_lost = 0

    def _commit(self, conn: psycopg.Connection[Any]) -> None:
        if self.lose <= 0:
            return super()._commit(conn)
        self.lose -= 1
        pid = conn.info.backend_pid
        conn.pgconn.send_query(b"COMMIT")
        conn.pgconn.flush()
        with admin() as watcher:

            def idle() -> bool:
                row = watcher.execute(
                    "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                return row is not None and row[0] == "idle"

            _wait_for(idle, "the COMMIT to be applied")
        self.committed_then_lost += 1
        conn.close()
        conn.execute(b"SELECT 1")  # raises: the connection is closed, the reply unread
        raise AssertionError("unreachable")  # pragma: no cover


class KilledBeforeCommit(PostgresStore):
    """Terminates its own backend just before the next ``kill`` COMMITs: not applied."""

    kill = 0

    def _commit(self, conn: psycopg.Connection[Any]) -> None:
        if self.kill > 0:
            self.kill -= 1
            pid = conn.info.backend_pid
            with admin() as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        super()._commit(conn)


@pytest.fixture
def lost(schema):
    stores: list[PostgresStore] = []

    def make(cls: type[PostgresStore] = LostReply) -> Any:
        store = cls(store_url(schema, retry_base="0.001"))
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close_sync()


async def test_lost_commit_reply_of_provide_input_is_not_applied_twice(lost):
    """The answer is recorded once and the caller gets the working task, not an error."""
    store = lost()
    task = await store.create(input_requests={"s": InputRequest("which?", SCHEMA)})
    store.lose = 1
    got = await store.provide_input(task.task_id, {"s": {"s": "payments"}})
    assert store.committed_then_lost == 1
    assert got.status is Status.WORKING
    events = [e for e in await store.history(task.task_id) if e.to_status is Status.WORKING]
    assert len(events) == 1


async def test_lost_commit_reply_of_create_makes_one_task(lost):
    """A create without idempotency key whose reply was lost: one task, returned."""
    store = lost()
    store.lose = 1
    task = await store.create(arguments={"a": 1})
    assert store.committed_then_lost == 1
    assert [t.task_id for t in await store.list()] == [task.task_id]


async def test_lost_commit_reply_of_claim_returns_the_claim(lost):
    """The claimed task comes back (fence 1, one claim event), not an empty claim."""
    store = lost()
    task = await store.create(name="job")
    store.lose = 1
    [got] = await store.claim(["job"], worker="w", lease_seconds=30)
    assert store.committed_then_lost == 1
    assert (got.task_id, got.fence, got.lease_owner) == (task.task_id, 1, "w")
    history = await store.history(task.task_id)
    assert sum(e.reason.startswith("claimed") for e in history) == 1


async def test_lost_commit_reply_of_a_group(lost):
    """Thirty completions sharing one transaction, its reply lost: each applied once."""
    store = lost()
    made = [await store.create(name="job") for _ in range(30)]
    leased = await store.claim(["job"], worker="w", lease_seconds=30, limit=30)
    assert len(leased) == 30
    store.lose = 1
    done: list[Any] = []

    async def complete(task: Any) -> None:
        done.append(await store.complete(task.task_id, {"ok": 1}, fence=task.fence))

    async with anyio.create_task_group() as tg:
        for task in leased:
            tg.start_soon(complete, task)
    assert store.committed_then_lost == 1
    assert sorted(t.task_id for t in done) == sorted(t.task_id for t in made)
    assert all(t.status is Status.COMPLETED for t in done)
    for task in made:
        history = await store.history(task.task_id)
        assert sum(e.to_status is Status.COMPLETED for e in history) == 1


async def test_lost_commit_reply_of_a_group_of_completions_and_a_claim(lost):
    """A claim made while completions are queued shares their transaction (claims and
    outcome writes are one lane): its reply lost, each write still applied exactly once
    (a completion and a history entry per task; the claim returns its tasks, each claimed
    once with the next fence)."""
    store = lost()
    first = [await store.create(name="job") for _ in range(20)]
    leased = await store.claim(["job"], worker="w", lease_seconds=30, limit=20)
    assert len(leased) == 20
    second = [await store.create(name="job") for _ in range(10)]
    store.lose = 1
    done: list[Any] = []
    claimed: list[Any] = []

    async def complete(task: Any) -> None:
        done.append(await store.complete(task.task_id, {"ok": 1}, fence=task.fence))

    async def claim() -> None:
        claimed.extend(await store.claim(["job"], worker="w2", lease_seconds=30, limit=10))

    async with anyio.create_task_group() as tg:
        for task in leased:
            tg.start_soon(complete, task)
        tg.start_soon(claim)
    assert store.committed_then_lost == 1
    assert sorted(t.task_id for t in done) == sorted(t.task_id for t in first)
    assert sorted(t.task_id for t in claimed) == sorted(t.task_id for t in second)
    for task in first:
        history = await store.history(task.task_id)
        assert [e.to_status for e in history].count(Status.COMPLETED) == 1, history
        assert (await store.get(task.task_id)).result == {"ok": 1}
    for task in claimed:
        assert (task.fence, task.lease_owner) == (1, "w2")
        history = await store.history(task.task_id)
        assert sum(e.reason.startswith("claimed") for e in history) == 1, history


async def test_a_write_group_that_wrote_nothing_keeps_no_operation_id(schema):
    """A group's operation id goes to keel_write_log first; a group whose calls were all
    refused before writing (a stale fence) rolls back, so neither the id nor anything
    else is kept, and the task is unchanged."""
    store = PostgresStore(store_url(schema))
    try:
        task = await store.create(name="job")
        [leased] = await store.claim(["job"], worker="w", lease_seconds=30)

        def logged() -> int:
            with admin() as conn:
                table = psycopg.sql.Identifier(schema, "keel_write_log")
                query = psycopg.sql.SQL("SELECT count(*) FROM {}").format(table)
                return int(conn.execute(query).fetchone()[0])  # type: ignore[index]

        before = logged()
        with pytest.raises(LeaseLost):
            await store.complete(task.task_id, {"ok": 1}, fence=leased.fence + 1)
        assert logged() == before
        assert (await store.get(task.task_id)).status is Status.WORKING
        await store.complete(task.task_id, {"ok": 1}, fence=leased.fence)
        assert logged() == before + 1
    finally:
        await store.close()


async def test_connection_killed_before_commit_is_retried_once(lost):
    """A backend terminated just before COMMIT: nothing applied; the retry applies once."""
    store = lost(KilledBeforeCommit)
    task = await store.create(name="job")
    store.kill = 1
    got = await store.cancel(task.task_id, reason="stop")
    assert store.kill == 0
    assert got.status is Status.CANCELLED
    history = await store.history(task.task_id)
    assert [e.to_status for e in history] == [Status.WORKING, Status.CANCELLED]


@pytest.mark.slow
async def test_backends_terminated_mid_run(schema):
    """Every connection of the store is terminated again and again while it works: all
    tasks still end exactly once."""
    app_name = f"keel_kill_{schema}"
    store = PostgresStore(store_url(schema, application_name=app_name, retry_base="0.01"))
    try:
        made = [await store.create(name="job") for _ in range(40)]
        stop = anyio.Event()
        kills = 0

        async def killer() -> None:
            nonlocal kills
            while not stop.is_set():
                kills += await anyio.to_thread.run_sync(terminate, app_name)
                await anyio.sleep(0.1)  # pacing the fault, not waiting for a result

        async with anyio.create_task_group() as tg:
            tg.start_soon(killer)
            for task in made:
                [leased] = await store.claim(["job"], worker="w", lease_seconds=30)
                await store.complete(leased.task_id, {"n": task.task_id}, fence=leased.fence)
            stop.set()
        assert kills > 0
        for task in made:
            final = await store.get(task.task_id)
            assert final.status is Status.COMPLETED
            events = [e.to_status for e in await store.history(task.task_id)]
            assert events == [Status.WORKING, Status.WORKING, Status.COMPLETED]
    finally:
        await store.close()


async def test_retry_bound_gives_a_store_error(schema):
    """With retries=1 a killed connection is not retried: StoreError, naming the store."""
    app_name = f"keel_once_{schema}"
    store = PostgresStore(
        store_url(schema, application_name=app_name, retries="1", pool_min="1", pool_max="1")
    )
    try:
        task = await store.create()
        assert terminate(app_name) >= 1
        with pytest.raises(StoreError, match="gave up after 1 tries") as info:
            await store.get(task.task_id)
        assert schema in str(info.value)
        # The broken connection was discarded: the next call gets a new one.
        assert (await store.get(task.task_id)).task_id == task.task_id
    finally:
        await store.close()
