"""The 10,000-request fuzz run: hostile requests against real ``keel serve`` processes.

The strategies and checks of ``tests/fuzz`` (``fuzz.strategies``, ``fuzz.harness``),
at bench scale: the conformance app and Incident Bridge, each on SQLite and on
PostgreSQL (``$KEEL_TEST_POSTGRES``, default 127.0.0.1:5432/test; a fresh schema,
dropped after), through 2026-07-28 and 2025-11-25, every kind of probe (envelopes, tool
arguments, task ids, input answers). Loopback only; bounded by ``--requests`` and
``--max-seconds`` (cells not reached in time are left out and said so). Target: 0
``-32603`` and 0 HTTP 5xx in >= 10,000 requests, every refusal leaving the store as it
was, every answer JSON-RPC.

    uv run python bench/fuzz_bench.py                    # 10,000 requests
    uv run python bench/fuzz_bench.py --requests 2000 --stores sqlite

Prints a table (requests by kind, answers by HTTP status and JSON-RPC code, -32603 and
5xx counts) and writes JSON (``--out``, default ``bench/results/fuzz_bench.json``) with
the first reproducer of each distinct problem: the request body and headers, and the
answer's problems.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _report import print_targets, write_results
from fuzz.harness import Harness, Outcome, drive, fuzz_server
from fuzz.strategies import KINDS, V2026, Probe
from keel.mcp.v2025 import V2025

SHARE = {"envelope": 3, "arguments": 3, "task-id": 2, "answer": 2}
"""How a cell's requests are split between the kinds."""
REPRODUCERS = 3  # reproducers kept per distinct problem


class Tally:
    """Every outcome, counted; the first reproducers of each problem kept."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()
        self.by_kind: Counter[tuple[str, str]] = Counter()
        self.internal = 0
        self.server_errors = 0
        self.unchanged_failures = 0
        self.malformed = 0
        self.problems: dict[str, list[dict[str, Any]]] = {}
        self.seconds: list[float] = []

    def add(self, cell: str, probe: Probe, outcome: Outcome, seconds: float) -> None:
        self.requests[probe.kind] += 1
        self.answers[outcome.answer] += 1
        self.by_kind[probe.kind, outcome.answer] += 1
        self.seconds.append(seconds)
        self.internal += outcome.code == -32603
        self.server_errors += outcome.status >= 500
        for problem in outcome.problems:
            self.unchanged_failures += problem.startswith("refused, yet")
            self.malformed += "not JSON-RPC" in problem or "without JSON-RPC" in problem
            key = f"{cell} {probe.kind} {probe.method}: {problem[:60]}"
            kept = self.problems.setdefault(key, [])
            if len(kept) < REPRODUCERS:
                kept.append(
                    {
                        "cell": cell,
                        "request": probe.describe(),
                        "answer": outcome.answer,
                        "problems": outcome.problems,
                    }
                )


class Clock:
    """Seconds between laps (one probe: drawing it, its answer, two store reads)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        return seconds


def run_cell(harness: Harness, cell: str, count: int, tally: Tally, deadline: float) -> int:
    """``count`` requests split between the kinds; how many were sent."""
    sent = 0
    total = sum(SHARE.values())
    for kind in KINDS:
        if harness.protocol == V2026 and kind == "answer" and not harness.target.waiting:
            continue
        if time.monotonic() > deadline:
            break
        clock = Clock()

        def each(probe: Probe, outcome: Outcome, clock: Clock = clock) -> None:
            nonlocal sent
            sent += 1
            tally.add(cell, probe, outcome, clock.lap())

        drive(harness, kind, max(1, count * SHARE[kind] // total), each)
    return sent


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests in all")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="time bound")
    parser.add_argument("--apps", nargs="+", default=["conformance", "bridge"])
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--out", default="bench/results/fuzz_bench.json")
    args = parser.parse_args()
    # SIGTERM unwinds like an error: the servers are stopped, the schemas dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cells = [(a, s, p) for a in args.apps for s in args.stores for p in (V2026, V2025)]
    per_cell = -(-args.requests // len(cells))  # rounded up: at least --requests in all
    tally = Tally()
    started = time.monotonic()
    deadline = started + args.max_seconds
    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="keel-fuzz-bench-") as folder:
        for app in args.apps:
            for store in args.stores:
                if time.monotonic() > deadline:
                    break
                with fuzz_server(app, store, Path(folder) / f"{app}-{store}") as served:
                    for protocol in (V2026, V2025):
                        cell = f"{app}/{store}/{protocol}"
                        with Harness(served, protocol) as harness:
                            sent = run_cell(harness, cell, per_cell, tally, deadline)
                        done.append(cell)
                        print(f"  {cell}: {sent} requests", flush=True)
    elapsed = time.monotonic() - started
    report(args, tally, elapsed, done, [f"{a}/{s}/{p}" for a, s, p in cells])


def _check(target: str, measured: object, ok: bool) -> dict[str, Any]:
    return {"target": target, "measured": str(measured), "ok": ok}


def report(
    args: argparse.Namespace, tally: Tally, elapsed: float, done: list[str], cells: list[str]
) -> None:
    total = sum(tally.requests.values())
    print(f"\nfuzz: {total:,} requests in {elapsed:.0f} s ({len(done)} of {len(cells)} cells)")
    kinds = [k for k in KINDS if tally.requests[k]]
    print(f"\n  {'answer':<18} " + " ".join(f"{k:>9}" for k in kinds) + f" {'all':>9}")
    for answer in sorted(tally.answers, key=lambda a: -tally.answers[a]):
        row = " ".join(f"{tally.by_kind[k, answer]:>9,}" for k in kinds)
        print(f"  {answer:<18} {row} {tally.answers[answer]:>9,}")
    row = " ".join(f"{tally.requests[k]:>9,}" for k in kinds)
    print(f"  {'requests':<18} {row} {total:>9,}")
    p50, p99 = _percentile(tally.seconds, 0.5), _percentile(tally.seconds, 0.99)
    print(f"\n  per probe (drawn, answered, store read twice): p50 {p50 * 1e3:.1f} ms,", end="")
    print(f" p99 {p99 * 1e3:.1f} ms")
    print(f"  -32603 answers: {tally.internal}   HTTP 5xx: {tally.server_errors}")
    print(f"  refusals that changed the store: {tally.unchanged_failures}")
    print(f"  answers that are not JSON-RPC: {tally.malformed}")
    for key in sorted(tally.problems):
        print(f"  problem: {key} (first of them in the JSON)")
    checks = [
        _check(">= 10,000 fuzzed requests", f"{total:,}", total >= 10_000),
        _check("0 -32603 answers", tally.internal, not tally.internal),
        _check("0 HTTP 5xx", tally.server_errors, not tally.server_errors),
        _check("0 problems of any kind", len(tally.problems), not tally.problems),
    ]
    print_targets(checks)
    out = write_results(
        args.out,
        "fuzz_bench",
        args,
        seconds=round(elapsed, 1),
        cells_done=done,
        cells_left=[c for c in cells if c not in done],
        requests=dict(tally.requests),
        answers=dict(tally.answers),
        by_kind={f"{k} {a}": n for (k, a), n in sorted(tally.by_kind.items())},
        internal_errors=tally.internal,
        server_errors=tally.server_errors,
        refusals_that_changed_the_store=tally.unchanged_failures,
        not_json_rpc=tally.malformed,
        p50_ms=round(p50 * 1e3, 2),
        p99_ms=round(p99 * 1e3, 2),
        problems=tally.problems,
        targets=checks,
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
