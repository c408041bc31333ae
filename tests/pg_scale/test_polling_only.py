"""With notifications off (``?notify=off``), workers find every task by polling alone.

Two ``keel worker`` processes and a ``keel serve --no-worker`` front end run with
``notify=off``; tasks are created over MCP through the front end, in bursts with pauses
between them (so that workers go idle and must find the next burst by polling). Every
task completes, exactly once. ``pg_stat_activity`` shows that none of the processes
holds a LISTEN session — while the same check finds the LISTEN session of a worker
started with notifications on, so it would have seen one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import anyio
import psycopg
import pytest

from acceptance.apps.harness import WorkerProcess, eventually, fleet
from keel.store import open_store
from postgres.pg import BASE_URL

from .support import (
    APP,
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

LEASE = 5.0  # seconds
BURSTS = 6
PER_BURST = 40
PAUSE = 1.5  # seconds between bursts: longer than a claim poll, so workers go idle
DRAIN_TIMEOUT = 60.0  # seconds


def listen_sessions(application_name: str) -> list[str]:
    """The last statement of each session of ``application_name`` that ran LISTEN."""
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchall()
    return [q for (q,) in rows if q.lstrip().upper().startswith("LISTEN")]


async def test_every_task_completes_with_notifications_off(
    tmp_path: Path, pg_url: Callable[..., str]
) -> None:
    """Bursts of tasks created over MCP with ``notify=off`` everywhere: all complete,
    exactly once, and no process of the fleet LISTENs."""
    quiet = f"keel_poll_{secrets.token_hex(4)}"
    loud = f"keel_listen_{secrets.token_hex(4)}"
    url = pg_url(notify="off", pool_max="3", application_name=quiet)
    effects = tmp_path / "effects.jsonl"
    env = app_env(effects, lease=LEASE)
    created: list[str] = []

    store = open_store(url)
    await store.list(limit=1)
    try:
        with fleet() as workers, FrontEnds() as front_ends:
            front_ends.append(FrontEnd(store=url, name="fe", logs=tmp_path, env=env))
            workers.extend(
                WorkerProcess(
                    store=url, worker_id=f"w{n}", logs=tmp_path, env=env, concurrency=4, app=APP
                )
                for n in range(2)
            )
            # The control: a worker with notifications on, in an app that has another task
            # name (so it takes none of these tasks), does LISTEN, and the check sees it.
            control = WorkerProcess(
                store=pg_url(pool_max="1", application_name=loud),
                worker_id="control",
                logs=tmp_path,
                env=env,
                concurrency=1,
                app="pg_scale_app:other",
            )
            workers.append(control)
            await front_ends[0].ready()
            for w in workers:
                await until_ready(w)

            async def control_listens() -> bool | None:
                return True if listen_sessions(loud) else None

            await eventually(control_listens, within=30, what="the control worker's LISTEN")
            async with mcp_client(front_ends[0].url) as client:
                for _ in range(BURSTS):
                    for _ in range(PER_BURST):
                        task_id = await create_task(client, "pg_steps", {"steps": 1, "work_ms": 1})
                        created.append(task_id)
                    assert listen_sessions(quiet) == []
                    await anyio.sleep(PAUSE)  # the scenario: idle workers between bursts

            async def all_done() -> bool | None:
                seen = await store.statuses(created)
                return True if all(s.terminal for s, _ in seen.values()) else None

            await eventually(all_done, within=DRAIN_TIMEOUT, what="every task", every=0.1)
            assert listen_sessions(quiet) == []
            for w in workers:
                assert w.terminate() == 0, w.output()

        assert sorted(await all_task_ids(store)) == sorted(created)
        by_task = read_effects(effects)
        seen = await read_back(store, created)
        ledger = Ledger()
        for task_id in created:
            task, history, steps = seen[task_id]
            check_task(
                task_id, task.status, task.result, history, steps, by_task[task_id], 1, ledger
            )
    finally:
        await store.close()
