"""Acceptance: ``/metrics``, ``/healthz`` and ``/readyz`` of real ``keel serve`` and
``keel worker`` processes on 127.0.0.1.

A known workload over MCP (tasks that complete, fail after a retry, are cancelled while
running, and wait for input), then ``/metrics`` read with prometheus_client's own text
parser: every counter exact, on SQLite and on PostgreSQL. And ``/readyz`` fails within
5 s of the store going away (a private PostgreSQL cluster stopped) while ``/healthz``
keeps answering, and is ready again within 15 s of the store coming back.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from prometheus_client.parser import text_string_to_metric_families

from acceptance.test_serve_http import until
from acceptance.test_worker_cli import keel_worker
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.client import accept, cancel_task, update_task
from keel.store import SqliteStore
from keel.telemetry.logs import principal_hash
from keel_serve import KeelServe
from pg_scale.cluster import ClusterUnavailable, PrivateCluster
from postgres.pg import REQUIRED, drop_schema, new_schema, require_postgres, store_url

from .apps.harness import APPS, KEEL, LoggedProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WAIT = 30.0  # seconds for a state to be reached
NOT_READY_WITHIN = 5.0  # seconds after the store breaks (the bound)
READY_AGAIN_WITHIN = 15.0  # seconds after the store is back

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Serve(KeelServe):
    """``keel serve --app observed_app:app`` on ``store``."""

    def __init__(self, folder: Path, store: str, *extra: str) -> None:
        log = folder / "keel-serve.log"
        super().__init__(
            ["--app", "observed_app:app", "--store", store, "--data-dir", str(folder), *extra],
            cwd=APPS,
            env={k: v for k, v in os.environ.items() if k != "KEEL_STORE"},
            log=log,
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store location of each kind (a PostgreSQL schema of its own, dropped after)."""
    if request.param == "sqlite":
        yield str(tmp_path / "keel.db")
        return
    require_postgres()
    schema = new_schema()
    try:
        yield store_url(schema)
    finally:
        drop_schema(schema)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as exc:  # 503 and the like: a status, with a body
        return exc.code, exc.headers["content-type"], exc.read().decode()


async def get(url: str) -> tuple[int, str, str]:
    """GET ``url`` (in a thread): status, content type, body."""
    return await anyio.to_thread.run_sync(_get, url)


async def metrics(base: str) -> Samples:
    code, kind, text = await get(f"{base}/metrics")
    assert code == 200
    assert kind.startswith("text/plain")
    return parse(text)


async def metrics_when(base: str, name: str, wanted: float, **labels: str) -> Samples:
    """``/metrics`` once ``name{labels}`` reached ``wanted`` (a counter is bumped just
    after the commit that a status poll may already see)."""
    with anyio.fail_after(WAIT):
        while True:
            samples = await metrics(base)
            if sample(samples, name, **labels) >= wanted:
                return samples
            await anyio.sleep(0.05)


async def run_workload(url: str, base: str) -> None:
    """3 echo (completed), 1 boom (retried, then dead-lettered), 1 hold (cancelled while
    it runs), 1 ask (input requested, answered, completed)."""
    async with Client(url, extensions=[Tasks()]) as client:
        call = client.session.call_tool
        echoes = [await call("echo", {"text": f"t{n}"}, allow_claimed=True) for n in range(3)]
        boom = await call("boom", {}, allow_claimed=True)
        hold = await call("hold", {}, allow_claimed=True)
        ask = await call("ask", {}, allow_claimed=True)
        for task in echoes:
            await until(url, task.task_id, "completed")
        await until(url, boom.task_id, "failed")
        await until(url, ask.task_id, "input_required")
        await update_task(client, ask.task_id, {"service": accept({"service": "db"})})
        await until(url, ask.task_id, "completed")
        await metrics_when(base, "keel_attempts_running", 1)  # hold is running
        await cancel_task(client, hold.task_id)
        await until(url, hold.task_id, "cancelled")


