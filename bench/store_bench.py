"""Store benchmark: task lifecycles per second as the store fills up.

Each configuration runs ``--repeat`` times (default 3) on the same store and reports the
median run: this 2-core VM's timings vary by tens of percent from run to run.

A lifecycle is the seed's incident in miniature: create a task with an input schema
(``input_required``), provide the input (``working``), complete it. Every operation is
acknowledged only after its commit (fsynced with ``synchronous=full``).

Measured for ``memory``, ``sqlite-full`` (the default), ``sqlite-normal`` and, as the
baseline, the seed's whole-file JSON store (every operation rewrites the whole file with
``json.dumps(indent=2)``; it is quadratic, so only at the smallest size), with 1,000,
10,000 and 100,000 tasks already in the store, by ``C`` concurrent clients in one process.

    uv run python bench/store_bench.py                  # the full table
    uv run python bench/store_bench.py --quick          # a smoke run

Prints a table and writes JSON (``--out``, default ``bench/results/store_bench.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _report import print_targets, write_results
from keel.model import DEFAULT_INPUT_KEY, InputRequest, Status, Task
from keel.store import SqliteStore, open_store
from keel.store.base import TxStore

SCHEMA = {
    "type": "object",
    "required": ["service"],
    "properties": {"service": {"type": "string"}},
}
REQUEST = {DEFAULT_INPUT_KEY: InputRequest("Which service is affected?", SCHEMA)}
ANSWER = {DEFAULT_INPUT_KEY: {"service": "payments"}}
RESULT = {
    "conclusion": "payments-db connection pool exhausted after deploy d-1842",
    "citations": ["incident:INC-7", "deploy:d-1842", "trace:4bf92f3577b34da6"],
}
PREFILL_CHUNK = 5_000


# --- the baseline: the seed's teaching store, as the chapter shows it ----------------


@dataclass
class SeedSnapshot:
    task_id: str
    status: str
    input_schema: dict[str, Any] | None = None
    input_value: Any = None
    result: Any = None
    idempotency_key: str | None = None


class WholeFileJsonStore:
    """The seed's ``TaskStore``: a dict, and ``_save()`` rewrites the whole file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tasks: dict[str, SeedSnapshot] = {}

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(
            json.dumps(
                {key: asdict(value) for key, value in self.tasks.items()},
                ensure_ascii=False,
                indent=2,
            ),
            encoding="utf-8",
        )

    def create(self, input_schema: dict[str, Any] | None) -> SeedSnapshot:
        task = SeedSnapshot(
            str(uuid.uuid4()), "input_required" if input_schema else "working", input_schema
        )
        self.tasks[task.task_id] = task
        self._save()
        return task

    def provide_input(self, task_id: str, value: Any) -> SeedSnapshot:
        task = self.tasks[task_id]
        if task.status != "input_required":
            raise RuntimeError(f"task is not waiting for input: {task.status}")
        task.input_value, task.status = value, "working"
        self._save()
        return task

    def complete(self, task_id: str, result: Any) -> SeedSnapshot:
        task = self.tasks[task_id]
        if task.status in {"completed", "failed", "cancelled"}:
            return task
        task.result, task.status = result, "completed"
        self._save()
        return task


# --- prefill ---------------------------------------------------------------------------


def _filler(i: int, now: float) -> Task:
    """A realistic mix: mostly finished tasks, some waiting for input, some working."""
    kind = i % 10
    common: dict[str, Any] = {
        "task_id": f"prefill-{i:07d}",
        "owner": "",
        "name": "diagnose_root_cause",
        "arguments": {"incident_id": f"INC-{i}"},
        "created_at": now - 86_400 + i * 0.01,
        "updated_at": now - 3_600,
        "input_requests": REQUEST,
        "ready_at": now,
        "idempotency_key": f"prefill-{i}",
    }
    if kind < 7:
        return Task(status=Status.COMPLETED, input_responses=ANSWER, result=RESULT, **common)
    if kind < 9:
        return Task(status=Status.INPUT_REQUIRED, **common)
    return Task(status=Status.WORKING, input_responses=ANSWER, **common)


async def prefill(store: TxStore, count: int) -> None:
    now = time.time()
    for start in range(0, count, PREFILL_CHUNK):
        chunk = [_filler(i, now) for i in range(start, min(count, start + PREFILL_CHUNK))]
        await store.import_tasks(chunk, actor="bench")


def prefill_json(store: WholeFileJsonStore, count: int) -> None:
    for i in range(count):
        t = _filler(i, 0.0)
        store.tasks[t.task_id] = SeedSnapshot(
            t.task_id,
            t.status.value,
            SCHEMA,
            t.input_responses.get(DEFAULT_INPUT_KEY),
            t.result,
            t.idempotency_key,
        )
    store._save()


# --- measurement -----------------------------------------------------------------------


@dataclass
class Row:
    adapter: str
    tasks_in_store: int
    clients: int
    lifecycles: int
    seconds: float
    lifecycles_per_s: float
    op_p50_ms: float
    op_p99_ms: float


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


