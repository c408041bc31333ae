"""What both PostgreSQL peer benchmarks do around their own queue: start the worker
processes, wait for them, check every job ran, and print the result as one JSON line.

Imported by the peer scripts, which run in their own virtualenv (only the standard
library here)."""

from __future__ import annotations

import json
import resource
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any


def run_workers(peer: str, commands: Sequence[Sequence[str]], wait: float) -> float:
    """Run one process per command until all exit (each within ``wait`` seconds); the
    wall time, start-up included.

    Raises:
        SystemExit: a worker failed.
    """
    started = time.perf_counter()
    procs = [subprocess.Popen(list(command)) for command in commands]
    try:
        codes = [p.wait(timeout=wait) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"a {peer} worker failed: exit codes {codes}")
    return wall


def _workers_cpu() -> float:
    """CPU seconds (user + system) of the worker processes, all exited by now (this
    process's children; the fill ran in this process and is not counted)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def report(
    peer: str,
    jobs: int,
    measure: Callable[[], dict[str, float]],
    fill_seconds: float,
    wall: float,
    **settings: Any,
) -> None:
    """Check that every job ran (``measure`` reads the peer's own timestamps) and print
    the result.

    Raises:
        SystemExit: jobs are missing or left in the queue.
    """
    timing = measure()
    if timing["done"] != jobs or timing["left"]:
        raise SystemExit(f"{peer} did not finish every job: {timing}")
    print(
        json.dumps(
            {
                "peer": peer.lower(),
                "jobs": jobs,
                **settings,
                "seconds": round(timing["seconds"], 3),
                "tasks_per_s": round(jobs / timing["seconds"], 1),
                "enqueue_per_s": round(jobs / fill_seconds, 1),
                "worker_cpu_ms_per_task": round(1000 * _workers_cpu() / jobs, 3),
                "wall_seconds_incl_startup": round(wall, 3),
            }
        )
    )
