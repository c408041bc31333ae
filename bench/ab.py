"""A/B harness: Keel's own benchmark figures, one checkout against another, in one run.

Issue 13's bar: every benchmark in ``bench/`` within 5% of before (``main`` at tag
``before-13``) or better, each figure the median of at least 5 alternated before/after
pairs measured in one run. This program measures exactly that:

* two checkouts, ``--before DIR`` and ``--after DIR``, each with its own ``.venv``
  (``uv sync -q`` is run in each first, unless ``--no-sync``). Each benchmark runs as
  ``DIR/.venv/bin/python bench/NAME.py ARGS --out TMP.json`` from ``DIR``, so each side
  runs its own benchmark code against its own ``src/``;
* for each benchmark (``--only NAME`` for some), ``--pairs`` pairs (default 5) of runs,
  one per checkout, back to back: pair 1 before then after, pair 2 after then before,
  and so on (``--same-order``: always before first). A pair of runs seconds apart shares
  the machine's moment; swapping the order cancels a steady drift and any advantage of
  going first or second;
* reduced arguments (``BENCHES`` below), sized for 5 pairs of all six in 30-45 minutes
  on an idle 2-core machine (one pair took 18 minutes with other test runs loading the
  machine to 8-10), and only Keel's figures: peers are skipped with flags both
  versions accept (``mcp_bench --servers keel``, ``pg_bench --peers none``,
  ``store_bench --adapters`` without the seed's ``json`` store);
* from each run's JSON, Keel's headline figures, each with the direction that is better
  (throughputs higher, latencies, times, CPU per task and RSS lower). For each figure:
  the median before, the median after, the change between medians, and the median of
  the paired ratios after/before, which decides the verdict: ``WORSE`` when it is more
  than ``--tolerance`` (5%) the wrong way, ``better`` when as much the right way, else
  ``ok``. Figures marked ``info`` (p99s of a few dozen samples, lease-bound recovery
  times, millisecond-scale opens) are shown with their verdict but do not count against
  the bar: they move by far more than 5% between two runs of the same code. Running it
  with one checkout on both sides shows each figure's noise floor.

Prints a table per benchmark and writes JSON (``--out``, default
``bench/results/ab.json``), rewritten after every benchmark so that an interrupted run
leaves what it measured (``--show FILE`` prints its tables again), with each run's wall
and CPU seconds and load average. Each run is a process group of its own, stopped after
it (``--timeout``, default 30 minutes; ^C). It needs only the standard library: run it
with any Python 3.11.

    git worktree add ../wt-before before-13
    python3 bench/ab.py --before ../wt-before --after .                  # all, 5 pairs
    python3 bench/ab.py --before ../wt-before --after . --only store_bench --pairs 1
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HIGHER, LOWER = "higher", "lower"


@dataclass(frozen=True)
class Figure:
    """One number read from one run: its name, unit and which direction is better."""

    name: str
    value: float
    unit: str
    better: str  # HIGHER or LOWER
    gate: bool = True  # counts against the bar; False: shown, informational


@dataclass(frozen=True)
class Bench:
    """A benchmark program, the arguments the A/B runs it with, and its figures."""

    name: str
    args: str  # split on spaces
    figures: Callable[[dict[str, Any]], Iterator[Figure]]
    about: str = ""


# --- each benchmark's figures, read from its JSON ------------------------------------------


def store_figures(doc: dict[str, Any]) -> Iterator[Figure]:
    for row in doc["rows"]:
        if row["adapter"] == "json-whole-file":  # the seed's store, not Keel's
            continue
        where = f"{row['adapter']} {row['tasks_in_store']:,} tasks C={row['clients']}"
        yield Figure(f"{where} lifecycles/s", row["lifecycles_per_s"], "/s", HIGHER)


def runtime_figures(doc: dict[str, Any]) -> Iterator[Figure]:
    r = doc["results"]
    for row in r["throughput"]:
        where = f"no-op {row['processes']}x{row['concurrency']}"
        yield Figure(f"{where} run/s", row["tasks_per_s"], "/s", HIGHER)
        yield Figure(f"{where} create/s", row["create_per_s"], "/s", HIGHER)
        yield Figure(f"{where} worker cpu/task", row["worker_cpu_us_per_task"], "µs", LOWER)
    for row in r["work"]:
        yield Figure(
            f"1 ms work {row['processes']}x{row['concurrency']} run/s",
            row["tasks_per_s"],
            "/s",
            HIGHER,
        )
    for row in r["cancel"]:
        kind = row["kind"].split(" ")[0]
        yield Figure(f"cancel {kind} p50", row["p50_ms"], "ms", LOWER)
        yield Figure(f"cancel {kind} p99", row["p99_ms"], "ms", LOWER, gate=False)
    if r.get("recovery"):
        rec = r["recovery"]
        # Bound by the lease (a random point of it is when the kill comes): informational.
        yield Figure("kill -> running again p50", rec["kill_to_running_p50_s"], "s", LOWER, False)
        expiry = rec["expiry_to_recovered_mean_s"]
        yield Figure("lease expiry -> recovered", expiry, "s", LOWER, False)
    if r.get("memory"):
        m = r["memory"]
        yield Figure("worker peak RSS, empty store", m["empty_store_vmhwm_mib"], "MiB", LOWER)
        yield Figure(f"worker peak RSS, {m['parked']:,} parked", m["vmhwm_mib"], "MiB", LOWER)


def mcp_figures(doc: dict[str, Any]) -> Iterator[Figure]:
    for row in doc["results"]:
        if row["server"] != "keel":
            continue
        c = f"C={row['clients']}"
        yield Figure(f"{c} tasks/s", row["tasks_per_s"], "/s", HIGHER)
        yield Figure(f"{c} create p50", row["create_p50_ms"], "ms", LOWER)
        yield Figure(f"{c} e2e p50", row["e2e_p50_ms"], "ms", LOWER)
        yield Figure(f"{c} create p99", row["create_p99_ms"], "ms", LOWER, gate=False)
        if row["tasks"]:  # with none done in the window, "per task" is the whole window's
            yield Figure(f"{c} server cpu/task", row["server_cpu_ms_per_task"], "ms", LOWER)
        yield Figure(f"{c} server peak RSS", row["server_peak_rss_mib"], "MiB", LOWER)
        if row["create_only"]["n"]:
            yield Figure(f"{c} create alone p50", row["create_only"]["p50_ms"], "ms", LOWER)
        if row["clients"] == 1 and row.get("discover_p50_ms"):  # the same at every C
            yield Figure("server/discover p50", row["discover_p50_ms"], "ms", LOWER)


def pg_figures(doc: dict[str, Any]) -> Iterator[Figure]:
    for row in doc["throughput"]:
        where = f"{row['workers']} workers x{row['concurrency']}"
        yield Figure(f"{where} run/s", row["tasks_per_s"], "/s", HIGHER)
        yield Figure(f"{where} create/s", row["create_per_s"], "/s", HIGHER)
    yield Figure("cancel cross-process p50", doc["cancel"]["p50_ms"], "ms", LOWER)
    yield Figure("cancel cross-process p99", doc["cancel"]["p99_ms"], "ms", LOWER, gate=False)


def serve_figures(doc: dict[str, Any]) -> Iterator[Figure]:
    yield Figure("restart -> first answer, median", statistics.median(doc["restarts"]), "s", LOWER)
    yield Figure("first start (sample data + index)", doc["first"], "s", LOWER)


def bridge_figures(doc: dict[str, Any]) -> Iterator[Figure]:
    d = doc["diagnosis"]
    yield Figure("diagnosis", d["diagnose_s"], "s", LOWER)
    yield Figure("diagnosis: open", d["open_s"], "s", LOWER, gate=False)  # a few ms
    yield Figure("diagnosis peak RSS", d["peak_rss_mb"], "MB", LOWER)
    yield Figure("sample data generated", doc["sample"]["generate_s"], "s", LOWER)
    yield Figure("ingest (sample)", doc["ingest_sample"]["spans_per_s"], "spans/s", HIGHER)
    # A few milliseconds: scheduling noise is a large share of it.
    yield Figure("prepare, up to date", doc["prepare_up_to_date_s"] * 1000, "ms", LOWER, False)
    for layout, r in doc["ingest"].items():
        yield Figure(f"ingest {layout}", r["spans_per_s"], "spans/s", HIGHER)
        yield Figure(f"ingest {layout} peak RSS", r["peak_rss_mb"], "MB", LOWER)


# Arguments: smaller than each benchmark's default, every Keel measurement still made, and
# only flags that the version at before-13 accepts too.
BENCHES = {
    b.name: b
    for b in (
        Bench(
            "store_bench",
            "--sizes 1000,10000 --lifecycles 1000 --repeat 1"
            " --adapters memory,sqlite-full,sqlite-normal",
            store_figures,
            "no seed json store; sizes 1k and 10k; 1,000 lifecycles; C=1 and 32",
        ),
        Bench(
            "runtime_bench",
            "--tasks 1500 --repeat 1 --work-tasks 300 --cancel-samples 40 --kill-trials 2"
            " --answered 100",
            runtime_figures,
            "1,500 no-op tasks per run, 1 run per configuration, 40 cancels, 2 kills",
        ),
        Bench(
            "mcp_bench",
            "--servers keel --warmup 1 --measure 4 --creates 200 --discovers 100",
            mcp_figures,
            "Keel only; C = 1, 8, 32; 1 s warm-up, 4 s measured",
        ),
        Bench(
            "pg_bench",
            "--peers none --tasks 5000 --repeat 1 --cancel-samples 20",
            pg_figures,
            "no peers; 5,000 tasks, 1 run; 20 cancels",
        ),
        Bench("serve_bench", "--runs 3", serve_figures, "3 restarts"),
        Bench("bridge_bench", "--quick", bridge_figures, "--quick: ~80k spans, 20 MB exports"),
    )
}


# --- running ---------------------------------------------------------------------------------


@dataclass
class Side:
    """One checkout: where it is, what it is, and its venv's interpreter."""

    label: str  # "before" or "after"
    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    def describe(self) -> dict[str, Any]:
        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(self.root), *args], capture_output=True, text=True, check=False
            )
            return done.stdout.strip()

        return {
            "dir": str(self.root),
            "commit": git("rev-parse", "HEAD"),
            "describe": git("describe", "--tags", "--always", "--dirty"),
            "subject": git("log", "-1", "--format=%s"),
        }

    def env(self) -> dict[str, str]:
        """This checkout's venv first on PATH; nothing inherited that points elsewhere."""
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
        env["VIRTUAL_ENV"] = str(self.root / ".venv")
        env["PATH"] = f"{self.root / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env


