"""Race helper: one OS process running a keel Worker over a SQLite file shared with others.

Usage: ``python _racer.py DB LOG IDS_JSON LEASE CONCURRENCY WATCH_INTERVAL``

Opens its own store on DB (the real clock), says ``ready`` on stdout and blocks until the
parent writes ``go`` on stdin (the start barrier). Then it runs a Worker for the task
``race`` until every task listed in IDS_JSON has ended, stops it, says ``done`` and exits 0.

The handler ``race(n, stall)`` appends lines to LOG, each with one ``os.write`` on an
``O_APPEND`` descriptor, so the lines of all processes are whole and in one order:

* ``start TASK FENCE PID``: an attempt began (its claim committed before this line);
* ``try TASK FENCE`` then ``ok TASK FENCE`` or ``lost TASK FENCE ERROR``: a fenced write
  (a checkpointed step) and whether the store accepted it;
* ``stale TASK FENCE OUTCOME``: a stalled attempt's own ``complete(fence=FENCE)``;
* ``return TASK FENCE``: the handler returns; the worker then completes with FENCE.

A ``stall`` task's first attempt plays a paused process: it blocks this process's event
loop (so no heartbeat renews its lease) until LOG shows another attempt of the task,
then tries to complete the task with its stale fence. Every other attempt of a stall
task waits for that ``stale`` line before it returns, so the stale write meets a live
task. Plain tasks wait until two processes have started attempts (proof that they ran at
the same time). Only keel, anyio and the standard library are imported.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from keel.errors import KeelError, LeaseLost
from keel.runtime import Keel, TaskContext, Worker
from keel.store import SqliteStore

PID = os.getpid()
WAIT = 60.0  # seconds any wait of this helper may take before it gives up


class Log:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, *words: object) -> None:
        os.write(self._fd, (" ".join(str(w) for w in words) + "\n").encode())

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.path.read_text().splitlines()]

    def has(self, word: str, task_id: str, newer_than: int = -1) -> bool:
        return any(
            w[0] == word and w[1] == task_id and int(w[2]) > newer_than for w in self.lines()
        )

    def pids_started(self) -> int:
        return len({w[3] for w in self.lines() if w[0] == "start"})


async def until(check: Any) -> None:
    """Wait, without blocking the loop, for ``check()`` (bounded)."""
    # Polling: the line it waits for is written by another process, not an Event here.
    with anyio.fail_after(WAIT):
        while True:
            if check():
                return
            await anyio.sleep(0.005)


def build(store: SqliteStore, log: Log, lease: float) -> Keel:
    app = Keel(store)

    @app.task("race", lease_seconds=lease, max_attempts=20, retry_base=0.01, retry_cap=0.05)
    async def race(ctx: TaskContext, n: int, stall: bool = False) -> dict[str, Any]:
        task_id, fence = ctx.task_id, ctx.fence
        log.write("start", task_id, fence, PID)
        if stall and fence == 1:
            deadline = time.monotonic() + WAIT
            while not log.has("start", task_id, newer_than=fence):
                if time.monotonic() > deadline:
                    log.write("stall-timeout", task_id, fence)
                    break
                # Blocking on purpose: a paused process renews no lease.
                time.sleep(0.005)  # noqa: ASYNC251
            with anyio.CancelScope(shield=True):  # record the answer even if stopped
                try:
                    await store.complete(task_id, {"fence": fence, "stale": True}, fence=fence)
                except KeelError as exc:
                    log.write("stale", task_id, fence, type(exc).__name__)
                else:
                    log.write("stale", task_id, fence, "accepted")
            return {"fence": fence, "pid": PID}
        log.write("try", task_id, fence)
        try:
            await ctx.step(f"work-{fence}", lambda: {"fence": fence, "pid": PID})
        except LeaseLost as exc:
            log.write("lost", task_id, fence, type(exc).__name__)
            raise
        log.write("ok", task_id, fence)
        if stall:
            await until(lambda: log.has("stale", task_id))
        else:
            await until(lambda: log.pids_started() >= 2)
        log.write("return", task_id, fence)
        return {"fence": fence, "pid": PID}

    return app


async def main(
    db: str, log_path: str, task_ids: list[str], lease: float, concurrency: int, watch: float
) -> None:
    store = SqliteStore(db)
    log = Log(log_path)
    app = build(store, log, lease)
    worker = Worker(
        app,
        concurrency=concurrency,
        worker_id=f"pid-{PID}",
        claim_interval=0.02,
        watch_interval=watch,
        recover_interval=0.05,
        purge_interval=3600.0,
    )
    print("ready", flush=True)
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"start barrier: expected 'go', got {line!r}")
    stop = anyio.Event()

    async def until_all_ended() -> None:
        with anyio.fail_after(WAIT):
            while True:
                seen = await store.statuses(task_ids)
                if len(seen) == len(task_ids) and all(s.terminal for s, _ in seen.values()):
                    break
                await anyio.sleep(0.05)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(until_all_ended)
        await worker.run(stop=stop)
    await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    db, log_path, ids_path, lease, concurrency, watch = sys.argv[1:]
    ids = json.loads(Path(ids_path).read_text())
    anyio.run(main, db, log_path, ids, float(lease), int(concurrency), float(watch))
