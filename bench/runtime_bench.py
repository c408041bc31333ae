"""Runtime benchmark: workers, cancellation, crash recovery and memory, on SQLite FULL.

Measured with real ``keel worker`` processes (this file is also their app:
``keel worker --app runtime_bench:app`` from ``bench/``), on a SQLite file with the
default ``synchronous=full`` (every commit fsynced):

* **throughput**: no-op tasks end to end (create -> claim -> run -> complete), with one
  worker process and with two, at ``--concurrency`` 4 (``keel worker``'s default) and
  16. The tasks are created first, in bulk (concurrent creates from this process); then
  the workers start, and wait at a barrier until every one has imported its code, so
  that two processes start claiming together. ``run/s`` is tasks / (last completion -
  first claim), both read from the store's own timestamps; ``create+run/s`` also counts
  the time creating them; ``cpu µs/task`` is the CPU time all worker processes used
  from the barrier to the last completion, per task (steadier than rates on a VM whose
  speed drifts: compare it between two versions of the code).
  Each configuration runs ``--repeat`` times (default 5), one process and two taking
  turns; the median run is reported, each run's rate in run order, and the ratio of each
  two-process run to the one-process run just before it. The target is judged on the
  median of those paired ratios: the VM's speed drifts over minutes, and a pair of runs
  seconds apart shares the same moment.
  SQLite has one writer at a time, so with no-op tasks a second process gains only by
  doing its share of the work outside the write lock (``keel.store.sqlite.planning.Planner``);
* **tasks that work**: the same with 1 ms of CPU per task (hashing in the handler), one
  process and two (informational: here a second process adds a core);
* **cancel latency**: from a cancel request to the handler's ``finally``, within one
  process (``app.cancel`` on a handler running in a ``Worker`` in the same process) and
  across processes (this process cancels through its own store; the handler, in a
  worker process, writes the time its ``finally`` ran to a file);
* **crash recovery**: a worker running a task is SIGKILLed; the time until the task's
  handler runs again on the other worker, against the lease TTL + 1 s;
* **telemetry overhead**: no-op throughput of one worker process with metrics, transition
  logs and tracing on (through the OpenTelemetry API, no SDK: a plain install) against
  all of them off (``KEEL_METRICS=off``), and with an SDK recording every span (no
  exporter); rounds of runs in rotating order, judged on the median of the ratios to the
  same round's ``off`` run (target: on >= 95% of off);
* **memory**: peak RSS (``VmHWM``) of a worker process with 10,000 tasks parked in
  ``input_required`` in its store, while it runs some of them to completion.

    uv run python bench/runtime_bench.py            # the full run (about 2 minutes)
    uv run python bench/runtime_bench.py --quick    # a smoke run
    uv run python bench/runtime_bench.py --telemetry-only   # metrics and tracing on/off

Prints a table and the targets met, and writes JSON (``--out``, default
``bench/results/runtime_bench.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio

from _report import print_targets, write_results
from keel.model import InputRequest, Status, Task
from keel.runtime import Keel, TaskContext, Worker
from keel.store import SqliteStore

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
KEEL = Path(sys.executable).parent / "keel"
LEASE = float(os.environ.get("KEEL_BENCH_LEASE", "2.0"))  # seconds, every task's lease
MARKS = os.environ.get("KEEL_BENCH_MARKS")  # file the hold handler writes its times to
SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}
READY_TIMEOUT = 60.0  # seconds a worker process may take to start
WAIT = 120.0  # seconds any one phase may take before the benchmark gives up

# --- the app the worker processes run ----------------------------------------------------

app = Keel()  # the store is given by `keel worker --store` (or use_store in this process)

BARRIER_LINE = "keel-bench: at the start barrier"
if os.environ.get("KEEL_BENCH_BARRIER") and __name__ != "__main__":
    # A throughput run's worker processes start claiming together: each waits here, with
    # its imports done, until the benchmark writes a line to every worker's stdin.
    print(BARRIER_LINE, file=sys.stderr, flush=True)
    sys.stdin.readline()

if os.environ.get("KEEL_BENCH_TRACING") == "1" and __name__ != "__main__":
    # The overhead comparison's "on+sdk": spans recorded by the SDK, exported nowhere.
    from opentelemetry.sdk.trace import TracerProvider

    from keel.telemetry import tracing

    tracing.use_tracer_provider(TracerProvider())

FINALLY: dict[str, float] = {}
"""In this process: task id -> when its hold handler's ``finally`` ran (time.time())."""
STARTED: dict[str, float] = {}


