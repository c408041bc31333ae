"""Acceptance: the file is the store, with real ``keel serve`` and ``keel worker``
processes.

* SIGTERM (or SIGINT) to ``keel serve`` (HTTP or stdio) or ``keel worker`` while it runs
  tasks: it exits 0 within 10 s, its running attempts given back (released: no lease
  left to expire, steps kept), and its store closed with the WAL folded in, so that
  ``keel.db`` copied alone holds every task; another worker then finishes them from
  their recorded steps. A request still open (a plain client's ``tools/call`` waiting
  for a task that never ends) does not hold ``keel serve`` past those 10 s.
* ``keel backup`` while a ``keel serve`` runs tasks and the test keeps creating more:
  the copy passes ``integrity_check`` on its own and holds every task acknowledged
  before the backup began.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import anyio
import pytest
from mcp import Client

from keel.model import Status, Task
from keel.store import SqliteStore
from keel_serve import KeelServe
from store_files import copied_alone, wal_size

from .apps.harness import APPS, KEEL, WorkerProcess, eventually, fleet, worker_env
from .checks import read_effects

# slow: every test starts real keel serve / keel worker processes
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

STOP_WITHIN = 10.0  # seconds a signalled process may take to exit (the promise)
WAIT = 20.0  # seconds for any one state to be reached; less than LEASE
LEASE = 60.0  # seconds: only a release can free a task before the test ends
TASKS = 6  # created; CONCURRENCY of them run at once
CONCURRENCY = 4


@contextmanager
def started(kind: str, db: Path, logs: Path, env: dict[str, str]) -> Iterator[Popen[Any]]:
    """``kind`` (``http``, ``stdio`` or ``worker``) running on ``db``; its process, killed
    and reaped at the end if it still runs."""
    args = ["--app", "steps_app:app", "--store", str(db), "--concurrency", str(CONCURRENCY)]
    if kind == "worker":
        worker = WorkerProcess(
            store=db, worker_id="first", logs=logs, env=env, concurrency=CONCURRENCY
        )
        process: Popen[Any] = worker.proc
    elif kind == "http":
        server = KeelServe(args, cwd=APPS, env=env, log=logs / "serve.log")
        server.start()
        assert server.process is not None
        process = server.process
    else:  # stdio: stdin stays open (a client that says nothing): only a signal stops it
        with (logs / "serve.log").open("wb") as log:
            process = Popen(
                [str(KEEL), "serve", "--transport", "stdio", *args],
                cwd=APPS,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
    try:
        yield process
    finally:
        if kind == "worker":
            worker.wait()  # reaps it (killed if it still runs) and closes its log
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdin is not None:
            process.stdin.close()


async def _effects(path: Path, step: str, count: int) -> dict[str, list[dict[str, object]]]:
    """Wait until ``count`` tasks have a ``step`` effect; the effects by task."""

    async def probe() -> dict[str, list[dict[str, object]]] | None:
        effects = read_effects(path)
        done = {t: e for t, e in effects.items() if any(x["step"] == step for x in e)}
        return effects if len(done) >= count else None

    return await eventually(probe, within=WAIT, what=f"{count} task(s) at {step!r}")


@pytest.mark.parametrize(
    ("kind", "signum"),
    [
        ("http", signal.SIGTERM),
        ("http", signal.SIGINT),
        ("stdio", signal.SIGTERM),
        ("worker", signal.SIGTERM),
    ],
    ids=["serve-http-SIGTERM", "serve-http-SIGINT", "serve-stdio-SIGTERM", "worker-SIGTERM"],
)
async def test_a_signal_gives_tasks_back_and_leaves_the_file_whole(
    tmp_path: Path, kind: str, signum: int
) -> None:
    """Signalled while it runs four tasks (each past its first step), the process exits 0
    within 10 s; keel.db copied alone then holds all six tasks, the four given back
    (working, no lease, attempt 1, their step recorded); another worker completes every
    one long before any lease could expire, running no step twice."""
    db, effects = tmp_path / "keel.db", tmp_path / "effects.jsonl"
    env = worker_env(effects, lease=LEASE, KEEL_TEST_HOLD="1", KEEL_STORE="")
    store = SqliteStore(db)  # the test's own connection stays open throughout
    try:
        with started(kind, db, tmp_path, env) as process, fleet() as workers:
            made = [await store.create(name="step_then_hold", max_attempts=3) for _ in range(TASKS)]
            held = await _effects(effects, "holding", CONCURRENCY)
            held_ids = {t for t, e in held.items() if any(x["step"] == "holding" for x in e)}
            process.send_signal(signum)
            assert process.wait(timeout=STOP_WITHIN) == 0

            assert wal_size(db) in (None, 0), "the WAL was folded into keel.db"
            copy = SqliteStore(copied_alone(db, tmp_path / "copy"))
            try:
                tasks = {t.task_id: t for t in await copy.list()}
                assert set(tasks) == {t.task_id for t in made}
                for task_id in held_ids:
                    task = tasks[task_id]
                    assert (task.status, task.lease_owner, task.attempt) == (
                        Status.WORKING, None, 1
                    ), task  # fmt: skip
                    assert "first" in await copy.steps(task_id)
                    last = (await copy.history(task_id))[-1]
                    assert last.reason.endswith(": worker shutting down"), last
            finally:
                await copy.close()

            finish_env = worker_env(effects, lease=LEASE, KEEL_STORE="")
            finisher = WorkerProcess(
                store=db, worker_id="finisher", logs=tmp_path, env=finish_env, concurrency=TASKS
            )
            workers.append(finisher)

            async def all_completed() -> list[Task] | None:
                got = [await store.get(t.task_id) for t in made]
                return got if all(t.status is Status.COMPLETED for t in got) else None

            await eventually(all_completed, within=WAIT, what="every task completed")
            assert finisher.terminate() == 0, finisher.output()
        by_task = read_effects(effects)
        for task in made:
            firsts = [e for e in by_task[task.task_id] if e["step"] == "first"]
            assert len(firsts) == 1, f"step 'first' of {task.task_id} ran twice: {firsts}"
            done = await store.get(task.task_id)
            assert done.result is not None
            assert done.result["structuredContent"]["first"] == firsts[0]["nonce"]
            history = await store.history(task.task_id)
            assert not any("expired" in event.reason for event in history), history
    finally:
        await store.close()


async def test_serve_exits_in_time_with_a_request_still_open(tmp_path: Path) -> None:
    """SIGTERM while a plain client's tools/call waits inline for a task that never ends:
    the request is cut after its grace, and keel serve still exits 0 within 10 s with
    the task given back and the WAL folded in."""
    db, effects = tmp_path / "keel.db", tmp_path / "effects.jsonl"
    env = worker_env(effects, lease=LEASE, KEEL_TEST_HOLD="1", KEEL_STORE="")
    server = KeelServe(
        ["--app", "steps_app:app", "--store", str(db)], cwd=APPS, env=env, log=tmp_path / "s.log"
    )
    server.start()
    try:
        await server.ready()
        async with Client(server.url) as client, anyio.create_task_group() as tg:

            async def call() -> None:
                with contextlib.suppress(Exception):  # cut by the stop: any error will do
                    await client.call_tool("step_then_hold", {})

            tg.start_soon(call)
            held = await _effects(effects, "holding", 1)
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            code = await anyio.to_thread.run_sync(lambda: server.process.wait(STOP_WITHIN))
            assert code == 0, server.output()
            tg.cancel_scope.cancel()
    finally:
        server.stop()
    assert wal_size(db) is None
    store = SqliteStore(db)
    try:
        [task_id] = held
        task = await store.get(task_id)
        assert (task.status, task.lease_owner) == (Status.WORKING, None)
    finally:
        await store.close()


async def test_backup_while_serving_holds_every_acknowledged_task(tmp_path: Path) -> None:
    """keel backup while keel serve runs tasks and the test keeps creating more: exit 0,
    one report line; the copy, alone (no -wal beside it), passes integrity_check and holds
    every task whose creation was acknowledged before the backup began, some of them
    already completed by the server."""
    db, effects, dest = tmp_path / "keel.db", tmp_path / "effects.jsonl", tmp_path / "b.db"
    env = worker_env(effects, KEEL_STORE="")
    store = SqliteStore(db)
    acknowledged: list[str] = []
    server = KeelServe(
        ["--app", "steps_app:app", "--store", str(db)], cwd=APPS, env=env, log=tmp_path / "s.log"
    )
    server.start()
    try:
        await server.ready()
        stop = anyio.Event()

        async def keep_creating() -> None:
            while not stop.is_set():
                task = await store.create(name="multi_step", arguments={"steps": 2, "work_ms": 2.0})
                acknowledged.append(task.task_id)

        async def some_completed() -> bool | None:
            done = await store.list(status=Status.COMPLETED, limit=1)
            return True if len(acknowledged) >= 100 and done else None

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_creating)
            await eventually(some_completed, within=WAIT, what="100 tasks, some completed")
            before = list(acknowledged)
            result = await anyio.to_thread.run_sync(
                lambda: subprocess.run(
                    [str(KEEL), "--store", str(db), "backup", str(dest)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
            )
            stop.set()
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"{db} -> {dest}: "), result.stdout
        assert server.stop() == 0, server.output()
    finally:
        server.stop()
        await store.close()
    integrity, rows = _read_alone(dest)
    assert integrity == "ok"
    assert set(before) <= set(rows)
    assert "completed" in rows.values()


def _read_alone(db: Path) -> tuple[str, dict[str, str]]:
    """``db``'s integrity check and its tasks' statuses, read with no -wal beside it."""
    assert sorted(p.name for p in db.parent.glob(f"{db.name}*")) == [db.name]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        rows = dict(conn.execute("SELECT task_id, status FROM tasks").fetchall())
    conn.close()
    return integrity, rows
