"""MCP benchmark: Keel vs FastMCP 4 (fastmcp-tasks), SEP-2663 tasks over Streamable HTTP.

One run measures both servers with the same client code, the official ``mcp`` client
(2.3.0, protocol ``2026-07-28``) with Keel's request models (``keel.mcp.client``):

* **Keel**: a real ``keel serve --app apps.noop_app:app`` process on a free loopback
  port, on a fresh SQLite file with the default ``synchronous=full`` (every create is
  committed and fsynced before its ``CreateTaskResult`` leaves), workers in the server
  process (``--keel-concurrency``, ``keel serve``'s default 4);
* **FastMCP**: ``bench/peers/fastmcp_server.py`` (FastMCP 4.1.4 + fastmcp-tasks 4.1.4,
  Docket worker in the server process, concurrency 10) on the local Redis, in a Redis
  database that is flushed before each cell. It runs with the interpreter of its own
  virtual environment (``--venv``, default ``~/.cache/keel-bench/fastmcp-venv``), created
  on first use (or with ``--setup``) by ``uv venv`` + ``uv pip install``; FastMCP is
  never one of Keel's dependencies.

Both speak the same wire version (``2026-07-28``, stateless, ``server/discover``), so no
raw-protocol client is needed: each client declares ``io.modelcontextprotocol/tasks`` on
every request (``TasksClientExtension``), calls ``tools/call noop`` with
``allow_claimed=True`` (the ``CreateTaskResult`` comes back unresolved), then sends
``tasks/get`` at once and every ``--poll-ms`` (10 ms) after that until the task is
terminal, whatever ``pollIntervalMs`` the server advertised.

For each C in ``--clients`` (1, 8, 32) and each server, ``--repeat`` times (the runs of
the servers alternated, so that run r of each was measured seconds apart; the median
run is reported, and the median of the pairs' tasks/s ratios beside the ratio of the
medians): a fresh server process, C
closed-loop clients (one ``mcp.Client``, so one HTTP connection, each), ``--warmup``
seconds not counted, then ``--measure`` seconds counted:

* ``tasks/s``: tasks whose completion was seen inside the measured window, per second;
* ``create``: ``tools/call`` sent -> ``CreateTaskResult`` received, p50 / p99;
* ``e2e``: ``tools/call`` sent -> the first ``tasks/get`` answer that shows ``completed``;
* ``polls/task``, errors, the server's CPU per task (``/proc``; for FastMCP also Redis's),
  the bench client's own CPU per task, the server's peak RSS (``VmHWM``).

    uv run python bench/mcp_bench.py                 # C = 1, 8, 32; ~2.5 minutes
    uv run python bench/mcp_bench.py --quick         # a smoke run
    uv run python bench/mcp_bench.py --setup         # (re)create the FastMCP venv first
    uv run python bench/mcp_bench.py --profile bench/results/keel.prof --servers keel
    uv run python bench/mcp_bench.py --cpu-load 2 --clients 1,8 --repeat 3  # busy machine
    uv run python bench/mcp_bench.py --servers keel,keel-base,fastmcp --keel-base ../before

``--keel-base DIR`` measures a second Keel, ``DIR/.venv/bin/keel serve`` (another
checkout, ``uv sync``'d), as the server ``keel-base``, its runs alternated with the
others: before and after a change in one run, with the ratios ``keel / keel-base``.

``--cpu-load N`` starts N CPU-bound processes (pure-Python busy loops, ``bench/_load.py``)
before the first cell and stops them after the last (on an error or Ctrl-C too), so both
servers are measured under the same contention; each row says how many cores the loops
got in its measured window (``load``) and the load average after it, and the issue-19
targets (tasks/s x1.5 at 1 client, x2 at 8, e2e p50 at 1 client <= FastMCP's) are checked.

``--profile`` runs the Keel server under cProfile (``apps/bench_serve.py``) and prints
its top functions; the numbers of a profiled run are not comparable to the others.

Prints a table, the ratios and the targets met (issue 4), and writes JSON (``--out``,
default ``bench/results/mcp_bench.json``).
"""

from __future__ import annotations

import argparse
import os
import pstats
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from _load import CpuLoad
from _report import print_targets, write_results
from keel.mcp.client import Created, Detailed, GetTask, TaskIdParams, TasksClientExtension