async def run_keel(
    url: str, size: int, lifecycles: int, clients: int, label: str, repeat: int
) -> Row:
    store = open_store(url)
    try:
        await prefill(store, size)
        if isinstance(store, SqliteStore):
            store.checkpoint()  # start from a settled file, as a store that has been running
        runs = [await _measure(store, size, lifecycles, clients, label) for _ in range(repeat)]
        return sorted(runs, key=lambda r: r.lifecycles_per_s)[len(runs) // 2]  # the median
    finally:
        await store.close()


async def _measure(store: TxStore, size: int, lifecycles: int, clients: int, label: str) -> Row:
    latencies: list[float] = []

    async def client(n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            task = await store.create(input_requests=REQUEST)
            t1 = time.perf_counter()
            await store.provide_input(task.task_id, ANSWER)
            t2 = time.perf_counter()
            done = await store.complete(task.task_id, RESULT)
            t3 = time.perf_counter()
            assert done.status is Status.COMPLETED
            latencies.extend((t1 - t0, t2 - t1, t3 - t2))

    per_client = max(1, lifecycles // clients)
    start = time.perf_counter()
    await asyncio.gather(*(client(per_client) for _ in range(clients)))
    elapsed = time.perf_counter() - start
    total = per_client * clients
    return Row(
        label,
        size,
        clients,
        total,
        elapsed,
        total / elapsed,
        _percentile(latencies, 50) * 1000,
        _percentile(latencies, 99) * 1000,
    )


def run_json(path: Path, size: int, lifecycles: int) -> Row:
    store = WholeFileJsonStore(path)
    prefill_json(store, size)
    latencies: list[float] = []
    start = time.perf_counter()
    for _ in range(lifecycles):
        t0 = time.perf_counter()
        task = store.create(SCHEMA)
        t1 = time.perf_counter()
        store.provide_input(task.task_id, ANSWER[DEFAULT_INPUT_KEY])
        t2 = time.perf_counter()
        store.complete(task.task_id, RESULT)
        t3 = time.perf_counter()
        latencies.extend((t1 - t0, t2 - t1, t3 - t2))
    elapsed = time.perf_counter() - start
    return Row(
        "json-whole-file",
        size,
        1,
        lifecycles,
        elapsed,
        lifecycles / elapsed,
        _percentile(latencies, 50) * 1000,
        _percentile(latencies, 99) * 1000,
    )


def _print(rows: list[Row]) -> None:
    header = (
        f"{'adapter':<16} {'tasks':>8} {'C':>3} {'lifecycles/s':>13} {'op p50 ms':>10} "
        f"{'op p99 ms':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.adapter:<16} {r.tasks_in_store:>8,} {r.clients:>3} {r.lifecycles_per_s:>13,.0f} "
            f"{r.op_p50_ms:>10.3f} {r.op_p99_ms:>10.3f}"
        )


def _targets(rows: list[Row]) -> list[dict[str, Any]]:
    def rate(adapter: str, size: int, clients: int) -> float | None:
        for r in rows:
            if (r.adapter, r.tasks_in_store, r.clients) == (adapter, size, clients):
                return r.lifecycles_per_s
        return None

    checks: list[dict[str, Any]] = []
    sizes = sorted({r.tasks_in_store for r in rows if r.adapter != "json-whole-file"})
    for clients in sorted({r.clients for r in rows}):
        for adapter, floor in (("sqlite-full", 500), ("sqlite-normal", 3000)):
            worst = [v for s in sizes if (v := rate(adapter, s, clients)) is not None]
            if worst:
                checks.append(
                    {
                        "target": f"{adapter} >= {floor}/s (C={clients}, every size)",
                        "measured": round(min(worst)),
                        "ok": min(worst) >= floor,
                    }
                )
            low, high = rate(adapter, sizes[0], clients), rate(adapter, sizes[-1], clients)
            if low and high and len(sizes) > 1:
                checks.append(
                    {
                        "target": f"{adapter} flat: rate at {sizes[-1]:,} >= 80% of "
                        f"{sizes[0]:,} (C={clients})",
                        "measured": round(high / low, 3),
                        "ok": high / low >= 0.8,
                    }
                )
        base = rate("json-whole-file", sizes[0], 1) if sizes else None
        full = rate("sqlite-full", sizes[0], clients) if sizes else None
        if base and full:
            checks.append(
                {
                    "target": f"sqlite-full >= 50x json baseline at {sizes[0]:,} (C={clients})",
                    "measured": round(full / base, 1),
                    "ok": full / base >= 50,
                }
            )
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--lifecycles", type=int, default=3000)
    parser.add_argument("--clients", default="1,32", help="concurrent clients, comma-separated")
    parser.add_argument("--adapters", default="memory,sqlite-full,sqlite-normal,json")
    parser.add_argument("--json-lifecycles", type=int, default=100)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per configuration; the median is reported (this VM is noisy)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few lifecycles")
    parser.add_argument("--out", default="bench/results/store_bench.json")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.lifecycles, args.json_lifecycles, args.repeat = "1000,5000", 500, 20, 1
    sizes = [int(s) for s in args.sizes.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    adapters = args.adapters.split(",")

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmp:
        for size in sizes:
            for adapter in adapters:
                if adapter == "json":
                    if size == sizes[0]:
                        rows.append(run_json(Path(tmp, "seed.json"), size, args.json_lifecycles))
                        _progress(rows[-1])
                    continue
                for c in clients:
                    db = Path(tmp, f"{adapter}-{size}-{c}.db")
                    url = {
                        "memory": "memory://",
                        "sqlite-full": f"sqlite:///{db}",
                        "sqlite-normal": f"sqlite:///{db}?synchronous=normal",
                    }[adapter]
                    rows.append(
                        asyncio.run(run_keel(url, size, args.lifecycles, c, adapter, args.repeat))
                    )
                    _progress(rows[-1])
    print()
    _print(rows)
    checks = _targets(rows)
    print_targets(checks)
    out = write_results(
        args.out, "store_bench", args, rows=[asdict(r) for r in rows], targets=checks
    )
    print(f"\nwrote {out}")


def _progress(row: Row) -> None:
    print(
        f"  {row.adapter:<16} {row.tasks_in_store:>8,} tasks  C={row.clients:<3} "
        f"{row.lifecycles_per_s:>9,.0f} lifecycles/s",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
