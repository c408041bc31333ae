"""Incident Bridge benchmark: diagnosis over ~1,000,000 indexed spans, and OTLP/JSON ingest.

1. **diagnosis**: sample data with ~1M spans (``--rate``), indexed; then one diagnosis of
   the seed's incident (``INC-2026-0142``, service ``payments``) at the fast pace, in a
   fresh subprocess: wall time and peak RSS. Targets: <= 10 s, <= 500 MB.
2. **ingest**: a large OTLP/JSON export (the sample traces repeated up to ``--export-mb``,
   default 200 MB; ``--gb`` for 1 GB), as JSON lines (the collector's file exporter) and
   as one single request object (walked span by span), each indexed in a fresh
   subprocess: spans/s, MiB/s and peak RSS. Target: <= 500 MB RSS for a 1 GB export.

3. **ingest only** (``--ingest-only``): ``keel bridge ingest`` on a collector-format
   export (default: ``bench/rca/generate.py --seed 2001`` into a temp dir, 1M spans),
   timed end to end as a subprocess: wall time, spans/s, peak RSS. ``--before SRC`` runs
   another version's ``src`` folder (``git archive main src | tar -x -C /tmp/main``) on
   the same export, alternated with this checkout, ``--runs`` times each (medians).

4. **diagnosis over an export** (``--diagnose-export DIR``): the incidents of a
   collector-format export (``bench/rca/generate.py``: ~1M spans), indexed once into
   ``--data-dir`` (``keel bridge ingest``), then each of ``--incidents`` of them (spread
   over the file, default 12; 0 for all) diagnosed in a fresh subprocess, as
   ``keel bridge diagnose`` would: wall time of the diagnosis and of the whole process,
   peak RSS, the 1-minute load average after each. Targets: <= 10 s, <= 500 MB.

Peak RSS counts the ingest's worker processes too (``keel bridge ingest`` reads the files
in one process per CPU): in ``--ingest-only``, the largest sum of the resident sets of the
process and its descendants, sampled every 20 ms from ``/proc`` (and never less than the
process's own ``ru_maxrss``); in the 200 MB / 1 GB ingest, the process's own peak plus
each worker's taken as the largest one's (``RUSAGE_CHILDREN``), an upper bound. Elsewhere
it is the subprocess's ``ru_maxrss``. Numbers vary by tens of percent on a shared 2-core
machine.

    uv run python bench/bridge_bench.py               # 1M spans, 200 MB export
    uv run python bench/bridge_bench.py --gb          # a 1 GB export
    uv run python bench/bridge_bench.py --quick       # a smoke run
    uv run python bench/bridge_bench.py --ingest-only --before /tmp/main/src --runs 3
    uv run python bench/bridge_bench.py --diagnose-export /tmp/rca-2001 --data-dir /tmp/i-2001

Prints a table and writes JSON (``--out``, default ``bench/results/bridge_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _report import print_targets, write_results

MiB = 2**20


def child_diagnose(data_dir: str) -> None:
    """In a fresh process: open the prepared data and diagnose the seed's incident."""
    from keel.bridge import SEED_INCIDENT, BridgeSettings, open_bridge, run_diagnosis

    began = time.perf_counter()
    bridge = open_bridge(BridgeSettings(data_dir=Path(data_dir), pace="fast"))
    opened = time.perf_counter()
    result = run_diagnosis(bridge, SEED_INCIDENT, "payments")
    done = time.perf_counter()
    print(
        json.dumps(
            {
                "open_s": opened - began,
                "diagnose_s": done - opened,
                "total_s": done - began,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "root_cause": result["root_cause"],
                "spans": bridge.paths.spans,
            }
        )
    )


def child_diagnose_export(data_dir: str, export: str, incident: str, service: str) -> None:
    """In a fresh process: open an export's index and diagnose one of its incidents."""
    from keel.bridge import BridgeSettings, open_bridge, run_diagnosis

    began = time.perf_counter()
    folder = Path(export)
    settings = BridgeSettings(
        data_dir=Path(data_dir),
        incidents=folder / "incidents.json",
        traces=[folder / "traces"],
        deploys=_deploys(folder),
        pace="fast",
    )
    bridge = open_bridge(settings)
    opened = time.perf_counter()
    result = run_diagnosis(bridge, incident, service or None)
    done = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cause = (result["root_cause"] or {}).get("service")
    print(
        json.dumps(
            {"open_s": opened - began, "diagnose_s": done - opened, "peak_rss_mb": rss}
            | {"total_s": done - began, "cause": cause, "spans": bridge.paths.spans}
        )
    )


def _deploys(folder: Path) -> Path:
    return next(p for p in (folder / "deploys.csv", folder / "deploys.json") if p.exists())


