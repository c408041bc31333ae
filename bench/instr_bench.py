"""Instructions per operation, counted by valgrind: a measure this VM's noise cannot move.

On the 2-core VMs Keel is developed on, the same code runs 20-40% faster or slower from
one minute to the next (a pure-CPU loop of memory-store operations, run six times in
alternation, gave after/before ratios from 0.81 to 1.34). Timed A/B pairs (``ab.py``)
then need many pairs to see a 5% change. This program counts what a change costs in
work instead: each scenario runs under ``valgrind --tool=cachegrind --cache-sim=no``,
which counts the instructions the process executes (Python's and SQLite's C code
included; the waits for the disk and the clock are not work and are not counted). Each
scenario runs at two sizes and the difference, divided by the difference of sizes, is
the cost of one more operation, start-up excluded. ``PYTHONHASHSEED=0``: the same run
counts the same (to a fraction of a percent).

Scenarios, each in one process with the checkout's own ``src/``:

* ``memory-lifecycle``: ``create`` then ``cancel`` of one task on ``memory://``, one at
  a time (the store's own work: transitions, rows, JSON, history);
* ``sqlite-lifecycle``: the same on a SQLite file (``synchronous=normal``), through the
  adapter's group commit and SQL;
* ``worker-noop``: no-op tasks created, then run by an in-process ``Worker``
  (concurrency 4) on SQLite until all are completed: claim, lease, attempt, outcome;
* ``worker-noop-pg``: the same on PostgreSQL, as ``keel worker`` runs it (concurrency 32,
  metrics on: the store observed by :class:`~keel.telemetry.Telemetry`, the start-up heap
  frozen and the young collections spaced out by ``settle_heap``), draining no-op
  tasks created beforehand by a process outside valgrind, each run in a fresh schema of
  ``$KEEL_BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``): per
  task, the worker process's claim, attempt and outcome;
* ``mcp-task``: ``keel serve`` (``bench/apps/noop_app.py``, SQLite ``synchronous=full``,
  its workers included) counted alone, while a client outside valgrind sends one
  ``tools/call`` creating a no-op task at a time, waits until the store shows them all
  completed, then one ``tasks/get`` for each: per task, a create over HTTP, a run, a
  get. The client (Keel's client helpers over the SDK's) runs with the after side's ``.venv``.

    python3 bench/instr_bench.py --before ../wt-before --after .
    python3 bench/instr_bench.py --after .            # one checkout: just its counts

Needs valgrind (Debian's ``valgrind``). Prints a table and writes JSON (``--out``,
default ``bench/results/instr_bench.json``). Runs with any Python 3.11; each side's
``.venv`` must exist (``uv sync``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

SCENARIOS = {
    "memory-lifecycle": (300, 1500),
    "sqlite-lifecycle": (300, 1500),
    "worker-noop": (200, 1000),
    "worker-noop-pg": (1000, 3000),
    "mcp-task": (100, 400),
}
"""Scenario -> (small, large) counts of operations."""

# Run inside the checkout's venv: ``python -c SCRIPT SCENARIO COUNT``.
SCRIPT = r"""
import sys, tempfile, anyio
scenario, count = sys.argv[1], int(sys.argv[2])

async def lifecycles(url):
    from keel.store import open_store
    store = open_store(url)
    for _ in range(count):
        task = await store.create(name="x", arguments={"a": 1})
        await store.cancel(task.task_id)
    await store.close()

def counting_app(url):
    # an app on url whose no-op task sets the event once count of them ran
    from keel.runtime import Keel
    app = Keel()
    app.use_store(url)
    done = anyio.Event()
    finished = [0]

    @app.task("noop")
    async def noop(ctx):
        finished[0] += 1
        if finished[0] == count:
            done.set()

    return app, done

async def worker(path):
    from keel.runtime import Worker
    app, done = counting_app(f"sqlite:///{path}?synchronous=normal")
    for _ in range(count):
        await app.submit("noop")
    runner = Worker(app, concurrency=4, worker_id="instr")
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: runner.run(stop=done))
    await app.close()

