"""Push notifications: from a committed change to the client seeing it, vs polling.

A task on a SQLite file gets a new ``statusMessage`` every ``--gap`` seconds (an
unleased ``set_status_message``: one committed write each). A client over real HTTP
sees it either on a ``subscriptions/listen`` stream (``notifications/tasks``) or by
polling ``tasks/get`` every 10 ms; the latency of a sample is from the moment the
write returned (committed) to the moment the client read the frame or the poll answer
that first shows it. Two set-ups, each measured both ways:

* **one process**: the server, its store and the writer in the bench's process (the
  ``keel serve`` with in-process workers case; one event loop for all);
* **across processes**: the writer is another process on the same file (a ``keel
  worker``'s commits reaching a front end): the server learns of it through the store's
  change log. Timestamps are ``time.monotonic()``, system-wide on Linux;
* **across processes on PostgreSQL** (``--postgres URL``): the same, on a fresh schema,
  the change reaching the server by ``NOTIFY``.

    uv run python bench/push_bench.py                 # 200 samples per cell
    uv run python bench/push_bench.py --samples 50 --streams 0
    uv run python bench/push_bench.py --postgres postgresql://postgres@127.0.0.1:5432/test

It also opens ``--streams`` listen streams (default 1,000, one task each) on a real
``keel serve --no-worker`` and reads the server's RSS before and after.

Prints a table and writes JSON (``--out``, default ``bench/results/push_bench.json``).
Targets (issue 16): p99 <= 50 ms in one process, <= 250 ms across processes on SQLite;
1,000 open listen streams on one front end hold <= 200 MB RSS.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import uvicorn

from _report import print_targets, write_results
from keel.mcp.serving import app_server
from keel.runtime import Keel
from keel.store import SqliteStore, open_store

VERSION = "2026-07-28"
POLL = 0.010  # seconds between two polls of the polling client
META = {
    "io.modelcontextprotocol/protocolVersion": VERSION,
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}}
    },
    "io.modelcontextprotocol/clientInfo": {"name": "push-bench", "version": "0"},
}
WRITER = """
import sys, time, anyio
from keel.store import open_store

async def main(path, task_id, samples, gap):
    store = open_store(path)
    await store.get(task_id)
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(samples):
        await store.set_status_message(task_id, f"m{i}")
        print(i, time.monotonic(), flush=True)
        await anyio.sleep(gap)
    await store.close()

anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
"""

Committed = dict[int, float]  # sample -> monotonic time its write returned
Seen = dict[int, float]  # sample -> monotonic time the client first saw it


def headers(method: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }


@asynccontextmanager
async def serving(app: Keel) -> AsyncIterator[str]:
    """The app's server (as ``keel serve`` builds it, no workers) on a loopback port."""
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = app_server(app, "push-bench", run_workers=False)
    logging.getLogger().setLevel(logging.WARNING)  # the SDK's INFO lines (every request)
    config = uvicorn.Config(
        server.streamable_http_app(json_response=True, host="127.0.0.1"),
        log_config=None,
        log_level="warning",
        lifespan="on",
    )
    http = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: http.serve(sockets=[sock]))
        while not http.started:  # noqa: ASYNC110 - uvicorn offers no event for it
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            http.should_exit = True
    sock.close()


def sample_of(task: dict[str, Any]) -> int | None:
    message = task.get("statusMessage") or ""
    return int(message[1:]) if message.startswith("m") else None


def note(seen: Seen, task: dict[str, Any]) -> None:
    """The client sees the task now: sample ``n`` and every earlier one not seen yet (a
    poll, or a coalesced notification, shows only the latest state)."""
    n = sample_of(task)
    if n is None:
        return
    now = time.monotonic()
    for k in range(n, -1, -1):
        if k in seen:
            break
        seen[k] = now


async def listen(url: str, task_id: str, seen: Seen, ready: anyio.Event) -> None:
    """Read ``notifications/tasks`` frames of the task, noting when each sample shows."""
    body = {
        "jsonrpc": "2.0",
        "id": "bench",
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [task_id]}, "_meta": META},
    }
    timeout = httpx2.Timeout(30, read=None)
    async with (
        httpx2.AsyncClient(timeout=timeout) as http,
        http.stream(
            "POST", url, content=json.dumps(body), headers=headers("subscriptions/listen")
        ) as response,
    ):
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            frame = json.loads(line[5:])
            if frame.get("method") == "notifications/subscriptions/acknowledged":
                ready.set()
            elif frame.get("method") == "notifications/tasks":
                note(seen, frame["params"])


