"""Acceptance: a task waiting for input outlives every worker process.

A task parks in ``input_required`` (its handler asked the user through ``ctx.elicit``),
every ``keel worker`` is SIGKILLed, a new worker process starts, the input is given, and
the task completes with it: the step before the question is replayed, not redone, and
waiting cost no attempt and left no lease to recover.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from keel.model import Status, Task
from keel.store import SqliteStore

from .apps.harness import WorkerProcess, eventually, fleet, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WAIT = 30.0  # seconds for a worker to run a task to its next state


async def reach(store: SqliteStore, task_id: str, status: Status) -> Task:
    """Poll (bounded) until the task has ``status``; fail at once if it ends otherwise."""

    async def probe() -> Task | None:
        task = await store.get(task_id)
        if task.status.terminal and task.status is not status:
            raise AssertionError(f"{task_id} ended {task.status.value}: {task.error}")
        return task if task.status is status else None

    return await eventually(probe, within=WAIT, what=f"{task_id} to be {status.value}")


def effects_of(path: Path, task_id: str) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["task"] == task_id]


async def test_parked_task_completes_with_input_given_after_every_worker_was_killed(
    tmp_path: Path,
) -> None:
    """Two tasks park in ``input_required`` on two workers; both workers are SIGKILLed.

    The parked tasks hold no lease and nothing happens to them. One task is answered
    while no worker runs; a new worker process starts; the other is answered. Both
    complete with their own answers; the step before the question ran exactly once (on
    a killed worker) and its recorded result is what the new worker used; the step after
    ran once, on the new worker. History reads: created, claimed, waiting for input,
    input provided, claimed again, completed; the attempt number stayed 1 (waiting is
    not a failed attempt) and no lease was ever recovered.
    """
    db, effects = tmp_path / "keel.db", tmp_path / "effects.jsonl"
    env = worker_env(effects)
    store = SqliteStore(db)
    try:
        with fleet() as workers:
            for n in range(2):
                workers.append(WorkerProcess(store=db, worker_id=f"old{n}", logs=tmp_path, env=env))
            for w in workers:
                w.wait_ready()
            early = await store.create(name="ask", arguments={"topic": "INC-7"}, max_attempts=3)
            late = await store.create(name="ask", arguments={"topic": "INC-8"}, max_attempts=3)
            for task in (early, late):
                parked = await reach(store, task.task_id, Status.INPUT_REQUIRED)
                assert parked.lease_owner is None
                assert list(parked.pending_input) == ["input-1"]
                assert (
                    parked.status_message == f"Which service is behind {task.arguments['topic']}?"
                )

            for w in workers:
                assert w.kill() == -signal.SIGKILL, w.output()
            assert await store.recover_expired() == []  # no lease was left behind

            await store.provide_input(early.task_id, {"input-1": {"service": "payments"}})
            assert (await store.get(early.task_id)).status is Status.WORKING
            new = WorkerProcess(store=db, worker_id="new", logs=tmp_path, env=env)
            workers.append(new)
            new.wait_ready()
            await store.provide_input(late.task_id, {"input-1": {"service": "search"}})

            for task, service in ((early, "payments"), (late, "search")):
                done = await reach(store, task.task_id, Status.COMPLETED)
                assert done.result is not None
                result = done.result["structuredContent"]
                assert result["service"] == service
                assert done.attempt == 1, "waiting for input must not count as an attempt"
                assert done.fence == 2

                steps = await store.steps(task.task_id)
                lines = effects_of(effects, task.task_id)
                assert [(r["step"], r["worker"]) for r in lines] == [
                    ("before", steps["before"]["worker"]),
                    ("after", "new"),
                ], "each step ran exactly once, the first on a killed worker"
                assert steps["before"]["worker"] in {"old0", "old1"}
                assert lines[0] == steps["before"]
                assert lines[1] == steps["after"]
                assert lines[1]["service"] == service
                assert result["before"] == lines[0]["nonce"], "the recorded step was replayed"
                assert result["after"] == lines[1]["nonce"]

                history = await store.history(task.task_id)
                moves = [(e.from_status, e.to_status, e.actor) for e in history]
                old = f"worker:{steps['before']['worker']}"
                assert moves == [
                    (None, Status.WORKING, "client"),
                    (Status.WORKING, Status.WORKING, old),  # claimed, fence 1
                    (Status.WORKING, Status.INPUT_REQUIRED, old),  # asked
                    (Status.INPUT_REQUIRED, Status.WORKING, "client"),  # answered
                    (Status.WORKING, Status.WORKING, "worker:new"),  # claimed, fence 2
                    (Status.WORKING, Status.COMPLETED, "worker:new"),
                ], history
                assert "attempt 1/3, fence 2" in history[4].reason
                assert not any("expired" in e.reason for e in history)

            assert new.terminate() == 0, new.output()
            assert "Traceback" not in new.log_path.read_text()
    finally:
        await store.close()