async def pg_worker(url):
    from keel.runtime import Worker
    from keel.telemetry import Telemetry
    app, done = counting_app(url)
    Telemetry(expect_workers=True).attach(app.store)  # as `keel worker` does
    runner = Worker(app, concurrency=32, worker_id="instr")
    try:  # as `keel worker` does once started: the start-up heap out of the GC's sight
        from keel.cli.common import settle_heap
    except ImportError:  # a checkout from before settle_heap
        pass
    else:
        settle_heap()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: runner.run(stop=done))
    await app.close()

with tempfile.TemporaryDirectory() as tmp:
    if scenario == "worker-noop-pg":
        anyio.run(pg_worker, sys.argv[3])
    elif scenario == "memory-lifecycle":
        anyio.run(lifecycles, "memory://")
    elif scenario == "sqlite-lifecycle":
        anyio.run(lifecycles, f"sqlite:///{tmp}/s.db?synchronous=normal")
    else:
        anyio.run(worker, f"{tmp}/w.db")
"""


# The tasks ``worker-noop-pg`` drains: ``python -c PG_CREATE URL COUNT``, not counted.
PG_CREATE = r"""
import sys, anyio
from keel.store import PostgresStore
url, count = sys.argv[1], int(sys.argv[2])

async def main():
    store = PostgresStore(url)
    for start in range(0, count, 500):
        async with anyio.create_task_group() as tg:
            for _ in range(min(500, count - start)):
                tg.start_soon(lambda: store.create(name="noop", max_attempts=3))
    await store.close()

anyio.run(main)
"""

PG_BASE = os.environ.get("KEEL_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

# The client of ``mcp-task``: ``python -c CLIENT URL COUNT DB`` from bench/, not counted.
CLIENT = r"""
import sqlite3, sys, time, anyio
from mcp import Client
from keel.mcp.client import Created, Detailed, GetTask, TaskIdParams, TasksClientExtension
url, count, db = sys.argv[1], int(sys.argv[2]), sys.argv[3]

async def main():
    async with Client(url, extensions=[TasksClientExtension()], cache=None) as client:
        ids = []
        for _ in range(count):
            created = await client.session.call_tool("noop", {}, allow_claimed=True)
            assert isinstance(created, Created), created
            ids.append(created.task_id)
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            with sqlite3.connect(db) as conn:
                done = conn.execute(
                    "SELECT count(*) FROM tasks WHERE status = 'completed'"
                ).fetchone()[0]
            if done >= count:
                break
            await anyio.sleep(0.5)
        for task_id in ids:
            task = await client.session.send_request(
                GetTask(params=TaskIdParams(task_id=task_id)), Detailed
            )
            assert task.status == "completed", task.status

anyio.run(main)
"""

VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def _counted(stderr: str, what: str) -> int:
    found = re.search(r"I\s+refs:\s+([\d,]+)", stderr)
    if found is None:
        raise RuntimeError(f"{what}: valgrind counted nothing:\n{stderr[-3000:]}")
    return int(found.group(1).replace(",", ""))


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("KEEL_STORE", None)
    return env


def instructions(root: Path, scenario: str, count: int, client: Path) -> int:
    """Instructions executed by one run of ``scenario`` with ``count`` operations."""
    if scenario == "mcp-task":
        return _served(root, count, client)
    if scenario == "worker-noop-pg":
        return _on_postgres(root, count)
    return _counted(_valgrind(root, [scenario, str(count)]), f"{scenario} x{count}")


def _valgrind(root: Path, args: list[str]) -> str:
    """Run ``SCRIPT`` with ``args`` under valgrind in ``root``'s venv: its stderr."""
    python = root / ".venv" / "bin" / "python"
    done = subprocess.run(
        [*VALGRIND, str(python), "-c", SCRIPT, *args],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} in {root} failed:\n{done.stderr[-3000:]}")
    return done.stderr