def diagnose_export(args: argparse.Namespace) -> None:
    """``--diagnose-export``: one fresh process per diagnosis over an indexed export."""
    import statistics

    export = Path(args.diagnose_export)
    if args.data_dir is None:
        raise SystemExit("--diagnose-export needs --data-dir (where the index is kept)")
    command = [sys.executable, "-m", "keel", "bridge", "ingest", "--data-dir", args.data_dir]
    command += ["--incidents", str(export / "incidents.json"), "--traces", str(export / "traces")]
    subprocess.run([*command, "--deploys", str(_deploys(export))], check=True)
    incidents = json.loads((export / "incidents.json").read_text(encoding="utf-8-sig"))
    incidents = incidents.get("incidents", incidents) if isinstance(incidents, dict) else incidents
    truth_path = export / "answers.json"
    truth = json.loads(truth_path.read_text())["incidents"] if truth_path.exists() else []
    symptom = {t["id"]: t["symptom_service"] for t in truth}
    step = max(1, len(incidents) // args.incidents) if args.incidents else 1
    chosen = incidents[::step][: args.incidents or None]
    runs = []
    for incident in chosen:
        service = incident.get("service") or symptom.get(incident["id"], "")
        began = time.perf_counter()
        r = run_child(
            "--child-diagnose-export", args.data_dir, str(export), incident["id"], service
        )
        r |= {"process_s": time.perf_counter() - began, "load": os.getloadavg()[0]}
        r["incident"] = incident["id"]
        runs.append(r)
        print(
            f"{r['incident']:<12} diagnosis {r['diagnose_s']:5.2f}s "
            f"(process {r['process_s']:5.2f}s)"
            f"  peak RSS {r['peak_rss_mb']:4.0f} MB  load {r['load']:.1f}  -> {r['cause']}",
            flush=True,
        )
    times = sorted(r["diagnose_s"] for r in runs)
    rss = max(r["peak_rss_mb"] for r in runs)
    spans = runs[0]["spans"]
    print(
        f"\n{len(runs)} diagnoses over {spans:,} spans: median {statistics.median(times):.2f}s, "
        f"max {times[-1]:.2f}s; peak RSS max {rss:.0f} MB"
    )
    checks = [
        {
            "target": "a diagnosis over ~1M spans <= 10 s (each, whole process)",
            "measured": f"max {max(r['process_s'] for r in runs):.2f}s over {spans:,} spans",
            "ok": max(r["process_s"] for r in runs) <= 10 and spans >= 900_000,
        },
        {"target": "diagnosis peak RSS <= 500 MB", "measured": f"{rss:.0f} MB", "ok": rss <= 500},
    ]
    print_targets(checks)
    out = write_results(args.out, "bridge_bench_diagnose_export", args, runs=runs, checks=checks)
    print(f"\nwrote {out}")


def child_ingest(path: str, dest: str) -> None:
    """In a fresh process: index one file."""
    from keel.bridge.index import build_index
    from keel.bridge.parallel import default_processes

    report = build_index([Path(path)], Path(dest))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "spans": report.spans,
                "mib": report.bytes / MiB,
                "seconds": report.seconds,
                "spans_per_s": report.spans_per_second,
                "mib_per_s": report.mib_per_second,
                "peak_rss_mb": own + workers * default_processes(),
            }
        )
    )


