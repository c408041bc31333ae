"""Acceptance: ``keel worker`` processes SIGKILLed at random moments, again and again.

Three worker processes share one SQLite file and run ``multi_step`` tasks (four
checkpointed steps; each step appends a fsynced line to a side-effect file outside the
store, in the middle of a few ms of work). The test keeps a backlog of tasks, SIGKILLs a
seeded random worker at a seeded random moment, restarts it under a new worker id, and
repeats; then it lets every task finish and checks the store, the history and the
side-effect file against each other.

What ``ctx.step`` can honestly promise, and what this test proves, is:

* every task completes exactly once, with the results its steps recorded;
* every step's function ran at least once, and its result was recorded exactly once;
  once recorded it is never run again (later attempts replay the record);
* a step's effect is repeated only in one window: the attempt was killed after the
  function's effect happened and before ``save_step`` committed its result. So a
  duplicate is always the last thing a killed attempt did, and at most one per killed
  attempt. This is the at-least-once window that no store can close for an effect
  outside its own transaction (the effect would have to be idempotent, or be written in
  the store's transaction);
* attempts never overlap (no effect of an older fence after one of a newer fence) and
  no effect is made outside a lease the history shows;
* history explains every retry: each attempt but the last ended with the recovery of
  an expired lease held by a worker this test killed, and attempt numbers count them
  (a live worker never loses a lease: this once caught the watch-loop race that
  ``test_worker_watch_race.py`` now guards).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from keel.store import SqliteStore

from .apps.harness import WorkerProcess, eventually, fleet, worker_env
from .checks import Ledger, check_task, read_effects

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SEED = int(os.environ.get("KEEL_CRASH_SEED", "20261201"))  # fixed; override to explore
KILLS = 36
WORKERS = 3  # processes alive at once
CONCURRENCY = 2  # attempts per worker process
LEASE = 1.5  # seconds: a killed worker's tasks are recovered soon after this
STEPS = 4
WORK_MS = 20.0  # per step; the effect is written half way through
BACKLOG = 60  # unfinished tasks kept in the store while killing, so workers are busy
KILL_DELAY = (0.05, 0.7)  # seconds after the victim is ready (or since the last kill)
DRAIN_TIMEOUT = 60.0  # seconds for every task to finish once the killing stops


@dataclass
class Run(Ledger):
    """What the test did, to check the store against: the checks' ledger (workers
    SIGKILLed, those whose kill cut an attempt short, counts) and the tasks created."""

    task_ids: list[str] = field(default_factory=list)


async def test_killed_workers_finish_every_task_once_and_replay_recorded_steps(
    tmp_path: Path,
) -> None:
    """SIGKILL one of three ``keel worker`` processes at a seeded random moment 36 times,
    restarting it each time, while they run four-step tasks on one SQLite file.

    Then every task completes exactly once with its recorded step results; each step ran
    at least once and was recorded once, and never ran again after it was recorded; a
    repeated effect happened only when a killed attempt had made it but not committed
    it (the last thing that attempt did, at most once per killed attempt); attempts
    never overlapped; every effect was made under a lease the history shows; and
    history explains every retry as the recovery of a killed worker's lease, with
    attempt numbers counting them. The kills must have interrupted attempts (two thirds
    of them at least), and the repeat window must have been hit at least once, or the
    run proved nothing about it. Seeded (``KEEL_CRASH_SEED``) and quoted on failure.
    """
    rng = random.Random(SEED)
    schedule = [(rng.randrange(WORKERS), rng.uniform(*KILL_DELAY)) for _ in range(KILLS)]
    db, effects = tmp_path / "keel.db", tmp_path / "effects.jsonl"
    env = worker_env(effects, lease=LEASE)
    run = Run()
    generation = Counter[int]()
    started = time.monotonic()

    def start(slot: int) -> WorkerProcess:
        worker_id = f"w{slot}g{generation[slot]}"
        generation[slot] += 1
        return WorkerProcess(
            store=db, worker_id=worker_id, logs=tmp_path, env=env, concurrency=CONCURRENCY
        )

    store = SqliteStore(db)
    unfinished: set[str] = set()

    async def top_up() -> None:
        seen = await store.statuses(list(unfinished))
        unfinished.difference_update(t for t, (s, _) in seen.items() if s.terminal)
        for _ in range(BACKLOG - len(unfinished)):
            task = await store.create(
                name="multi_step",
                arguments={"steps": STEPS, "work_ms": WORK_MS},
                max_attempts=1_000,
            )
            run.task_ids.append(task.task_id)
            unfinished.add(task.task_id)

    try:
        with fleet() as workers:
            await top_up()
            slots = [start(slot) for slot in range(WORKERS)]
            workers.extend(slots)
            for n, (slot, delay) in enumerate(schedule):
                victim = slots[slot]
                victim.wait_ready()
                await top_up()
                await anyio.sleep(delay)  # the point of the test: a random moment
                code = victim.kill()
                assert code == -signal.SIGKILL, (
                    f"kill {n}: {victim.worker_id} was not killed (exit {code}); seed {SEED}\n"
                    + victim.output()
                )
                run.killed.add(victim.worker_id)
                run.stats["kills"] += 1
                slots[slot] = start(slot)
                workers.append(slots[slot])

            async def all_done() -> bool | None:
                seen = await store.statuses(run.task_ids)
                return True if all(s.terminal for s, _ in seen.values()) else None

            await eventually(all_done, within=DRAIN_TIMEOUT, what=f"every task (seed {SEED})")
            for w in slots:  # a graceful stop, with nothing left to run
                w.wait_ready()
                assert w.terminate() == 0, w.output()
            for w in workers:
                text = w.log_path.read_text()
                assert "Traceback" not in text, w.output()
                assert " raised " not in text, w.output()  # no attempt crashed

        assert store.integrity_check() == "ok"
        by_task = read_effects(effects)
        assert set(by_task) == set(run.task_ids)
        for task_id in run.task_ids:
            task = await store.get(task_id)
            history = list(await store.history(task_id))
            steps = dict(await store.steps(task_id))
            try:
                check_task(
                    task_id, task.status, task.result, history, steps, by_task[task_id], STEPS, run
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n[seed {SEED}; rerun with KEEL_CRASH_SEED]") from exc
    finally:
        await store.close()

    stats = run.stats
    print(
        f"seed {SEED}: {len(run.task_ids)} tasks, {len(run.interrupting)} kills mid-task, "
        f"{dict(sorted(stats.items()))}, "
        f"{time.monotonic() - started:.1f}s"
    )
    assert stats["kills"] == KILLS
    # The kills landed mid-task: most cut at least one attempt short …
    assert len(run.interrupting) >= KILLS * 2 // 3, (len(run.interrupting), stats)
    # … and the repeat window was hit, so the checks above saw it handled.
    assert stats["effects_repeated"] >= 1, stats