def _on_postgres(root: Path, count: int) -> int:
    """``worker-noop-pg``: ``count`` tasks created outside valgrind, drained under it."""
    schema = f"keel_instr_{secrets.token_hex(4)}"
    url = f"{PG_BASE}{'&' if '?' in PG_BASE else '?'}{urlencode({'schema': schema})}"
    python = root / ".venv" / "bin" / "python"
    try:
        subprocess.run([str(python), "-c", PG_CREATE, url, str(count)], cwd=root, env=_env(),
                       check=True, timeout=600)  # fmt: skip
        return _counted(_valgrind(root, ["worker-noop-pg", str(count), url]), f"pg x{count}")
    finally:
        subprocess.run(
            [str(python), "-c", "import sys, psycopg; psycopg.connect(sys.argv[1], "
             "autocommit=True).execute(f'DROP SCHEMA IF EXISTS \"{sys.argv[2]}\" CASCADE')",
             PG_BASE, schema], check=False, timeout=120,
        )  # fmt: skip


def _served(root: Path, count: int, client: Path) -> int:
    """``keel serve`` under valgrind, driven by ``count`` tasks from a client outside it."""
    with tempfile.TemporaryDirectory(prefix="keel-instr-") as tmp:
        db = Path(tmp) / "keel.db"
        with socket.socket() as probe:  # a port for before-13 too (it has no --port 0)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        keel = root / ".venv" / "bin" / "keel"
        serve = [str(root / ".venv" / "bin" / "python"), str(keel), "serve", "--app"]
        serve += ["apps.noop_app:app", "--store", str(db), "--port", str(port)]
        server = subprocess.Popen(
            [*VALGRIND, *serve],
            cwd=root / "bench",
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert server.stderr is not None
        lines = []
        for line in server.stderr:  # until uvicorn listens (minutes under valgrind)
            lines.append(line)
            if "Uvicorn running on" in line:
                break
        else:
            raise RuntimeError(f"keel serve in {root} did not start:\n{''.join(lines)[-3000:]}")
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            subprocess.run(
                [str(client / ".venv" / "bin" / "python"), "-c", CLIENT, url, str(count), str(db)],
                cwd=client / "bench",
                env=_env(),
                check=True,
                timeout=3600,
            )
        finally:
            server.send_signal(signal.SIGTERM)
            rest = server.stderr.read()
            server.wait(timeout=600)
        return _counted(rest, f"keel serve x{count}")


def measure(root: Path, scenario: str, client: Path) -> dict[str, Any]:
    small, large = SCENARIOS[scenario]
    at_small = instructions(root, scenario, small, client)
    at_large = instructions(root, scenario, large, client)
    return {
        "scenario": scenario,
        "counts": [small, large],
        "instructions": [at_small, at_large],
        "per_op": round((at_large - at_small) / (large - small)),
        "start_up": round(at_small - small * (at_large - at_small) / (large - small)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout to compare with (its .venv)")
    parser.add_argument("--after", type=Path, default=Path(), help="the checkout measured")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/instr_bench.json"))
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("instr_bench: needs valgrind (apt-get install valgrind)")
    sides = {"after": args.after.resolve()}
    if args.before is not None:
        sides = {"before": args.before.resolve(), **sides}
    began = time.monotonic()
    rows = []
    for scenario in args.only or list(SCENARIOS):
        row: dict[str, Any] = {"scenario": scenario}
        for label, root in sides.items():
            row[label] = measure(root, scenario, sides["after"])
            print(f"  {scenario} {label}: {row[label]['per_op']:,} per op", file=sys.stderr)
        if "before" in row:
            row["ratio"] = round(row["after"]["per_op"] / row["before"]["per_op"], 4)
        rows.append(row)
    print(f"\n{'scenario':<18} {'before/op':>12} {'after/op':>12} {'after/before':>13}")
    for row in rows:
        before = f"{row['before']['per_op']:,}" if "before" in row else "-"
        ratio = f"x{row['ratio']:.3f}" if "ratio" in row else "-"
        print(f"{row['scenario']:<18} {before:>12} {row['after']['per_op']:>12,} {ratio:>13}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "instr_bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sides": {label: str(root) for label, root in sides.items()},
        "rows": rows,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