HERE = Path(__file__).resolve().parent
KEEL = Path(sys.executable).parent / "keel"
FASTMCP_PINS = ("fastmcp==4.1.4", "fastmcp-tasks==4.1.4")
DEFAULT_VENV = Path.home() / ".cache" / "keel-bench" / "fastmcp-venv"
READY_TIMEOUT = 60.0  # seconds a server may take to start listening
TASK_TIMEOUT = 30.0  # seconds one task may take (create + polls) before it counts as an error
DRAIN_TIMEOUT = 30.0  # seconds the clients may take to finish their last task
TERMINAL = {"completed", "failed", "cancelled"}
TICK = os.sysconf("SC_CLK_TCK")
SERVERS = ("keel", "keel-base", "fastmcp")
PAIRS = (("keel", "fastmcp"), ("keel-base", "fastmcp"), ("keel", "keel-base"))  # ratios: a / b
RATIO_KEYS = ("tasks_per_s", "create_p50_ms", "create_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


# --- the FastMCP environment and Redis --------------------------------------------------------


def fastmcp_python(venv: Path, *, setup: bool) -> Path:
    """The venv's interpreter with the pinned FastMCP installed; create it if needed."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import fastmcp, fastmcp_tasks; print(fastmcp.__version__)"]
    if not setup and python.exists():
        probe = subprocess.run(check, capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == "4.1.4":
            return python
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv is not on PATH: it is needed to create the FastMCP venv")
    _progress(f"creating {venv} with {' '.join(FASTMCP_PINS)}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([uv, "venv", "-q", "--python", "3.11", str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), *FASTMCP_PINS], check=True)
    subprocess.run(check, check=True, capture_output=True)
    return python


def redis_call(python: Path, url: str, code: str) -> str:
    """Run ``code`` (with ``r``, a redis client on ``url``) in the FastMCP venv; its output.

    Keel's environment has no Redis client and should not get one for a benchmark.
    """
    script = f"import redis, sys\nr = redis.Redis.from_url(sys.argv[1])\n{code}"
    done = subprocess.run(
        [str(python), "-c", script, url], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"Redis at {url} is not usable:\n{done.stderr.strip()}")
    return done.stdout.strip()


def redis_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "redis-server":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of processes, from /proc/PID/stat."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / TICK


def filesystem_of(path: Path) -> str:
    """The type of the filesystem ``path`` is on (longest mount point that contains it)."""
    best, kind = "", "?"
    target = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        mount, fs = parts[1], parts[2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, fs
    return kind


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- server processes ------------------------------------------------------------------------


class ServerProcess:
    """One server under test, a real process on a free loopback port."""

    def __init__(self, name: str, argv: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.output.append(line)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{''.join(self.output[-30:])}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)

    def cpu(self) -> float:
        return cpu_seconds([self.proc.pid])

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def start_keel(
    args: argparse.Namespace, folder: Path, profile: Path | None, name: str = "keel"
) -> ServerProcess:
    """``keel serve`` of this checkout, or (``keel-base``) of the ``--keel-base`` one."""
    serve = [
        "serve",
        "--app",
        "apps.noop_app:app",
        "--store",
        str(folder / "keel.db"),  # no ?synchronous=: the default, full
        "--port",
        "{port}",
        "--concurrency",
        str(args.keel_concurrency),
    ]
    if name == "keel-base":
        argv = [str(Path(args.keel_base) / ".venv" / "bin" / "keel"), *serve]
    elif profile is None:
        argv = [str(KEEL), *serve]
    else:
        profile.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, str(HERE / "apps" / "bench_serve.py"), "--profile", str(profile)]
        argv += ["--", *serve]
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    return ServerProcess(name, argv, cwd=HERE, env=env)


def start_fastmcp(args: argparse.Namespace, python: Path) -> ServerProcess:
    argv = [
        str(python),
        str(HERE / "peers" / "fastmcp_server.py"),
        "--port",
        "{port}",
        "--redis",
        args.redis_url,
        "--concurrency",
        str(args.fastmcp_concurrency),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_"))}
    return ServerProcess("fastmcp", argv, cwd=HERE, env=env)


# --- the client --------------------------------------------------------------------------------


@dataclass
class Sample:
    sent: float  # perf_counter when tools/call was sent
    created: float  # when the CreateTaskResult arrived
    done: float  # when the tasks/get that showed a terminal status arrived
    status: str
    polls: int


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def one_task(client: Client, poll: float) -> Sample:
    sent = time.perf_counter()
    created = await client.session.call_tool("noop", {}, allow_claimed=True)
    got = time.perf_counter()
    if not isinstance(created, Created):
        raise TypeError(f"expected a CreateTaskResult, got {type(created).__name__}")
    get = GetTask(params=TaskIdParams(task_id=created.task_id))
    polls = 0
    while True:
        task = await client.session.send_request(get, Detailed)
        polls += 1
        if task.status in TERMINAL:
            return Sample(sent, got, time.perf_counter(), task.status, polls)
        await anyio.sleep(poll)


async def discover_baseline(url: str, count: int) -> list[float]:
    """``server/discover`` round trips from one client, before the load (``ping`` is gone
    in 2026-07-28): about the least any request costs through the client, HTTP and the
    SDK's dispatch on either server; every create pays it too."""
    times = []
    async with Client(url, extensions=[TasksClientExtension()], cache=None) as client:
        version = client.protocol_version
        for _ in range(count):
            sent = time.perf_counter()
            await client.session.send_discover(version)
            times.append((time.perf_counter() - sent) * 1000)
    return times


async def create_only(url: str, count: int) -> list[float]:
    """``count`` sequential ``tools/call`` -> ``CreateTaskResult`` from one client, nothing
    polled (the tasks still run in the background): the create latency on its own, with
    many more samples than the closed loop gives a server that completes few tasks."""
    times = []
    async with Client(url, extensions=[TasksClientExtension()], cache=None) as client:
        for _ in range(count):
            sent = time.perf_counter()
            created = await client.session.call_tool("noop", {}, allow_claimed=True)
            times.append((time.perf_counter() - sent) * 1000)
            if not isinstance(created, Created):
                raise TypeError(f"expected a CreateTaskResult, got {type(created).__name__}")
    return times


def fsync_probe(folder: Path, count: int = 200) -> dict[str, float | None]:
    """Append 100 bytes and fsync, ``count`` times, in ``folder``: what one durable commit
    costs this disk at least."""
    times = []
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(count):
            os.write(fd, b"x" * 100)
            sent = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - sent) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return {"p50_ms": pct(times, 50), "p99_ms": pct(times, 99)}


