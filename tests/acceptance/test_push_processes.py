"""Push notifications across real processes: ``keel serve --no-worker`` answers
``subscriptions/listen`` while ``keel worker`` processes, elsewhere, run the task.

A change a worker commits in its own process reaches the front end's listener through
the store's change feed (SQLite: the change log on one file; PostgreSQL: NOTIFY). The
worker is SIGKILLed mid-task, a new worker finishes the task from its recorded step,
and the listener, which never reconnected, still receives the terminal state, equal to
what ``tasks/get`` answers. A SIGTERMed ``keel serve`` ends the open stream gracefully:
its last frame is the listen's result, stamped with the subscription id.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from keel.model import Task
from keel.store import SqliteStore
from keel_serve import KeelServe
from postgres.pg import drop_schema, new_schema, require_postgres, store_url
from tasks_extension.support import Listen, listen, post

from .apps.harness import APPS, WorkerProcess, eventually, fleet, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
WAIT = 30.0  # seconds for any one step (a killed worker's lease is 1.5 s)


def front_end(store: str, tmp_path: Path, effects: Path, *workers: str) -> KeelServe:
    """``keel serve --app steps_app:app`` on ``store``; front end only unless ``workers``
    (then: ``--concurrency`` as given)."""
    args = ["--app", "steps_app:app", "--store", store, "--data-dir", str(tmp_path / "data")]
    args += ["--concurrency", workers[0]] if workers else ["--no-worker"]
    log = tmp_path / "keel-serve.log"
    log.touch()
    return KeelServe(args, cwd=APPS, env=worker_env(effects), log=log)


def effects_of(effects: Path, step: str) -> list[dict[str, Any]]:
    """The side-effect lines the steps app wrote for ``step``."""
    if not effects.exists():
        return []
    lines = [json.loads(line) for line in effects.read_text().splitlines() if line]
    return [line for line in lines if line["step"] == step]


async def task_frames(stream: Listen, task_id: str, *until: str) -> list[dict[str, Any]]:
    """The stream's task frames up to the first whose status is in ``until``."""
    seen: list[dict[str, Any]] = []
    while True:
        frame = await stream.notification(WAIT)
        assert frame["method"] == "notifications/tasks", frame
        assert frame["params"]["taskId"] == task_id
        seen.append(frame["params"])
        if frame["params"]["status"] in until:
            return seen


async def finished(store: str, task_id: str) -> Task | None:
    """The task, read from the store file, once it has ended (else None)."""
    opened = SqliteStore(store)
    try:
        task = await opened.get(task_id)
    finally:
        await opened.close()
    return task if task.status.terminal else None


def without_meta(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in {"_meta", "resultType"}}


async def held_task(
    serve: KeelServe, workers: list[WorkerProcess], store: str, tmp_path: Path, effects: Path
) -> str:
    """Start worker ``w1`` (it holds its task after the first step) and create a
    ``step_then_hold`` task through ``serve``; its id."""
    holding = worker_env(effects, KEEL_TEST_HOLD="1")
    workers.append(WorkerProcess(store=store, worker_id="w1", logs=tmp_path, env=holding))
    await anyio.to_thread.run_sync(workers[0].wait_ready)
    created = await post(serve.url, "tools/call", {"name": "step_then_hold", "arguments": {}})
    return str(created.result["taskId"])


async def kill_mid_task_and_finish_elsewhere(store: str, tmp_path: Path) -> None:
    """The scenario, on ``store``: see the module docstring."""
    effects = tmp_path / "effects.jsonl"
    serve = front_end(store, tmp_path, effects)
    serve.start()
    with fleet() as workers:
        try:
            await serve.ready()
            task_id = await held_task(serve, workers, store, tmp_path, effects)
            async with listen(serve.url, {"taskIds": [task_id]}, request_id=1) as stream:
                ack = await stream.notification(WAIT)
                assert ack["params"]["notifications"] == {"taskIds": [task_id]}
                await eventually(
                    lambda: anyio.to_thread.run_sync(
                        lambda: effects_of(effects, "holding") or None
                    ),
                    within=WAIT,
                    what="w1 to hold the task",
                )
                workers[0].kill()  # mid-task: its step recorded, the task not finished
                workers.append(
                    WorkerProcess(
                        store=store, worker_id="w2", logs=tmp_path, env=worker_env(effects)
                    )
                )
                frames = await task_frames(stream, task_id, "completed", "failed", "cancelled")
                now = await post(serve.url, "tasks/get", {"taskId": task_id})
            last = frames[-1]
            assert last["status"] == "completed", frames
            assert without_meta(last) == without_meta(now.result)
            assert last["_meta"] == {SUBSCRIPTION_ID: 1}
            [first] = effects_of(effects, "first")  # w2 replayed the step w1 recorded
            assert last["result"]["structuredContent"]["first"] == first["nonce"]
        finally:
            serve.stop()
            for worker in workers:
                if worker.alive:
                    worker.terminate()