def _mark(ctx: TaskContext, what: str) -> None:
    now = time.time()
    (STARTED if what == "started" else FINALLY)[ctx.task_id] = now
    if MARKS:
        line = json.dumps({"task": ctx.task_id, "what": what, "t": now, "worker": ctx.worker})
        fd = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


@app.task("noop", lease_seconds=LEASE)
async def noop(ctx: TaskContext) -> None:
    """Nothing: what is measured is the runtime around it."""


WORK_SECONDS = 0.001  # CPU time of one "work" task


@app.task("work", lease_seconds=LEASE)
async def work(ctx: TaskContext) -> int:
    """About a millisecond of CPU (hashing), as a handler that computes something does."""
    deadline = time.thread_time() + WORK_SECONDS
    rounds = 0
    digest = b"keel"
    while time.thread_time() < deadline:
        digest = hashlib.sha256(digest).digest()
        rounds += 1
    return rounds


@app.task("hold", lease_seconds=LEASE, max_attempts=100)
async def hold(ctx: TaskContext) -> None:
    """Run until cancelled (or killed); note when it started and when ``finally`` ran."""
    _mark(ctx, "started")
    try:
        await anyio.sleep_forever()
    finally:
        _mark(ctx, "finally")


@app.task("park", lease_seconds=LEASE)
async def park(ctx: TaskContext) -> dict[str, Any]:
    """Ask a question (the task parks in input_required); return the answer."""
    return await ctx.elicit("Which service?", SERVICE, key="service")


# --- worker processes ----------------------------------------------------------------------


class WorkerProcess:
    """``keel worker --app runtime_bench:app`` on a store, run from ``bench/``."""

    def __init__(
        self,
        store: Path | str,
        worker_id: str,
        *,
        concurrency: int,
        env: dict[str, str],
        barrier: bool = False,
    ) -> None:
        self.worker_id = worker_id
        self.proc = subprocess.Popen(
            [
                str(KEEL),
                "worker",
                "--app",
                "runtime_bench:app",
                "--store",
                str(store),
                "--concurrency",
                str(concurrency),
                "--worker-id",
                worker_id,
            ],
            cwd=HERE,
            env={**env, "KEEL_BENCH_BARRIER": "1"} if barrier else env,
            stdin=subprocess.PIPE if barrier else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.output: list[str] = []
        self._ready = threading.Event()
        self._at_barrier = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.output.append(line)
            if line.startswith(f"keel worker {self.worker_id}:"):
                self._ready.set()
            elif line.strip() == BARRIER_LINE:
                self._at_barrier.set()

    def wait_at_barrier(self) -> None:
        self._wait(self._at_barrier)

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait_ready(self) -> None:
        self._wait(self._ready)

    def _wait(self, event: threading.Event) -> None:
        """Until the worker's output has set ``event``; a worker that exits is an error."""
        deadline = time.monotonic() + READY_TIMEOUT
        while not event.wait(0.02):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.worker_id} did not start:\n{''.join(self.output)}")

    def peak_rss_kib(self) -> tuple[int, int]:
        """(VmHWM, VmRSS) in KiB, from /proc."""
        fields = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return int(fields["VmHWM"].split()[0]), int(fields["VmRSS"].split()[0])

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far, from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=READY_TIMEOUT)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=READY_TIMEOUT)


def worker_env(marks: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"KEEL_STORE", "KEEL_BENCH_MARKS"}}
    env["KEEL_BENCH_LEASE"] = str(LEASE)
    if marks is not None:
        env["KEEL_BENCH_MARKS"] = str(marks)
    env.update(extra or {})
    return env


