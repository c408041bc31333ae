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

``--load SECONDS`` (off by default) runs ``--clients`` clients (default 32,
``TasksClientExtension``) calling ``slow_compute`` (0.2 s) in a loop against ``keel
serve --app conformance`` (its workers in-process, SQLite), once listening and once
polling every 10 ms: tasks/s, and the server's CPU per task (``/proc/PID/stat``: user +
system, read before and after the measured window) and the clients' HTTP requests per
task (a polling client that cannot keep up polls less often than asked: then the
comparison says little). The clients run in ``--client-processes`` processes of their
own (default: one each), started and warmed up (every client has finished a task)
before the window opens, so that the clients' own CPU is not the server's process's
and one client's event loop never delays another's polls; ``--client-processes 0`` runs
them all in this process, as before. ``--rounds N`` alternates push and polling N
times (medians reported).

    uv run python bench/push_bench.py --samples 0 --streams 0 --load 20 --rounds 3

``--raw-clients`` runs them with the bench's own client instead
(``bench/_raw_client.py``: the same wire over raw HTTP/1.1, a fraction of the SDK
client's CPU), all in one process by default, so that 32 clients really poll every
10 ms or hold their listen streams on a 2-core machine; it also reports the polls per
task achieved and the mean task time. With it ``--pin`` is on by default: the server on
one CPU, the clients and this process on the others (``os.sched_setaffinity``), so
that the clients never take the server's CPU (``--no-pin`` to let the kernel place
them).

    uv run python bench/push_bench.py --samples 0 --streams 0 --load 20 --rounds 3 --raw-clients

It also opens ``--streams`` listen streams (default 1,000, one task each) on a real
``keel serve --no-worker`` and reads the server's RSS before and after.

Prints a table and writes JSON (``--out``, default ``bench/results/push_bench.json``).
Targets (issue 16): p99 <= 50 ms in one process, <= 250 ms across processes on SQLite;
1,000 open listen streams on one front end hold <= 200 MB RSS.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
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
from anyio.streams.buffered import BufferedByteReceiveStream

from _report import print_targets, write_results
from keel.mcp.serving import app_server
from keel.runtime import Keel
from keel.store import SqliteStore, open_store

VERSION = "2026-07-28"
POLL = 0.010  # seconds between two polls of the polling client
TASK_SECONDS = 0.2  # how long --load's slow_compute tasks run
RAW_CLIENT = Path(__file__).with_name("_raw_client.py")  # --raw-clients' load process
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def keel_serve(store: str, folder: str, *more: str) -> AsyncIterator[tuple[str, int]]:
    """``keel serve --app conformance`` on ``store`` as a process: (its URL, its pid)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    keel = Path(sys.executable).parent / "keel"
    argv = [str(keel), "serve", "--app", "conformance", "--store", store, *more]
    argv += ["--data-dir", f"{folder}/data", "--port", str(port)]
    process = await anyio.open_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        await answering(url, process)
        yield url, process.pid
    finally:
        process.terminate()
        with anyio.fail_after(30):
            await process.wait()


async def load(seconds: float, *, listening: bool, clients: int = 32) -> dict[str, Any]:
    """``clients`` clients calling ``slow_compute`` for ``seconds``: tasks/s, server CPU."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from keel.mcp.client import TasksClientExtension

    done = 0
    requests = 0

    async def count(_request: httpx2.Request) -> None:
        nonlocal requests
        requests += 1

    with tempfile.TemporaryDirectory() as folder:
        store = f"{folder}/keel.db"
        async with keel_serve(store, folder, "--concurrency", str(clients)) as (url, pid):

            async def client() -> None:
                nonlocal done
                http = httpx2.AsyncClient(event_hooks={"request": [count]}, timeout=60)
                tasks = TasksClientExtension(
                    min_poll_interval=POLL, max_poll_interval=POLL, listen=listening
                )
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport, extensions=[tasks]) as session:
                    while True:
                        await session.call_tool("slow_compute", {"seconds": TASK_SECONDS})
                        done += 1

            async with anyio.create_task_group() as tg:
                for _ in range(clients):
                    tg.start_soon(client)
                await anyio.sleep(1.0)  # warm-up: every client connected and calling
                first, cpu, sent = done, cpu_seconds(pid), requests
                await anyio.sleep(seconds)
                tasks, used, sent = done - first, cpu_seconds(pid) - cpu, requests - sent
                tg.cancel_scope.cancel()
    return {
        "client": "push" if listening else f"poll {POLL * 1000:g} ms",
        "clients": clients,
        "tasks": tasks,
        "tasks_per_s": round(tasks / seconds, 1),
        "server_cpu_ms_per_task": round(used * 1000 / max(tasks, 1), 2),
        "http_requests_per_task": round(sent / max(tasks, 1), 1),
    }


