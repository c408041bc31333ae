"""Processes and checks shared by the PostgreSQL scale-out tests.

* :class:`FrontEnd`: a real ``keel serve --app pg_scale_app:app --no-worker`` process
  on a free loopback port, driven with the official MCP client;
* workers are the acceptance tier's :class:`~acceptance.apps.harness.WorkerProcess`
  (``keel worker``), given a ``postgresql://`` store URL;
* :func:`check_task` checks one finished ``pg_steps`` task's outcome, history, recorded
  steps and side effects against each other (the rules of ``test_worker_crash.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp_types import Result

from acceptance.apps.harness import APPS, KEEL, WorkerProcess
from keel.mcp.client import CancelTask, Created, Detailed, GetTask, TaskIdParams
from keel.mcp.client import TasksClientExtension as Tasks
from keel.model import Event, Status

APP = "pg_scale_app:app"
READY_TIMEOUT = 60.0  # seconds a front end may take to start
EXIT_TIMEOUT = 30.0  # seconds a front end may take to stop

CLAIMED = re.compile(
    r"claimed by (?P<worker>\S+) \(attempt (?P<attempt>\d+)/\d+, fence (?P<fence>\d+)\)"
)
RECOVERED = re.compile(r"lease of (?P<worker>\S+) expired .* on attempt (?P<attempt>\d+)/")


async def until_ready(worker: WorkerProcess, within: float = READY_TIMEOUT) -> None:
    """Wait without blocking the event loop until a worker printed its ready line."""
    deadline = time.monotonic() + within
    while not worker.ready:
        if not worker.alive:
            raise AssertionError(f"{worker.worker_id} exited early\n{worker.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker.worker_id} not ready in {within}s\n{worker.output()}")
        await anyio.sleep(0.02)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def app_env(effects: Path, *, lease: float) -> dict[str, str]:
    """The environment of a worker or front end: the test's, without ``$KEEL_STORE``,
    plus the app's settings."""
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    env.update(KEEL_TEST_EFFECTS=str(effects), KEEL_TEST_LEASE=str(lease), PYTHONUNBUFFERED="1")
    return env


