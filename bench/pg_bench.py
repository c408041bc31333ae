"""PostgreSQL benchmark: real ``keel worker`` processes against one database.

Measured on the PostgreSQL at ``$KEEL_BENCH_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``), each run in a fresh schema dropped after:

* **throughput**: no-op tasks claimed, run and completed by ``--workers`` worker processes
  (``keel worker --app pg_bench_app:app`` from ``bench/``) at ``--concurrency`` each
  (``--prefetch``: the worker's values to compare, alternated; ``ahead`` in the table, ``-``
  for its default). The tasks
  are created first (concurrent creates, grouped into shared transactions); then the
  workers start. ``run/s`` is tasks / (last completion - first claim), both read from the
  store's own timestamps. Each configuration runs ``--repeat`` times; the median is kept;
* **cancel latency across processes**: a handler runs in a worker process; this process
  cancels it through its own store; the handler's ``finally`` writes the time it ran to a
  file. The wake-up is a NOTIFY (the worker's 0.2 s watch poll is the fallback).
* **peers, the same shape, in the same run**: PgQueuer and Procrastinate (from PyPI, each
  in a virtual environment of its own under ``~/.cache/keel-bench/pg-NAME``, created on
  first use or with ``--setup-peers`` by ``uv venv`` + ``uv pip install``; never one of
  Keel's dependencies) drain pre-filled no-op jobs with ``--workers`` processes
  (``bench/peers/pg_NAME_bench.py``), each run in a fresh database dropped after.
  Procrastinate gets at most 5,000 jobs (its rate is flat and slow; a full run would
  take minutes). Keel and peer runs alternate, so all see the same machine; the medians
  and the ratios Keel/peer are reported. ``--peers none`` skips them.

    uv run python bench/pg_bench.py            # the full run
    uv run python bench/pg_bench.py --quick    # a smoke run
    uv run python bench/pg_bench.py --setup-peers  # (re)create the peer venvs first

Prints a table and the targets met, and writes JSON (``--out``, default
``bench/results/pg_bench.json``). Numbers from a 2-core machine shared with PostgreSQL
itself (and, during development, with other work) are a floor, not a ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import anyio
import psycopg

import keel
from _report import print_targets, write_results
from keel.model import Task
from keel.store import PostgresStore
from peers._peer_run import ServerCpu

HERE = Path(__file__).resolve().parent
KEEL = Path(sys.executable).parent / "keel"
BASE = os.environ.get("KEEL_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
WAIT = 180.0  # seconds any one phase may take before the benchmark gives up


def url(schema: str) -> str:
    return f"{BASE}{'&' if '?' in BASE else '?'}{urlencode({'schema': schema})}"


def drop(schema: str) -> None:
    with psycopg.connect(BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


class Fleet:
    """``keel worker`` processes; all stopped when the block ends."""

    def __init__(
        self, store_url: str, concurrency: int, env: dict[str, str], prefetch: int | None = None
    ) -> None:
        self.store_url, self.concurrency, self.env = store_url, concurrency, env
        self.prefetch = prefetch
        self.procs: list[subprocess.Popen[str]] = []
        self.ready: list[threading.Event] = []

    def start(self, worker_id: str) -> None:
        proc = subprocess.Popen(
            [str(KEEL), "worker", "--app", "pg_bench_app:app", "--store", self.store_url,
             "--concurrency", str(self.concurrency), "--worker-id", worker_id,
             *([] if self.prefetch is None else ["--prefetch", str(self.prefetch)])],
            cwd=HERE, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        ready = threading.Event()

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith(f"keel worker {worker_id}:"):
                    ready.set()
                elif "Traceback" in line or "error" in line.lower():
                    sys.stderr.write(f"[{worker_id}] {line}")

        threading.Thread(target=pump, daemon=True).start()
        self.procs.append(proc)
        self.ready.append(ready)

    def wait_ready(self) -> None:
        for ready in self.ready:
            if not ready.wait(60):
                raise RuntimeError("a worker did not start within 60 s")

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def worker_env(marks: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in compiled_env().items() if k not in {"KEEL_STORE", "KEEL_BENCH_MARKS"}}
    if marks is not None:
        env["KEEL_BENCH_MARKS"] = str(marks)
    return env


async def create_many(store: PostgresStore, name: str, count: int) -> list[Task]:
    made: list[Task] = []

    async def one() -> None:
        made.append(await store.create(name=name, max_attempts=3))

    for start in range(0, count, 500):
        async with anyio.create_task_group() as tg:
            for _ in range(min(500, count - start)):
                tg.start_soon(one)
    return made


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have exited."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_until_done(direct: str, tasks: int) -> None:
    """Until no task is left working. A light look every 0.25 s: what is measured comes
    from the store's own timestamps, so the look's own delay is not counted, and it must
    not load the server the workers share (a ``store.list`` ordered by ``seq`` every 50 ms
    read thousands of index entries each time)."""
    deadline = time.monotonic() + WAIT
    with psycopg.connect(direct, autocommit=True) as conn:
        while conn.execute("SELECT 1 FROM tasks WHERE status = 'working' LIMIT 1").fetchone():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tasks} tasks not done in {WAIT}s")
            time.sleep(0.25)  # the harness's own poll, in a thread: nothing else to do


async def throughput(
    workers: int, concurrency: int, prefetch: int | None, tasks: int
) -> dict[str, Any]:
    schema = f"keel_bench_{secrets.token_hex(4)}"
    store_url = url(schema)
    store = PostgresStore(store_url)
    direct = store_url.replace(f"schema={schema}", f"options=-csearch_path%3D{schema}")
    try:
        t0 = time.perf_counter()
        made = await create_many(store, "noop", tasks)
        create_seconds = time.perf_counter() - t0
        cpu_before = children_cpu()
        with ServerCpu() as server, Fleet(store_url, concurrency, worker_env(), prefetch) as fleet:
            for n in range(workers):
                fleet.start(f"w{n}")
            fleet.wait_ready()
            await anyio.to_thread.run_sync(wait_until_done, direct, tasks)
        worker_cpu = children_cpu() - cpu_before  # the fleet's processes, once they exited
        with psycopg.connect(direct) as conn:
            first, last, done = conn.execute(
                "SELECT (SELECT min(at) FROM task_events WHERE reason LIKE 'claimed%%'),"
                " max(updated_at), count(*) FILTER (WHERE status = 'completed') FROM tasks"
            ).fetchone()  # type: ignore[misc]
    finally:
        await store.close()
        drop(schema)
    assert done == tasks == len(made), (done, tasks)
    return {
        "workers": workers,
        "concurrency": concurrency,
        "prefetch": prefetch,
        "tasks": tasks,
        "seconds": round(last - first, 3),
        "tasks_per_s": round(tasks / (last - first), 1),
        "create_per_s": round(tasks / create_seconds, 1),
        "worker_cpu_ms_per_task": round(1000 * worker_cpu / tasks, 3),
        "server_cpu_ms_per_task": round(1000 * server.seconds / tasks, 3),
    }


async def cancel_latency(samples: int, tmp: Path) -> dict[str, Any]:
    schema = f"keel_bench_{secrets.token_hex(4)}"
    store_url = url(schema)
    marks = tmp / f"marks-{schema}.jsonl"
    store = PostgresStore(store_url)
    latencies: list[float] = []
    try:
        with Fleet(store_url, 8, worker_env(marks)) as fleet:
            fleet.start("cancel")
            fleet.wait_ready()
            for _ in range(samples):
                task = await store.create(name="hold")
                deadline = time.monotonic() + 30
                while (await store.get(task.task_id)).lease_owner is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError("hold task not claimed")
                    await anyio.sleep(0.005)
                await anyio.sleep(0.02)  # let the handler reach its await
                t0 = time.time()
                await store.cancel(task.task_id, reason="bench")
                while True:
                    seen = {
                        m["task"]: m["t"]
                        for m in map(json.loads, marks.read_text().splitlines())
                        if marks.exists()
                    } if marks.exists() else {}  # fmt: skip
                    if task.task_id in seen:
                        latencies.append(seen[task.task_id] - t0)
                        break
                    if time.time() - t0 > 10:
                        raise RuntimeError("handler was not stopped within 10 s")
                    await anyio.sleep(0.002)
    finally:
        await store.close()
        drop(schema)
    ordered = sorted(latencies)
    return {
        "samples": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "max_ms": round(1000 * ordered[-1], 1),
    }


CACHE = Path.home() / ".cache" / "keel-bench"
PYCACHE = CACHE / "pycache"


def compiled_env() -> dict[str, str]:
    """This environment for a worker process, Keel's or a peer's: importing compiled
    bytecode, as an installed package does (pip compiles it at install), kept under
    ``PYCACHE`` instead of beside the sources. Without it, under
    ``PYTHONDONTWRITEBYTECODE=1`` (set by ``.ci/run`` and by some shells), every worker
    compiled its imports from source at start: about 0.9 s of CPU for a ``keel worker``
    and 0.45 s for a PgQueuer one on a 2-core VM, counted in ``cpu ms/task`` and
    competing with the first workers' runs."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def precompile(python: Path, *extra: Path) -> None:
    """Compile ``python``'s site-packages (and ``extra`` sources) into ``PYCACHE`` before
    anything is measured; after the first time it only compares timestamps (about 1 s)."""
    paths = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    # check=False: a file that does not compile (some packages ship one) is left as it is
    subprocess.run(
        [str(python), "-m", "compileall", "-q", "-j", "0", *paths, *map(str, extra)],
        env=compiled_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Peer:
    """A peer queue, run from its own venv by its script in ``bench/peers/``."""

    name: str
    label: str
    pins: tuple[str, ...]
    script: str
    max_jobs: int | None = None
    """Fewer jobs than Keel's run, for a slow peer (its rate is flat; the run stays short)."""

    @property
    def venv(self) -> Path:
        return CACHE / f"pg-{self.name}"

    @property
    def version(self) -> str:
        return self.pins[0].split("==")[1]


PEERS = {
    "pgqueuer": Peer(
        "pgqueuer",
        "PgQueuer (asyncpg, batch_size 10 per process)",
        ("pgqueuer==1.6.0", "asyncpg==0.32.0"),
        "pg_pgqueuer_bench.py",
    ),
    "procrastinate": Peer(
        "procrastinate",
        "Procrastinate (psycopg, concurrency 8 per process)",
        ("procrastinate==3.10.0",),
        "pg_procrastinate_bench.py",
        max_jobs=5_000,
    ),
}
NOTE = (
    "measured on a 2-core machine shared with the PostgreSQL server itself and with other "
    "work (other developers' test runs) going on at the same time: a floor, not a ceiling"
)


def peer_python(peer: Peer, *, setup: bool) -> Path:
    """The peer venv's interpreter with the pinned package installed; create it if needed."""
    python = peer.venv / "bin" / "python"
    check = [str(python), "-c", f"import importlib.metadata as m; print(m.version({peer.name!r}))"]
    if not setup and python.exists():
        probe = subprocess.run(check, capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == peer.version:
            return python
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit(f"uv is not on PATH: it is needed to create the {peer.name} venv")
    print(f"  creating {peer.venv} with {' '.join(peer.pins)}", file=sys.stderr, flush=True)
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([uv, "venv", "-q", "--python", "3.11", str(peer.venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), *peer.pins], check=True)
    subprocess.run(check, check=True, capture_output=True)
    return python


def database_url(name: str) -> str:
    """The benchmark server's URL for the database ``name`` (no query options)."""
    parts = urlsplit(BASE)
    return urlunsplit(parts._replace(path=f"/{name}", query=""))


def peer_throughput(peer: Peer, python: Path, workers: int, tasks: int) -> dict[str, Any]:
    """The peer drains ``tasks`` pre-filled no-op jobs with ``workers`` processes, in a
    fresh database of its own (dropped after)."""
    name = f"keel_bench_peer_{secrets.token_hex(4)}"
    with psycopg.connect(BASE, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        done = subprocess.run(
            [str(python), str(HERE / "peers" / peer.script), "--dsn", database_url(name),
             "--jobs", str(tasks), "--workers", str(workers)],
            capture_output=True, text=True, timeout=WAIT + 600, check=False, env=compiled_env(),
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the {peer.name} run failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result
    finally:
        with psycopg.connect(BASE, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32])
    parser.add_argument(
        "--prefetch",
        type=int,
        nargs="+",
        default=[None],
        help="keel worker --prefetch values to compare (default: the worker's own default)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cancel-samples", type=int, default=50)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results" / "pg_bench.json"))
    parser.add_argument(
        "--peers",
        default="pgqueuer,procrastinate",
        help=f"comma-separated, of {', '.join(PEERS)}; 'none' for none",
    )
    parser.add_argument("--setup-peers", action="store_true", help="(re)create the peer venvs")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.repeat, args.cancel_samples = 3_000, 1, 10
    chosen = [] if args.peers == "none" else [PEERS[p.strip()] for p in args.peers.split(",")]
    pythons = {peer.name: peer_python(peer, setup=args.setup_peers) for peer in chosen}
    for python in [*pythons.values(), Path(sys.executable)]:
        precompile(python, Path(keel.__file__).parent, HERE)
    load_before = os.getloadavg()
    shapes = [(c, p) for c in args.concurrency for p in args.prefetch]
    runs_by_shape: dict[tuple[int, int | None], list[dict[str, Any]]] = {s: [] for s in shapes}
    peer_runs: dict[str, list[dict[str, Any]]] = {peer.name: [] for peer in chosen}
    for n in range(args.repeat):  # Keel and the peers alternate: all see the same machine
        for concurrency, prefetch in shapes:
            run = await throughput(args.workers, concurrency, prefetch, args.tasks)
            runs_by_shape[concurrency, prefetch].append(run)
            print(f"  keel {n + 1}/{args.repeat}, concurrency {concurrency} prefetch {prefetch}: "
                  f"{run['tasks_per_s']}/s", file=sys.stderr, flush=True)  # fmt: skip
        for peer in chosen:
            jobs = min(args.tasks, peer.max_jobs or args.tasks)
            row = await anyio.to_thread.run_sync(
                peer_throughput, peer, pythons[peer.name], args.workers, jobs
            )
            peer_runs[peer.name].append(row)
            print(f"  {peer.name} {n + 1}/{args.repeat}: {row['tasks_per_s']}/s",
                  file=sys.stderr, flush=True)  # fmt: skip
    rows = []
    for runs in runs_by_shape.values():
        runs.sort(key=lambda r: r["tasks_per_s"])
        median = runs[len(runs) // 2]
        median["all_runs_per_s"] = [r["tasks_per_s"] for r in runs]
        rows.append(median)
    peers: dict[str, dict[str, Any]] = {}
    for name, runs in peer_runs.items():
        runs.sort(key=lambda r: r["tasks_per_s"])
        peers[name] = runs[len(runs) // 2]
        peers[name]["all_runs_per_s"] = [r["tasks_per_s"] for r in runs]
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    cancel = await cancel_latency(args.cancel_samples, tmp)
    print(f"\nPostgreSQL {BASE.split('@')[-1]}, {args.tasks} no-op tasks, median of {args.repeat}")
    print(f"{'workers':>8} {'conc':>5} {'ahead':>5} {'run/s':>9} {'create/s':>9} "
          f"{'cpu ms/task':>11} {'server ms/task':>14}  runs")  # fmt: skip
    for r in rows:
        ahead = "-" if r["prefetch"] is None else r["prefetch"]
        print(f"{r['workers']:>8} {r['concurrency']:>5} {ahead:>5} {r['tasks_per_s']:>9} "
              f"{r['create_per_s']:>9} {r['worker_cpu_ms_per_task']:>11} "
              f"{r['server_cpu_ms_per_task']:>14}  {r['all_runs_per_s']}")  # fmt: skip
    print(f"\ncancel across processes: p50 {cancel['p50_ms']} ms, p99 {cancel['p99_ms']} ms, "
          f"max {cancel['max_ms']} ms ({cancel['samples']} samples)")  # fmt: skip
    best = max(r["tasks_per_s"] for r in rows)
    if peers:
        print(f"\npeers, same shape (pre-filled no-op jobs, {args.workers} processes), "
              "median of the runs alternated with Keel's:")  # fmt: skip
        print(f"{'peer':<60} {'jobs':>6} {'run/s':>9}  {'Keel/peer':>9} {'cpu ms/task':>11}"
              f" {'server ms/task':>14}  runs")  # fmt: skip
    for name, row in peers.items():
        peer = PEERS[name]
        row["version"] = peer.version
        row["keel_over_peer"] = round(best / row["tasks_per_s"], 2)
        print(f"{peer.label + ' ' + peer.version:<60} {row['jobs']:>6} {row['tasks_per_s']:>9} "
              f"{row['keel_over_peer']:>9} {row.get('worker_cpu_ms_per_task', '-'):>11} "
              f"{row.get('server_cpu_ms_per_task', '-'):>14}  {row['all_runs_per_s']}")  # fmt: skip
    print(f"\nnote: {NOTE} (load average before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f})")  # fmt: skip
    print_targets(
        [
            {"target": "claim+run+complete, 4 worker processes >= 2,000 tasks/s",
             "ok": best >= 2000, "measured": f"{best} tasks/s"},
            {"target": "cross-process cancel -> handler cancelled p99 <= 500 ms",
             "ok": cancel["p99_ms"] <= 500, "measured": f"{cancel['p99_ms']} ms"},
        ]
    )  # fmt: skip
    out = write_results(
        args.out, "pg_bench", args, throughput=rows, cancel=cancel, peers=peers, note=NOTE,
        load_average={"before": load_before, "after": os.getloadavg()},
    )  # fmt: skip
    print(f"\nwrote {out}")


if __name__ == "__main__":
    anyio.run(main)
