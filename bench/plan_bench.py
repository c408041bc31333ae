"""What SQLite write planning buys: two worker processes, ``?plan=auto`` against ``?plan=off``.

Planning (``keel.store.sqlite.planning``) works out a group of writes against a read
snapshot, outside the write lock, so that a second process waits less. It is kept only
while it pays: at least x1.2 on two processes. This measures exactly that, isolated: the
same code, the same no-op tasks (``runtime_bench.throughput``: created first, then run by
real ``keel worker`` processes on a SQLite file with ``synchronous=full``), the workers'
store URL the only difference. ``auto`` and ``off`` alternate, pair by pair (the order
flips every pair), and the verdict is the median of the paired ratios: this 2-core VM's
speed drifts over minutes, and two runs seconds apart share the same moment.

    uv run python bench/plan_bench.py                  # 5 pairs at 4 and 16 per process
    uv run python bench/plan_bench.py --pairs 3 --concurrency 4

Prints a table and writes JSON (``--out``, default ``bench/results/plan_bench.json``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from _report import print_targets, write_results
from runtime_bench import throughput

TARGET = 1.2
"""The least that planning must buy on two processes (paired median) to stay."""


def measure(tmp: Path, pairs: int, tasks: int, concurrency: int) -> dict[str, Any]:
    """``pairs`` alternated auto/off pairs at one concurrency; rates and paired ratios."""
    rates: dict[str, list[float]] = {"auto": [], "off": []}
    for n in range(pairs):
        order = ("auto", "off") if n % 2 == 0 else ("off", "auto")
        for plan in order:
            folder = tmp / f"c{concurrency}-{n}-{plan}"
            row = anyio.run(throughput, folder, 2, tasks, concurrency, "noop", plan)
            rates[plan].append(row["tasks_per_s"])
            print(f"  2 x {concurrency}, pair {n + 1}, plan={plan}: {row['tasks_per_s']:,.0f}/s")
    ratios = [a / o for a, o in zip(rates["auto"], rates["off"], strict=True)]
    return {
        "concurrency": concurrency,
        "auto_per_s": rates["auto"],
        "off_per_s": rates["off"],
        "paired_ratios": [round(r, 2) for r in ratios],
        "paired_ratio_median": round(statistics.median(ratios), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=3000, help="no-op tasks per run")
    parser.add_argument("--concurrency", default="4,16", help="per process, comma-separated")
    parser.add_argument("--out", default="bench/results/plan_bench.json")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keel-plan-bench-") as name:
        rows = [
            measure(Path(name), args.pairs, args.tasks, int(c)) for c in args.concurrency.split(",")
        ]
    print(f"\n{'2 processes x':>14} {'auto /s':>9} {'off /s':>9} {'paired auto/off':>16}")
    for row in rows:
        print(
            f"{row['concurrency']:>14} {statistics.median(row['auto_per_s']):>9,.0f} "
            f"{statistics.median(row['off_per_s']):>9,.0f} {row['paired_ratio_median']:>15}x"
        )
    checks = [
        {
            "target": f"planning buys >= x{TARGET} on two processes at {row['concurrency']} each",
            "measured": f"x{row['paired_ratio_median']} (median of {args.pairs} pairs)",
            "ok": row["paired_ratio_median"] >= TARGET,
        }
        for row in rows
    ]
    print_targets(checks)
    out = write_results(
        args.out,
        "plan_bench",
        args,
        rows=rows,
        checks=checks,
        elapsed_s=round(time.monotonic() - started, 1),
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
