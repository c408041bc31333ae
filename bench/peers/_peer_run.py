"""What both PostgreSQL peer benchmarks do around their own queue: start the worker
processes, wait for them, check every job ran, and print the result as one JSON line.

Imported by the peer scripts, which run in their own virtualenv (only the standard
library here)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class ServerCpu:
    """CPU seconds the local PostgreSQL server's processes spent while the block ran.

    Every process named ``postgres`` is read from ``/proc`` every ``every`` seconds (the
    server runs on this machine); a backend's CPU is kept as last seen, so that a backend
    whose client disconnected and which exited during the block still counts (up to its
    last ``every`` seconds). Used for Keel's workers and the peers' alike, over the phase
    in which the workers drain the queue.
    """

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.seconds = 0.0
        self._seen: dict[int, float] = {}
        self._before: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def read() -> dict[int, float]:
        tick = os.sysconf("SC_CLK_TCK")
        found: dict[int, float] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:  # the process is gone
                continue
            name, _, rest = text.partition(" (")[2].partition(") ")
            if name == "postgres":
                fields = rest.split()
                found[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick
        return found

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self._seen.update(self.read())

    def __enter__(self) -> ServerCpu:
        self._before = self.read()
        self._seen = dict(self._before)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._seen.update(self.read())
        self.seconds = sum(self._seen.values()) - sum(self._before.values())


SERVER = ServerCpu()
"""The server's CPU while the workers ran (read by :func:`report`)."""


def run_workers(peer: str, commands: Sequence[Sequence[str]], wait: float) -> float:
    """Run one process per command until all exit (each within ``wait`` seconds); the
    wall time, start-up included.

    Raises:
        SystemExit: a worker failed.
    """
    started = time.perf_counter()
    with SERVER:
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
                "server_cpu_ms_per_task": round(1000 * SERVER.seconds / jobs, 3),
                "wall_seconds_incl_startup": round(wall, 3),
            }
        )
    )
