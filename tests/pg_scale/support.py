"""Processes and checks shared by the PostgreSQL scale-out tests.

* :class:`FrontEnd`: a real ``keel serve --app pg_scale_app:app --no-worker`` process
  on a free loopback port (a :class:`keel_serve.KeelServe`), driven with the official
  MCP client;
* workers are the acceptance tier's :class:`~acceptance.apps.harness.WorkerProcess`
  (``keel worker``), given a ``postgresql://`` store URL;
* :func:`check_task` checks one finished ``pg_steps`` task's outcome, history, recorded
  steps and side effects against each other; it, :class:`Ledger`, :func:`read_effects`
  and the history patterns are :mod:`acceptance.checks`' (shared with
  ``test_worker_crash.py``), imported here for the tests of this folder.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp_types import Result

from acceptance.apps.harness import APPS, WorkerProcess, worker_env
from acceptance.checks import CLAIMED, RECOVERED, Ledger, check_task, read_effects
from keel.mcp.client import CancelTask, Created, Detailed, GetTask, TaskIdParams
from keel.mcp.client import TasksClientExtension as Tasks
from keel.model import Event
from keel_serve import KeelServe

__all__ = [
    "APP",
    "CLAIMED",
    "RECOVERED",
    "FrontEnd",
    "FrontEnds",
    "Ledger",
    "all_task_ids",
    "app_env",
    "cancel_task",
    "check_task",
    "create_task",
    "get_task",
    "mcp_client",
    "read_back",
    "read_effects",
    "until_ready",
]

APP = "pg_scale_app:app"
READY_TIMEOUT = 60.0  # seconds a worker may take to start


async def until_ready(worker: WorkerProcess, within: float = READY_TIMEOUT) -> None:
    """Wait without blocking the event loop until a worker printed its ready line."""
    deadline = time.monotonic() + within
    while not worker.ready:
        if not worker.alive:
            raise AssertionError(f"{worker.worker_id} exited early\n{worker.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker.worker_id} not ready in {within}s\n{worker.output()}")
        await anyio.sleep(0.02)


def app_env(effects: Path, *, lease: float) -> dict[str, str]:
    """The environment of a worker or front end: the test's, without ``$KEEL_STORE``,
    plus the app's settings."""
    return worker_env(effects, lease=lease)


class FrontEnd(KeelServe):
    """``keel serve --no-worker`` for the test app on a store, on a free port (its output
    in ``<logs>/<name>.log``)."""

    def __init__(self, *, store: str, name: str, logs: Path, env: Mapping[str, str]) -> None:
        self.name = name
        super().__init__(
            ["--app", APP, "--no-worker", "--store", store],
            cwd=APPS,
            env=env,
            log=logs / f"{name}.log",
        )
        self.start()


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
