"""A worker whose connection pool is far smaller than the work it runs: no deadlock.

One ``keel worker`` with ``?pool_max=2`` runs 12 slow handlers at once, each writing
its status line every few milliseconds (so that store calls always queue for the two
connections), on top of the worker's own lease renewals, cancel watch, claims and
recovery sweeps; more tasks wait behind them. The test then cancels the running tasks
one by one from another process: each cancel reaches its handler (its ``finally`` runs)
within a bound, and each freed slot is filled by a claim of a waiting task, so neither
cancels nor claims are starved. No lease is lost meanwhile, and the worker stops
cleanly at the end.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from acceptance.apps.harness import WorkerProcess, eventually, fleet
from keel.model import Status
from keel.store import open_store
from postgres.pg import BASE_URL

from .support import APP, RECOVERED, app_env, read_effects, until_ready

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

LEASE = 3.0  # seconds
CONCURRENCY = 12  # handlers at once, on a pool of two connections
WAITING = 8  # tasks queued behind the running ones
EVERY_MS = 5.0  # how often each handler writes its status line
CANCEL_BOUND = 10.0  # seconds for a cancel to reach its handler, under this contention
CLAIM_BOUND = 10.0  # seconds for a freed slot to be filled


def sessions(application_name: str) -> int:
    """How many server sessions ``application_name`` holds."""
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_cancels_and_claims_get_through_an_exhausted_pool(
    tmp_path: Path, pg_url: Callable[..., str]
) -> None:
    """Cancel 12 busy handlers one at a time through a worker's two-connection pool:
    every cancel reaches its handler, every freed slot takes a waiting task, no lease is
    lost, and the worker then stops gracefully."""
    name = f"keel_pool_{secrets.token_hex(4)}"
    url = pg_url(pool_max="2", application_name=name)
    effects = tmp_path / "effects.jsonl"
    store = open_store(pg_url())
    ids = [
        (await store.create(name="pg_churn", arguments={"every_ms": EVERY_MS}, max_attempts=3))
        for _ in range(CONCURRENCY + WAITING)
    ]
    task_ids = [t.task_id for t in ids]

    def marks(what: str) -> set[str]:
        return {
            task_id
            for task_id, lines in read_effects(effects).items()
            for line in lines
            if line["step"] == what
        }

    try:
        with fleet() as workers:
            worker = WorkerProcess(
                store=url,
                worker_id="busy",
                logs=tmp_path,
                env=app_env(effects, lease=LEASE),
                concurrency=CONCURRENCY,
                app=APP,
            )
            workers.append(worker)
            await until_ready(worker)

            async def full() -> set[str] | None:
                started = marks("started")
                return started if len(started) >= CONCURRENCY else None

            running = await eventually(full, within=30, what="every slot busy")
            assert len(running) == CONCURRENCY
            # Twelve busy handlers, and the worker holds no more than its pool of two
            # (plus its LISTEN connection): their store calls queue for a connection.
            assert 1 <= sessions(name) <= 3, sessions(name)
            cancelled: list[str] = []
            for n, task_id in enumerate(sorted(running)):
                await store.cancel(task_id, reason="pool test")
                cancelled.append(task_id)

                async def stopped(task_id: str = task_id) -> bool | None:
                    return True if task_id in marks("finally") else None

                await eventually(stopped, within=CANCEL_BOUND, what=f"cancel {n} to reach it")
                if n < WAITING:

                    async def refilled(want: int = CONCURRENCY + n + 1) -> bool | None:
                        return True if len(marks("started")) >= want else None

                    await eventually(refilled, within=CLAIM_BOUND, what=f"slot {n} refilled")
            for task_id in task_ids:
                if task_id not in cancelled:
                    await store.cancel(task_id, reason="end of test")

            async def all_stopped() -> bool | None:
                return True if marks("finally") >= marks("started") else None

            await eventually(all_stopped, within=CANCEL_BOUND, what="every handler to stop")
            assert worker.terminate() == 0, worker.output()
            assert " raised " not in worker.log_path.read_text(), worker.output()

        assert marks("started") == set(task_ids)  # every waiting task got a slot
        for task_id in task_ids:
            task = await store.get(task_id)
            assert task.status is Status.CANCELLED, task
            history = await store.history(task_id)
            assert [e.to_status for e in history].count(Status.CANCELLED) == 1, history
            assert not [e for e in history if RECOVERED.match(e.reason)], (
                f"a live worker lost a lease: {history}"
            )
        for lines in read_effects(effects).values():
            assert [line["step"] for line in lines] == ["started", "finally"], lines
    finally:
        await store.close()