class FrontEnd:
    """``keel serve --no-worker`` for the test app on a store, on a free port."""

    def __init__(self, *, store: str, name: str, logs: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = logs / f"{name}.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [
                str(KEEL),
                "serve",
                "--app",
                APP,
                "--no-worker",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--store",
                store,
            ],
            cwd=APPS,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._pump, name=name, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def ready(self, within: float = READY_TIMEOUT) -> None:
        """Wait until the server accepts connections (bounded)."""
        deadline = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited early\n{self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{self.name} not listening in {within}s\n{self.output()}"
                    ) from None
                await anyio.sleep(0.05)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM, then reap (killed if it will not go)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._reader.join(timeout=EXIT_TIMEOUT)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()

    def output(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return f"--- output of {self.name} (pid {self.proc.pid}) ---\n{text[-4000:]}"


class FrontEnds(list[FrontEnd]):
    """Front ends started by a test; all stopped at the end."""

    def __enter__(self) -> FrontEnds:
        return self

    def __exit__(self, *exc: object) -> None:
        for fe in self:
            fe.stop()


@asynccontextmanager
async def mcp_client(url: str) -> AsyncIterator[Client]:
    """An official MCP client that declares the tasks extension."""
    async with Client(url, extensions=[Tasks()]) as client:
        yield client


async def create_task(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """``tools/call`` of a task tool; the task id of the handle the server returned
    (only after the task was committed)."""
    created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(created, Created), created
    return str(created.task_id)


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/get``: the task as the wire shows it."""
    task = await client.session.send_request(
        GetTask(params=TaskIdParams(task_id=task_id)), Detailed
    )
    return task.model_dump(by_alias=True)


async def cancel_task(client: Client, task_id: str) -> None:
    """``tasks/cancel``."""
    await client.session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), Result)


def read_effects(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The side-effect lines, by task, in the order they were appended."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not path.exists():
        return by_task
    text = path.read_text(encoding="utf-8")
    assert not text or text.endswith("\n"), "a side-effect line was torn"
    for line in text.splitlines():
        record = json.loads(line)
        by_task[record["task"]].append(record)
    return by_task


# --- the checks of a finished pg_steps task --------------------------------------------------


@dataclass
class Claim:
    """One attempt of a task as its history tells it."""

    worker: str
    attempt: int
    fence: int
    ended_by: Event | None = None


@dataclass
class Ledger:
    """What the test did, to check the store against, and what the checks counted."""

    killed: set[str] = field(default_factory=set)
    """Worker ids the test SIGKILLed (or whose attempts the test otherwise cut short)."""
    interrupting: set[str] = field(default_factory=set)
    stats: Counter[str] = field(default_factory=Counter)


def claims_of(task_id: str, history: list[Event]) -> list[Claim]:
    """The task's attempts from its history, each checked to be explained: a claim only
    after creation or the end of the previous attempt; every attempt but the last ended
    by the recovery of its expired lease; the completion written by the last claimer."""
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
            # No stale write accepted: the completion is the current fence holder's.
            assert event.actor == f"worker:{claims[-1].worker}", event
            claims[-1].ended_by = event
        else:
            raise AssertionError(f"{task_id}: history has an unexplained event {event}")
    return claims


def check_task(
    task_id: str,
    status: Status,
    result: Any,
    history: list[Event],
    steps: Mapping[str, Any],
    effects: list[dict[str, Any]],
    step_count: int,
    ledger: Ledger,
) -> None:
    """Check one ``pg_steps`` task's outcome, history, recorded steps and side effects
    together:

    * it completed exactly once (one completion, the last event), written by the worker
      holding the last fence, with a result built from the recorded steps;
    * fences strictly increase and attempt numbers count the recoveries; every attempt
      but the last ended by the recovery of a lease that a killed worker held;
    * each step was recorded once, by an attempt whose fence and worker the history
      shows, in fence order (a superseded fence never recorded a step after a newer one);
    * an attempt ran exactly the steps not recorded when it started (recorded steps are
      replayed, never run again); a step's effect was repeated only as the last act of
      an attempt that was killed before it could record it.
    """
    stats = ledger.stats
    assert status is Status.COMPLETED, f"{task_id} ended {status}: {history}"
    completions = [e for e in history if e.to_status is Status.COMPLETED]
    assert len(completions) == 1, history
    assert history[-1] is completions[0], history

    claims = claims_of(task_id, history)
    by_fence = {c.fence: c for c in claims}
    fences = [c.fence for c in claims]
    assert fences == sorted(set(fences)), f"{task_id}: fences not increasing: {history}"
    assert [c.attempt for c in claims] == list(range(1, len(claims) + 1)), (
        f"{task_id}: every attempt number counts one recovery: {history}"
    )
    for claim in claims[:-1]:
        assert claim.worker in ledger.killed, f"{task_id}: a live worker lost its lease: {history}"
        ledger.interrupting.add(claim.worker)
        stats["attempts_interrupted"] += 1
    stats["tasks_retried"] += len(claims) > 1

    names = [f"step-{n}" for n in range(step_count)]
    assert sorted(steps) == names, f"{task_id}: recorded steps {sorted(steps)}"
    recorded = [steps[name] for name in names]
    assert result["structuredContent"]["nonces"] == [r["nonce"] for r in recorded], (
        f"{task_id}: the result does not use the recorded step results"
    )
    assert result["structuredContent"]["fence"] == claims[-1].fence, (result, history)

    nonces = Counter(e["nonce"] for e in effects)
    for rec in recorded:
        assert nonces[rec["nonce"]] == 1, f"{task_id}: recorded effect {rec} not in the file"
        assert rec["fence"] in by_fence, f"{task_id}: step recorded by unknown fence {rec}"
        assert by_fence[rec["fence"]].worker == rec["worker"], rec
    assert [r["fence"] for r in recorded] == sorted(r["fence"] for r in recorded)

    made = [e["fence"] for e in effects]
    assert made == sorted(made), f"{task_id}: attempts overlapped: {effects}"
    recorded_nonces = {r["nonce"] for r in recorded}
    for fence, claim in by_fence.items():
        mine = [e for e in effects if e["fence"] == fence]
        assert all(e["worker"] == claim.worker for e in mine), f"{task_id}: {mine}"
        assert all(e["attempt"] == claim.attempt for e in mine), f"{task_id}: {mine}"
        done_before = sum(1 for r in recorded if r["fence"] < fence)
        ran = [e["step"] for e in mine]
        assert ran == names[done_before : done_before + len(ran)], (
            f"{task_id}: fence {fence} ran {ran} with {done_before} steps recorded before it"
        )
        unrecorded = [e for e in mine if e["nonce"] not in recorded_nonces]
        if unrecorded:
            assert len(unrecorded) == 1, f"{task_id}: fence {fence} lost {unrecorded}"
            assert mine[-1] is unrecorded[0], f"{task_id}: fence {fence} went on: {mine}"
            assert claim.ended_by is not None, claim
            assert claim.ended_by.actor == "recovery", claim
            assert claim.worker in ledger.killed, claim
            stats["effects_repeated"] += 1
    stats["effects"] += len(effects)
    for name in names:
        assert any(e["step"] == name for e in effects), f"{task_id}: {name} never ran"


async def read_back(
    store: Any, task_ids: list[str], *, parallel: int = 8
) -> dict[str, tuple[Any, list[Event], dict[str, Any]]]:
    """Each task's snapshot, history and recorded steps, read through the store protocol
    (``parallel`` reads at a time)."""
    out: dict[str, tuple[Any, list[Event], dict[str, Any]]] = {}
    limiter = anyio.CapacityLimiter(parallel)

    async def one(task_id: str) -> None:
        async with limiter:
            task = await store.get(task_id)
            history = list(await store.history(task_id))
            steps = dict(await store.steps(task_id))
        out[task_id] = (task, history, steps)

    async with anyio.create_task_group() as tg:
        for task_id in task_ids:
            tg.start_soon(one, task_id)
    return out


async def all_task_ids(store: Any) -> list[str]:
    """The id of every task in the store (paged through ``list``)."""
    ids: list[str] = []
    after: str | None = None
    while True:
        page = await store.list(limit=1000, after=after)
        if not page:
            return ids
        ids.extend(t.task_id for t in page)
        after = page[-1].task_id
