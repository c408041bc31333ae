"""PostgreSQL restarted under a running fleet: workers and a front end ride through it.

On a private throwaway cluster (never the shared server), two ``keel worker`` processes
and one ``keel serve --no-worker`` front end run tasks that an MCP client keeps creating
through the front end. Mid-run the server is stopped — once with ``pg_ctl stop -m fast``
(every session ended with admin_shutdown), once with ``-m immediate`` (a crash: the next
start replays the WAL) — and started again after a moment. Nobody touches the Keel
processes: afterwards they are the same processes, and every task the front end
acknowledged completed exactly once, its steps recorded once, with no lease lost (the
outage is shorter than the lease) and nothing lost or made twice.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import anyio
import pytest

from acceptance.apps.harness import WorkerProcess, eventually, fleet
from keel.store import open_store

from .cluster import PrivateCluster
from .support import (
    APP,
    CLAIMED,
    FrontEnd,
    FrontEnds,
    Ledger,
    all_task_ids,
    app_env,
    check_task,
    create_task,
    mcp_client,
    read_back,
    read_effects,
    until_ready,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

LEASE = 5.0  # seconds: longer than the outage, so no live worker may lose a lease
STEPS = 2
WORK_MS = 10.0
TASKS = 600  # acknowledged creations wanted in all
RESTART_AT = (150, 350)  # restart once this many tasks were acknowledged
OUTAGES: tuple[Literal["fast", "immediate"], ...] = ("fast", "immediate")
DOWNTIME = 1.0  # seconds the server stays down (the scenario, not a wait for a condition)
CREATE_TIMEOUT = 120.0  # seconds for all the creations, outages included
DRAIN_TIMEOUT = 90.0  # seconds for every task to finish after that


async def test_workers_and_front_end_ride_through_postgres_restarts(
    tmp_path: Path, private_cluster: PrivateCluster
) -> None:
    """Stop the cluster (fast, then immediate) twice under load and start it again: the
    same worker and front-end processes finish every task, each exactly once."""
    cluster = private_cluster
    url = cluster.url("postgres", schema="keel_restart", pool_max="3")
    effects = tmp_path / "effects.jsonl"
    env = app_env(effects, lease=LEASE)
    acknowledged: list[str] = []
    failures: list[str] = []
    restarted_at: list[float] = []

    store = open_store(url)
    await store.list(limit=1)  # the schema exists before the processes start
    try:
        with fleet() as workers, FrontEnds() as front_ends:
            front_ends.append(FrontEnd(store=url, name="fe", logs=tmp_path, env=env))
            workers.extend(
                WorkerProcess(
                    store=url, worker_id=f"w{n}", logs=tmp_path, env=env, concurrency=4, app=APP
                )
                for n in range(2)
            )
            await front_ends[0].ready()
            for w in workers:
                await until_ready(w)

            reached = {threshold: anyio.Event() for threshold in RESTART_AT}

            async def create() -> None:
                while len(acknowledged) < TASKS:
                    try:
                        async with mcp_client(front_ends[0].url) as client:
                            while len(acknowledged) < TASKS:
                                task_id = await create_task(
                                    client, "pg_steps", {"steps": STEPS, "work_ms": WORK_MS}
                                )
                                acknowledged.append(task_id)
                                if len(acknowledged) in reached:
                                    reached[len(acknowledged)].set()
                    except Exception as exc:
                        # An outage may fail a call (then the task may or may not exist).
                        failures.append(f"{type(exc).__name__}: {exc}")
                        await anyio.sleep(0.1)

            async def outages() -> None:
                for threshold, mode in zip(RESTART_AT, OUTAGES, strict=True):
                    await reached[threshold].wait()
                    await anyio.to_thread.run_sync(cluster.stop, mode)
                    await anyio.sleep(DOWNTIME)
                    await anyio.to_thread.run_sync(cluster.start)
                    restarted_at.append(time.time())

            with anyio.fail_after(CREATE_TIMEOUT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(create)
                    tg.start_soon(outages)
            assert len(restarted_at) == len(OUTAGES)
            # The outages hit live sessions: fast ended them, immediate forced a recovery.
            log = cluster.log.read_text(errors="replace")
            assert log.count("terminating connection due to administrator command") >= 3, log
            assert "automatic recovery in progress" in log, log

            async def all_done() -> bool | None:
                ids = await all_task_ids(store)
                seen = await store.statuses(ids)
                return True if all(s.terminal for s, _ in seen.values()) else None

            await eventually(all_done, within=DRAIN_TIMEOUT, what="every task", every=0.25)

            # No operator action: the very processes started above did all of it.
            assert front_ends[0].alive, front_ends[0].output()
            for w in workers:
                assert w.alive, w.output()
                assert w.terminate() == 0, w.output()
                text = w.log_path.read_text()
                assert " raised " not in text, w.output()  # no attempt crashed

        ids = await all_task_ids(store)
        assert set(acknowledged) <= set(ids), "a task the front end acknowledged is gone"
        assert len(ids) - len(acknowledged) <= len(failures), (len(ids), failures)
        by_task = read_effects(effects)
        seen = await read_back(store, ids)
        ledger = Ledger()  # nobody was killed: any recovered lease fails the check
        claimed_after_last_restart = set()
        for task_id in ids:
            task, history, steps = seen[task_id]
            check_task(
                task_id, task.status, task.result, history, steps, by_task[task_id], STEPS, ledger
            )
            claimed_after_last_restart.update(
                e.actor for e in history if CLAIMED.fullmatch(e.reason) and e.at > restarted_at[-1]
            )
        # Both workers kept claiming after the server came back the second time.
        assert claimed_after_last_restart == {"worker:w0", "worker:w1"}, claimed_after_last_restart
    finally:
        await store.close()
    print(
        f"{len(ids)} tasks ({len(acknowledged)} acknowledged); {len(failures)} failed calls "
        f"during the outages: {failures[:3]}; {dict(ledger.stats)}"
    )
