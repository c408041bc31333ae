"""Real ``keel serve`` / ``keel ops`` processes for the console tests, and waiting on a
task through the store's change feed (a bound, never a pause)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from keel.model import Task
from keel.store import Store
from keel_serve import KeelServe

APPS = Path(__file__).resolve().parent / "apps"
WAIT = 30.0  # seconds any one state may take to be reached


@asynccontextmanager
async def serving(command: str, db: Path, logs: Path, *extra: str) -> AsyncIterator[KeelServe]:
    """``keel serve --app console_app:app`` (``command="serve"``) or ``keel ops`` on
    ``db``, listening on a loopback port of its own; stopped (SIGTERM) at the end."""
    args = ["--store", str(db), *extra]
    if command == "serve":
        args = ["--app", "console_app:app", *args]
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    server = KeelServe(args, cwd=APPS, env=env, log=logs / f"{command}.log", command=command)
    server.start()
    try:
        await server.ready()
        yield server
    finally:
        assert server.stop() == 0, server.output()


def base_of(server: KeelServe) -> str:
    """The server's origin (``http://127.0.0.1:PORT``)."""
    return server.url.removesuffix("/mcp")


async def until(store: Store, task_id: str, ok: Callable[[Task], bool]) -> Task:
    """The task once ``ok(task)`` holds, read again on every change the feed reports."""
    with anyio.fail_after(WAIT):
        async for change in store.changes():
            if change.task_ids is None or task_id in change.task_ids:
                task = await store.get(task_id)
                if ok(task):
                    return task
    raise AssertionError("the change feed ended")  # pragma: no cover
