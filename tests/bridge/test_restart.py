"""Acceptance: a diagnosis survives its worker being SIGKILLed mid-way.

A real ``keel worker --app keel.bridge:app`` process runs ``diagnose_root_cause`` at a
slow pace; once some phases are checkpointed it is SIGKILLed; a new worker process takes
the task over when the lease expires. The phases recorded before the kill are not
computed again (their checkpoints still name the killed worker, with the same timings),
the rest are computed by the new worker, and the result equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from acceptance.apps.harness import WorkerProcess, eventually, fleet
from keel.bridge import SEED_DEPLOY, SEED_INCIDENT
from keel.bridge.core import open_bridge
from keel.bridge.diagnosis import PHASES, run_diagnosis
from keel.model import Status
from keel.store import SqliteStore

from .conftest import DatasetFactory

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WAIT = 90.0  # seconds for the whole diagnosis, the lease expiry and the takeover
PACE = "0.6"  # seconds per phase: slow enough to kill the worker between two phases
LEASE = "2"  # seconds: the killed worker's lease expires quickly


async def test_killed_worker_mid_diagnosis_recomputes_nothing_already_checkpointed(
    dataset: DatasetFactory, tmp_path: Path
) -> None:
    """SIGKILL after >= 3 checkpointed phases; a new worker finishes with the same
    result as an uninterrupted run, recomputing none of the phases done before."""
    settings = dataset(7)
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    env.update(
        KEEL_BRIDGE_DATA=str(settings.data_dir.resolve()),
        KEEL_BRIDGE_PACE=PACE,
        KEEL_BRIDGE_LEASE=LEASE,
        PYTHONUNBUFFERED="1",
    )
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    try:
        with fleet() as workers:
            old = WorkerProcess(
                store=db, worker_id="old", logs=tmp_path, env=env, app="keel.bridge:app"
            )
            workers.append(old)
            old.wait_ready()
            task = await store.create(
                name="diagnose_root_cause",
                arguments={"incident_id": SEED_INCIDENT, "service": "payments"},
                max_attempts=5,
            )

            async def three_phases() -> dict[str, Any] | None:
                steps = dict(await store.steps(task.task_id))
                return steps if len(steps) >= 3 else None

            await eventually(three_phases, within=WAIT, what="three checkpointed phases")
            assert old.kill() == -signal.SIGKILL, old.output()
            before = dict(await store.steps(task.task_id))
            assert 3 <= len(before) < len(PHASES), "killed mid-way"
            assert {s["worker"] for s in before.values()} == {"old"}

            new = WorkerProcess(
                store=db, worker_id="new", logs=tmp_path, env=env, app="keel.bridge:app"
            )
            workers.append(new)
            new.wait_ready()

            async def finished() -> Any:
                current = await store.get(task.task_id)
                assert current.status not in {Status.FAILED, Status.CANCELLED}, current.error
                return current if current.status is Status.COMPLETED else None

            done = await eventually(finished, within=WAIT, what="the diagnosis to complete")
            after = dict(await store.steps(task.task_id))
            assert set(after) == {name for name, _ in PHASES}
            for name, recorded in before.items():
                assert after[name] == recorded, f"phase {name} was computed again"
            assert {after[n]["worker"] for n in set(after) - set(before)} == {"new"}
            assert new.terminate() == 0, new.output()
            assert "Traceback" not in new.log_path.read_text()
            history = await store.history(task.task_id)
            assert any("expired" in e.reason for e in history), [e.reason for e in history]

        assert done.result is not None
        result = done.result["structuredContent"]
        assert result["root_cause"]["deploy_id"] == SEED_DEPLOY
        uninterrupted = run_diagnosis(open_bridge(settings), SEED_INCIDENT, "payments")
        assert result == json.loads(json.dumps(uninterrupted))
    finally:
        await store.close()
