"""CPU contention for benchmarks: N CPU-bound processes beside the programs measured.

``with CpuLoad(2) as load:`` starts two pure-Python busy loops (``python -c``, each its
own process, so each can take a whole core) and stops them when the block ends, however
it ends (an exception, Ctrl-C). Each loop also checks every few milliseconds that its
parent is still the one that started it, and ends on its own if the benchmark was killed
outright, so that no busy loop outlives the run.

``load.cpu_seconds()`` is the CPU the loops got so far (``/proc``): how hard they really
competed. The loops run at the same (normal) priority as everything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

__all__ = ["CpuLoad"]

TICK = os.sysconf("SC_CLK_TCK")

# Busy, in pure Python; a check of the parent every ~200k iterations (a few ms).
BUSY_LOOP = (
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(200_000):\n"
    "        pass\n"
)


class CpuLoad:
    """``processes`` CPU-bound processes while the ``with`` block runs (0: none)."""

    def __init__(self, processes: int) -> None:
        if processes < 0:
            raise ValueError("--cpu-load takes a number of processes >= 0")
        self.processes = processes
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __enter__(self) -> CpuLoad:
        try:
            for _ in range(self.processes):
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BUSY_LOOP],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        start_new_session=True,  # Ctrl-C reaches the bench, which stops them
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def cpu_seconds(self) -> float:
        """User + system CPU the loops got so far, from /proc/PID/stat."""
        total = 0
        for pid in self.pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / TICK

    def stop(self) -> None:
        """Stop every loop (SIGTERM, then SIGKILL); safe to call twice."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._procs.clear()

    def describe(self) -> str:
        if not self.processes:
            return "none"
        return f"{self.processes} busy pure-Python process(es), normal priority"
