"""The Procrastinate side of ``bench/pg_bench.py``: no-op jobs drained by worker processes.

Run with the benchmark's own virtual environment (``procrastinate`` from PyPI; never
one of Keel's dependencies), never with Keel's::

    ~/.cache/keel-bench/pg-procrastinate/bin/python bench/peers/pg_procrastinate_bench.py \
        --dsn postgresql://postgres@127.0.0.1:5432/some_fresh_db --jobs 5000 --workers 4

Against a fresh, empty database it applies Procrastinate's schema, defers ``--jobs``
no-op jobs in batches (``batch_defer_async``), then starts ``--workers`` processes of
this same script (``--worker``), each one ``run_worker_async`` with ``--concurrency``
(default 8, on a psycopg pool one larger) and ``wait=False``: it exits once no job is
left. The measured shape is the one Keel's side measures: pre-filled ready jobs,
fetched, run (a no-op) and finished by four processes. The rate is jobs / (last
``succeeded`` event - first ``started`` event), from ``procrastinate_events`` (the
server's clock). It prints one JSON line on stdout.

This file imports nothing from Keel (it runs in another interpreter) and is excluded
from Keel's type checking; ruff still lints it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import psycopg
from _peer_run import report, run_workers
from procrastinate import App, PsycopgConnector

DEFER_BATCH = 1000  # jobs per batch_defer_async call
WAIT = 600.0  # seconds the workers may take to drain the queue


def make_app(dsn: str, concurrency: int) -> App:
    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=concurrency + 1))

    @app.task(name="noop")
    async def noop() -> None:
        """Nothing: what is measured is the queue around it."""

    return app


async def worker(dsn: str, concurrency: int) -> None:
    app = make_app(dsn, concurrency)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )


async def fill(dsn: str, jobs: int) -> float:
    app = make_app(dsn, 1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        noop = app.tasks["noop"]
        t0 = time.perf_counter()
        for start in range(0, jobs, DEFER_BATCH):
            await noop.batch_defer_async(*([{}] * min(DEFER_BATCH, jobs - start)))
        return time.perf_counter() - t0


def measure(dsn: str) -> dict[str, float]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT"
            " (SELECT min(at) FROM procrastinate_events WHERE type = 'started'),"
            " (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded'),"
            " (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),"
            " (SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded')"
        ).fetchone()
    assert row is not None
    first, last, done, left = row
    return {"seconds": (last - first).total_seconds(), "done": int(done), "left": int(left)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--worker", action="store_true", help="(internal) run one worker")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker(args.dsn, args.concurrency))
        return
    fill_seconds = asyncio.run(fill(args.dsn, args.jobs))
    argv = [sys.executable, __file__, "--worker", "--dsn", args.dsn, "--concurrency"]
    commands = [[*argv, str(args.concurrency)] for _ in range(args.workers)]
    wall = run_workers("Procrastinate", commands, WAIT)
    report(
        "Procrastinate",
        args.jobs,
        lambda: measure(args.dsn),
        fill_seconds,
        wall,
        workers=args.workers,
        concurrency=args.concurrency,
    )


if __name__ == "__main__":
    main()