async def client_loop(url: str, run: Run, stop_at: float, poll: float) -> None:
    async with Client(url, extensions=[TasksClientExtension()], cache=None) as client:
        while time.perf_counter() < stop_at and len(run.errors) < 100:
            try:
                with anyio.fail_after(TASK_TIMEOUT):
                    run.samples.append(await one_task(client, poll))
            except Exception as exc:  # counted and shown; the loop goes on
                run.errors.append(f"{type(exc).__name__}: {exc}"[:300])


async def drive(
    server: ServerProcess, clients: int, args: argparse.Namespace, load: CpuLoad
) -> dict[str, Any]:
    """C closed-loop clients for warmup + measure seconds; the measured window's numbers."""
    run = Run()
    poll = args.poll_ms / 1000
    marks: dict[str, tuple[float, float, float, float]] = {}
    redis = redis_pids() if server.name == "fastmcp" else []

    async def mark(at: float, name: str) -> None:
        await anyio.sleep(max(0.0, at - time.perf_counter()))
        rusage = resource.getrusage(resource.RUSAGE_SELF)
        me = rusage.ru_utime + rusage.ru_stime
        marks[name] = (server.cpu(), cpu_seconds(redis), me, load.cpu_seconds())

    discover_ms = await discover_baseline(server.url, args.discovers)
    creates_ms = await create_only(server.url, args.creates) if clients == 1 else []
    start = time.perf_counter()
    warm_end = start + args.warmup
    stop_at = warm_end + args.measure
    with anyio.fail_after(args.warmup + args.measure + DRAIN_TIMEOUT + TASK_TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(mark, warm_end, "warm_end")
            tg.start_soon(mark, stop_at, "stop_at")
            for _ in range(clients):
                tg.start_soon(client_loop, server.url, run, stop_at, poll)
    done_in = [s for s in run.samples if warm_end <= s.done <= stop_at]
    started_in = [s for s in run.samples if warm_end <= s.sent and s.done <= stop_at]
    completed = [s for s in done_in if s.status == "completed"]
    (srv0, red0, me0, load0), (srv1, red1, me1, load1) = marks["warm_end"], marks["stop_at"]
    per_task = 1000 / max(1, len(done_in))
    create_ms = [(s.created - s.sent) * 1000 for s in started_in]
    e2e_ms = [(s.done - s.sent) * 1000 for s in started_in]
    return {
        "server": server.name,
        "clients": clients,
        "tasks": len(done_in),
        "tasks_per_s": round(len(completed) / args.measure, 1),
        "create_p50_ms": pct(create_ms, 50),
        "create_p99_ms": pct(create_ms, 99),
        "e2e_p50_ms": pct(e2e_ms, 50),
        "e2e_p99_ms": pct(e2e_ms, 99),
        "e2e_max_ms": round(max(e2e_ms), 2) if e2e_ms else None,
        "polls_per_task": round(statistics.mean(s.polls for s in done_in), 2) if done_in else None,
        "not_completed": len(done_in) - len(completed),
        "errors": len(run.errors),
        "error_sample": sorted(set(run.errors))[:5],
        "server_cpu_ms_per_task": round((srv1 - srv0) * per_task, 2),
        "redis_cpu_ms_per_task": round((red1 - red0) * per_task, 2) if redis else None,
        "client_cpu_ms_per_task": round((me1 - me0) * per_task, 2),
        "load_cores": round((load1 - load0) / args.measure, 2),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "server_peak_rss_mib": server.peak_rss_mib(),
        "discover_p50_ms": pct(discover_ms, 50),
        "create_only": {
            "n": len(creates_ms),
            "p50_ms": pct(creates_ms, 50),
            "p99_ms": pct(creates_ms, 99),
        },
        "all_tasks": len(run.samples),
    }


def pct(values: Sequence[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 2)


# --- one cell ------------------------------------------------------------------------------------


def cell(
    name: str,
    clients: int,
    args: argparse.Namespace,
    python: Path | None,
    tmp: Path,
    profile: Path | None,
    load: CpuLoad,
) -> dict[str, Any]:
    """A fresh server (fresh SQLite file, or flushed Redis db), measured with C clients."""
    if name.startswith("keel"):
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-c{clients}-", dir=tmp))
        server = start_keel(args, folder, profile, name)
    else:
        assert python is not None
        redis_call(python, args.redis_url, "r.flushdb()")
        server = start_fastmcp(args, python)
    try:
        server.wait_ready()
        row = anyio.run(drive, server, clients, args, load)
    finally:
        server.stop()
    if name.startswith("keel"):
        row["store"] = {
            "path": str(folder / "keel.db"),
            "synchronous": "full (the default: --store has no ?synchronous=)",
            "filesystem": filesystem_of(folder),
        }
    return row


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    runs = sorted(runs, key=lambda r: r["tasks_per_s"])
    row = dict(runs[len(runs) // 2])
    row["runs"] = [
        {
            k: r[k]
            for k in (
                "tasks_per_s",
                "create_p50_ms",
                "e2e_p50_ms",
                "create_only",
                "polls_per_task",
                "errors",
                "load_cores",
                "loadavg",
            )
        }
        for r in runs
    ]
    return row


# --- the report -------------------------------------------------------------------------------


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keel over FastMCP (and, with ``keel-base``, each Keel over the other), per C."""
    out = []
    by = {(r["server"], r["clients"]): r for r in rows}
    for c, (a_name, b_name) in [(c, pair) for c in sorted({r["clients"] for r in rows})
                                for pair in PAIRS]:  # fmt: skip
        keel, fast = by.get((a_name, c)), by.get((b_name, c))
        if keel is None or fast is None:
            continue
        over = "" if b_name == "fastmcp" else f" / {b_name}"
        ratio: dict[str, Any] = {"clients": c, "server": a_name + over}
        for key in RATIO_KEYS:
            a, b = keel[key], fast[key]
            ratio[key] = round(a / b, 2) if a is not None and b else None
        # Run r of each server ran back to back: the median of those pairs' ratios.
        pairs = zip(keel["run_tasks_per_s"], fast["run_tasks_per_s"], strict=True)
        paired = [a / b for a, b in pairs if b]
        ratio["tasks_per_s_paired"] = round(statistics.median(paired), 2) if paired else None
        out.append(ratio)
    return out


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["server"], r["clients"]): r for r in rows}
    checks: list[dict[str, Any]] = []
    keel8, fast8 = by.get(("keel", 8)), by.get(("fastmcp", 8))
    if keel8 and fast8:
        a, b = keel8["tasks_per_s"], fast8["tasks_per_s"]
        checks.append(
            {
                "target": "end-to-end tasks/s at 8 clients >= 2x FastMCP's",
                "measured": f"{a} vs {b} tasks/s (x{a / b:.2f})" if b else f"{a} vs {b}",
                "ok": bool(b) and a >= 2 * b,
            }
        )
    keel1, fast1 = by.get(("keel", 1)), by.get(("fastmcp", 1))
    if keel1 and fast1 and keel1["create_p50_ms"] and fast1["create_p50_ms"]:
        a, b = keel1["create_p50_ms"], fast1["create_p50_ms"]
        checks.append(
            {
                "target": "tools/call -> CreateTaskResult p50 at 1 client <= half of FastMCP's",
                "measured": f"{a} vs {b} ms (x{a / b:.2f})",
                "ok": a <= b / 2,
            }
        )
        qa, qb = keel1["create_only"]["p50_ms"], fast1["create_only"]["p50_ms"]
        if qa and qb:
            checks.append(
                {
                    "target": "the same, from the create-only calls (more samples)",
                    "measured": f"{qa} vs {qb} ms (x{qa / qb:.2f})",
                    "ok": qa <= qb / 2,
                }
            )
    keel_rows = [r for r in rows if r["server"].startswith("keel")]
    if keel_rows:
        filesystems = sorted({r["store"]["filesystem"] for r in keel_rows})
        durable = all(fs not in {"tmpfs", "ramfs"} for fs in filesystems)
        checks.append(
            {
                "target": "every Keel create fsync-durable (SQLite synchronous=full, on disk)",
                "measured": f"synchronous=full on {', '.join(filesystems)}",
                "ok": durable,
            }
        )
    return checks


def contention_targets(rows: list[dict[str, Any]], cpu_load: int) -> list[dict[str, Any]]:
    """Issue 19's targets under ``--cpu-load`` (none on a quiet run)."""
    if cpu_load <= 0:
        return []
    by = {(r["server"], r["clients"]): r for r in rows}
    checks: list[dict[str, Any]] = []
    for c, factor in ((1, 1.5), (8, 2.0)):
        keel, fast = by.get(("keel", c)), by.get(("fastmcp", c))
        if keel and fast:
            a, b = keel["tasks_per_s"], fast["tasks_per_s"]
            checks.append(
                {
                    "target": f"--cpu-load {cpu_load}: tasks/s at {c} client(s) >= {factor:g}x "
                    "FastMCP's",
                    "measured": f"{a} vs {b} tasks/s (x{a / b:.2f})" if b else f"{a} vs {b}",
                    "ok": bool(b) and a >= factor * b,
                }
            )
    keel1, fast1 = by.get(("keel", 1)), by.get(("fastmcp", 1))
    if keel1 and fast1 and keel1["e2e_p50_ms"] and fast1["e2e_p50_ms"]:
        a, b = keel1["e2e_p50_ms"], fast1["e2e_p50_ms"]
        checks.append(
            {
                "target": f"--cpu-load {cpu_load}: e2e p50 at 1 client <= FastMCP's",
                "measured": f"{a} vs {b} ms (x{a / b:.2f})",
                "ok": a <= b,
            }
        )
    return checks


def report(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]], cpu_load: int) -> None:
    print("\nno-op tasks over Streamable HTTP: tools/call -> CreateTaskResult, tasks/get to done")
    if cpu_load:
        print(f"  under --cpu-load {cpu_load}: {cpu_load} busy pure-Python processes all run long")
    print(
        f"  {'server':<9} {'C':>3} {'tasks':>6} {'tasks/s':>8} {'create p50/p99 ms':>18} "
        f"{'e2e p50/p99 ms':>18} {'polls':>6} {'err':>4} {'srv cpu':>8} {'redis':>6} "
        f"{'client':>7} {'rss MiB':>8} {'disc p50':>9} {'load':>5} {'ldavg':>6}"
    )
    for r in rows:
        redis = "-" if r["redis_cpu_ms_per_task"] is None else f"{r['redis_cpu_ms_per_task']:.1f}"
        print(
            f"  {r['server']:<9} {r['clients']:>3} {r['tasks']:>6} {r['tasks_per_s']:>8.1f} "
            f"{_pair(r['create_p50_ms'], r['create_p99_ms']):>18} "
            f"{_pair(r['e2e_p50_ms'], r['e2e_p99_ms']):>18} "
            f"{r['polls_per_task'] or 0:>6.2f} {r['errors'] + r['not_completed']:>4} "
            f"{r['server_cpu_ms_per_task']:>8.2f} {redis:>6} "
            f"{r['client_cpu_ms_per_task']:>7.2f} {r['server_peak_rss_mib']:>8.1f} "
            f"{r['discover_p50_ms'] or 0:>9.2f} {r['load_cores']:>5.2f} {r['loadavg'][0]:>6.2f}"
        )
    print(
        "  (cpu columns: ms of CPU per task in the measured window; disc p50: one client's "
        "server/discover round trip, ms, before the load;\n   load: cores the --cpu-load "
        "processes got in the measured window; ldavg: 1-minute load average after the cell)"
    )
    alone = [r for r in rows if r["create_only"]["n"]]
    if alone:
        print("\ntools/call -> CreateTaskResult alone (one client, sequential, nothing polled)")
        print(f"  {'server':<9} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
        for r in alone:
            q = r["create_only"]
            print(f"  {r['server']:<9} {q['n']:>5} {q['p50_ms']:>8.2f} {q['p99_ms']:>8.2f}")
    if ratio_rows:
        print("\nRatios: Keel / FastMCP, or A / B (tasks/s: higher is better; latencies: lower)")
        print(
            f"  {'ratio':<18} {'C':>3} {'tasks/s':>8} {'create p50':>11} "
            f"{'create p99':>11} {'e2e p50':>8} {'e2e p99':>8} {'tasks/s, paired runs':>21}"
        )
        for q in ratio_rows:
            print(
                f"  {q['server']:<18} {q['clients']:>3} {_x(q['tasks_per_s']):>8} "
                f"{_x(q['create_p50_ms']):>11} {_x(q['create_p99_ms']):>11} "
                f"{_x(q['e2e_p50_ms']):>8} {_x(q['e2e_p99_ms']):>8} "
                f"{_x(q['tasks_per_s_paired']):>21}"
            )
    for r in rows:
        for error in r["error_sample"]:
            print(f"  error ({r['server']}, C={r['clients']}): {error}")


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.2f} / {b:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def print_profile(path: Path, top: int) -> list[dict[str, Any]]:
    """The profiled server's top functions by own time, with their share of the total."""
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in raw.values()) or 1.0
    ranked = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    rows = []
    print(f"\nKeel server profile ({path}): top {top} functions by own time")
    print(f"  {'own %':>6} {'own s':>7} {'cum s':>7} {'calls':>9}  function")
    for (file, line, func), (_, calls, tt, ct, _) in ranked:
        where = f"{_short(file)}:{line}({func})"
        print(f"  {100 * tt / total:>6.1f} {tt:>7.2f} {ct:>7.2f} {calls:>9}  {where}")
        rows.append({"function": where, "own_s": round(tt, 3), "cum_s": round(ct, 3)})
    return rows


def profile_path(base: Path | None, clients: int, server: str = "keel") -> Path | None:
    """Where a Keel server's profile goes: ``BASE-SERVER-cN.prof``."""
    if base is None or not server.startswith("keel"):
        return None
    return base.with_name(f"{base.stem}-{server}-c{clients}{base.suffix or '.prof'}")


def _short(file: str) -> str:
    for marker in ("site-packages/", "/src/", "python3.11/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8,32", help="closed-loop clients, comma-separated")
    parser.add_argument(
        "--servers",
        default="keel,fastmcp",
        help="comma-separated: keel, fastmcp",
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds not counted, per cell")
    parser.add_argument("--measure", type=float, default=10.0, help="seconds counted, per cell")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="tasks/get every N ms")
    parser.add_argument(
        "--discovers", type=int, default=200, help="server/discover round trips per cell"
    )
    parser.add_argument(
        "--creates", type=int, default=300, help="create-only calls, before the C=1 load"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; the median is kept")
    parser.add_argument("--keel-concurrency", type=int, default=4, help="keel serve --concurrency")
    parser.add_argument("--fastmcp-concurrency", type=int, default=10, help="Docket concurrency")
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/9",
        help="FastMCP's Docket backend; this database is FLUSHDB'd before each cell",
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the FastMCP venv")
    parser.add_argument(
        "--keel-base",
        help="another checkout (with its .venv), measured as the server keel-base",
    )
    parser.add_argument("--setup", action="store_true", help="(re)create the FastMCP venv")
    parser.add_argument("--profile", type=Path, help="cProfile the Keel server into this file")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument(
        "--cpu-load",
        type=int,
        default=0,
        help="N CPU-bound processes (pure-Python busy loops) beside both servers, all run long",
    )
    parser.add_argument("--quick", action="store_true", help="1 s warm-up, 3 s measured")
    parser.add_argument("--out", default="bench/results/mcp_bench.json")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.measure = 1.0, 3.0
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers or not set(servers) <= set(SERVERS):
        parser.error(f"--servers takes some of {', '.join(SERVERS)}")
    if ("keel-base" in servers) != bool(args.keel_base):
        parser.error("--servers keel-base and --keel-base DIR go together")
    clients = [int(c) for c in args.clients.split(",")]

    python = fastmcp_python(args.venv, setup=args.setup) if "fastmcp" in servers else None
    redis_info: dict[str, str] = {}
    if python is not None:
        got = redis_call(
            python,
            args.redis_url,
            "i = r.info('server'); c = r.config_get('appendonly'); s = r.config_get('save')\n"
            "print(i['redis_version'], c.get('appendonly'), repr(s.get('save')))",
        )
        version, aof, save = got.split(" ", 2)
        redis_info = {"version": version, "appendonly": aof, "save": save, "url": args.redis_url}
        _progress(f"redis {version}: appendonly={aof} save={save}")

    started = time.monotonic()
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="keel-mcp-bench-") as name,
        CpuLoad(args.cpu_load) as load,  # for the whole run; stopped however it ends
    ):
        tmp = Path(name)
        disk = {"filesystem": filesystem_of(tmp), **fsync_probe(tmp)}
        _progress(f"fsync on {disk['filesystem']} ({tmp}): p50 {disk['p50_ms']} ms")
        _progress(f"CPU load: {load.describe()}")
        for i, c in enumerate(clients):
            runs: dict[str, list[dict[str, Any]]] = {server: [] for server in servers}
            for r in range(args.repeat):
                # Alternate which server goes first, run by run, so that drift in the
                # machine's load is shared (pairs of runs seconds apart).
                order = servers if (i + r) % 2 == 0 else servers[::-1]
                for server in order:
                    profile = profile_path(args.profile, c, server)
                    runs[server].append(cell(server, c, args, python, tmp, profile, load))
            for server in servers:
                row = median_row(runs[server])
                row["run_tasks_per_s"] = [run["tasks_per_s"] for run in runs[server]]
                rows.append(row)
                _progress(
                    f"{server} C={c}: {row['tasks_per_s']} tasks/s, create p50 "
                    f"{row['create_p50_ms']} ms, e2e p50 {row['e2e_p50_ms']} ms, "
                    f"errors {row['errors']}, load {row['load_cores']} cores, "
                    f"loadavg {row['loadavg'][0]}"
                )
        load_cpu_s = round(load.cpu_seconds(), 1)
    if python is not None:
        redis_call(python, args.redis_url, "r.flushdb()")  # leave nothing behind
    rows.sort(key=lambda r: (r["clients"], SERVERS.index(r["server"])))
    ratio_rows = ratios(rows)
    report(rows, ratio_rows, args.cpu_load)
    checks = targets(rows) + contention_targets(rows, args.cpu_load)
    print_targets(checks)
    profile_rows = {}
    for server in servers:
        for c in clients:
            path = profile_path(args.profile, c, server)
            if path is not None:
                profile_rows[f"{server}-c{c}"] = print_profile(path, args.profile_top)
    elapsed = time.monotonic() - started
    args.venv = str(args.venv)
    args.profile = None if args.profile is None else str(args.profile)
    out = write_results(
        args.out,
        "mcp_bench",
        args,
        elapsed_s=round(elapsed, 1),
        redis=redis_info,
        fsync=disk,
        loadavg_before=[round(x, 2) for x in load_before],
        loadavg_after=[round(x, 2) for x in os.getloadavg()],
        cpu_load={
            "processes": args.cpu_load,
            "what": load.describe(),
            "cpu_s": load_cpu_s,
        },
        results=rows,
        ratios=ratio_rows,
        targets=checks,
        profile=profile_rows,
        profiled=bool(args.profile),
    )
    print(f"\nwrote {out} ({elapsed:.0f} s)")


def _progress(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
