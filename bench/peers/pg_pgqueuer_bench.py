"""The PgQueuer side of ``bench/pg_bench.py``: no-op jobs drained by worker processes.

Run with the benchmark's own virtual environment (``pgqueuer`` and ``asyncpg`` from
PyPI; never one of Keel's dependencies), never with Keel's::

    ~/.cache/keel-bench/pg-pgqueuer/bin/python bench/peers/pg_pgqueuer_bench.py \
        --dsn postgresql://postgres@127.0.0.1:5432/some_fresh_db --jobs 20000 --workers 4

Against a fresh, empty database it installs PgQueuer's schema (durable: logged tables,
the default), enqueues ``--jobs`` no-op jobs in batches, then starts ``--workers``
processes of this same script (``--worker``), each one ``QueueManager`` on its own
asyncpg connection with ``batch_size`` 10 (PgQueuer's default, and its own benchmark's),
running in ``drain`` mode: it exits once the queue is empty and its jobs are logged.
The measured shape is the one Keel's side measures: pre-filled ready jobs, claimed, run
(a no-op) and completed by four processes. The rate is jobs / (last completion - first
pick), both read from ``pgqueuer_log``'s timestamps (the server's clock). It prints one
JSON line on stdout.

This file imports nothing from Keel (it runs in another interpreter) and is excluded
from Keel's type checking; ruff still lints it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import timedelta

import asyncpg
from _peer_run import report, run_workers
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "noop"
ENQUEUE_BATCH = 1000  # jobs per enqueue call (one statement)
WAIT = 300.0  # seconds the workers may take to drain the queue


async def worker(dsn: str, batch_size: int) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        """Nothing: what is measured is the queue around it."""

    await qm.run(
        batch_size=batch_size,
        mode=QueueExecutionMode.drain,
        dequeue_timeout=timedelta(seconds=1),
    )
    await conn.close()


async def fill(dsn: str, jobs: int) -> float:
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    t0 = time.perf_counter()
    for start in range(0, jobs, ENQUEUE_BATCH):
        n = min(ENQUEUE_BATCH, jobs - start)
        await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
    seconds = time.perf_counter() - t0
    await conn.close()
    return seconds


async def measure(dsn: str) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    row = await conn.fetchrow(
        "SELECT"
        " (SELECT min(created) FROM pgqueuer_log WHERE status = 'picked') AS first,"
        " (SELECT max(created) FROM pgqueuer_log WHERE status = 'successful') AS last,"
        " (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful') AS done,"
        " (SELECT count(*) FROM pgqueuer) AS left_in_queue"
    )
    await conn.close()
    return {
        "seconds": (row["last"] - row["first"]).total_seconds(),
        "done": int(row["done"]),
        "left": int(row["left_in_queue"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help="(internal) run one worker")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.dsn, args.batch_size))
        return
    fill_seconds = asyncio.run(fill(args.dsn, args.jobs))
    argv = [sys.executable, __file__, "--worker", "--dsn", args.dsn, "--batch-size"]
    commands = [[*argv, str(args.batch_size)] for _ in range(args.workers)]
    wall = run_workers("PgQueuer", commands, WAIT)
    report(
        "PgQueuer",
        args.jobs,
        lambda: asyncio.run(measure(args.dsn)),
        fill_seconds,
        wall,
        workers=args.workers,
        batch_size=args.batch_size,
    )


if __name__ == "__main__":
    main()
