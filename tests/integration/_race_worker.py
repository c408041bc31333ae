"""Race helper: one process that tries to complete every task of a shared SQLite store.

Usage: ``python _race_worker.py DB INDEX SCHEDULE SEED TASK_IDS_JSON OUT_JSON``

Opens its own store on DB (``synchronous=FULL``, the default), reads the task ids, says
``ready`` on stdout and blocks until the parent writes ``go`` on stdin: the start barrier.
Then it calls ``complete(task_id, {"winner": INDEX})`` on every task and records, per task,
whether it won (the returned snapshot holds its own result), lost (``TaskAlreadyTerminal``
carrying the winner's snapshot) or hit anything else (any other error, reported to the
parent rather than raised).

SCHEDULE says how calls are ordered:

* ``free``: the ids shuffled with ``SEED + INDEX``, called back to back;
* ``lockstep``: the ids in the given order, and after each call the worker says
  ``step`` and waits for the next ``go``, so that every round all workers attempt the
  same task at the same moment;
* ``grouped``: the shuffled ids split among ``GROUPED`` concurrent callers in this
  process, so that the store commits their writes in groups (one transaction each).

Finally it writes its record to OUT_JSON, says ``done`` and exits 0. Only keel and the
standard library are imported, so it runs with the project's interpreter and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from keel.errors import TaskAlreadyTerminal
from keel.store import SqliteStore

GROUPED = 8  # concurrent callers per process in the "grouped" schedule


def barrier() -> None:
    """Block until the parent releases every worker with ``go``."""
    line = sys.stdin.readline().strip()
    if line != "go":
        raise SystemExit(f"start barrier: expected 'go' on stdin, got {line!r}")


async def attempt(store: SqliteStore, task_id: str, index: int) -> dict[str, Any]:
    started = time.time()
    try:
        task = await store.complete(task_id, {"winner": index}, actor=f"racer-{index}")
    except TaskAlreadyTerminal as exc:
        outcome = {"outcome": "lost", "status": exc.task.status.value, "result": exc.task.result}
    except Exception as exc:  # every other error is reported to the parent, not raised
        outcome = {"outcome": "error", "error": f"{type(exc).__name__}: {exc}"}
    else:
        outcome = {"outcome": "won", "status": task.status.value, "result": task.result}
    return {**outcome, "started": started, "ended": time.time()}


async def race(store: SqliteStore, index: int, schedule: str, task_ids: list[str]) -> Any:
    outcomes: dict[str, dict[str, Any]] = {}

    async def run_through(ids: list[str]) -> None:
        for task_id in ids:
            outcomes[task_id] = await attempt(store, task_id, index)
            if schedule == "lockstep" and task_id != task_ids[-1]:
                print("step", flush=True)
                barrier()

    try:
        print("ready", flush=True)
        barrier()
        if schedule == "grouped":  # GROUPED callers at once: their writes commit in groups
            await asyncio.gather(*(run_through(task_ids[i::GROUPED]) for i in range(GROUPED)))
        else:
            await run_through(task_ids)
    finally:
        await store.close()
    return outcomes


def main(db: str, index: int, schedule: str, seed: int, ids_path: str, out_path: str) -> None:
    task_ids: list[str] = json.loads(Path(ids_path).read_text())
    if schedule in {"free", "grouped"}:
        random.Random(seed + index).shuffle(task_ids)
    elif schedule != "lockstep":
        raise SystemExit(f"unknown schedule {schedule!r}")
    store = SqliteStore(db)  # synchronous=FULL, the default
    outcomes = asyncio.run(race(store, index, schedule, task_ids))
    calls = outcomes.values()
    record = {
        "index": index,
        "first": min(o["started"] for o in calls),
        "last": max(o["ended"] for o in calls),
        "tasks": outcomes,
    }
    Path(out_path).write_text(json.dumps(record))
    print("done", flush=True)


if __name__ == "__main__":
    db, index, schedule, seed, ids_path, out_path = sys.argv[1:]
    main(db, int(index), schedule, int(seed), ids_path, out_path)