async def poll(url: str, task_id: str, seen: Seen, ready: anyio.Event) -> None:
    """``tasks/get`` every :data:`POLL` seconds, noting when each sample first shows."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tasks/get",
        "params": {"taskId": task_id, "_meta": META},
    }
    async with httpx2.AsyncClient(timeout=30) as http:
        while True:
            response = await http.post(
                url,
                content=json.dumps(body),
                headers={**headers("tasks/get"), "Mcp-Name": task_id},
            )
            note(seen, response.json()["result"])
            ready.set()
            await anyio.sleep(POLL)


Client = Callable[[str, str, Seen, anyio.Event], Awaitable[None]]


async def in_process(app: Keel, task_id: str, samples: int, gap: float) -> Committed:
    committed: Committed = {}
    for i in range(samples):
        await app.store.set_status_message(task_id, f"m{i}")
        committed[i] = time.monotonic()
        await anyio.sleep(gap)
    return committed


async def other_process(path: str, task_id: str, samples: int, gap: float) -> Committed:
    committed: Committed = {}
    argv = [sys.executable, "-c", WRITER, path, task_id, str(samples), str(gap)]
    async with await anyio.open_process(argv) as writer:
        assert writer.stdin is not None
        assert writer.stdout is not None
        lines = writer.stdout
        buffer = b""
        while b"ready\n" not in buffer:
            buffer += await lines.receive()
        buffer = buffer.split(b"ready\n", 1)[1]
        await writer.stdin.send(b"go\n")
        while len(committed) < samples:
            while b"\n" not in buffer:
                buffer += await lines.receive()
            line, buffer = buffer.split(b"\n", 1)
            n, at = line.split()
            committed[int(n)] = float(at)
    return committed


async def cell(
    setup: str, client: Client, samples: int, gap: float, postgres: str | None = None
) -> dict[str, Any]:
    """One measurement: a fresh store and server, one client, ``samples`` writes (on a
    fresh schema of ``postgres`` if given, else a SQLite file)."""
    with tempfile.TemporaryDirectory() as folder:
        schema = f"push_bench_{secrets.token_hex(4)}"
        path = f"{postgres}?schema={schema}" if postgres else str(Path(folder) / "keel.db")
        app = Keel(open_store(path))
        task = await app.store.create(arguments={})
        seen: Seen = {}
        async with serving(app) as url, anyio.create_task_group() as tg:
            ready = anyio.Event()
            tg.start_soon(client, url, task.task_id, seen, ready)
            await ready.wait()
            if setup == "one process":
                committed = await in_process(app, task.task_id, samples, gap)
            else:
                committed = await other_process(path, task.task_id, samples, gap)
            with anyio.move_on_after(5):
                while len(seen) < samples:  # noqa: ASYNC110 - the clients fill a dict
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        await app.close()
        if postgres:
            drop_schema(postgres, schema)
    latencies = sorted(
        (seen[n] - committed[n]) * 1000 for n in committed if n in seen and seen[n] >= 0
    )
    return {
        "setup": setup,
        "client": "push" if client is listen else f"poll {POLL * 1000:g} ms",
        "samples": samples,
        "received": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        "max_ms": round(latencies[-1], 2),
    }


def rss_mb(pid: int) -> float:
    """The resident set of process ``pid``, in MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def answering(url: str, process: anyio.abc.Process) -> None:
    """Wait (bounded) until the server answers a request."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
    with anyio.fail_after(60):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"keel serve exited with {process.returncode}")
            try:
                async with httpx2.AsyncClient(timeout=5) as http:
                    response = await http.post(
                        url, content=json.dumps(body), headers=headers("tools/list")
                    )
                if response.status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            await anyio.sleep(0.1)


async def streams_rss(n: int) -> dict[str, Any]:
    """RSS of a ``keel serve --no-worker`` before and with ``n`` open listen streams."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "keel.db"
        store = SqliteStore(path)
        task_ids = [(await store.create(arguments={})).task_id for _ in range(n)]
        await store.close()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        keel = Path(sys.executable).parent / "keel"
        argv = [str(keel), "serve", "--app", "conformance", "--no-worker", "--store", str(path)]
        argv += ["--data-dir", f"{folder}/data", "--port", str(port)]
        process = await anyio.open_process(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            await answering(url, process)
            idle = rss_mb(process.pid)
            opened = 0
            all_open = anyio.Event()
            limits = httpx2.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
            timeout = httpx2.Timeout(60, read=None)

            async def hold(http: httpx2.AsyncClient, task_id: str) -> None:
                nonlocal opened
                body = {
                    "jsonrpc": "2.0",
                    "id": task_id,
                    "method": "subscriptions/listen",
                    "params": {"notifications": {"taskIds": [task_id]}, "_meta": META},
                }
                async with http.stream(
                    "POST", url, content=json.dumps(body), headers=headers("subscriptions/listen")
                ) as response:
                    async for line in response.aiter_lines():
                        if '"notifications/tasks"' in line:  # the task's state: fully open
                            opened += 1
                            if opened == n:
                                all_open.set()

            started = time.monotonic()
            async with (
                httpx2.AsyncClient(limits=limits, timeout=timeout) as http,
                anyio.create_task_group() as tg,
            ):
                for task_id in task_ids:
                    tg.start_soon(hold, http, task_id)
                with anyio.fail_after(300):
                    await all_open.wait()
                opening = time.monotonic() - started
                held = rss_mb(process.pid)
                tg.cancel_scope.cancel()
        finally:
            process.terminate()
            with anyio.fail_after(30):
                await process.wait()
    return {
        "streams": n,
        "rss_idle_mb": round(idle, 1),
        "rss_with_streams_mb": round(held, 1),
        "kb_per_stream": round((held - idle) * 1024 / n, 1),
        "seconds_to_open_all": round(opening, 2),
    }


def drop_schema(url: str, schema: str) -> None:
    import psycopg  # only with --postgres

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [
        await cell(setup, client, args.samples, args.gap)
        for setup in ("one process", "across processes")
        for client in (listen, poll)
    ]
    if args.postgres:
        rows += [
            await cell("across (PostgreSQL)", client, args.samples, args.gap, args.postgres)
            for client in (listen, poll)
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="writes per cell")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between writes")
    parser.add_argument(
        "--postgres", default="", help="also across processes on this PostgreSQL database URL"
    )
    parser.add_argument("--streams", type=int, default=1000, help="listen streams held (0: skip)")
    parser.add_argument("--out", default="bench/results/push_bench.json")
    args = parser.parse_args()
    rows = anyio.run(run, args)
    held = anyio.run(streams_rss, args.streams) if args.streams else None
    print(f"{'setup':<20} {'client':<12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'seen':>6}")
    for r in rows:
        print(
            f"{r['setup']:<20} {r['client']:<12} {r['p50_ms']:>8} {r['p99_ms']:>8} "
            f"{r['max_ms']:>8} {r['received']:>3}/{r['samples']}"
        )
    push = {r["setup"]: r for r in rows if r["client"] == "push"}
    checks = [
        {
            "target": "push p99 <= 50 ms in one process",
            "ok": push["one process"]["p99_ms"] <= 50,
            "measured": f"{push['one process']['p99_ms']} ms",
        },
        {
            "target": "push p99 <= 250 ms across processes (SQLite)",
            "ok": push["across processes"]["p99_ms"] <= 250,
            "measured": f"{push['across processes']['p99_ms']} ms",
        },
    ]
    if held is not None:
        print(
            f"\n{held['streams']} listen streams on keel serve: RSS {held['rss_idle_mb']} MB "
            f"idle -> {held['rss_with_streams_mb']} MB ({held['kb_per_stream']} KB a stream; "
            f"all open in {held['seconds_to_open_all']} s)"
        )
        checks.append(
            {
                "target": f"{held['streams']} listen streams on one front end <= 200 MB RSS",
                "ok": held["rss_with_streams_mb"] <= 200,
                "measured": f"{held['rss_with_streams_mb']} MB",
            }
        )
    if "across (PostgreSQL)" in push:
        checks.append(
            {
                "target": "push p99 <= 100 ms across processes on PostgreSQL",
                "ok": push["across (PostgreSQL)"]["p99_ms"] <= 100,
                "measured": f"{push['across (PostgreSQL)']['p99_ms']} ms",
            }
        )
    print_targets(checks)
    out = write_results(args.out, "push_bench", args, rows=rows, streams=held, targets=checks)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