@pytest.mark.requirement("K8")
async def test_a_worker_killed_mid_task_on_sqlite_still_reaches_the_listener(
    tmp_path: Path,
) -> None:
    """SQLite file shared by keel serve --no-worker and keel worker processes: the
    terminal state committed by the second worker reaches the front end's listener."""
    await kill_mid_task_and_finish_elsewhere(str(tmp_path / "keel.db"), tmp_path)


@pytest.fixture
def pg_store() -> Iterator[str]:
    """A store URL on a fresh PostgreSQL schema, dropped afterwards."""
    require_postgres()
    schema = new_schema()
    try:
        yield store_url(schema)
    finally:
        drop_schema(schema)


@pytest.mark.postgres
@pytest.mark.requirement("K8")
async def test_a_worker_killed_mid_task_on_postgres_still_reaches_the_listener(
    pg_store: str, tmp_path: Path
) -> None:
    """The same on PostgreSQL: the change reaches the front end by NOTIFY."""
    await kill_mid_task_and_finish_elsewhere(pg_store, tmp_path)


@pytest.mark.requirement("B4.27")
async def test_a_sigterm_ends_open_listen_streams_gracefully(tmp_path: Path) -> None:
    """SIGTERM to keel serve while a listen stream is open: the stream's last frame is the
    listen's JSON-RPC result carrying the subscription id (the spec's graceful close, not
    a cut connection), then the body ends; the server exits 0."""
    effects = tmp_path / "effects.jsonl"
    serve = front_end(str(tmp_path / "keel.db"), tmp_path, effects, "2")
    serve.start()
    try:
        await serve.ready()
        created = await post(serve.url, "tools/call", {"name": "hold", "arguments": {}})
        task_id = created.result["taskId"]
        async with listen(serve.url, {"taskIds": [task_id]}, request_id="bye") as stream:
            assert (await stream.notification(WAIT))["method"].endswith("acknowledged")
            await stream.notification(WAIT)  # the task's state
            assert serve.process is not None
            serve.process.terminate()
            frame = await stream.frame(WAIT)
            while frame is not None and "method" in frame:  # the task given back, maybe
                frame = await stream.frame(WAIT)
            assert frame is not None, "the stream was cut without its result"
            assert frame["id"] == "bye"
            assert frame["result"]["_meta"][SUBSCRIPTION_ID] == "bye"
            assert await stream.frame(WAIT) is None
        assert serve.stop() == 0
    finally:
        serve.stop()


@pytest.mark.requirement("K8")
async def test_a_listener_of_a_killed_front_end_reads_the_current_state_on_another(
    tmp_path: Path,
) -> None:
    """The front end is SIGKILLed while a listener waits on a task a worker process holds;
    the task moves on meanwhile (the worker is killed and another finishes it). The
    listener listens again on a restarted front end: the first frame after the ack is
    the task's current, terminal state (a reconnect reads the current state first)."""
    effects = tmp_path / "effects.jsonl"
    store = str(tmp_path / "keel.db")
    serve = front_end(store, tmp_path, effects)
    serve.start()
    with fleet() as workers:
        try:
            await serve.ready()
            task_id = await held_task(serve, workers, store, tmp_path, effects)
            with contextlib.suppress(httpx2.TransportError):  # the connection is cut
                async with listen(serve.url, {"taskIds": [task_id]}) as stream:
                    await stream.notification(WAIT)  # the ack
                    await eventually(
                        lambda: anyio.to_thread.run_sync(
                            lambda: effects_of(effects, "holding") or None
                        ),
                        within=WAIT,
                        what="w1 to hold the task",
                    )
                    serve.kill()
                    while await stream.frame(WAIT) is not None:
                        pass
            workers[0].kill()
            workers.append(
                WorkerProcess(store=store, worker_id="w2", logs=tmp_path, env=worker_env(effects))
            )
            await eventually(
                lambda: finished(store, task_id), within=WAIT, what="the task to finish on w2"
            )
            serve.start()
            await serve.ready()
            async with listen(serve.url, {"taskIds": [task_id]}, request_id=2) as stream:
                ack = await stream.notification(WAIT)
                assert ack["params"]["notifications"] == {"taskIds": [task_id]}
                first = (await stream.notification(WAIT))["params"]
            now = await post(serve.url, "tasks/get", {"taskId": task_id})
            assert first["status"] == "completed"
            assert without_meta(first) == without_meta(now.result)
        finally:
            serve.stop()
            for worker in workers:
                if worker.alive:
                    worker.terminate()
