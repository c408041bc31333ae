"""The operator console's pages on a big store: server time per page, p50 / p95.

Fills a fresh store (SQLite, or PostgreSQL with ``--store postgresql://…``) with
``--tasks`` tasks (a realistic mix of statuses, tools and principals, over a day of
creation times), then requests each page through the console's real ASGI app (httpx's
ASGI transport: the handler, the store queries and the template, no network) and
reports p50 / p95 per page: the list unfiltered, by status, tool name, principal,
created and updated range, a page deep in (through its cursor), and a task's page.

With ``--leases N`` it times the Workers and health page instead, on a store that also
holds ``N`` live leases spread over ``--workers`` workers (a few expired and not
recovered, as after a worker died; each with its claim in the history):

    uv run python bench/ops_bench.py --tasks 1000000
    uv run python bench/ops_bench.py --tasks 1000000 --store postgresql://127.0.0.1/test
    uv run python bench/ops_bench.py --tasks 0 --leases 3000 --workers 30
    uv run python bench/ops_bench.py --tasks 100000 --leases 3000 --workers 30

Target (issue 17): every list filter but free text, and the task page, p95 <= 150 ms on
1,000,000 tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from _report import print_targets, write_results
from keel.model import InputRequest, Status, Task
from keel.ops import standalone_app
from keel.store import open_store
from keel.store.base import TxStore
from keel.store.rows import task_to_row
from keel.store.sqlite.tx import Q as SQLITE_Q

CHUNK = 20_000
TARGET_MS = 150.0
NAMES = ["diagnose_root_cause", "rollback", "page_oncall", "reindex"]
OWNERS = [f"team-{n}" for n in range(20)]
REQUEST = {
    "input": InputRequest(
        "Which service?",
        {"type": "object", "properties": {"service": {"type": "string"}}, "required": ["service"]},
    )
}


def _filler(i: int, now: float) -> Task:
    """Mostly finished tasks; some waiting, some working, some failed."""
    kind = i % 20
    common: dict[str, Any] = {
        "task_id": f"{int((now - 86_400 + i * 0.05) * 1000):012x}bench{i:017d}",
        "owner": OWNERS[i % len(OWNERS)],
        "name": NAMES[i % len(NAMES)],
        "arguments": {"incident_id": f"INC-{i}"},
        "created_at": now - 86_400 + i * (86_400 / 2_000_000),
        "updated_at": now - 3_600 + (i % 3_600),
        "ready_at": now,
        "status_message": f"step {i % 7} of 7",
    }
    if kind < 15:
        return Task(status=Status.COMPLETED, result={"ok": True, "n": i}, **common)
    if kind < 17:
        return Task(status=Status.INPUT_REQUIRED, input_requests=REQUEST, **common)
    if kind < 19:
        return Task(status=Status.WORKING, **common)
    error = {"code": -32000, "message": "upstream refused"}
    return Task(status=Status.FAILED, error=error, **common)


_COLUMNS = (
    "task_id", "status", "owner", "name", "arguments", "created_at", "updated_at",
    "status_message", "input_requests", "input_responses", "result", "error",
    "idempotency_key", "attempt", "max_attempts", "lease_owner", "lease_expires_at", "fence",
    "ready_at", "ttl", "closed_fence", "expires_at", "request_digest",
)  # fmt: skip


def _copy_postgres(where: str, chunk: list[Task], now: float) -> None:
    """One chunk of rows and history entries into PostgreSQL with COPY."""
    import psycopg

    from keel.store.postgres.config import parse_postgres_url

    with psycopg.connect(parse_postgres_url(where).conninfo) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY tasks ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
            for task in chunk:
                row = task_to_row(task)
                copy.write_row([row[c] for c in _COLUMNS])
        events = "COPY task_events (task_id, at, from_status, to_status, reason, actor)"
        with cur.copy(f"{events} FROM STDIN") as copy:
            for task in chunk:
                copy.write_row((task.task_id, now, None, task.status.value, "imported", "bench"))


def _leased(i: int, now: float, workers: int) -> tuple[Task, float]:
    """Live lease ``i``: a claimed ``working`` task, renewed up to 20 s ago (one in 50
    expired and not recovered), and when its lease was claimed (up to 10 minutes ago)."""
    expired = i % 50 == 0
    task = Task(
        task_id=f"{int((now - 600 + i * 0.01) * 1000):012x}lease{i:017d}",
        status=Status.WORKING,
        owner=OWNERS[i % len(OWNERS)],
        name=NAMES[i % len(NAMES)],
        arguments={"incident_id": f"INC-L{i}"},
        created_at=now - 900 + i * 0.01,
        updated_at=now - (120 if expired else i % 20),
        ready_at=now - 900,
        status_message=f"step {i % 7} of 7",
        max_attempts=3,
        lease_owner=f"worker-{i % workers:03d}",
        lease_expires_at=now - 90 if expired else now + 30 - i % 20,
        fence=1,
    )
    return task, now - 600 + (i * 7) % 600


def _fill_leases(where: str, count: int, workers: int, now: float) -> None:
    """``count`` live leases over ``workers`` workers, each with its creation and its
    claim in the history (the claim is the latest entry of a leased task)."""
    leased = [_leased(i, now, workers) for i in range(count)]
    events = [
        row
        for task, claimed in leased
        for row in (
            (task.task_id, task.created_at, None, "working", "created", "client"),
            (task.task_id, claimed, "working", "working", "claimed", f"worker:{task.lease_owner}"),
        )
    ]
    if where.startswith("postgres"):
        import psycopg

        from keel.store.postgres.config import parse_postgres_url

        with psycopg.connect(parse_postgres_url(where).conninfo) as conn, conn.cursor() as cur:
            with cur.copy(f"COPY tasks ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
                for task, _ in leased:
                    row = task_to_row(task)
                    copy.write_row([row[c] for c in _COLUMNS])
            cols = "task_id, at, from_status, to_status, reason, actor"
            with cur.copy(f"COPY task_events ({cols}) FROM STDIN") as copy:
                for event in events:
                    copy.write_row(event)
            cur.execute("ANALYZE tasks")
        return
    with sqlite3.connect(where) as direct:
        direct.executemany(SQLITE_Q["insert_task"], [task_to_row(t) for t, _ in leased])
        direct.executemany(SQLITE_Q["insert_event_row"], events)
    direct.close()


async def fill(store: TxStore, count: int, where: str) -> float:
    """Fill the store directly, many rows per transaction, each with one history entry
    (import_tasks reads and checks each task first: minutes for a million)."""
    started, now = time.perf_counter(), time.time()
    direct = None if where.startswith("postgres") else sqlite3.connect(where)
    for start in range(0, count, CHUNK):
        chunk = [_filler(i, now) for i in range(start, min(count, start + CHUNK))]
        if direct is None:
            _copy_postgres(where, chunk, now)
        else:
            with direct:
                direct.executemany(SQLITE_Q["insert_task"], [task_to_row(t) for t in chunk])
                direct.executemany(
                    SQLITE_Q["insert_event_row"],
                    [(t.task_id, now, None, t.status.value, "imported", "bench") for t in chunk],
                )
        print(f"  filled {start + len(chunk):,}", end="\r", flush=True)
    if direct is not None:
        direct.close()
    else:  # fresh statistics, as autovacuum would gather them soon after a bulk load
        import psycopg

        from keel.store.postgres.config import parse_postgres_url

        with psycopg.connect(parse_postgres_url(where).conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE tasks")
    print()
    return time.perf_counter() - started


async def timed(http: httpx.AsyncClient, url: str, requests: int) -> dict[str, float]:
    took = []
    for _ in range(requests):
        began = time.perf_counter()
        response = await http.get(url)
        took.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, (url, response.status_code, response.text[:300])
    cuts = statistics.quantiles(took, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49], 2),
        "p95_ms": round(cuts[94], 2),
        "max_ms": round(max(took), 2),
    }


async def _list_pages(http: httpx.AsyncClient, store: TxStore, now: float) -> dict[str, str]:
    first = await http.get("/ops/?status=failed&limit=50")
    cursor = first.text.split("cursor=")[1].split('"')[0].split("&")[0]
    sample = (await store.browse(limit=1)).tasks[0].task_id
    return {
        "list": "/ops/",
        "list status=input_required": "/ops/?status=input_required",
        "list name": f"/ops/?name={NAMES[1]}",
        "list principal": f"/ops/?principal={OWNERS[3]}",
        "list created range": f"/ops/?created_from={now - 70_000}&created_to={now - 60_000}",
        "list updated range": f"/ops/?updated_from={now - 1_800}",
        "list status+name+principal": (
            f"/ops/?status=failed&name={NAMES[3]}&principal={OWNERS[19]}"
        ),
        "list next page (cursor)": f"/ops/?status=failed&cursor={cursor}",
        "task page": f"/ops/tasks/{sample}",
    }


def _worker_pages(args: argparse.Namespace) -> dict[str, str]:
    return {
        f"workers ({args.leases:,} leases, {args.workers} workers)": "/ops/workers",
        "one worker's leases": f"/ops/workers?worker=worker-{7 % args.workers:03d}",
    }


async def main(args: argparse.Namespace) -> None:
    where = args.store or str(Path(tempfile.mkdtemp(prefix="ops-bench-")) / "keel.db")
    store = open_store(where)
    await store.counts()  # opened: the schema exists before the fill
    try:
        seconds = 0.0 if args.filled else await fill(store, args.tasks, where)
        if args.leases and not args.filled:
            _fill_leases(where, args.leases, args.workers, time.time())
        print(f"{args.tasks:,} tasks, {args.leases:,} leases, filled in {seconds:.1f} s ({where})")
        now = time.time()
        # The deadline of one tool, as keel serve gives its app's: /workers judges attempts.
        judged = {"deadlines": {NAMES[0]: args.deadline}} if args.deadline else {}
        transport = httpx.ASGITransport(app=standalone_app(store, **judged))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            pages = _worker_pages(args) if args.leases else await _list_pages(http, store, now)
            rows = {}
            for label, url in pages.items():
                await http.get(url)  # warm
                rows[label] = await timed(http, url, args.requests)
                print(f"  {label:40s} {rows[label]}")
    finally:
        await store.close()
    size = f"{args.tasks:,} tasks" + (f" + {args.leases:,} leases" if args.leases else "")
    checks = [
        {
            "target": f"{label}: p95 <= {TARGET_MS:g} ms on {size}",
            "measured": f"{row['p95_ms']} ms",
            "ok": row["p95_ms"] <= TARGET_MS,
        }
        for label, row in rows.items()
    ]
    print_targets(checks)
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"  load average (1, 5, 15 min): {load[0]} {load[1]} {load[2]}")
    kind = "postgres" if args.store and args.store.startswith("postgres") else "sqlite"
    name = f"ops-{kind}-{args.tasks}" + (f"-leases-{args.leases}" if args.leases else "")
    out = write_results(
        f"bench/results/{name}.json", "ops_bench", args,
        fill_seconds=round(seconds, 1), pages=rows, checks=checks, load_average=load,
    )  # fmt: skip
    print(f"\nresults: {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40, help="per page")
    parser.add_argument("--store", help="a store URL (default: a fresh SQLite file)")
    parser.add_argument(
        "--filled", action="store_true", help="--store holds --tasks tasks of an earlier run"
    )
    parser.add_argument(
        "--leases", type=int, default=0, help="live leases to add: time /ops/workers instead"
    )
    parser.add_argument("--workers", type=int, default=30, help="workers holding the leases")
    parser.add_argument(
        "--deadline",
        type=float,
        default=300.0,
        help=f"seconds: the deadline of {NAMES[0]} the console judges (0: none, as before)",
    )
    asyncio.run(main(parser.parse_args()))
