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

import json
import os
import random
import re
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from keel.model import Event, Status
from keel.store import SqliteStore

from .apps.harness import WorkerProcess, eventually, fleet, worker_env

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

CLAIMED = re.compile(
    r"claimed by (?P<worker>\S+) \(attempt (?P<attempt>\d+)/\d+, fence (?P<fence>\d+)\)"
)
RECOVERED = re.compile(r"lease of (?P<worker>\S+) expired .* on attempt (?P<attempt>\d+)/")


@dataclass
class Claim:
    """One attempt of a task as its history tells it."""

    worker: str
    attempt: int
    fence: int
    ended_by: Event | None = None  # the event that ended it (None: still open)


@dataclass
class Run:
    """What the test did, to check the store against."""

    killed: set[str] = field(default_factory=set)  # worker ids SIGKILLed
    interrupting: set[str] = field(default_factory=set)  # … whose kill cut an attempt short
    task_ids: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)


def claims_of(task_id: str, history: list[Event]) -> list[Claim]:
    """Parse the task's attempts from its history, checking that each is explained.

    Every claim must follow the creation or the end of the previous attempt, and every
    attempt except the last must have ended by recovery of its expired lease.
    """
    claims: list[Claim] = []
    assert history[0].from_status is None, history[0]
    assert history[0].reason == "created", history[0]
    for event in history[1:]:
        if m := CLAIMED.fullmatch(event.reason):
            assert not claims or claims[-1].ended_by is not None, (
                f"{task_id}: claimed while an attempt was open: {history}"
            )
            claim = Claim(m["worker"], int(m["attempt"]), int(m["fence"]))
            assert event.actor == f"worker:{claim.worker}", event
            claims.append(claim)
        elif m := RECOVERED.match(event.reason):
            assert claims, f"{task_id}: {history}"
            assert claims[-1].ended_by is None, f"{task_id}: {history}"
            assert m["worker"] == claims[-1].worker, event
            assert int(m["attempt"]) == claims[-1].attempt, event
            assert (event.from_status, event.to_status) == (Status.WORKING, Status.WORKING)
            assert event.actor == "recovery", event
            claims[-1].ended_by = event
        elif event.to_status is Status.COMPLETED:
            assert claims, f"{task_id}: {history}"
            assert claims[-1].ended_by is None, f"{task_id}: {history}"
            assert event.actor == f"worker:{claims[-1].worker}", event
            claims[-1].ended_by = event
        else:
            raise AssertionError(f"{task_id}: history has an unexplained event {event}")
    return claims


def read_effects(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The side-effect lines, by task, in the order they were appended."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), "a side-effect line was torn"
    for line in text.splitlines():
        record = json.loads(line)
        by_task[record["task"]].append(record)
    return by_task


def check_task(
    task_id: str,
    status: Status,
    result: Any,
    history: list[Event],
    steps: dict[str, Any],
    effects: list[dict[str, Any]],
    run: Run,
) -> None:
    """Check one task's outcome, history, recorded steps and side effects together."""
    stats = run.stats
    assert status is Status.COMPLETED, f"{task_id} ended {status}: {history}"
    # Finished exactly once: one completion, the last event, by the last attempt.
    completions = [e for e in history if e.to_status is Status.COMPLETED]
    assert len(completions) == 1, history
    assert history[-1] is completions[0], history

    claims = claims_of(task_id, history)
    by_fence = {c.fence: c for c in claims}
    assert [c.fence for c in claims] == sorted(by_fence), f"{task_id}: fences not increasing"
    assert [c.attempt for c in claims] == list(range(1, len(claims) + 1)), (
        f"{task_id}: every attempt number counts one recovery: {history}"
    )
    for claim in claims[:-1]:  # ended by recovery: only a worker this test killed
        assert claim.worker in run.killed, f"{task_id}: a live worker lost its lease: {history}"
        run.interrupting.add(claim.worker)
        stats["attempts_interrupted"] += 1
    stats["tasks_retried"] += len(claims) > 1

    # Every step recorded once; the result is built from the recorded values (replay).
    names = [f"step-{n}" for n in range(STEPS)]
    assert sorted(steps) == names, f"{task_id}: recorded steps {sorted(steps)}"
    recorded = [steps[name] for name in names]
    assert result["structuredContent"]["nonces"] == [r["nonce"] for r in recorded], (
        f"{task_id}: the result does not use the recorded step results"
    )
    assert result["structuredContent"]["fence"] == claims[-1].fence

    # Each recorded result is the return value of a line in the effects file, made by the
    # attempt whose fence it carries, on the worker that held that fence.
    nonces = Counter(e["nonce"] for e in effects)
    for rec in recorded:
        assert nonces[rec["nonce"]] == 1, f"{task_id}: recorded effect {rec} not in the file"
        assert by_fence[rec["fence"]].worker == rec["worker"], rec
    assert [r["fence"] for r in recorded] == sorted(r["fence"] for r in recorded)

    # Side effects, in the order they were made.
    fences = [e["fence"] for e in effects]
    assert fences == sorted(fences), f"{task_id}: attempts overlapped: {effects}"
    recorded_nonces = {r["nonce"] for r in recorded}
    for fence, claim in by_fence.items():
        mine = [e for e in effects if e["fence"] == fence]
        assert all(e["worker"] == claim.worker for e in mine), f"{task_id}: {mine}"
        assert all(e["attempt"] == claim.attempt for e in mine), f"{task_id}: {mine}"
        # An attempt runs exactly the steps not recorded when it started, in order:
        # recorded steps are replayed, never recomputed.
        done_before = sum(1 for r in recorded if r["fence"] < fence)
        ran = [e["step"] for e in mine]
        assert ran == names[done_before : done_before + len(ran)], (
            f"{task_id}: fence {fence} ran {ran} with {done_before} steps recorded before it"
        )
        unrecorded = [e for e in mine if e["nonce"] not in recorded_nonces]
        if unrecorded:
            # The window: the effect happened, its result was not committed, the attempt
            # died right there. Only a killed attempt, only its last effect, at most one.
            assert len(unrecorded) == 1, f"{task_id}: fence {fence} lost {unrecorded}"
            assert mine[-1] is unrecorded[0], f"{task_id}: fence {fence} went on: {mine}"
            assert claim.ended_by is not None, claim
            assert claim.ended_by.actor == "recovery", claim
            assert claim.worker in run.killed, claim
            stats["effects_repeated"] += 1
    stats["effects"] += len(effects)
    for name in names:
        assert sum(1 for e in effects if e["step"] == name) >= 1, f"{task_id}: {name} never ran"


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
                check_task(task_id, task.status, task.result, history, steps, by_task[task_id], run)
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