@dataclass
class Run:
    """One run of one benchmark in one checkout."""

    pair: int
    side: str
    seconds: float
    cpu_seconds: float  # of the benchmark and every process it waited for
    load_before: float
    figures: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def run_once(
    bench: Bench, side: Side, pair: int, tmp: Path, timeout: float
) -> tuple[Run, list[Figure]]:
    """Run the benchmark in one checkout; its figures, or the error that stopped it."""
    out = tmp / f"{bench.name}-{pair}-{side.label}.json"
    log = tmp / f"{bench.name}-{pair}-{side.label}.log"
    command = [str(side.python), f"bench/{bench.name}.py", *bench.args.split(), "--out", str(out)]
    load = os.getloadavg()[0]
    began, cpu_began = time.monotonic(), _children_cpu()
    error = None
    with log.open("w") as sink:
        # A session of its own: on a timeout or ^C, the benchmark's servers and workers
        # are stopped with it instead of being left to load the machine.
        proc = subprocess.Popen(
            command, cwd=side.root, env=side.env(), stdin=subprocess.DEVNULL,
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            if proc.wait(timeout=timeout) != 0:
                error = f"exit {proc.returncode}: {_tail(log)}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:g} s: {_tail(log)}"
        finally:
            _stop_group(proc)
    seconds, cpu = time.monotonic() - began, _children_cpu() - cpu_began
    run = Run(pair, side.label, round(seconds, 1), round(cpu, 1), round(load, 2), error=error)
    figures: list[Figure] = []
    if error is None:
        try:
            figures = list(bench.figures(json.loads(out.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a changed JSON shape
            run.error = f"reading {out.name}: {type(exc).__name__}: {exc}"
    run.figures = {f.name: f.value for f in figures if f.value is not None}
    return run, figures


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left of the run's process group, then reap the benchmark."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def measure(
    bench: Bench, before: Side, after: Side, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """``args.pairs`` alternated pairs of runs of one benchmark; the per-figure summary."""
    runs: list[Run] = []
    specs: dict[str, Figure] = {}  # name -> the first run's Figure (unit, direction, gate)
    for pair in range(1, args.pairs + 1):
        order = (before, after) if args.same_order or pair % 2 else (after, before)
        for side in order:
            run, figures = run_once(bench, side, pair, tmp, args.timeout)
            for f in figures:
                specs.setdefault(f.name, f)
            runs.append(run)
            status = "ok" if run.error is None else f"FAILED\n{run.error}"
            _progress(
                f"[{bench.name}] pair {pair}/{args.pairs} {side.label:<6} "
                f"{run.seconds:6.1f} s, cpu {run.cpu_seconds:5.1f} s "
                f"(load {run.load_before:.1f}): {status}"
            )
    rows = [summarise(spec, runs, args.tolerance) for spec in specs.values()]
    sides = ("before", "after")
    seconds = {label: [r.seconds for r in runs if r.side == label] for label in sides}
    cpu = {label: [r.cpu_seconds for r in runs if r.side == label] for label in sides}
    return {
        "args": bench.args,
        "about": bench.about,
        "run_seconds": seconds,
        "run_cpu_seconds": cpu,
        "runs": [vars(r) for r in runs],
        "figures": rows,
    }


def summarise(spec: Figure, runs: list[Run], tolerance: float) -> dict[str, Any]:
    """Medians per side, the change between them, and the verdict from the paired ratios."""
    by_pair: dict[int, dict[str, float]] = {}
    for r in runs:
        if spec.name in r.figures:
            by_pair.setdefault(r.pair, {})[r.side] = r.figures[spec.name]
    before = [p["before"] for p in by_pair.values() if "before" in p]
    after = [p["after"] for p in by_pair.values() if "after" in p]
    ratios = [
        p["after"] / p["before"] for p in by_pair.values() if len(p) == 2 and p["before"] != 0
    ]
    row: dict[str, Any] = {
        "figure": spec.name,
        "unit": spec.unit,
        "better": spec.better,
        "gate": spec.gate,
        "before": before,
        "after": after,
        "before_median": statistics.median(before) if before else None,
        "after_median": statistics.median(after) if after else None,
        "paired_ratios": [round(x, 4) for x in ratios],
        "paired_ratio_median": round(statistics.median(ratios), 4) if ratios else None,
    }
    b, a = row["before_median"], row["after_median"]
    row["change_pct"] = round(100 * (a / b - 1), 2) if a is not None and b else None
    row["verdict"] = verdict(row["paired_ratio_median"], spec.better, tolerance)
    return row


def verdict(ratio: float | None, better: str, tolerance: float) -> str:
    """``ok`` within the tolerance; ``WORSE`` or ``better`` beyond it; ``-`` with no pair."""
    if ratio is None:
        return "-"
    bar = tolerance / 100
    worse, gained = (ratio < 1 - bar, ratio > 1 + bar)
    if better == LOWER:
        worse, gained = gained, worse
    return "WORSE" if worse else "better" if gained else "ok"


# --- the report ------------------------------------------------------------------------------


def report(name: str, result: dict[str, Any]) -> None:
    secs, cpu = result["run_seconds"], result.get("run_cpu_seconds", {})
    print(
        f"\n{name} ({result['about']}); seconds per run: before {_list(secs['before'])}, "
        f"after {_list(secs['after'])}; cpu seconds: before {_list(cpu.get('before', []))}, "
        f"after {_list(cpu.get('after', []))}"
    )
    print(
        f"  {'figure':<44} {'unit':>7} {'better':>6} {'before':>10} {'after':>10} "
        f"{'change':>8} {'paired':>7}  verdict"
    )
    for row in result["figures"]:
        ratio = row["paired_ratio_median"]
        verdict_text = row["verdict"] + ("" if row["gate"] else " (info)")
        print(
            f"  {row['figure']:<44} {row['unit']:>7} {row['better']:>6} "
            f"{_num(row['before_median']):>10} {_num(row['after_median']):>10} "
            f"{_pct(row['change_pct']):>8} {'-' if ratio is None else f'x{ratio:.3f}':>7}  "
            f"{verdict_text}"
        )
    for run in result["runs"]:
        if run["error"]:
            print(f"  run failed (pair {run['pair']}, {run['side']}): {run['error'][:300]}")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _list(xs: list[float]) -> str:
    return ", ".join(f"{x:.0f}" for x in xs) or "-"


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the before checkout")
    parser.add_argument("--after", type=Path, help="the after checkout")
    parser.add_argument("--pairs", type=int, default=5, help="alternated before/after pairs")
    parser.add_argument(
        "--only", action="append", choices=sorted(BENCHES), help="this benchmark (repeatable)"
    )
    parser.add_argument("--tolerance", type=float, default=5.0, help="percent; the verdict's bar")
    parser.add_argument("--same-order", action="store_true", help="before first in every pair")
    parser.add_argument("--no-sync", action="store_true", help="do not run uv sync -q first")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--keep", type=Path, help="keep each run's JSON and log in this folder")
    parser.add_argument("--out", default="bench/results/ab.json")
    parser.add_argument("--show", type=Path, help="print the tables of this ab.json; run nothing")
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="run benchmark NAME with ARGS instead of its reduced ones (larger runs: less noise)",
    )
    args = parser.parse_args()
    if args.show:
        show(json.loads(args.show.read_text()))
        return
    if args.before is None or args.after is None:
        parser.error("--before and --after are needed (or --show)")
    before, after = Side("before", args.before.resolve()), Side("after", args.after.resolve())
    for side in (before, after):
        if not args.no_sync:
            _progress(f"uv sync -q in {side.root}")
            subprocess.run(["uv", "sync", "-q"], cwd=side.root, env=side.env(), check=True)
        if not side.python.exists():
            parser.error(f"{side.python} does not exist (uv sync in {side.root})")
    names = args.only or list(BENCHES)
    for override in args.args:  # e.g. runtime_bench="--tasks 6000 --repeat 1"
        name, _, given = override.partition("=")
        if name not in BENCHES:
            parser.error(f"--args: unknown benchmark {name!r}")
        BENCHES[name] = dataclasses.replace(BENCHES[name], args=given, about=f"{name} {given}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "benchmark": "ab",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "before": before.describe(),
        "after": after.describe(),
        "pairs": args.pairs,
        "tolerance_pct": args.tolerance,
        "order": "before first" if args.same_order else "alternating (before first in odd pairs)",
        "benches": {},
    }
    started = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keel-ab-") as name:
        tmp = args.keep or Path(name)
        for bench_name in names:
            result = measure(BENCHES[bench_name], before, after, args, tmp)
            document["benches"][bench_name] = result
            report(bench_name, result)
            worse = [
                f"{b}: {row['figure']}"
                for b, res in document["benches"].items()
                for row in res["figures"]
                if row["gate"] and row["verdict"] == "WORSE"
            ]
            document["worse"] = worse
            document["failed_runs"] = [
                f"{b} pair {run['pair']} {run['side']}"
                for b, res in document["benches"].items()
                for run in res["runs"]
                if run["error"]
            ]
            document["elapsed_s"] = round(time.monotonic() - started, 1)
            out.write_text(json.dumps(document, indent=2))
    summary(document)
    print(f"wrote {out} ({document['elapsed_s']:.0f} s)")


def show(document: dict[str, Any]) -> None:
    """The tables of a finished (or interrupted) A/B, from its JSON."""
    for side in ("before", "after"):
        d = document[side]
        print(f"{side:<6} {d['describe']} {d['dir']}: {d['subject'][:70]}")
    for name, result in document["benches"].items():
        report(name, result)
    summary(document)


def summary(document: dict[str, Any]) -> None:
    worse = document.get("worse", [])
    print(
        f"\n{len(worse)} figure(s) more than {document['tolerance_pct']:g}% worse "
        f"(median of paired ratios, {document['pairs']} pair(s)): " + ("; ".join(worse) or "none")
    )
    failed = document.get("failed_runs", [])
    if failed:
        print(f"{len(failed)} run(s) FAILED, their figures missing: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