async def client_process(url: str, clients: int, listening: bool) -> None:
    """A client process of ``--load``: ``clients`` clients calling ``slow_compute`` in a
    loop. Prints ``ready`` once each has finished a task; then answers each ``mark``
    line on stdin with its counts so far (JSON: tasks done, HTTP requests sent); ends
    at ``stop`` or at the end of stdin."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from keel.mcp.client import TasksClientExtension

    counts = {"tasks": 0, "requests": 0, "warm": 0}

    async def count(_request: httpx2.Request) -> None:
        counts["requests"] += 1

    async def client() -> None:
        http = httpx2.AsyncClient(event_hooks={"request": [count]}, timeout=60)
        tasks = TasksClientExtension(
            min_poll_interval=POLL, max_poll_interval=POLL, listen=listening
        )
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, extensions=[tasks]) as session:
            await session.call_tool("slow_compute", {"seconds": TASK_SECONDS})
            counts["tasks"] += 1
            counts["warm"] += 1
            while True:
                await session.call_tool("slow_compute", {"seconds": TASK_SECONDS})
                counts["tasks"] += 1

    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(client)
        with anyio.fail_after(300):
            while counts["warm"] < clients:  # noqa: ASYNC110 - the clients bump a counter
                await anyio.sleep(0.05)
        print("ready", flush=True)
        async for line in anyio.wrap_file(sys.stdin):
            if line.strip() != "mark":
                break
            print(json.dumps({k: counts[k] for k in ("tasks", "requests")}), flush=True)
        tg.cancel_scope.cancel()


class ClientProcess:
    """One ``--client-process`` child: started, told ``mark`` and ``stop``."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.lines = BufferedByteReceiveStream(process.stdout)

    async def line(self) -> bytes:
        with anyio.fail_after(300):
            return await self.lines.receive_until(b"\n", 1 << 16)

    async def mark(self) -> dict[str, int]:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"mark\n")
        counts: dict[str, int] = json.loads(await self.line())
        return counts

    async def stop(self) -> float:
        """Tell it to stop; its CPU seconds (user + system) until then."""
        used = cpu_seconds(self.process.pid)
        assert self.process.stdin is not None
        await self.process.stdin.send(b"stop\n")
        with anyio.fail_after(30):
            await self.process.wait()
        return used


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of process ``pid`` (and the threads it starts later) on ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def cpu_split() -> tuple[set[int], set[int]] | None:
    """``--pin``: (the server's CPU, the clients' CPUs), or None on a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else None


async def load_processes(
    seconds: float,
    *,
    listening: bool,
    clients: int,
    processes: int,
    raw: bool = False,
    pinned: bool = False,
) -> dict[str, Any]:
    """:func:`load` with the clients in ``processes`` processes of their own: the SDK's
    client, or with ``raw`` the bench's own (``bench/_raw_client.py``). ``pinned``: the
    server on one CPU, the clients (and this process) on the others (:func:`cpu_split`)."""
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    mode = "push" if listening else "poll"
    split = cpu_split() if pinned else None
    if split is not None:
        pin(os.getpid(), split[1])
    with tempfile.TemporaryDirectory() as folder:
        store = f"{folder}/keel.db"
        async with keel_serve(store, folder, "--concurrency", str(clients)) as (url, pid):
            if split is not None:
                pin(pid, split[0])
            children = []
            try:
                for share in shares:
                    if raw:
                        argv = [sys.executable, str(RAW_CLIENT), url, str(share), mode]
                        argv += ["--interval", str(POLL), "--seconds", str(TASK_SECONDS)]
                    else:
                        argv = [sys.executable, __file__, "--client-process", url, str(share), mode]
                    children.append(ClientProcess(await anyio.open_process(argv, stderr=None)))
                    if split is not None:
                        pin(children[-1].process.pid, split[1])
                for child in children:
                    assert await child.line() == b"ready"
                before = [await child.mark() for child in children]
                cpu, started = cpu_seconds(pid), time.monotonic()
                clients_cpu = sum(cpu_seconds(child.process.pid) for child in children)
                await anyio.sleep(seconds)
                after = [await child.mark() for child in children]
                used, window = cpu_seconds(pid) - cpu, time.monotonic() - started
                clients_cpu = sum(cpu_seconds(c.process.pid) for c in children) - clients_cpu
            finally:
                client_cpu = [await child.stop() for child in children]
    done = {k: sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) for k in after[0]}
    tasks = max(done["tasks"], 1)
    row = {
        "client": "push" if listening else f"poll {POLL * 1000:g} ms",
        "clients": clients,
        "client_kind": "raw" if raw else "sdk",
        "client_processes": processes,
        "pinned": None if split is None else [sorted(split[0]), sorted(split[1])],
        "seconds": round(window, 2),
        "tasks": done["tasks"],
        "tasks_per_s": round(done["tasks"] / window, 1),
        "server_cpu_s": round(used, 2),
        "server_cpu_ms_per_task": round(used * 1000 / tasks, 2),
        "http_requests_per_task": round(done["requests"] / tasks, 1),
        "clients_cpu_s_in_window": round(clients_cpu, 2),
        "clients_cpu_s_total": round(sum(client_cpu), 1),  # start-up included
        "load_average": os.getloadavg(),
    }
    if raw:
        row["polls_per_task"] = round(done["polls"] / tasks, 1)
        row["frames_per_task"] = round(done["frames"] / tasks, 1)
        row["task_ms"] = round(done["task_ms"] / tasks, 1)
    return row


MEDIANS = (
    "tasks_per_s",
    "server_cpu_ms_per_task",
    "http_requests_per_task",
    "polls_per_task",
    "frames_per_task",
    "task_ms",
    "server_cpu_s",
    "clients_cpu_s_in_window",
    "seconds",
)


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each measured figure of ``rows`` (one client kind, several rounds)."""
    return {
        **rows[0],
        **{k: statistics.median(r[k] for r in rows) for k in MEDIANS if k in rows[0]},
    }


