"""Acceptance: ``keel worker`` as an operator meets it, at its edges.

Refusals are exit code 1 with one ``keel: error: …`` line and no traceback, and leave no
store behind; SIGTERM (or Ctrl-C) is a graceful stop with exit code 0 that gives a
running task back: history says it was released, the attempt number is unchanged, and
another worker takes it at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from keel.model import Status, Task
from keel.store import SqliteStore

from .apps.harness import APPS, KEEL, WorkerProcess, eventually, fleet, worker_env

# slow: every test starts real keel worker processes
pytestmark = pytest.mark.slow

TIMEOUT = 60  # seconds; a hung command is a failure, not a stuck run
WAIT = 30.0  # seconds for a worker to reach a state


def keel_worker(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``keel worker ARGS`` in the apps folder; expect exit 1 with exactly one
    ``keel: error:`` line and no traceback; return the error text."""
    result = subprocess.run(
        [str(KEEL), "worker", *args],
        cwd=APPS,
        env=env or worker_env(tmp_path / "effects.jsonl"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    assert result.stdout == "", output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("keel: error: "), output
    return lines[0].removeprefix("keel: error: ")


def test_malformed_app_is_a_usage_error(tmp_path: Path) -> None:
    """--app without MODULE:ATTR is a usage error (exit 2) naming the option."""
    result = subprocess.run(
        [str(KEEL), "worker", "--app", "steps_app"],
        cwd=APPS,
        env=worker_env(tmp_path / "effects.jsonl"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "--app" in result.stderr
    assert "MODULE:ATTR" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module:app", "cannot import 'no_such_module'"),
        ("steps_app:nope", "'steps_app:nope' is not a keel.runtime.Keel (got NoneType)"),
        ("steps_app:SERVICE", "'steps_app:SERVICE' is not a keel.runtime.Keel (got dict)"),
    ],
)
def test_unknown_app_is_one_line_error(tmp_path: Path, spec: str, message: str) -> None:
    """An --app whose module or attribute is missing, or not a Keel, exits 1 with one
    line naming it, before any store is opened or created."""
    db = tmp_path / "keel.db"
    assert message in keel_worker(tmp_path, "--app", spec, "--store", str(db))
    assert not db.exists()


@pytest.mark.parametrize("via", ["option", "environment"])
def test_memory_store_is_refused(tmp_path: Path, via: str) -> None:
    """``memory://`` (by --store or $KEEL_STORE) exits 1: no other process could see it."""
    if via == "option":
        error = keel_worker(tmp_path, "--app", "steps_app:app", "--store", "memory://")
    else:
        env = worker_env(tmp_path / "effects.jsonl", KEEL_STORE="memory://")
        error = keel_worker(tmp_path, "--app", "steps_app:app", env=env)
    assert "cannot use memory://" in error


@pytest.mark.parametrize("store", ["not-a-database.db", "missing-parent/file.db"])
def test_store_that_cannot_be_opened_is_one_line_error(tmp_path: Path, store: str) -> None:
    """A store that is not a Keel SQLite file, or whose folder cannot be made, exits 1
    with one line naming the store (and no ready line claiming the worker runs)."""
    (tmp_path / "not-a-database.db").write_text("not sqlite\n")
    (tmp_path / "missing-parent").write_text("a file where the folder should be\n")
    error = keel_worker(tmp_path, "--app", "steps_app:app", "--store", str(tmp_path / store))
    assert store in error


def test_app_without_tasks_is_one_line_error(tmp_path: Path) -> None:
    """An app with no registered task exits 1 with one line saying there is nothing to run."""
    error = keel_worker(tmp_path, "--app", "empty_app:app", "--store", str(tmp_path / "k.db"))
    assert "registers no tasks" in error


async def _state(store: SqliteStore, task_id: str, status: Status, owner: str | None) -> Task:
    async def probe() -> Task | None:
        task = await store.get(task_id)
        return task if (task.status, task.lease_owner) == (status, owner) else None

    return await eventually(probe, within=WAIT, what=f"{task_id}: {status.value} on {owner}")


async def _effect(path: Path, task_id: str, step: str, worker: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        effects = anyio.Path(path)
        if not await effects.exists():
            return None
        for line in (await effects.read_text(encoding="utf-8")).splitlines():
            record = json.loads(line)
            if (record["task"], record["step"], record["worker"]) == (task_id, step, worker):
                return record
        return None

    return await eventually(probe, within=WAIT, what=f"{step} of {task_id} on {worker}")


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_graceful_stop_releases_the_running_task(tmp_path: Path, signum: int) -> None:
    """SIGTERM (or SIGINT) while a handler runs: the handler is cancelled (its
    ``finally`` runs), the task is released (history says so, lease gone, attempt still
    1), and the worker exits 0 without a traceback. Another worker claims it at once
    (attempt 1, fence 2); cancelling it there stops that handler too; that worker, told
    to stop, exits 0 and the task stays cancelled."""
    db, effects = tmp_path / "keel.db", tmp_path / "effects.jsonl"
    env = worker_env(effects, lease=30.0)  # a long lease: only the release frees the task
    store = SqliteStore(db)
    try:
        with fleet() as workers:
            first = WorkerProcess(store=db, worker_id="first", logs=tmp_path, env=env)
            workers.append(first)
            first.wait_ready()
            task = await store.create(name="hold", max_attempts=3)
            await _effect(effects, task.task_id, "started", "first")

            first.proc.send_signal(signum)
            assert first.wait() == 0, first.output()
            assert "Traceback" not in first.log_path.read_text(), first.output()
            await _effect(effects, task.task_id, "finally", "first")
            released = await store.get(task.task_id)
            assert released.status is Status.WORKING
            assert released.lease_owner is None
            assert (released.attempt, released.fence) == (1, 1)
            last = (await store.history(task.task_id))[-1]
            assert last.reason == "released by first: worker shutting down", last
            assert last.actor == "worker:first"

            second = WorkerProcess(store=db, worker_id="second", logs=tmp_path, env=env)
            workers.append(second)
            second.wait_ready()
            again = await _state(store, task.task_id, Status.WORKING, "second")
            assert (again.attempt, again.fence) == (1, 2)
            await _effect(effects, task.task_id, "started", "second")

            await store.cancel(task.task_id, reason="operator")
            await _effect(effects, task.task_id, "finally", "second")
            assert second.terminate() == 0, second.output()
            assert (await store.get(task.task_id)).status is Status.CANCELLED
            history = await store.history(task.task_id)
            assert history[-1].to_status is Status.CANCELLED
            assert not any("expired" in e.reason or "failed" in e.reason for e in history)
    finally:
        await store.close()