async def test_every_counter_is_exact_after_a_known_workload(tmp_path: Path, store: str) -> None:
    """After the workload, the front end's /metrics (it runs the workers too) counts each
    transition exactly once, and keel_tasks reads the store."""
    server = Serve(tmp_path, store)
    server.start()
    try:
        await server.ready()
        await run_workload(server.url, server.base)
        got = await metrics_when(server.base, "keel_tasks_cancelled_total", 1, tool="hold")
    finally:
        assert server.stop() == 0
    expected = {
        ("keel_tasks_created_total", "echo"): 3,
        ("keel_tasks_created_total", "boom"): 1,
        ("keel_tasks_created_total", "hold"): 1,
        ("keel_tasks_created_total", "ask"): 1,
        ("keel_tasks_completed_total", "echo"): 3,
        ("keel_tasks_completed_total", "ask"): 1,
        ("keel_tasks_completed_total", "boom"): 0,
        ("keel_tasks_failed_total", "boom"): 1,
        ("keel_tasks_dead_lettered_total", "boom"): 1,
        ("keel_task_retries_total", "boom"): 1,
        ("keel_tasks_cancelled_total", "hold"): 1,
        ("keel_task_input_requests_total", "ask"): 1,
        ("keel_input_wait_seconds_count", "ask"): 1,
        ("keel_lease_expiries_total", "echo"): 0,
        ("keel_queue_wait_seconds_count", "echo"): 3,
        ("keel_queue_wait_seconds_count", "boom"): 2,
        ("keel_queue_wait_seconds_count", "hold"): 1,
        ("keel_queue_wait_seconds_count", "ask"): 2,
    }
    assert {key: sample(got, key[0], tool=key[1]) for key in expected} == expected
    attempts = {
        (tool, outcome): sample(
            got, "keel_attempt_duration_seconds_count", tool=tool, outcome=outcome
        )
        for tool, outcome in [
            ("echo", "completed"),
            ("boom", "error"),
            ("hold", "cancelled"),
            ("ask", "input_required"),
            ("ask", "completed"),
        ]
    }
    assert attempts == {
        ("echo", "completed"): 3,
        ("boom", "error"): 2,
        ("hold", "cancelled"): 1,
        ("ask", "input_required"): 1,
        ("ask", "completed"): 1,
    }
    statuses = {s: sample(got, "keel_tasks", status=s) for s in ("completed", "failed")}
    assert statuses == {"completed": 4, "failed": 1}
    assert sample(got, "keel_tasks", status="cancelled") == 1
    assert sample(got, "keel_tasks", status="working") == 0
    assert sample(got, "keel_claim_batch_size_sum") == 3 + 2 + 1 + 2
    assert sample(got, "keel_store_commit_seconds_count", op="create") == 6
    assert sample(got, "keel_store_up") == 1
    assert sample(got, "keel_workers_running") == 1


# --- readiness ---------------------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A throwaway PostgreSQL cluster this test may stop (the shared one never is)."""
    try:
        made = PrivateCluster.create()
    except ClusterUnavailable as exc:
        if REQUIRED:
            pytest.fail(f"cannot make a private PostgreSQL cluster: {exc}")
        pytest.skip(f"cannot make a private PostgreSQL cluster: {exc}")
    with made:
        yield made


class Worker(LoggedProcess):
    """``keel worker --metrics-port 0``; :attr:`base` once it said where it listens."""

    def __init__(self, store: str, logs: Path, *extra: str) -> None:
        argv = [str(KEEL), "worker", "--app", "observed_app:app", "--store", store,
                "--metrics-port", "0", *extra]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
        super().__init__(argv, name="worker", logs=logs, env={**env, "PYTHONUNBUFFERED": "1"})
        self.base: str | None = None

    def _saw(self, line: str) -> None:
        found = re.search(r"metrics: (http://127\.0\.0\.1:\d+)/metrics", line)
        if found:
            self.base = found.group(1)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=WAIT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._close(WAIT)


async def probe(base: str, path: str) -> tuple[int, Any]:
    code, _, text = await get(f"{base}{path}")
    return code, json.loads(text) if path == "/readyz" else text


async def readiness_becomes(bases: list[str], code: int, within: float) -> float:
    """Seconds until every ``/readyz`` of ``bases`` answers ``code`` (at most ``within``);
    meanwhile every ``/healthz`` answers 200."""
    started = time.monotonic()
    with anyio.fail_after(within):
        while True:
            codes = [(await probe(base, "/readyz"))[0] for base in bases]
            assert [(await probe(base, "/healthz"))[0] for base in bases] == [200] * len(bases)
            if codes == [code] * len(bases):
                return time.monotonic() - started
            await anyio.sleep(0.1)