def run_loads(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``--rounds`` alternations of push and polling: every round, and the medians."""
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for listening in (True, False):
            if args.client_processes:
                measure = functools.partial(
                    load_processes,
                    args.load,
                    listening=listening,
                    clients=args.clients,
                    processes=args.client_processes,
                    raw=args.raw_clients,
                    pinned=args.pin,
                )
            else:
                measure = functools.partial(
                    load, args.load, listening=listening, clients=args.clients
                )
            rounds.append(anyio.run(measure))
            row = rounds[-1]
            polls = f" {row['polls_per_task']:>5} polls/task" if "polls_per_task" in row else ""
            print(
                f"  round: {row['client']:<10} {row['tasks_per_s']:>7} tasks/s "
                f"{row['server_cpu_ms_per_task']:>7} ms CPU/task "
                f"{row['http_requests_per_task']:>6} requests/task{polls} "
                f"(load {row['load_average'][0]:.1f})",
                flush=True,
            )
    medians = [median_row([r for r in rounds if r["client"] == kind]) for kind in ("push", POLLED)]
    return rounds, medians


POLLED = f"poll {POLL * 1000:g} ms"
CLOSE_ENOUGH = 0.75  # polls per task achieved / asked below which polling fell behind


def report_loads(args: argparse.Namespace, loads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Print the medians of ``--load``; the targets they meet or miss."""
    where = f"in {args.client_processes} processes" if args.client_processes else "in-process"
    pinned = ", server and clients pinned to separate CPUs" if args.pin else ""
    print(
        f"\n{args.clients} {'raw' if args.raw_clients else 'SDK'} clients {where}{pinned}, "
        f"median of {args.rounds}:\n"
        f"{'client':<12} {'tasks/s':>8} {'server CPU ms/task':>19} {'requests/task':>14} "
        f"{'polls/task':>11} {'task ms':>8} {'server cores':>13} {'client cores':>13}"
    )
    for row in loads:
        print(
            f"{row['client']:<12} {row['tasks_per_s']:>8} "
            f"{row['server_cpu_ms_per_task']:>19} {row['http_requests_per_task']:>14} "
            f"{row.get('polls_per_task', '-'):>11} {row.get('task_ms', '-'):>8} "
            f"{row['server_cpu_s'] / row['seconds']:>13.2f} "
            f"{row['clients_cpu_s_in_window'] / row['seconds']:>13.2f}"
        )
    pushed, polled = loads
    asked = TASK_SECONDS / POLL
    if "polls_per_task" in polled and polled["polls_per_task"] < CLOSE_ENOUGH * asked:
        print(
            f"\nNOTE: polling fell behind: {polled['polls_per_task']} polls per task, where "
            f"a poll every {POLL * 1000:g} ms over a {TASK_SECONDS:g} s task makes about "
            f"{asked:g} (tasks took {polled['task_ms']} ms)."
        )
    return [
        {
            "target": "server CPU per task with push <= half of polling at 10 ms",
            "ok": pushed["server_cpu_ms_per_task"] <= polled["server_cpu_ms_per_task"] / 2,
            "measured": f"{pushed['server_cpu_ms_per_task']} vs "
            f"{polled['server_cpu_ms_per_task']} ms",
        },
        {
            "target": "tasks/s with push >= with polling",
            "ok": pushed["tasks_per_s"] >= polled["tasks_per_s"],
            "measured": f"{pushed['tasks_per_s']} vs {polled['tasks_per_s']}",
        },
    ]


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
    parser.add_argument("--load", type=float, default=0.0, help="seconds of load (0: skip)")
    parser.add_argument("--clients", type=int, default=32, help="clients of --load")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=None,
        help="processes the --load clients run in (default: one each; 0: this process)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternations of --load")
    parser.add_argument(
        "--raw-clients",
        action="store_true",
        help="--load with the bench's own raw HTTP client (bench/_raw_client.py, one "
        "process by default) instead of the SDK's",
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--load: the server on one CPU, the clients on the others "
        "(default: on with --raw-clients)",
    )
    parser.add_argument("--client-process", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=1000, help="listen streams held (0: skip)")
    parser.add_argument("--out", default="bench/results/push_bench.json")
    args = parser.parse_args()
    if args.client_process:
        url, clients, mode = args.client_process
        anyio.run(client_process, url, int(clients), mode == "push")
        return
    if args.client_processes is None:
        args.client_processes = 1 if args.raw_clients else args.clients
    if args.pin is None:
        args.pin = args.raw_clients
    load_before = os.getloadavg()
    rows = anyio.run(run, args) if args.samples else []
    held = anyio.run(streams_rss, args.streams) if args.streams else None
    rounds, loads = run_loads(args) if args.load else ([], [])
    print(f"load average at the start: {load_before[0]:.1f} (1 min), {load_before[1]:.1f} (5 min)")
    print(f"{'setup':<20} {'client':<12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'seen':>6}")
    for r in rows:
        print(
            f"{r['setup']:<20} {r['client']:<12} {r['p50_ms']:>8} {r['p99_ms']:>8} "
            f"{r['max_ms']:>8} {r['received']:>3}/{r['samples']}"
        )
    push = {r["setup"]: r for r in rows if r["client"] == "push"}
    checks = []
    if rows:
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
    if loads:
        checks += report_loads(args, loads)
    print_targets(checks)
    out = write_results(
        args.out,
        "push_bench",
        args,
        rows=rows,
        streams=held,
        load=loads,
        load_rounds=rounds,
        load_average_at_start=load_before,
        targets=checks,
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
