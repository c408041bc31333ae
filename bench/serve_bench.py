"""``keel serve`` start-up: from process start to the first answered MCP request.

Incident Bridge on an existing data directory (the sample data and its trace index
already built by a first start, which is measured separately): each run starts the real
console script ``keel serve`` on a free loopback port and times until an official MCP
client's ``tools/list`` answers, then stops it. Target: ready within 2 s.

    uv run python bench/serve_bench.py              # 10 restarts
    uv run python bench/serve_bench.py --runs 3

Prints a table and writes JSON (``--out``, default ``bench/results/serve_bench.json``).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

from _report import print_targets, write_results

KEEL = Path(sys.executable).parent / "keel"
TARGET_SECONDS = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _first_answer(url: str, process: subprocess.Popen[bytes], started: float) -> float:
    """Seconds from ``started`` until tools/list answers (polling every 10 ms)."""
    with anyio.fail_after(60):
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"keel serve exited with {process.returncode}")
            try:
                async with Client(url) as client:
                    tools = await client.list_tools()
                assert any(t.name == "diagnose_root_cause" for t in tools.tools)
                return time.perf_counter() - started
            except (OSError, RuntimeError, ExceptionGroup):
                await anyio.sleep(0.01)


def start_once(data_dir: Path) -> float:
    port = _free_port()
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(KEEL), "serve", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return anyio.run(_first_answer, f"http://127.0.0.1:{port}/mcp", process, started)
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="restarts on the existing data")
    parser.add_argument("--out", default="bench/results/serve_bench.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-serve-bench-") as folder:
        data_dir = Path(folder) / "data"
        first = start_once(data_dir)  # generates the sample data and builds the index
        restarts = [start_once(data_dir) for _ in range(args.runs)]
    median, worst = statistics.median(restarts), max(restarts)
    print("keel serve (Incident Bridge): process start -> first tools/list answered")
    print(f"  {'start':<34} {'seconds':>8}")
    print(f"  {'first (sample data + index built)':<34} {first:>8.2f}")
    print(f"  {'restart, median of ' + str(args.runs):<34} {median:>8.2f}")
    print(f"  {'restart, worst':<34} {worst:>8.2f}")
    checks = [
        {
            "target": f"ready within {TARGET_SECONDS:g} s of start on an existing data directory",
            "measured": f"median {median:.2f} s, worst {worst:.2f} s over {args.runs} starts",
            "ok": worst <= TARGET_SECONDS,
        }
    ]
    print_targets(checks)
    out = write_results(args.out, "serve", args, first=first, restarts=restarts, targets=checks)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