async def test_readyz_fails_while_the_store_is_down_and_recovers(
    cluster: PrivateCluster, tmp_path: Path
) -> None:
    """A front end (no workers) and a worker on a private PostgreSQL cluster: ready; the
    cluster stopped: both not ready within 5 s, alive all along; started again: both
    ready within 15 s."""
    url = cluster.url("postgres")
    front = Serve(tmp_path, url, "--no-worker")
    worker = Worker(url, tmp_path)
    front.start()
    try:
        await front.ready()
        bases = [front.base, await started(worker)]
        await readiness_becomes(bases, 200, WAIT)
        code, body = await probe(bases[1], "/readyz")
        assert body["workers"] == 1
        assert body["schema_version"] >= 1
        cluster.stop("fast")
        assert await readiness_becomes(bases, 503, NOT_READY_WITHIN) < NOT_READY_WITHIN
        code, body = await probe(front.base, "/readyz")
        assert code == 503
        assert body["ready"] is False
        assert body["problems"][0].startswith("store: ")
        cluster.start()
        await readiness_becomes(bases, 200, READY_AGAIN_WITHIN)
    finally:
        assert worker.stop() == 0, worker.output()
        assert front.stop() == 0


async def started(worker: Worker) -> str:
    """The worker's metrics address, once it said where it listens."""
    with anyio.fail_after(WAIT):
        while worker.base is None:
            assert worker.alive, worker.output()
            await anyio.sleep(0.05)
    return worker.base


async def test_an_attempt_is_timed_once_by_the_process_that_ends_it(
    tmp_path: Path, store: str
) -> None:
    """A front end without workers and a worker on one store: the worker claims echo
    and hold; it ends echo itself, while hold's end is the front end's cancel. Each
    attempt's duration is observed exactly once, in the process that wrote its end,
    although only the worker claimed (its /metrics and the front end's, both parsed)."""
    front = Serve(tmp_path, store, "--no-worker")
    worker = Worker(store, tmp_path)
    front.start()
    try:
        await front.ready()
        base = await started(worker)
        async with Client(front.url, extensions=[Tasks()]) as client:
            echo = await client.session.call_tool("echo", {"text": "t"}, allow_claimed=True)
            hold = await client.session.call_tool("hold", {}, allow_claimed=True)
            await until(front.url, echo.task_id, "completed")
            await metrics_when(base, "keel_attempts_running", 1)  # hold is running
            await cancel_task(client, hold.task_id)
            await until(front.url, hold.task_id, "cancelled")
        name = "keel_attempt_duration_seconds_count"
        at_worker = await metrics_when(base, name, 1, tool="echo", outcome="completed")
        at_front = await metrics_when(front.base, name, 1, tool="hold", outcome="cancelled")
    finally:
        assert worker.stop() == 0, worker.output()
        assert front.stop() == 0
    counts = {
        (where, tool, outcome): sample(samples, name, tool=tool, outcome=outcome)
        for where, samples in (("worker", at_worker), ("front", at_front))
        for tool, outcome in (("echo", "completed"), ("hold", "cancelled"))
    }
    assert counts == {
        ("worker", "echo", "completed"): 1,
        ("worker", "hold", "cancelled"): 0,
        ("front", "echo", "completed"): 0,
        ("front", "hold", "cancelled"): 1,
    }
    assert sample(at_worker, "keel_claim_batch_size_sum") == 2
    assert sample(at_front, "keel_claim_batch_size_count") == 0


def test_a_taken_metrics_port_is_one_error_line(tmp_path: Path) -> None:
    """--metrics-port on a port another process listens on: exit 1, one line naming it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = keel_worker(
            tmp_path,
            "--app", "observed_app:app", "--store", str(tmp_path / "keel.db"),
            "--metrics-port", str(port),
        )  # fmt: skip
    assert message.startswith(f"cannot listen on 127.0.0.1:{port} for metrics: ")


async def test_a_json_logging_worker_logs_each_transition_once(tmp_path: Path) -> None:
    """keel worker -v --log-format json: the claim and the completion of a task are one
    JSON line each, naming task, tool, attempt, worker and principal hash, not its text."""
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    task = await store.create(name="echo", arguments={"text": "private words"}, owner="bob")
    await store.close()
    worker = Worker(str(db), tmp_path, "-v", "--log-format", "json", "--worker-id", "w-json")
    try:
        with anyio.fail_after(WAIT):
            while "complete: working -> completed" not in worker.output():
                assert worker.alive, worker.output()
                await anyio.sleep(0.05)
    finally:
        assert worker.stop() == 0
    text = worker.log_path.read_text()
    assert "private words" not in text
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    mine = [r for r in records if r.get("task_id") == task.task_id]
    assert [(r["op"], r["to_status"]) for r in mine] == [
        ("claim", "working"),
        ("complete", "completed"),
    ]
    for record in mine:
        assert record["tool"] == "echo"
        assert record["attempt"] == 1
        assert record["worker"] == "w-json"
        assert record["principal"] == principal_hash("bob")
