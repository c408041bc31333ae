"""Scale-out on PostgreSQL: 4 ``keel worker`` processes and 2 ``keel serve --no-worker``
front ends on one database run 5,000 tasks while workers are SIGKILLed and restarted at
random.

The tasks are created over MCP, with the official client, through both front ends at
once (each call answers only once its task is committed). Each task runs two
checkpointed steps whose effects go to a file outside the store (see
``tests/acceptance/apps/pg_scale_app.py``). Meanwhile the test SIGKILLs a seeded random
worker at a seeded random moment and starts a new one in its place, again and again,
until every task is created; then it lets them all finish and checks the store, the
history and the effects against each other (:func:`~pg_scale.support.check_task`):
every task ends exactly once, no recorded step runs twice, and no write of a superseded
fence is accepted.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from acceptance.apps.harness import WorkerProcess, eventually, fleet
from keel.store import open_store

from .support import (
    APP,
    FrontEnd,
    FrontEnds,
    Ledger,
    all_task_ids,
    app_env,
    check_task,
    create_task,
    get_task,
    mcp_client,
    read_back,
    read_effects,
    until_ready,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

SEED = int(os.environ.get("KEEL_CRASH_SEED", "20261206"))  # fixed; override to explore
TASKS = int(os.environ.get("KEEL_PG_SCALE_TASKS", "5000"))  # the issue asks for 5,000
WORKERS = 4  # worker processes alive at once
CONCURRENCY = 8  # attempts per worker process
FRONT_ENDS = 2
CLIENTS_PER_FRONT_END = 4  # MCP clients creating tasks through each front end at once
LEASE = 2.0  # seconds: a killed worker's tasks are recovered soon after this
STEPS = 2
WORK_MS = 40.0  # per step, effect half way: workers always have attempts to cut short
MIN_KILLS = 10  # killing goes on until the tasks are all created, and at least this often
KILL_DELAY = (0.3, 1.5)  # seconds after the victim is ready (or since the last kill)
DRAIN_TIMEOUT = 120.0  # seconds for every task to finish once the killing stops
POOL = {"pool_max": "3"}  # 4 workers + 2 front ends + this test share a 100-connection server


async def test_killed_workers_on_postgres_finish_5000_tasks_exactly_once(
    tmp_path: Path, pg_url: Callable[..., str]
) -> None:
    """Four workers (SIGKILLed and restarted at seeded random moments) and two MCP front
    ends on one PostgreSQL schema run 5,000 two-step tasks created over MCP: each task
    completes exactly once with its recorded step results, written by the holder of its
    last fence; every retry is the recovery of a killed worker's lease; no recorded step
    ran again, and a step's effect repeated only where a killed attempt made it without
    recording it. Seeded (``KEEL_CRASH_SEED``) and quoted on failure."""
    url = pg_url(**POOL)
    rng = random.Random(SEED)
    effects = tmp_path / "effects.jsonl"
    env = app_env(effects, lease=LEASE)
    ledger = Ledger()
    generation = Counter[int]()
    created: list[str] = []
    started = time.monotonic()

    store = open_store(url)  # creates the schema before any process races to
    await store.list(limit=1)

    def start(slot: int) -> WorkerProcess:
        worker_id = f"w{slot}g{generation[slot]}"
        generation[slot] += 1
        return WorkerProcess(
            store=url, worker_id=worker_id, logs=tmp_path, env=env, concurrency=CONCURRENCY, app=APP
        )

    try:
        with fleet() as workers, FrontEnds() as front_ends:
            front_ends.extend(
                FrontEnd(store=url, name=f"fe{n}", logs=tmp_path, env=env)
                for n in range(FRONT_ENDS)
            )
            slots = [start(slot) for slot in range(WORKERS)]
            workers.extend(slots)
            for fe in front_ends:
                await fe.ready()
            for w in slots:
                await until_ready(w)

            creating_done = anyio.Event()
            per_client = TASKS // (FRONT_ENDS * CLIENTS_PER_FRONT_END)
            assert per_client * FRONT_ENDS * CLIENTS_PER_FRONT_END == TASKS

            async def creator(fe: FrontEnd) -> None:
                async with mcp_client(fe.url) as client:
                    for _ in range(per_client):
                        task_id = await create_task(
                            client, "pg_steps", {"steps": STEPS, "work_ms": WORK_MS}
                        )
                        created.append(task_id)

            async def create_all() -> None:
                async with anyio.create_task_group() as tg:
                    for fe in front_ends:
                        for _ in range(CLIENTS_PER_FRONT_END):
                            tg.start_soon(creator, fe)
                creating_done.set()

            async def killer() -> None:
                n = 0
                while not creating_done.is_set() or n < MIN_KILLS:
                    slot = rng.randrange(WORKERS)
                    victim = slots[slot]
                    await until_ready(victim)
                    await anyio.sleep(rng.uniform(*KILL_DELAY))  # the point: a random moment
                    code = victim.kill()
                    assert code == -signal.SIGKILL, (
                        f"kill {n}: {victim.worker_id} was not killed (exit {code}); "
                        f"seed {SEED}\n{victim.output()}"
                    )
                    ledger.killed.add(victim.worker_id)
                    ledger.stats["kills"] += 1
                    slots[slot] = start(slot)
                    workers.append(slots[slot])
                    n += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(create_all)
                tg.start_soon(killer)
            created_at = time.monotonic()
            assert len(created) == len(set(created)) == TASKS

            async def all_done() -> bool | None:
                seen = await store.statuses(created)
                return True if all(s.terminal for s, _ in seen.values()) else None

            await eventually(
                all_done, within=DRAIN_TIMEOUT, what=f"every task (seed {SEED})", every=0.25
            )
            drained_at = time.monotonic()

            # Front ends are stateless: each answers for tasks created through the other.
            async with mcp_client(front_ends[1].url) as client:
                for task_id in created[::100]:
                    assert (await get_task(client, task_id))["status"] == "completed"

            for w in slots:  # a graceful stop, with nothing left to run
                w.wait_ready()
                assert w.terminate() == 0, w.output()
            for w in workers:
                text = w.log_path.read_text()
                assert "Traceback" not in text, w.output()
                assert " raised " not in text, w.output()  # no attempt crashed
            for fe in front_ends:
                assert fe.alive, fe.output()

        # Exactly the tasks the front ends acknowledged: none lost, none made twice.
        assert sorted(await all_task_ids(store)) == sorted(created)
        by_task = read_effects(effects)
        assert set(by_task) == set(created)
        seen = await read_back(store, created)
        for task_id in created:
            task, history, steps = seen[task_id]
            try:
                check_task(
                    task_id, task.status, task.result, history, steps, by_task[task_id], STEPS,
                    ledger,
                )  # fmt: skip
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n[seed {SEED}; rerun with KEEL_CRASH_SEED]") from exc
    finally:
        await store.close()

    stats = ledger.stats
    print(
        f"seed {SEED}: {TASKS} tasks; created in {created_at - started:.1f}s, drained "
        f"{drained_at - created_at:.1f}s later; {len(ledger.interrupting)} kills mid-task; "
        f"{dict(sorted(stats.items()))}; {time.monotonic() - started:.1f}s in all"
    )
    assert stats["kills"] >= MIN_KILLS
    # The kills landed mid-task: most cut at least one attempt short.
    assert len(ledger.interrupting) >= stats["kills"] // 2, (len(ledger.interrupting), stats)