class Fleet:
    """Worker processes started by one phase; all stopped when it ends."""

    def __init__(
        self,
        store: Path | str,
        *,
        concurrency: int,
        marks: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.store, self.concurrency, self.marks = store, concurrency, marks
        self.env = env
        self.workers: list[WorkerProcess] = []

    def start(self, worker_id: str, *, barrier: bool = False) -> WorkerProcess:
        w = WorkerProcess(
            self.store,
            worker_id,
            concurrency=self.concurrency,
            env=worker_env(self.marks, self.env),
            barrier=barrier,
        )
        self.workers.append(w)
        return w

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.kill()


async def until(
    probe: Callable[[], Awaitable[T | None]], what: str, every: float = 0.01, limit: float = WAIT
) -> T:
    """Poll ``probe`` until it returns a value (at most ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while (value := await probe()) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {limit}s waiting for {what}")
        await anyio.sleep(every)
    return value


def read_marks(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def percentile(values: Sequence[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# --- measurements ----------------------------------------------------------------------------


@dataclass
class Results:
    throughput: list[dict[str, Any]] = field(default_factory=list)
    work: list[dict[str, Any]] = field(default_factory=list)
    cancel: list[dict[str, Any]] = field(default_factory=list)
    recovery: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)


async def create_many(store: SqliteStore, name: str, count: int) -> list[str]:
    """Create ``count`` tasks, many at a time (one process's concurrent creates share
    commits)."""
    made: list[Task] = []

    async def one() -> None:
        made.append(await store.create(name=name, max_attempts=3))

    for start in range(0, count, 250):
        async with anyio.create_task_group() as tg:
            for _ in range(min(250, count - start)):
                tg.start_soon(one)
    return [t.task_id for t in sorted(made, key=lambda t: t.task_id)]


async def throughput(
    tmp: Path,
    processes: int,
    tasks: int,
    concurrency: int,
    name: str = "noop",
    plan: str = "auto",
    env: dict[str, str] | None = None,
    label: str = "",
) -> dict[str, Any]:
    """``tasks`` tasks of handler ``name`` created, then run by ``processes`` worker
    processes (with ``env`` added to theirs); ``plan`` is the workers' SQLite ``?plan=``
    (see bench/plan_bench.py)."""
    db = tmp / f"throughput-{name}-{processes}x{concurrency}{label}.db"
    store = SqliteStore(db)
    try:
        t0 = time.perf_counter()
        ids = await create_many(store, name, tasks)
        create_seconds = time.perf_counter() - t0
        at = db if plan == "auto" else f"sqlite:///{db.resolve()}?plan={plan}"
        with Fleet(at, concurrency=concurrency, env=env) as fleet:
            workers = [
                fleet.start(f"tp{processes}x{concurrency}-{n}", barrier=True)
                for n in range(processes)
            ]
            for w in workers:  # every process imported and waiting: start them together
                w.wait_at_barrier()
            cpu_before = sum(w.cpu_seconds() for w in workers)
            for w in workers:
                w.release()
            started = time.time()

            async def done() -> bool | None:
                left = await store.list(status=Status.WORKING, limit=1)
                return None if left else True

            await until(done, f"{tasks} no-op tasks", every=0.05)
            wall = time.time() - started
            cpu = sum(w.cpu_seconds() for w in workers) - cpu_before
            for w in workers:
                w.stop()
        finished = await store.list(limit=tasks + 1)
        assert len(finished) == tasks
        assert all(t.status is Status.COMPLETED for t in finished)
        last = max(t.updated_at for t in finished)
        claims = []
        for tid in ids[:50]:  # the first tasks created are claimed first
            claims += [e.at for e in await store.history(tid) if e.reason.startswith("claimed")]
        first = min(claims)
        per_worker = {w.worker_id: 0 for w in workers}
        for t in finished[:: max(1, tasks // 500)]:  # a sample: who completed what
            actor = (await store.history(t.task_id))[-1].actor.removeprefix("worker:")
            per_worker[actor] = per_worker.get(actor, 0) + 1
    finally:
        await store.close()
    rate = tasks / (last - first)
    return {
        "processes": processes,
        "concurrency": concurrency,
        "tasks": tasks,
        "seconds": round(last - first, 3),
        "tasks_per_s": round(rate, 1),
        "wall_seconds_incl_startup": round(wall, 3),
        "create_per_s": round(tasks / create_seconds, 1),
        # as if created and then run back to back: create -> claim -> run -> complete
        "end_to_end_per_s": round(tasks / (create_seconds + last - first), 1),
        # CPU time of all worker processes per task: steadier than rates on a noisy VM
        "worker_cpu_us_per_task": round(cpu / tasks * 1e6),
        "completed_by_sample": per_worker,
    }


TELEMETRY_MODES = {
    "off": {"KEEL_METRICS": "off"},
    "on": {"KEEL_METRICS": "on"},
    "on+sdk": {"KEEL_METRICS": "on", "KEEL_BENCH_TRACING": "1"},
}
"""off: no store observer (no metrics, no transition logs), no tracer provider; on: what a
plain install runs (metrics and transition logs on, spans through the OpenTelemetry API
with no SDK); on+sdk: the same with an SDK tracer provider recording every span and
exporting none (the cost of recording, without an exporter's)."""


def telemetry_overhead(tmp: Path, tasks: int, repeat: int, concurrency: int = 4) -> dict[str, Any]:
    """No-op throughput of one worker process in each of :data:`TELEMETRY_MODES`:
    ``repeat`` rounds, the order within a round rotating, each mode judged against the
    ``off`` run of its own round (the median of those paired ratios)."""
    modes = list(TELEMETRY_MODES)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for n in range(repeat):
        for mode in modes[n % len(modes) :] + modes[: n % len(modes)]:
            row = anyio.run(throughput, tmp / f"telemetry{n}", 1, tasks, concurrency, "noop",
                            "auto", TELEMETRY_MODES[mode], f"-{mode}")  # fmt: skip
            runs[mode].append(row)
            _progress(f"telemetry {mode}, round {n + 1}: {row['tasks_per_s']:,.0f}/s")
    out: dict[str, Any] = {"tasks": tasks, "concurrency": concurrency, "repeat": repeat}
    for mode, rows in runs.items():
        rates = [r["tasks_per_s"] for r in rows]
        cpu = [r["worker_cpu_us_per_task"] for r in rows]
        paired = [rate / off["tasks_per_s"] for rate, off in zip(rates, runs["off"], strict=True)]
        out[mode] = {
            "runs_per_s": rates,
            "median_per_s": statistics.median(rates),
            "cpu_us_per_task_median": statistics.median(cpu),
            "paired_ratios": [round(x, 3) for x in paired],
            "paired_ratio_median": round(statistics.median(paired), 3),
        }
    return out


async def cancel_in_process(tmp: Path, samples: int, batch: int) -> dict[str, Any]:
    """Handlers run by a Worker in this process; each cancelled through ``app.cancel``."""
    store = SqliteStore(tmp / "cancel-local.db")
    app.use_store(store)
    latencies: list[float] = []
    try:
        worker = Worker(app, concurrency=batch, worker_id="local")
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: worker.run(stop=stop))
            await worker.started.wait()
            while len(latencies) < samples:
                n = min(batch, samples - len(latencies))
                ids = [(await app.submit("hold")).task_id for _ in range(n)]

                async def all_started(ids: list[str] = ids) -> bool | None:
                    return True if all(t in STARTED for t in ids) else None

                await until(all_started, "hold handlers to start")
                for tid in ids:
                    t0 = time.time()
                    await app.cancel(tid, reason="bench")

                    async def stopped(tid: str = tid) -> float | None:
                        return FINALLY.get(tid)

                    latencies.append(await until(stopped, "the handler to stop", every=0) - t0)
            stop.set()
    finally:
        await store.close()
    return _latency_row("in-process (app.cancel)", latencies, 0.250)


async def cancel_cross_process(
    tmp: Path, samples: int, batch: int, rng: random.Random
) -> dict[str, Any]:
    """Handlers in a worker process; cancelled through this process's own store.

    The worker learns of the cancel by polling (every ``watch_interval``); each cancel
    comes after a random pause, so that it lands at a random point of that cycle rather
    than right after the poll that saw the previous one.
    """
    db, marks = tmp / "cancel-remote.db", tmp / "cancel-marks.jsonl"
    store = SqliteStore(db)
    latencies: list[float] = []
    try:
        with Fleet(db, concurrency=batch, marks=marks) as fleet:
            worker = fleet.start("remote")
            worker.wait_ready()
            while len(latencies) < samples:
                n = min(batch, samples - len(latencies))
                ids = [(await store.create(name="hold", max_attempts=3)).task_id for _ in range(n)]

                async def all_started(ids: list[str] = ids) -> bool | None:
                    seen = {m["task"] for m in read_marks(marks) if m["what"] == "started"}
                    return True if seen >= set(ids) else None

                await until(all_started, "hold handlers to start")
                for tid in ids:
                    await anyio.sleep(rng.uniform(0, 0.25))  # a random phase (see above)
                    t0 = time.time()
                    await store.cancel(tid, reason="bench")

                    async def stopped(tid: str = tid) -> float | None:
                        for m in read_marks(marks):
                            if m["task"] == tid and m["what"] == "finally":
                                return float(m["t"])
                        return None

                    latencies.append(await until(stopped, "the handler to stop", every=0.002) - t0)
            worker.stop()
    finally:
        await store.close()
    return _latency_row("cross-process (store.cancel)", latencies, 1.0)


def _latency_row(kind: str, latencies: list[float], target: float) -> dict[str, Any]:
    ms = [x * 1000 for x in latencies]
    return {
        "kind": kind,
        "samples": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "target_p99_ms": target * 1000,
    }


async def kill_recovery(tmp: Path, trials: int, rng: random.Random) -> dict[str, Any]:
    """Two workers; the one running the hold task is SIGKILLed at a random moment of its
    lease's renewal cycle; the time until the task's handler runs on the other one."""
    db, marks = tmp / "recovery.db", tmp / "recovery-marks.jsonl"
    store = SqliteStore(db)
    rows: list[dict[str, float]] = []
    try:
        with Fleet(db, concurrency=4, marks=marks) as fleet:
            alive = {w.worker_id: w for w in (fleet.start("rA0"), fleet.start("rB0"))}
            for w in alive.values():
                w.wait_ready()
            for trial in range(trials):
                task = await store.create(name="hold", max_attempts=100)

                async def running(tid: str = task.task_id, skip: int = 0) -> dict[str, Any] | None:
                    starts = [m for m in read_marks(marks) if m["task"] == tid]
                    starts = [m for m in starts if m["what"] == "started"]
                    return starts[skip] if len(starts) > skip else None

                first = await until(running, "the task to run")
                victim = alive.pop(first["worker"])
                await anyio.sleep(rng.uniform(0, LEASE))  # a random point of the lease
                leased = await store.get(task.task_id)
                killed_at = time.time()
                victim.kill()

                async def again(tid: str = task.task_id) -> dict[str, Any] | None:
                    return await running(tid, skip=1)

                second = await until(again, "the task to run again", every=0.005)
                history = await store.history(task.task_id)
                recovered = next(e.at for e in history if e.actor == "recovery")
                assert leased.lease_expires_at is not None
                rows.append(
                    {
                        "kill_to_running_s": second["t"] - killed_at,
                        "kill_to_lease_expiry_s": leased.lease_expires_at - killed_at,
                        "expiry_to_recovered_s": recovered - leased.lease_expires_at,
                    }
                )
                await store.cancel(task.task_id, reason="bench")
                replacement = fleet.start(f"{victim.worker_id[:2]}{trial + 1}")
                replacement.wait_ready()
                alive[replacement.worker_id] = replacement
            for w in alive.values():
                w.stop()
    finally:
        await store.close()
    times = [r["kill_to_running_s"] for r in rows]
    within = sum(1 for t in times if t <= LEASE + 1.0)
    return {
        "lease_s": LEASE,
        "trials": len(rows),
        "kill_to_running_p50_s": round(statistics.median(times), 3),
        "kill_to_running_max_s": round(max(times), 3),
        "within_lease_plus_1s": within,
        "kill_to_lease_expiry_mean_s": round(
            statistics.mean(r["kill_to_lease_expiry_s"] for r in rows), 3
        ),
        "expiry_to_recovered_mean_s": round(
            statistics.mean(r["expiry_to_recovered_s"] for r in rows), 3
        ),
        "expiry_to_recovered_max_s": round(max(r["expiry_to_recovered_s"] for r in rows), 3),
        "trials_detail": [{k: round(v, 3) for k, v in r.items()} for r in rows],
    }


def _parked(i: int, now: float) -> Task:
    return Task(
        task_id=f"parked-{i:06d}",
        status=Status.INPUT_REQUIRED,
        owner="",
        name="park",
        arguments={},
        created_at=now,
        updated_at=now,
        input_requests={"service": InputRequest("Which service?", SERVICE)},
        status_message="Which service?",
        max_attempts=3,
        ready_at=now,
        ttl=86_400.0,
    )


async def memory(tmp: Path, parked: int, answered: int) -> dict[str, Any]:
    """Peak RSS of a worker process: on an empty store, and with ``parked`` tasks waiting
    for input (of which ``answered`` are then answered and run to completion)."""
    out: dict[str, Any] = {"parked": parked, "answered": answered}
    empty = tmp / "rss-empty.db"
    SqliteStore(empty).integrity_check()  # creates the schema
    with Fleet(empty, concurrency=4) as fleet:
        w = fleet.start("rss-empty")
        w.wait_ready()
        await anyio.sleep(1.0)  # a few claim, watch and recovery rounds on nothing
        out["empty_store_vmhwm_mib"] = round(w.peak_rss_kib()[0] / 1024, 1)
        w.stop()

    db = tmp / "rss.db"
    store = SqliteStore(db)
    try:
        now = time.time()
        for start in range(0, parked, 5000):
            await store.import_tasks(
                [_parked(i, now) for i in range(start, min(parked, start + 5000))]
            )
        store.checkpoint()
        with Fleet(db, concurrency=4) as fleet:
            w = fleet.start("rss")
            w.wait_ready()
            ids = [f"parked-{i:06d}" for i in range(0, parked, max(1, parked // answered))]
            ids = ids[:answered]
            for tid in ids:
                await store.provide_input(tid, {"service": {"service": "payments"}})

            async def done() -> bool | None:
                seen = await store.statuses(ids)
                return True if all(s is Status.COMPLETED for s, _ in seen.values()) else None

            await until(done, "the answered tasks", every=0.05)
            waiting = await store.list(status=Status.INPUT_REQUIRED, limit=parked + 1)
            hwm, rss = w.peak_rss_kib()
            w.stop()
    finally:
        await store.close()
    out.update(
        still_parked=len(waiting),
        vmhwm_mib=round(hwm / 1024, 1),
        vmrss_mib=round(rss / 1024, 1),
        db_mib=round(db.stat().st_size / 2**20, 1),
    )
    return out


# --- the report ------------------------------------------------------------------------------


def targets(r: Results) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    rates = {(row["processes"], row["concurrency"]): row["tasks_per_s"] for row in r.throughput}
    paired = {
        row["concurrency"]: row["paired_ratio_median"]
        for row in r.throughput
        if "paired_ratio_median" in row
    }
    for conc in sorted({c for _, c in rates}):
        one, two = rates.get((1, conc)), rates.get((2, conc))
        if one is not None:
            checks.append(
                {
                    "target": f"no-op tasks >= 300/s, one worker process (concurrency {conc})",
                    "measured": one,
                    "ok": one >= 300,
                }
            )
        if one is not None and two is not None:
            ratio = paired.get(conc, two / one)
            checks.append(
                {
                    "target": f"two worker processes faster than one (concurrency {conc})",
                    "measured": f"x{ratio:.2f} paired (medians: x{two / one:.2f})",
                    "ok": ratio > 1,
                }
            )
    checks.extend(
        {
            "target": f"cancel p99 <= {row['target_p99_ms']:g} ms, {row['kind']}",
            "measured": row["p99_ms"],
            "ok": row["p99_ms"] <= row["target_p99_ms"],
        }
        for row in r.cancel
    )
    if r.recovery:
        rec = r.recovery
        checks.append(
            {
                "target": f"killed worker's task running again within lease + 1 s "
                f"({rec['lease_s'] + 1:g} s), every trial",
                "measured": f"max {rec['kill_to_running_max_s']} s; "
                f"{rec['within_lease_plus_1s']}/{rec['trials']} within",
                "ok": rec["within_lease_plus_1s"] == rec["trials"],
            }
        )
    if r.telemetry:
        # Judged on the worker's CPU time per task (throughput = 1 / CPU for no-op tasks):
        # on this shared VM the wall-clock rates of two runs a minute apart differ by half.
        off, on, sdk = (r.telemetry[m] for m in ("off", "on", "on+sdk"))
        cost = on["cpu_us_per_task_median"] / off["cpu_us_per_task_median"]
        with_sdk = sdk["cpu_us_per_task_median"] / off["cpu_us_per_task_median"]
        checks.append(
            {
                "target": "metrics and tracing on (no exporter): no-op throughput >= 95% of off",
                "measured": f"CPU/task x{cost:.3f} (with an SDK recording spans x{with_sdk:.3f});"
                f" run/s paired x{on['paired_ratio_median']:.2f}",
                "ok": cost <= 1 / 0.95,
            }
        )
    if r.memory:
        checks.append(
            {
                "target": f"worker peak RSS <= 150 MB with {r.memory['parked']:,} parked tasks",
                "measured": f"{r.memory['vmhwm_mib']} MiB",
                "ok": r.memory["vmhwm_mib"] * 2**20 <= 150e6,
            }
        )
    return checks


def report(r: Results) -> None:
    if r.throughput:
        _report_phases(r)
    _report_telemetry(r)


def _report_phases(r: Results) -> None:
    print(
        "\nthroughput: no-op tasks, create -> claim -> run -> complete (sqlite, synchronous=full)"
    )
    print(
        f"  {'processes':>9} {'conc':>5} {'tasks':>6} {'run/s':>9} {'seconds':>8} "
        f"{'create/s':>9} {'create+run/s':>13} {'cpu µs/task':>12}  {'run/s of each run':<20}"
    )
    for row in r.throughput:
        print(
            f"  {row['processes']:>9} {row['concurrency']:>5} {row['tasks']:>6} "
            f"{row['tasks_per_s']:>9,.0f} {row['seconds']:>8.2f} {row['create_per_s']:>9,.0f} "
            f"{row['end_to_end_per_s']:>13,.0f} {row['worker_cpu_us_per_task']:>12}  "
            + ", ".join(f"{x:,.0f}" for x in row["runs_per_s"])
        )
        if "paired_ratios" in row:
            ratios = ", ".join(f"x{x:.2f}" for x in row["paired_ratios"])
            print(f"  {'':>9} {'':>5} two / one, run by run: {ratios}")
    if r.work:
        print("\nthroughput: tasks of 1 ms CPU each (hashing in the handler), concurrency 4")
        for row in r.work:
            print(
                f"  {row['processes']:>9} {row['concurrency']:>5} {row['tasks']:>6} "
                f"{row['tasks_per_s']:>9,.0f} {row['seconds']:>8.2f}  "
                + ", ".join(f"{x:,.0f}" for x in row["runs_per_s"])
            )
        one, two = (row["tasks_per_s"] for row in r.work)
        print(f"  two processes / one: x{two / one:.2f} (informational; the targets are no-op)")
    print("\ncancel -> handler's finally ran")
    print(f"  {'where':<30} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for row in r.cancel:
        print(
            f"  {row['kind']:<30} {row['samples']:>4} {row['p50_ms']:>8.1f} "
            f"{row['p99_ms']:>8.1f} {row['max_ms']:>8.1f}"
        )
    if r.recovery:
        rec = r.recovery
        print(
            f"\nSIGKILLed worker -> its task running on another worker (lease {rec['lease_s']:g} s)"
        )
        print(
            f"  trials {rec['trials']}: p50 {rec['kill_to_running_p50_s']:.2f} s, "
            f"max {rec['kill_to_running_max_s']:.2f} s; "
            f"kill -> lease expiry {rec['kill_to_lease_expiry_mean_s']:.2f} s (mean), "
            f"expiry -> recovered {rec['expiry_to_recovered_mean_s']:.2f} s (mean), "
            f"{rec['expiry_to_recovered_max_s']:.2f} s (max)"
        )
    if r.memory:
        m = r.memory
        print("\nworker peak RSS (VmHWM)")
        print(
            f"  empty store {m['empty_store_vmhwm_mib']} MiB; with {m['parked']:,} parked tasks "
            f"({m['answered']} answered and run) {m['vmhwm_mib']} MiB "
            f"(RSS now {m['vmrss_mib']} MiB; store file {m['db_mib']} MiB)"
        )


def _report_telemetry(r: Results) -> None:
    if not r.telemetry:
        return
    t = r.telemetry
    print(f"\ntelemetry: no-op tasks, 1 process x {t['concurrency']}, {t['tasks']} tasks a run")
    print(f"  {'mode':<7} {'run/s':>7} {'cpu µs/task':>12} {'/ off':>7}  runs (paired ratios)")
    for mode in TELEMETRY_MODES:
        row = t[mode]
        runs = ", ".join(f"{x:,.0f} (x{y:.2f})" for x, y in
                         zip(row["runs_per_s"], row["paired_ratios"], strict=True))  # fmt: skip
        ratio = f"x{row['paired_ratio_median']:.3f}"
        print(f"  {mode:<7} {row['median_per_s']:>7,.0f} "
              f"{row['cpu_us_per_task_median']:>12,.0f} {ratio:>7}  {runs}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000, help="no-op tasks per throughput run")
    parser.add_argument(
        "--concurrency",
        default="4,16",
        help="attempts per worker process, comma-separated (4 is keel worker's default)",
    )
    parser.add_argument("--seed", type=int, default=20261201, help="for the random pauses")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="throughput runs per configuration; the median is reported (this VM is noisy)",
    )
    parser.add_argument(
        "--work-tasks", type=int, default=3000, help="tasks of 1 ms CPU per run (informational)"
    )
    parser.add_argument("--cancel-samples", type=int, default=100)
    parser.add_argument("--kill-trials", type=int, default=6)
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--answered", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="fewer tasks, samples and trials")
    parser.add_argument(
        "--telemetry-only",
        action="store_true",
        help="only the metrics and tracing on/off comparison (--tasks tasks, --repeat pairs)",
    )
    parser.add_argument("--out", default="bench/results/runtime_bench.json")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.cancel_samples, args.kill_trials, args.answered = 600, 20, 2, 50
        args.work_tasks = 300
        args.repeat = 1

    r = Results()
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keel-runtime-bench-") as name:
        tmp = Path(name)
        r.telemetry = telemetry_overhead(tmp, args.tasks, max(args.repeat, 3))
        if not args.telemetry_only:
            _rest(r, args, tmp, rng)
    report(r)
    checks = targets(r)
    print_targets(checks)
    elapsed = time.monotonic() - started
    out = write_results(
        args.out,
        "runtime_bench",
        args,
        lease_s=LEASE,
        elapsed_s=round(elapsed, 1),
        results=asdict(r),
        targets=checks,
    )
    print(f"\nwrote {out} ({elapsed:.0f} s)")


def _rest(r: Results, args: argparse.Namespace, tmp: Path, rng: random.Random) -> None:
    """Every phase but the telemetry comparison, into ``r``."""
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        by_processes: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
        for n in range(args.repeat):
            for processes, runs in by_processes.items():  # taking turns
                runs.append(
                    anyio.run(throughput, tmp / f"run{n}", processes, args.tasks, concurrency)
                )
        # Each two-process run against the one-process run just before it: the VM's
        # speed drifts over minutes, and a pair seconds apart shares the same moment.
        paired = [
            two["tasks_per_s"] / one["tasks_per_s"]
            for one, two in zip(by_processes[1], by_processes[2], strict=True)
        ]
        for processes, runs in by_processes.items():
            in_order = [x["tasks_per_s"] for x in runs]
            runs.sort(key=lambda row: row["tasks_per_s"])
            row = runs[len(runs) // 2]  # the median run
            row["runs_per_s"] = in_order
            if processes == 2:
                row["paired_ratios"] = [round(x, 2) for x in paired]
                row["paired_ratio_median"] = round(statistics.median(paired), 2)
            r.throughput.append(row)
            _progress(f"throughput, {processes} x {concurrency}: {row['tasks_per_s']:,.0f}/s")
    for processes in (1, 2):  # where the handlers' own work is what takes the time
        runs = [
            anyio.run(throughput, tmp / f"work{n}", processes, args.work_tasks, 4, "work")
            for n in range(args.repeat)
        ]
        runs.sort(key=lambda row: row["tasks_per_s"])
        row = runs[len(runs) // 2]
        row["runs_per_s"] = [x["tasks_per_s"] for x in runs]
        r.work.append(row)
        _progress(f"1 ms CPU tasks, {processes} x 4: {row['tasks_per_s']:,.0f}/s")
    r.cancel.append(anyio.run(cancel_in_process, tmp, args.cancel_samples, 25))
    _progress(f"cancel in process: p99 {r.cancel[-1]['p99_ms']} ms")
    r.cancel.append(anyio.run(cancel_cross_process, tmp, args.cancel_samples // 2, 25, rng))
    _progress(f"cancel across processes: p99 {r.cancel[-1]['p99_ms']} ms")
    r.recovery = anyio.run(kill_recovery, tmp, args.kill_trials, rng)
    _progress(f"kill recovery: max {r.recovery['kill_to_running_max_s']} s")
    r.memory = anyio.run(memory, tmp, args.parked, args.answered)
    _progress(f"memory: {r.memory['vmhwm_mib']} MiB")


def _progress(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
