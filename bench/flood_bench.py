"""An ``initialize`` flood of old-protocol (2025-11-25) sessions against a real ``keel
serve``: the server's memory, and what a current-protocol client polling a task sees.

Starts ``keel serve --app conformance`` on a free loopback port (its default session
limits, or those given), creates one long task over 2026-07-28, and polls it with
``tasks/get`` (one poll at a time) while idle (``--idle-seconds``), then while
``--sessions`` old-protocol ``initialize`` calls (``--concurrency`` at a time, from a
process of their own) hit the server, then stops it. The server's RSS is sampled every
50 ms from /proc. Targets (issue 15): under 250 MB through a flood of 10,000, and the
poller's p99 latency within 2x of idle.

    uv run python bench/flood_bench.py                    # 2,000 initialize calls
    uv run python bench/flood_bench.py --sessions 10000
    uv run python bench/flood_bench.py --sdk-defaults     # the SDK's limits (10,000; 30 min)
    uv run python bench/flood_bench.py --control          # flood another server: the baseline
    uv run python bench/flood_bench.py --serve-arg=--session-rate=20   # other keel serve settings

Loopback only, and bounded (at most 20,000 calls). Prints a table and writes JSON
(``--out``, default ``bench/results/flood_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx2

from _report import print_targets, write_results

KEEL = Path(sys.executable).parent / "keel"
HOST = "127.0.0.1"
MAX_CALLS = 20_000
RSS_TARGET_MB = 250.0
P99_FACTOR = 2.0
SAMPLE_EVERY = 0.05  # seconds between RSS samples
V2026 = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "flood", "version": "0"},
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` has used, in seconds (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """The resident set of process ``pid``, in MB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def call_2026(
    http: httpx2.AsyncClient, url: str, method: str, params: dict[str, Any], name: str
) -> dict[str, Any]:
    """One 2026-07-28 request, as the official client sends it; its result."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "flood-bench", "version": "0"},
    }
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": V2026,
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    response = await http.post(url, content=json.dumps(message), headers=headers)
    body = response.json()
    if "result" not in body:
        raise RuntimeError(f"{method}: {response.status_code} {body}")
    result: dict[str, Any] = body["result"]
    return result


async def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    """Until the server answers a 2026-07-28 tools/list (bounded)."""
    async with httpx2.AsyncClient(timeout=5) as http:
        with anyio.fail_after(120):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"keel serve exited with {process.returncode}")
                try:
                    await call_2026(http, url, "tools/list", {}, "")
                except (httpx2.HTTPError, RuntimeError, ValueError):
                    await anyio.sleep(0.05)
                else:
                    return


class Poller:
    """Polls one task with tasks/get, one request at a time, recording latencies into
    the phase currently named."""

    def __init__(self, url: str, task_id: str) -> None:
        self.url, self.task_id = url, task_id
        self.phase = "idle"
        self.latencies: dict[str, list[float]] = {"idle": [], "flood": [], "after": []}
        self.errors = 0

    async def run(self, http: httpx2.AsyncClient, stop: anyio.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                await call_2026(http, self.url, "tasks/get", {"taskId": self.task_id}, self.task_id)
            except (httpx2.HTTPError, RuntimeError, ValueError):
                self.errors += 1
                continue
            self.latencies[self.phase].append((time.perf_counter() - started) * 1000)


def outcome(status: int, body: dict[str, Any]) -> str:
    """An answer by kind: ``HTTP 200``, or the status and JSON-RPC code, and for
    Keel's ``-32052`` which limit refused it (the session limit, or the queue of
    requests waiting their turn to open one)."""
    if status == 200:
        return "HTTP 200"
    error = body.get("error", {}) if isinstance(body, dict) else {}
    message = str(error.get("message", ""))
    limit = next((f" ({s})" for s in ("--max-sessions", "--session-queue") if s in message), "")
    return f"HTTP {status} {error.get('code', '')}{limit}"


async def flood(url: str, calls: int, concurrency: int) -> dict[str, Any]:
    """``calls`` old-protocol initialize requests, ``concurrency`` at a time: the
    answers by kind, the seconds it took, and how long the calls took (ms)."""
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    limiter = anyio.Semaphore(concurrency)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    body = json.dumps(INITIALIZE)
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx2.AsyncClient(timeout=30, limits=limits) as http:

        async def one() -> None:
            async with limiter:
                sent = time.perf_counter()
                try:
                    response = await http.post(url, content=body, headers=headers)
                except httpx2.HTTPError as exc:
                    outcomes[type(exc).__name__] += 1
                    return
                latencies.append((time.perf_counter() - sent) * 1000)
                answer = response.json() if response.status_code != 200 and response.text else {}
                outcomes[outcome(response.status_code, answer)] += 1

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(calls):
                tg.start_soon(one)
        seconds = time.perf_counter() - started
    return {"outcomes": outcomes, "seconds": seconds, "calls": _stats(latencies)}


async def flood_process(url: str, calls: int, concurrency: int) -> dict[str, Any]:
    """:func:`flood` in a process of its own (this script with ``--flood-only``), so
    that the flood's client work does not slow the poller's event loop; also the CPU
    seconds that process used."""
    argv = [sys.executable, __file__, "--flood-only", url]
    argv += ["--sessions", str(calls), "--concurrency", str(concurrency)]
    before = os.times()
    done = await anyio.run_process(argv)
    after = os.times()
    report: dict[str, Any] = json.loads(done.stdout)
    report["client_cpu_seconds"] = round(
        after.children_user + after.children_system - before.children_user - before.children_system,
        2,
    )
    return report


async def measure(url: str, flooded: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """Idle polls of ``url``, then polls during the flood of ``flooded`` (the same
    server, or another with ``--control``), with RSS of ``pid`` sampled throughout."""
    samples: list[tuple[float, float]] = []
    stop_sampling, stop_polling = anyio.Event(), anyio.Event()
    begun = time.perf_counter()

    async def sample() -> None:
        while not stop_sampling.is_set():
            samples.append((time.perf_counter() - begun, rss_mb(pid)))
            await anyio.sleep(SAMPLE_EVERY)

    async with httpx2.AsyncClient(timeout=30) as http:
        created = await call_2026(
            http,
            url,
            "tools/call",
            {"name": "slow_compute", "arguments": {"seconds": 3600, "label": "polled"}},
            "slow_compute",
        )
        poller = Poller(url, created["taskId"])
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            tg.start_soon(poller.run, http, stop_polling)
            idle_until = time.perf_counter() + args.idle_seconds
            idle_cpu = cpu_seconds(pid)
            with anyio.fail_after(120 + args.idle_seconds):
                while (  # noqa: ASYNC110
                    len(poller.latencies["idle"]) < args.idle_polls
                    or time.perf_counter() < idle_until
                ):
                    await anyio.sleep(0.01)
            rss_before = rss_mb(pid)
            idle_polls = len(poller.latencies["idle"])
            poll_cpu = (cpu_seconds(pid) - idle_cpu) / max(1, idle_polls)  # each poll's
            poller.phase = "flood"
            flood_started = time.perf_counter() - begun
            cpu_before = cpu_seconds(pid)
            flooding = await flood_process(flooded, args.sessions, args.concurrency)
            cpu_used = cpu_seconds(pid) - cpu_before
            poller.phase = "after"
            stop_polling.set()
            stop_sampling.set()
        await call_2026(http, url, "tasks/cancel", {"taskId": poller.task_id}, poller.task_id)
    during = [mb for at, mb in samples if at >= flood_started]
    flood_cpu = max(0.0, cpu_used - poll_cpu * len(poller.latencies["flood"]))
    return {
        "rss_before_mb": round(rss_before, 1),
        "rss_peak_mb": round(max(during or [rss_before]), 1),
        "rss_after_mb": round(rss_mb(pid), 1),
        "flood_seconds": round(flooding["seconds"], 2),
        "flood_outcomes": dict(flooding["outcomes"]),
        "flood_calls": flooding["calls"],
        "flood_client_cpu_seconds": flooding["client_cpu_seconds"],
        "server_cpu_seconds": round(cpu_used, 2),
        "server_cpu_ms_per_poll": round(poll_cpu * 1000, 2),
        "server_cpu_ms_per_call": round(flood_cpu * 1000 / args.sessions, 2),
        "poll_errors": poller.errors,
        "idle": _stats(poller.latencies["idle"]),
        "flood": _stats(poller.latencies["flood"]),
    }


def _stats(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"polls": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "polls": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(ordered[-1], 2),
    }


def start_server(folder: Path, args: argparse.Namespace) -> tuple[str, subprocess.Popen[bytes]]:
    """A ``keel serve --app conformance`` on a free loopback port, ready; its URL."""
    port = _free_port()
    url = f"http://{HOST}:{port}/mcp"
    limits = (
        ["--max-sessions", "10000", "--session-idle-timeout", "1800"]
        if args.sdk_defaults
        else ["--max-sessions", str(args.max_sessions)]
    )
    argv = [str(KEEL), "serve", "--app", "conformance", "--host", HOST, "--port", str(port)]
    argv += ["--data-dir", str(folder / "data"), *limits, *args.serve_arg]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        anyio.run(wait_ready, url, process)
    except BaseException:
        process.kill()
        raise
    return url, process


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start keel serve (two with ``--control``: the flood hits the other), measure,
    stop them."""
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="keel-flood-bench-") as folder:
        try:
            url, polled = start_server(Path(folder) / "polled", args)
            processes.append(polled)
            flooded = url
            if args.control:
                flooded, other = start_server(Path(folder) / "flooded", args)
                processes.append(other)
            return anyio.run(measure, url, flooded, polled.pid, args)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2_000, help="initialize calls")
    parser.add_argument("--concurrency", type=int, default=50, help="calls at once")
    parser.add_argument("--idle-polls", type=int, default=300, help="polls before the flood")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="and seconds of polls before the flood: a p99 over a second of a shared "
        "machine misses the stalls that a minute of flood catches",
    )
    parser.add_argument("--max-sessions", type=int, default=1_000, help="keel serve's limit")
    parser.add_argument("--sdk-defaults", action="store_true", help="the SDK's own limits")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="another keel serve argument (repeatable): --serve-arg=--session-rate=20",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="flood another keel serve instead: what the machine's load alone does to the poller",
    )
    parser.add_argument("--out", default="bench/results/flood_bench.json")
    parser.add_argument("--flood-only", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.sessions <= MAX_CALLS or not 1 <= args.concurrency <= 500:
        parser.error(f"--sessions must be 1..{MAX_CALLS}, --concurrency 1..500")
    if args.flood_only:  # the flooding process of flood_process
        if not args.flood_only.startswith(f"http://{HOST}:"):
            parser.error("loopback only")
        print(json.dumps(anyio.run(flood, args.flood_only, args.sessions, args.concurrency)))
        return
    result = run(args)
    idle, during = result["idle"], result["flood"]
    limits = "SDK defaults (10,000; 1,800 s)" if args.sdk_defaults else f"{args.max_sessions}"
    print(f"initialize flood: {args.sessions} old-protocol sessions, {args.concurrency} at once")
    print(f"  keel serve --app conformance, max sessions {limits}")
    if args.control:
        print("  CONTROL: the flood hits another keel serve; the polled one is not flooded")
    calls = result["flood_calls"]
    print(f"  flood took {result['flood_seconds']} s: {result['flood_outcomes']}")
    print(
        f"  a flood call took {calls['p50_ms']} ms (p50), {calls['p99_ms']} ms (p99), "
        f"{calls['max_ms']} ms (max); the flooding client used "
        f"{result['flood_client_cpu_seconds']} s of CPU"
    )
    print(
        f"  server CPU in the flood: {result['server_cpu_seconds']} s; less the polls' "
        f"({result['server_cpu_ms_per_poll']} ms each when idle), "
        f"{result['server_cpu_ms_per_call']} ms per flood call"
    )
    print()
    print(f"  {'':18} {'polls':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, row in (("poll, idle", idle), ("poll, in flood", during)):
        print(
            f"  {name:18} {row['polls']:>6} {row['p50_ms']:>8} {row['p99_ms']:>8} "
            f"{row['max_ms']:>8}"
        )
    print()
    print(
        f"  server RSS: {result['rss_before_mb']} MB before, {result['rss_peak_mb']} MB peak, "
        f"{result['rss_after_mb']} MB after; poll errors: {result['poll_errors']}"
    )
    ratio = during["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else float("inf")
    checks = [
        {
            "target": f"server RSS under {RSS_TARGET_MB:g} MB through the flood",
            "measured": f"{result['rss_peak_mb']} MB peak ({args.sessions} calls)",
            "ok": result["rss_peak_mb"] < RSS_TARGET_MB,
        },
        {
            "target": f"poll p99 within {P99_FACTOR:g}x of idle",
            "measured": f"{during['p99_ms']} ms vs {idle['p99_ms']} ms ({ratio:.2f}x)",
            "ok": ratio <= P99_FACTOR,
        },
    ]
    print_targets(checks)
    out = write_results(args.out, "flood_bench", args, result=result, checks=checks)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
