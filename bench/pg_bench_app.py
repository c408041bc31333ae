"""The app ``bench/pg_bench.py``'s worker processes run: ``keel worker --app pg_bench_app:app``.

A module of its own, so that a worker imports only what its two tasks need, not the
harness (argparse, the report, the peers): a worker's start-up is counted in the
benchmark's CPU per task, as a PgQueuer worker's is (issue 19).
"""

from __future__ import annotations

import json
import os
import time

import anyio

from keel.runtime import Keel, TaskContext

MARKS = os.environ.get("KEEL_BENCH_MARKS")
"""A file the ``hold`` task appends to when its ``finally`` runs (the cancel latency)."""

app = Keel()  # the store is given by `keel worker --store`


@app.task("noop", lease_seconds=30.0)
async def noop(ctx: TaskContext) -> None:
    """Nothing: what is measured is the runtime and the store around it."""


@app.task("hold", lease_seconds=30.0)
async def hold(ctx: TaskContext) -> None:
    """Run until cancelled; write when ``finally`` ran."""
    try:
        await anyio.sleep_forever()
    finally:
        if MARKS:
            line = json.dumps({"task": ctx.task_id, "t": time.time()}) + "\n"
            fd = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
