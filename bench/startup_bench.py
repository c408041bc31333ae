"""Start-up of a ``keel worker``: the CPU one spends from process start to its first claim.

``bench/pg_bench.py`` counts its workers' whole CPU, start-up included, per task (issue
19); this measures the start-up alone. Each run starts ``keel worker --app APP`` (from
``bench/``, as pg_bench's fleet does: compiled bytecode under ``~/.cache/keel-bench``)
against a fresh schema of the PostgreSQL at ``$KEEL_BENCH_POSTGRES`` (migrated first, as
pg_bench's is before its workers start), waits for its
``keel worker w:`` line (printed once it is claiming), reads its CPU from ``/proc`` (10 ms
ticks), lets it idle ``--idle`` seconds, stops it with SIGTERM and reads its whole CPU
(``getrusage`` of the child: start, idle, stop). Prints each run and the medians; writes
JSON (``--out``).

``--instructions`` counts instead, under ``valgrind --tool=cachegrind --cache-sim=no``
(``PYTHONHASHSEED=0``; a measure the VM's load cannot move, see ``instr_bench.py``), the
instructions of start-up and stop (SIGTERM as soon as the worker is ready: no idle).

    uv run python bench/startup_bench.py                       # 5 runs of pg_bench_app:app
    uv run python bench/startup_bench.py --runs 9 --app pg_bench_app:app
    uv run python bench/startup_bench.py --instructions --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import keel
from _report import write_results
from keel.store import migrate
from pg_bench import BASE, HERE, KEEL, compiled_env, drop, precompile, url

TICK = os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these, per second
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def cpu_now(pid: int) -> float:
    """Seconds of CPU (user + system) the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15


def one_run(app: str, store_url: str, idle: float, counted: bool) -> dict[str, float]:
    """One worker, started, ready, idle, stopped: its ready time and CPU (or, ``counted``,
    the instructions it executed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    worker = ["worker", "--app", app, "--store", store_url, "--concurrency", "32",
              "--worker-id", "w"]  # fmt: skip
    if counted:
        command = [*VALGRIND, sys.executable, "-m", "keel", *worker]
        env = {**compiled_env(), "PYTHONHASHSEED": "0"}
    else:
        command, env = [str(KEEL), *worker], compiled_env()
    proc = subprocess.Popen(
        command, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("keel worker w:"):
            break
        sys.stderr.write(line)
    else:
        raise RuntimeError(f"the worker ended before it was ready (exit {proc.wait()})")
    ready = time.perf_counter() - started
    at_ready = cpu_now(proc.pid)
    time.sleep(0 if counted else idle)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    proc.wait(timeout=60)
    if counted:
        found = re.search(r"I\s+refs:\s+([\d,]+)", rest)
        if found is None:
            raise RuntimeError(f"valgrind counted nothing:\n{rest[-3000:]}")
        return {"ready_s": ready, "instructions_m": int(found.group(1).replace(",", "")) / 1e6}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"ready_s": ready, "cpu_at_ready_s": at_ready, "cpu_total_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--app", default="pg_bench_app:app")
    parser.add_argument("--idle", type=float, default=1.0, help="seconds between ready and stop")
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--out", default=str(HERE / "results" / "startup_bench.json"))
    args = parser.parse_args()
    precompile(Path(sys.executable), Path(keel.__file__).parent, HERE)
    schema = f"keel_su_{secrets.token_hex(3)}"
    runs = []
    try:
        migrate(url(schema))
        for _ in range(args.runs):
            runs.append(one_run(args.app, url(schema), args.idle, args.instructions))
            print("  ".join(f"{key} {value:.2f}" for key, value in runs[-1].items()))
    finally:
        drop(schema)
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(
        f"median of {len(runs)} ({args.app}, idle {args.idle:g} s, {BASE}): "
        + ", ".join(f"{key} {value:.2f}" for key, value in medians.items())
    )
    write_results(args.out, "startup_bench", args, runs=runs, medians=medians)


if __name__ == "__main__":
    main()