def run_child(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def make_export(traces: Path, dest: Path, mb: int, *, single: bool) -> None:
    """The sample's trace lines repeated up to ``mb`` MiB: JSON lines, or one request."""
    lines = [
        line
        for path in sorted(traces.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line
    ]
    target = mb * MiB
    written = 0
    with dest.open("w") as out:
        if single:
            out.write('{"resourceSpans": [\n')
        first = True
        while written < target:
            for line in lines:
                if single:
                    # Each request's resourceSpans entries, spliced into one request.
                    inner = json.loads(line)["resourceSpans"]
                    for resource_spans in inner:
                        text = json.dumps(resource_spans)
                        out.write(("" if first else ",\n") + text)
                        first = False
                        written += len(text) + 2
                else:
                    out.write(line + "\n")
                    written += len(line) + 1
                if written >= target:
                    break
        if single:
            out.write("\n]}\n")


class TreeRss:
    """The largest sum of the resident sets of a process and its descendants (its
    ingest workers), sampled from ``/proc`` every ``interval`` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        import threading

        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _tree(self, pid: int) -> list[int]:
        found = [pid]
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    for child in f.read().split():
                        found += self._tree(int(child))
        except OSError:  # gone meanwhile
            pass
        return found

    def _rss_kib(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while not self.done.wait(self.interval):
            total = sum(self._rss_kib(pid) for pid in self._tree(self.pid))
            self.peak_kib = max(self.peak_kib, total)

    def stop(self) -> float:
        """MB at the peak."""
        self.done.set()
        self.thread.join()
        return self.peak_kib / 1024


def timed_ingest(src: Path, export: Path, data_dir: Path) -> dict[str, Any]:
    """``keel bridge ingest`` of ``export`` (a folder of incidents, deploys and traces)
    with ``src`` first on the path, in a fresh process: wall time and its peak RSS."""
    import shutil
    import sqlite3

    shutil.rmtree(data_dir, ignore_errors=True)
    deploys = next(p for p in (export / "deploys.csv", export / "deploys.json") if p.exists())
    command = [sys.executable, "-c", "from keel.cli import main; main()", "bridge", "ingest"]
    command += ["--data-dir", str(data_dir), "--incidents", str(export / "incidents.json")]
    command += ["--traces", str(export / "traces"), "--deploys", str(deploys)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    began = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    tree = TreeRss(child.pid)  # before the child reaps its workers: sampled while it runs
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - began
    tree_mb = tree.stop()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"keel bridge ingest failed ({child.returncode}) with {src}")
    conn = sqlite3.connect(data_dir / "index.db")
    spans = int(conn.execute("SELECT value FROM meta WHERE key = 'spans'").fetchone()[0])
    conn.close()
    shutil.rmtree(data_dir)
    return {
        "seconds": seconds,
        "spans": spans,
        "spans_per_s": spans / seconds,
        # wait4's ru_maxrss is the process's own peak (or a reaped worker's, if larger);
        # the tree's sum counts the workers running beside it.
        "peak_rss_mb": max(tree_mb, usage.ru_maxrss / 1024),
        "own_peak_rss_mb": usage.ru_maxrss / 1024,
    }


def ingest_only(args: argparse.Namespace) -> None:
    """``--ingest-only``: this checkout (and ``--before``), alternated, on one export."""
    import statistics

    here = Path(args.after) if args.after else Path(__file__).resolve().parent.parent / "src"
    sides = {"after": here} if args.before is None else {"before": Path(args.before), "after": here}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        export = Path(args.export) if args.export else Path(tmp) / "export"
        if not args.export:
            generator = Path(__file__).resolve().parent / "rca" / "generate.py"
            subprocess.run(
                [sys.executable, str(generator), "--seed", "2001", "--out", str(export)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        size = sum(p.stat().st_size for p in (export / "traces").iterdir())
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for n in range(args.runs):
            for side, src in sides.items():
                r = timed_ingest(src, export, Path(tmp) / f"data-{side}")
                runs[side].append(r)
                print(
                    f"run {n + 1} {side:<6} {r['spans']:,} spans in {r['seconds']:.1f}s: "
                    f"{r['spans_per_s']:,.0f} spans/s, peak RSS {r['peak_rss_mb']:.0f} MB, "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    median = {
        side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()
    }
    print(f"\n{'side':<8} {'spans':>10} {'median s':>9} {'spans/s':>9} {'MiB/s':>7} {'RSS MB':>7}")
    for side, m in median.items():
        mib_s = size / 2**20 / m["seconds"]
        print(
            f"{side:<8} {m['spans']:>10,.0f} {m['seconds']:>9.1f} {m['spans_per_s']:>9,.0f} "
            f"{mib_s:>7.1f} {m['peak_rss_mb']:>7.0f}"
        )
    checks = [
        {
            "target": "ingest peak RSS <= 300 MB",
            "measured": f"{median['after']['peak_rss_mb']:.0f} MB",
            "ok": max(r["peak_rss_mb"] for r in runs["after"]) <= 300,
        }
    ]
    if "before" in median:
        ratio = median["after"]["spans_per_s"] / median["before"]["spans_per_s"]
        checks.append(
            {
                "target": "ingest >= 2x the spans/s of before",
                "measured": f"x{ratio:.2f}",
                "ok": ratio >= 2,
            }
        )
    print_targets(checks)
    out = write_results(
        args.out,
        "bridge_bench_ingest",
        args,
        export_mib=size / 2**20,
        runs=runs,
        median=median,
        checks=checks,
    )
    print(f"\nwrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=250.0, help="requests/min (~1M spans)")
    parser.add_argument("--export-mb", type=int, default=200)
    parser.add_argument("--gb", action="store_true", help="a 1 GB export (1024 MB)")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--workdir", default=None, help="keep the data here (default: a temp dir)")
    parser.add_argument("--out", default="bench/results/bridge_bench.json")
    parser.add_argument("--ingest-only", action="store_true", help="time keel bridge ingest")
    parser.add_argument("--export", default=None, help="--ingest-only: an rca-format export")
    parser.add_argument("--before", default=None, help="--ingest-only: a src folder to compare")
    parser.add_argument("--after", default=None, help="--ingest-only: src (default: this one)")
    parser.add_argument("--runs", type=int, default=3, help="--ingest-only: runs per side")
    parser.add_argument("--diagnose-export", default=None, help="an rca-format export")
    parser.add_argument("--data-dir", default=None, help="--diagnose-export: its index")
    parser.add_argument("--incidents", type=int, default=12, help="--diagnose-export: how many")
    parser.add_argument("--child-diagnose", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-diagnose-export", nargs=4, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-ingest", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_diagnose:
        child_diagnose(args.child_diagnose)
        return
    if args.child_ingest:
        child_ingest(*args.child_ingest)
        return
    if args.child_diagnose_export:
        child_diagnose_export(*args.child_diagnose_export)
        return
    if args.diagnose_export:
        if args.out == parser.get_default("out"):
            args.out = "bench/results/bridge_bench_diagnose_export.json"
        diagnose_export(args)
        return
    if args.ingest_only:
        if args.out == parser.get_default("out"):
            args.out = "bench/results/bridge_bench_ingest.json"
        ingest_only(args)
        return
    if args.quick:
        args.rate, args.export_mb = 20.0, 20
    if args.gb:
        args.export_mb = 1024

    from keel.bridge import BridgeSettings, prepare
    from keel.bridge.generate import generate

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        data = root / "data"
        began = time.perf_counter()
        summary = generate(data, seed=7, rate=args.rate)
        generated = time.perf_counter() - began
        paths = prepare(BridgeSettings(data_dir=data, pace="fast"), log=lambda _l: None)
        assert paths.ingested is not None
        ready = time.perf_counter()
        prepare(BridgeSettings(data_dir=data, pace="fast"), log=lambda _l: None)
        ready_s = time.perf_counter() - ready
        diagnosis = run_child("--child-diagnose", str(data))
        rows: list[tuple[str, str]] = [
            ("sample data", f"{summary.spans:,} spans generated in {generated:.1f}s"),
            (
                "ingest (sample)",
                f"{paths.ingested.spans:,} spans in {paths.ingested.seconds:.1f}s "
                f"({paths.ingested.spans_per_second:,.0f} spans/s)",
            ),
            ("prepare, up to date", f"{ready_s * 1000:.1f} ms"),
            (
                "diagnosis (fast pace)",
                f"{diagnosis['diagnose_s']:.2f}s (+{diagnosis['open_s']:.2f}s open), "
                f"peak RSS {diagnosis['peak_rss_mb']:.0f} MB -> "
                f"{diagnosis['root_cause']['kind']} {diagnosis['root_cause']['deploy_id']}",
            ),
        ]
        ingests: dict[str, Any] = {}
        for layout in ("json-lines", "single-object"):
            export = root / f"export-{layout}.json"
            make_export(data / "traces", export, args.export_mb, single=layout == "single-object")
            ingests[layout] = run_child("--child-ingest", str(export), str(root / f"{layout}.db"))
            export.unlink()
            (root / f"{layout}.db").unlink()
            r = ingests[layout]
            rows.append(
                (
                    f"ingest {r['mib']:.0f} MiB {layout}",
                    f"{r['spans']:,} spans in {r['seconds']:.1f}s: {r['spans_per_s']:,.0f} "
                    f"spans/s, {r['mib_per_s']:.1f} MiB/s, peak RSS {r['peak_rss_mb']:.0f} MB",
                )
            )

    print(f"{'measurement':<28} result")
    for name, value in rows:
        print(f"{name:<28} {value}")
    checks = [
        {
            "target": "diagnosis over ~1M spans <= 10 s",
            "measured": f"{diagnosis['diagnose_s']:.2f}s over {diagnosis['spans']:,} spans",
            "ok": diagnosis["diagnose_s"] <= 10 and diagnosis["spans"] >= 900_000,
        },
        {
            "target": "diagnosis peak RSS <= 500 MB",
            "measured": f"{diagnosis['peak_rss_mb']:.0f} MB",
            "ok": diagnosis["peak_rss_mb"] <= 500,
        },
        {
            "target": "prepare on an up-to-date data dir well under 2 s",
            "measured": f"{ready_s * 1000:.1f} ms",
            "ok": ready_s < 2,
        },
        *(
            {
                "target": f"ingest peak RSS <= 500 MB ({layout}, {r['mib']:.0f} MiB export)",
                "measured": f"{r['peak_rss_mb']:.0f} MB",
                "ok": r["peak_rss_mb"] <= 500,
            }
            for layout, r in ingests.items()
        ),
    ]
    print_targets(checks)
    out = write_results(
        args.out,
        "bridge_bench",
        args,
        sample={"spans": summary.spans, "generate_s": generated},
        ingest_sample={
            "spans": paths.ingested.spans,
            "seconds": paths.ingested.seconds,
            "spans_per_s": paths.ingested.spans_per_second,
        },
        prepare_up_to_date_s=ready_s,
        diagnosis=diagnosis,
        ingest=ingests,
        checks=checks,
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
