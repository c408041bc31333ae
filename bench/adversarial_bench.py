"""Issue 15's adversarial tries, re-run as a hostile user would, against real processes.

Every try of the issue's first half ("Tried as a hostile user would, currently: …") is
sent again, and each row says what the issue reported then and what happens now:

* **the wire**: Incident Bridge under ``keel serve`` (127.0.0.1, a free port) on a fresh
  SQLite file and on a private schema of the PostgreSQL test server
  (``$KEEL_TEST_POSTGRES``, default 127.0.0.1:5432/test; dropped after), sent raw
  JSON-RPC over HTTP (2026-07-28, routing headers as the official client sends them;
  ``tests/fuzz/strategies.py``), so that lone surrogates, NUL and NaN reach the server
  as a hostile client writes them: unknown tool arguments, odd text in arguments,
  answers and task ids (the same answer on both stores), ``search_traces`` with
  out-of-range times, NaN and huge durations, ``Host``/``Origin`` of another site;
* **the CLI**: ``keel`` as subprocesses: odd text and deep JSON in ``keel tasks answer``
  and ``keel tasks import``, an imported ``updated_at: 1e308``, a malformed IPv6 store
  URL, a 5,000-character path, an empty or non-SQLite ``keel.db`` under ``keel tasks
  list``, ``keel serve`` and ``keel worker``, a corrupted page, a read-only data
  directory (a read-only bind mount: root writes through permissions; needs root);
* **the file**: a no-op app under ``keel serve``, driven by the official MCP client:
  ``keel.db`` copied alone after a SIGTERM holds every acknowledged task; ``keel backup``
  while tasks are being created gives a copy that passes ``keel check``.

* **the disk and the WAL**: the no-op app's store on a small filesystem of its own (a
  tmpfs mounted for the run; needs root) filled while a client creates tasks: how the
  refusals read, whether the server lives through it, and whether every acknowledged
  task completes once there is room again (none dead-lettered); and a store whose
  server was SIGKILLed after its tasks completed, its ``-wal`` (and ``-shm``) then
  deleted: what ``keel check``, ``keel tasks list`` and ``keel serve`` say, and how
  many acknowledged completions the file still holds.

Not repeated here: PostgreSQL down and back (``bench/failure_bench.py``) and the
old-protocol ``initialize`` flood (``bench/flood_bench.py``).

    uv run python bench/adversarial_bench.py             # everything: 2-4 min on a busy 2-core VM
    uv run python bench/adversarial_bench.py --no-postgres
    uv run python bench/adversarial_bench.py --only disk  # the full disk and the WAL: 1 min

Prints a table (try | issue reported | now | ok?) and writes JSON (``--out``, default
``bench/results/adversarial_bench.json``). Exit code 1 if any try fails.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psycopg
from mcp import Client
from mcp.shared.exceptions import MCPError

from _report import write_results
from keel.mcp.client import Created
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.v2025 import V2025
from keel.model import Status
from keel.store import open_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from fuzz.harness import messages_of  # noqa: E402 - the fuzz suite's answer reader
from fuzz.strategies import V2026, Target, request  # noqa: E402 - its request builder
from keel_serve import KEEL, KeelServe  # noqa: E402 - the tests' keel serve process
from postgres.pg import BASE_URL, drop_schema, new_schema, store_url  # noqa: E402
from store_files import damage, read_only_folder  # noqa: E402 - the tests' damaged files

WIRE = Target(V2026, {}, (), ())
HTTP_TIMEOUT = 30.0  # seconds one answer may take
CLI_TIMEOUT = 90.0  # seconds one keel command may take (a loaded machine: its start-up)
SERVE_TIMEOUT = 90.0  # seconds keel serve or keel worker may take to refuse a store
PARALLEL = max(2, os.cpu_count() or 1)  # keel commands at once
SETTLE = 30.0  # seconds a task may take to reach the state a try needs
STOP_TARGET = 10.0  # seconds: SIGTERM to exit (issue 15, "The file is the store")
DISK_BYTES = 8 * 1024 * 1024  # the small filesystem of the full-disk try
AFTER_ROOM = 50  # tasks created once there is room again
STORE_UNAVAILABLE = -32050  # keel.mcp.wire.STORE_UNAVAILABLE (names the store and the cause)
SURROGATE = "INC-2026-0288\ud800"
NUL = "INC-2026-0288\x00"
DEEP = "[" * 100_000 + "]" * 100_000
TOOL = "diagnose_root_cause"
SDK_REFUSALS = {-32700: "the SDK's JSON parser", -32020: "the SDK's Mcp-Name check"}
"""Refusals of the SDK's transport, before Keel sees the request."""


@dataclass
class Row:
    """One try: what the issue reported, what happened now, and whether that is right
    (None: not run on this build, or measured elsewhere)."""

    name: str
    reported: str
    now: str
    ok: bool | None


ROWS: list[Row] = []


def record(name: str, reported: str, now: str, ok: bool | None) -> None:
    ROWS.append(Row(name, reported, " ".join(now.split()), ok))
    mark = {True: "ok", False: "FAILS", None: "-"}[ok]
    print(f"  [{mark}] {name}: {ROWS[-1].now[:160]}", flush=True)


# --- the wire -----------------------------------------------------------------------


class Wire:
    """Raw JSON-RPC to one ``keel serve``: the HTTP status and the first message.
    2026-07-28 (each request on its own), or a 2025-11-25 session (:meth:`session`)."""

    def __init__(self, url: str, target: Target = WIRE) -> None:
        self.url = url
        self.http = httpx2.Client(timeout=HTTP_TIMEOUT)
        self.target = target

    def session(self) -> Wire:
        """The same server through a new 2025-11-25 session (no routing headers there)."""
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        hello = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": V2025,
                "capabilities": {"tasks": {"cancel": {}, "list": {}}},
                "clientInfo": {"name": "keel-adversarial", "version": "0"},
            },
        }
        session = self.http.post(self.url, json=hello, headers=headers).headers["mcp-session-id"]
        headers |= {"mcp-session-id": session, "MCP-Protocol-Version": V2025}
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        self.http.post(self.url, json=done, headers=headers).raise_for_status()
        return Wire(self.url, Target(V2025, {}, (), (), session=session))

    def call(
        self, method: str, params: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        probe = request(self.target, "adversarial", method, params)
        response = self.http.post(
            self.url, content=probe.body, headers={**probe.headers, **(headers or {})}
        )
        kind = response.headers.get("content-type", "")
        messages = messages_of(response.text, kind, response.status_code)
        return response.status_code, messages[0] if messages else {"text": response.text}


def said(status: int, message: dict[str, Any]) -> str:
    """An answer as a table cell: HTTP status, JSON-RPC code and message, or the tool
    result (error or not) and its text."""
    if "error" in message:
        error = message["error"]
        return f"HTTP {status} {error.get('code')} {error.get('message', '')!r}"
    result = message.get("result")
    if isinstance(result, dict) and "content" in result:
        text = " ".join(c.get("text", "") for c in result["content"] if isinstance(c, dict))
        return f"HTTP {status} result isError={result.get('isError', False)} {text[:120]!r}"
    if isinstance(result, dict):
        return f"HTTP {status} result {sorted(result)[:4]}"
    return f"HTTP {status} {str(message)[:120]!r}"


def refused(status: int, message: dict[str, Any], *words: str) -> bool:
    """A -32602 whose message names every word."""
    error = message.get("error") or {}
    text = str(error.get("message", "")) + json.dumps(error.get("data"))
    return status < 500 and error.get("code") == -32602 and all(w in text for w in words)


def tool_refused(status: int, message: dict[str, Any], *words: str) -> bool:
    """A -32602, or a tool result with isError, whose text names every word; never a
    bare "Error executing tool"."""
    if refused(status, message, *words):
        return True
    result = message.get("result") or {}
    text = " ".join(c.get("text", "") for c in result.get("content", []) if isinstance(c, dict))
    return bool(result.get("isError")) and all(w in text for w in words)


def tasks_in(location: str) -> dict[str, Any]:
    """Every task in the store, by id (read through keel.store)."""

    async def read() -> dict[str, Any]:
        store = open_store(location)
        try:
            return {t.task_id: t for t in await store.list(limit=1000)}
        finally:
            await store.close()

    return anyio.run(read)


def settle(location: str, task_id: str, status: Status) -> Any:
    deadline = time.monotonic() + SETTLE
    while True:
        task = tasks_in(location).get(task_id)
        if task is not None and task.status is status:
            return task
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} never reached {status}: {task}")
        time.sleep(0.05)  # polling the store: it offers no event across processes


def asking_incident(data: Path) -> str:
    """An incident that names no service: its diagnosis asks which one."""
    document = json.loads((data / "bridge" / "incidents.json").read_text())
    incidents = document if isinstance(document, list) else document["incidents"]
    return str(next(i["id"] for i in incidents if not i.get("service")))


def wire_tries(wire: Wire, location: str, store: str, data: Path) -> tuple[dict[str, str], str]:
    """The odd-input tries over the wire on one store; each answer, by try (for the
    comparison of the two stores), and the id of the task left waiting for input."""
    answers: dict[str, str] = {}

    def unchanged_try(
        name: str, reported: str, method: str, params: dict[str, Any], words: tuple[str, ...]
    ) -> None:
        before = tasks_in(location)
        status, message = wire.call(method, params)
        after = tasks_in(location)
        kept = set(before) == set(after)
        now = said(status, message) + (
            "" if kept else f"; {len(after) - len(before)} task(s) stored"
        )
        answers[name] = said(status, message)
        record(f"{name} ({store})", reported, now, refused(status, message, *words) and kept)

    good = {"incident_id": "INC-2026-0288"}
    unchanged_try(
        "unknown tool argument `bogus`",
        "accepted; task dead-lettered after 5 attempts (TypeError)",
        "tools/call",
        {"name": TOOL, "arguments": {**good, "bogus": 1}},
        ("bogus",),
    )
    unchanged_try(
        "lone surrogate in an argument",
        "-32603",
        "tools/call",
        {"name": TOOL, "arguments": {"incident_id": SURROGATE}},
        ("incident_id",),
    )
    unchanged_try(
        "NUL in an argument",
        "acknowledged, then dead-lettered",
        "tools/call",
        {"name": TOOL, "arguments": {"incident_id": NUL}},
        ("incident_id",),
    )
    pg_nul = "-32603 on PostgreSQL, 'unknown task' on SQLite"
    unchanged_try("NUL in a task id", pg_nul, "tasks/get", {"taskId": "a\x00b"}, ())
    # A lone surrogate in a task id never reaches Keel: on 2026-07-28 the Mcp-Name header
    # cannot carry it (the SDK refuses the mismatch, -32020); on 2025-11-25 the SDK's
    # JSON parser refuses the escape (-32700). Either is a typed refusal, store unchanged.
    old = wire.session()
    for protocol, client in [("2026-07-28", wire), ("2025-11-25", old)]:
        for name, task_id in [
            ("NUL in a task id", "a\x00b"),
            ("lone surrogate in a task id", "a\ud800b"),
        ]:
            if protocol == "2026-07-28" and "NUL" in name:
                continue  # above
            before = tasks_in(location)
            status, message = client.call("tasks/get", {"taskId": task_id})
            code = (message.get("error") or {}).get("code")
            sdk = "surrogate" in name and code in SDK_REFUSALS and status < 500
            kept = set(tasks_in(location)) == set(before)
            answers[f"{name}, {protocol}"] = said(status, message)
            now = said(status, message) + (f" ({SDK_REFUSALS[code]})" if sdk else "")
            reported = pg_nul if "NUL" in name else "-32603"
            ok = (refused(status, message) or sdk) and kept
            record(f"{name} ({store}, {protocol})", reported, now, ok)

    status, message = wire.call(
        "tools/call", {"name": TOOL, "arguments": {"incident_id": asking_incident(data)}}
    )
    task_id = message["result"]["taskId"]
    waiting = settle(location, task_id, Status.INPUT_REQUIRED)
    key = next(iter(waiting.pending_input))
    for name, reported, text in [
        ("lone surrogate in an answer", "-32603", "web\udfff"),
        ("NUL in an answer", "acknowledged or -32603", "web\x00"),
    ]:
        answer = {key: {"action": "accept", "content": {key: text}}}
        status, message = wire.call("tasks/update", {"taskId": task_id, "inputResponses": answer})
        task = tasks_in(location)[task_id]
        kept = task.status is Status.INPUT_REQUIRED and not task.input_responses
        answers[name] = said(status, message).replace(task_id, "<id>")
        now = answers[name] + ("" if kept else f"; task now {task.status}")
        record(f"{name} ({store})", reported, now, refused(status, message, key) and kept)
    return answers, task_id


def search_tries(wire: Wire) -> None:
    reported = 'a bare "Error executing tool"'
    for name, args, words in [
        ("search_traces: start in year 1000", {"start": "1000-01-01T00:00:00Z"}, ("start",)),
        ("search_traces: end in year 9999", {"end": "9999-12-31T23:59:59Z"}, ("end",)),
        (
            "search_traces: min_duration_ms NaN",
            {"min_duration_ms": float("nan")},
            ("min_duration_ms",),
        ),
        ("search_traces: min_duration_ms 1e308", {"min_duration_ms": 1e308}, ("min_duration_ms",)),
        ("search_traces: limit 10**30", {"limit": 10**30}, ("limit",)),
    ]:
        status, message = wire.call("tools/call", {"name": "search_traces", "arguments": args})
        text = said(status, message)
        bare = text.rstrip("'\" ").endswith(("Error executing tool", "search_traces"))
        record(name, reported, text, tool_refused(status, message, *words) and not bare)


def origin_tries(wire: Wire, port: int) -> None:
    reported = "served, nothing warns (with --host 0.0.0.0)"
    if importlib.util.find_spec("keel.mcp.access") is None:
        record(
            "Host: evil.example / Origin: http://evil.example", reported, "not on this build", None
        )
        return
    status, _ = wire.call("tools/list", {}, {"Host": "evil.example"})
    record("Host: evil.example (bound to 127.0.0.1)", reported, f"HTTP {status}", status == 421)
    status, _ = wire.call("tools/list", {}, {"Origin": "http://evil.example"})
    record(
        "Origin: http://evil.example (bound to 127.0.0.1)",
        reported,
        f"HTTP {status}",
        status == 403,
    )
    status, _ = wire.call("tools/list", {}, {"Host": f"127.0.0.1:{port}"})
    record("Host: 127.0.0.1:PORT (control)", "served", f"HTTP {status}", status == 200)


def compare_stores(sqlite: dict[str, str], postgres: dict[str, str]) -> None:
    """The same answer for the same odd input on both stores (task ids aside)."""
    for name, answer in sqlite.items():
        other = postgres.get(name)
        same = other == answer
        now = f"the same: {answer}" if same else f"SQLite {answer} / PostgreSQL {other}"
        reported = (
            "-32603 on PostgreSQL, 'unknown task' on SQLite" if "NUL in a task" in name else "-"
        )
        record(f"{name}: SQLite vs PostgreSQL", reported, now, same)


# --- the CLI ------------------------------------------------------------------------


@dataclass
class Run:
    code: int | None
    out: str
    err: str
    seconds: float


def keel(*args: str, cwd: Path, stdin: str | None = None, timeout: float = CLI_TIMEOUT) -> Run:
    """``keel ARGS`` as a subprocess (KEEL_STORE unset), bounded in time."""
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [str(KEEL), *args],
            cwd=cwd,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return Run(None, out, f"(still running after {timeout:g} s)", timeout)
    return Run(done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


def one_line(run: Run, *words: str) -> tuple[bool, str]:
    """Exit 1 with one ``keel: error:`` line, last on stderr, naming every word; no
    traceback. What it printed, as a table cell."""
    lines = [line for line in run.err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("keel: error:")]
    traceback = "Traceback" in run.err + run.out
    last = lines[-1] if lines else "(nothing on stderr)"
    ok = run.code == 1 and len(errors) == 1 and last == errors[0] and not traceback
    ok = ok and all(w.lower() in last.lower() for w in words)
    if traceback:
        return False, f"exit {run.code}, a traceback of {len(lines)} lines: {last[:140]}"
    return ok, f"exit {run.code} in {run.seconds:.1f} s, {len(lines)} line(s): {last[:180]}"


Job = tuple[tuple[str, ...], dict[str, Any]]
"""A keel command: its arguments and :func:`keel`'s keywords."""


def parallel(jobs: dict[str, Job]) -> dict[str, Run]:
    """Every command at once (each is mostly Python's start-up), by name."""
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = {name: pool.submit(keel, *args, **kw) for name, (args, kw) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def cli_tries(folder: Path, waiting: dict[str, tuple[str, str]]) -> None:
    """Odd input through the CLI. ``waiting``: store label -> (location, the id of a task
    there that waits for input)."""
    surrogate_json = '{"service": "web\\udfff"}'  # JSON's escape: a lone surrogate
    db = waiting["SQLite"][0]
    first = folder / "teaching-surrogate.json"
    first.write_text(
        json.dumps({"t1": {"task_id": "t1", "status": "completed", "result": {"x": "a\ud800"}}})
    )
    second = folder / "teaching-time.json"
    second.write_text(
        json.dumps(
            {"t2": {"task_id": "t2", "status": "completed", "result": 1, "updated_at": 1e308}}
        )
    )
    here = {"cwd": folder}
    jobs: dict[str, Job] = {
        f"answer {label}": (
            ("tasks", "answer", task_id, "--store", location, "--json", surrogate_json),
            here,
        )
        for label, (location, task_id) in waiting.items()
    }
    sqlite_waiting = waiting["SQLite"][1]
    jobs |= {
        "deep": (
            ("tasks", "answer", sqlite_waiting, "--store", db, "--json", "-"),
            {**here, "stdin": DEEP},
        ),
        "import surrogate": (("tasks", "import", str(first), "--store", db), here),
        "import time": (("tasks", "import", str(second), "--store", db), here),
        "ipv6": (("tasks", "list", "--store", "postgresql://postgres@[::1/test"), here),
        "long": (("tasks", "list", "--store", str(folder / ("x" * 5_000) / "keel.db")), here),
        "bind": (
            (
                "serve",
                "--host",
                "0.0.0.0",
                "--check",
                "--app",
                "conformance",
                "--data-dir",
                str(folder / "open"),
            ),
            here,
        ),
    }
    before = sorted(tasks_in(db))
    runs = parallel(jobs)
    listed = keel("tasks", "list", "--store", db, cwd=folder)
    kept = sorted(tasks_in(db)) == before
    for label in waiting:
        ok, now = one_line(runs[f"answer {label}"], "surrogate")
        record(f"keel tasks answer: lone surrogate ({label})", "75-line traceback", now, ok)
    record(
        "keel tasks answer: JSON nested 100,000 deep",
        "traceback",
        *reversed(one_line(runs["deep"])),
    )
    ok, now = one_line(runs["import surrogate"], "surrogate")
    record("keel tasks import: lone surrogate", "75-line traceback", now, ok and kept)
    ok, now = one_line(runs["import time"], "updated_at")
    record(
        "keel tasks import: updated_at 1e308, then keel tasks list",
        "imported; keel tasks list fails for the whole store",
        f"{now}; then keel tasks list exit {listed.code}",
        ok and kept and listed.code == 0,
    )
    record("store URL with a malformed IPv6 host", "traceback", *reversed(one_line(runs["ipv6"])))
    record("a 5,000-character store path", "traceback", *reversed(one_line(runs["long"])))
    record(
        "keel serve --host 0.0.0.0 without --auth (--check: never binds)",
        "served, nothing warns",
        *reversed(one_line(runs["bind"], "--insecure-no-auth")),
    )


def opening_jobs(path: Path, data: Path) -> dict[str, Job]:
    """The three commands that open a store, on ``path`` (in the folder ``data``)."""
    app = "apps.noop_app:app"
    bench = {"cwd": HERE, "timeout": SERVE_TIMEOUT}
    return {
        "keel tasks list": (("tasks", "list", "--store", str(path)), bench),
        "keel serve": (("serve", "--app", app, "--data-dir", str(data), "--port", "0"), bench),
        "keel worker": (("worker", "--app", app, "--store", str(path)), bench),
    }


def not_a_store_tries(folder: Path) -> None:
    """An empty and a non-SQLite keel.db under the three commands that open a store."""
    cases = {"zero-byte": b"", "non-SQLite": b"not a database, notes\n" * 300}
    jobs: dict[str, Job] = {}
    for label, content in cases.items():
        data = folder / f"bad-{label}"
        data.mkdir()
        (data / "keel.db").write_bytes(content)
        jobs |= {f"{label}|{c}": job for c, job in opening_jobs(data / "keel.db", data).items()}
    runs = parallel(jobs)
    for key, run in runs.items():
        label, command = key.split("|")
        path = folder / f"bad-{label}" / "keel.db"
        ok, now = one_line(run, str(path))
        reported = "silently a new, empty store" if label == "zero-byte" else "-32603 to clients"
        record(
            f"{label} keel.db: {command}", reported, now, ok and path.read_bytes() == cases[label]
        )


def damaged_tries(folder: Path, good: Path) -> None:
    """A corrupted page (bytes flipped in a copy) and a read-only data directory."""
    data = folder / "corrupt"
    data.mkdir()
    copy = data / "keel.db"
    shutil.copyfile(good, copy)
    damage(copy)
    jobs = opening_jobs(copy, data)
    del jobs["keel tasks list"]  # reads what it can: only serve and worker quick-check
    jobs["keel check"] = (("check", "--store", str(copy)), {"cwd": HERE})
    source = folder / "read-only"
    source.mkdir()
    shutil.copyfile(good, source / "keel.db")
    shutil.copyfile(good.parent / "request-state.key", source / "request-state.key")
    task_id = sqlite_ids(good)[0]
    with read_only_folder(source) as ro:
        if ro is not None:
            jobs["ro cancel"] = (
                ("tasks", "cancel", task_id, "--store", str(ro / "keel.db")),
                {"cwd": HERE},
            )
            jobs["ro serve"] = (
                ("serve", "--app", "apps.noop_app:app", "--data-dir", str(ro), "--port", "0"),
                {"cwd": HERE, "timeout": SERVE_TIMEOUT},
            )
        runs = parallel(jobs)
    reported = "-32603 with HTTP 200; the server starts on it"
    for command in ("keel check", "keel serve", "keel worker"):
        record(
            f"corrupted page: {command}", reported, *reversed(one_line(runs[command], str(copy)))
        )
    if ro is None:
        record(
            "read-only data directory",
            "-32603 with HTTP 200",
            "not run: no read-only folder here",
            None,
        )
        return
    for key, command in [("ro cancel", "keel tasks cancel"), ("ro serve", "keel serve")]:
        record(
            f"read-only data directory: {command}",
            "-32603 with HTTP 200",
            *reversed(one_line(runs[key], "read-only")),
        )


def sqlite_ids(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return [row[0] for row in conn.execute("SELECT task_id FROM tasks")]


def sqlite_statuses(db: Path) -> dict[str, int]:
    """Tasks per status in ``db`` opened alone (no -wal beside it: what a copy holds)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())


# --- the file -----------------------------------------------------------------------


async def create_tasks(url: str, count: int) -> list[str]:
    async with Client(url, extensions=[Tasks()]) as client:
        ids = []
        for _ in range(count):
            created = await client.session.call_tool("noop", {}, allow_claimed=True)
            assert isinstance(created, Created), created
            ids.append(str(created.task_id))
        return ids


async def create_until(url: str, stop: threading.Event, acknowledged: list[str]) -> None:
    async with Client(url, extensions=[Tasks()]) as client:
        while not stop.is_set():
            created = await client.session.call_tool("noop", {}, allow_claimed=True)
            assert isinstance(created, Created), created
            acknowledged.append(str(created.task_id))


def noop_server(data: Path) -> KeelServe:
    args = ["--app", "apps.noop_app:app", "--data-dir", str(data)]
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    return KeelServe(args, cwd=HERE, env=env, log=data.parent / f"{data.name}-serve.log")


def file_tries(folder: Path, tasks: int) -> Path:
    """SIGTERM, then keel.db alone; keel backup and keel check while serving. The store
    (for the damaged-file tries)."""
    data = folder / "served"
    data.mkdir()
    db = data / "keel.db"
    server = noop_server(data)
    server.start()
    anyio.run(server.ready)
    ids = anyio.run(create_tasks, server.url, tasks)
    started = time.perf_counter()
    code = server.stop()
    seconds = time.perf_counter() - started
    alone = folder / "copied-alone"
    alone.mkdir()
    shutil.copyfile(db, alone / "keel.db")
    statuses = sqlite_statuses(alone / "keel.db")
    held = sum(statuses.values())
    wal = Path(f"{db}-wal")
    now = (
        f"exit {code} in {seconds:.2f} s; keel.db copied alone holds {held}/{len(ids)} tasks "
        f"{statuses}; -wal {wal.stat().st_size if wal.exists() else 'gone'}"
    )
    ok = code == 0 and seconds <= STOP_TARGET and held == len(ids)
    record(
        "SIGTERM keel serve, then copy keel.db alone",
        "keel.db an empty 4 KB file, every row in -wal",
        now,
        ok,
    )

    server.start()
    anyio.run(server.ready)
    stop, acknowledged = threading.Event(), []
    creator = threading.Thread(
        target=anyio.run, args=(create_until, server.url, stop, acknowledged)
    )
    creator.start()
    try:
        deadline = time.monotonic() + SETTLE
        while len(acknowledged) < 50 and creator.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)  # until tasks are being created
        before = len(ids) + len(acknowledged)
        dest = folder / "backup.db"
        backup = keel("backup", str(dest), "--store", str(db), cwd=HERE)
        after = len(ids) + len(acknowledged)
        check = keel("check", "--store", str(db), cwd=HERE)
    finally:
        stop.set()
        creator.join(HTTP_TIMEOUT)
    copied = sum(sqlite_statuses(dest).values()) if dest.exists() else 0
    dest_check = keel("check", "--store", str(dest), cwd=HERE)
    now = (
        f"exit {backup.code} in {backup.seconds:.2f} s; the copy holds {copied} tasks "
        f"({before} acknowledged before, {after} after); keel check of it: exit {dest_check.code}"
    )
    ok = backup.code == 0 and dest_check.code == 0 and before <= copied <= after
    record(
        "keel backup DEST while tasks are created",
        "(no such command; cp keel.db copied nothing)",
        now,
        ok,
    )
    first = check.out.strip().splitlines()[:1]
    record(
        "keel check while serving",
        "(no such command)",
        f"exit {check.code}: {' '.join(first)}",
        check.code == 0,
    )
    server.stop()
    return db


# --- the disk and the WAL -------------------------------------------------------------


@contextlib.contextmanager
def small_disk(folder: Path) -> Any:
    """A tmpfs of :data:`DISK_BYTES` mounted on ``folder`` (None where it cannot be:
    not root, or not allowed); unmounted after."""
    folder.mkdir()
    mount = shutil.which("mount")
    if os.geteuid() != 0 or mount is None:
        yield None
        return
    argv = [mount, "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)]
    if subprocess.run(argv, check=False, capture_output=True).returncode:
        yield None
        return
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem has no room left; the bytes written."""
    written = 0
    with path.open("wb", buffering=0) as file:
        try:
            while True:
                written += file.write(b"\0" * 65536)
        except OSError:  # ENOSPC: full (a last partial chunk may have gone in)
            pass
    return written


@dataclass
class Creates:
    acknowledged: list[str]
    refusals: list[MCPError]
    seconds: list[float]
    """How long each refused create took to be answered."""
    room: int | None = None
    """How many were acknowledged when room was made again."""


async def create_until_stopped(url: str, stop: threading.Event, done: Creates) -> None:
    """Create no-op tasks one after another until ``stop``, refusals kept in ``done``."""
    async with Client(url, extensions=[Tasks()]) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                created = await client.session.call_tool("noop", {}, allow_claimed=True)
            except MCPError as exc:
                done.refusals.append(exc)
                done.seconds.append(time.perf_counter() - started)
                time.sleep(0.01)  # noqa: ASYNC251 - a client retrying, as a real one would
                continue
            assert isinstance(created, Created), created
            done.acknowledged.append(str(created.task_id))


def wait_for(condition: Any, within: float = SETTLE) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # the creating thread offers no event
    return True


def settled(db: Path, count: int) -> dict[str, int]:
    """Tasks per status in ``db`` once none of ``count`` is live any more (or after
    twice :data:`SETTLE` seconds)."""
    deadline = time.monotonic() + 2 * SETTLE
    while True:
        statuses = sqlite_statuses(db)
        finished = sum(statuses.get(s, 0) for s in ("completed", "failed", "cancelled"))
        if finished >= count or time.monotonic() > deadline:
            return statuses
        time.sleep(0.1)  # polling the store: it offers no event across processes


def through_full_disk(server: KeelServe, disk: Path) -> tuple[Creates, int, bool]:
    """A client creates tasks while the disk fills (a filler file), is refused a few
    times, then room is made and it goes on; what it saw, the filler's size, and
    whether the server was alive when room was made."""
    done, stop = Creates([], [], []), threading.Event()
    creator = threading.Thread(
        target=anyio.run, args=(create_until_stopped, server.url, stop, done)
    )
    creator.start()
    try:
        wait_for(lambda: len(done.acknowledged) >= 20)
        filler = disk / "filler"
        size = fill(filler)
        wait_for(lambda: len(done.refusals) >= 5)
        alive = server.alive
        done.room = len(done.acknowledged)
        filler.unlink()
        wait_for(lambda: len(done.acknowledged) >= (done.room or 0) + AFTER_ROOM)
    finally:
        stop.set()
        creator.join(HTTP_TIMEOUT)
    return done, size, alive


def full_disk_try(folder: Path) -> None:
    """The store's filesystem fills while a client creates tasks, then has room again."""
    reported = (
        "-32603 with HTTP 200; after the disk grew, tasks whose outcome could not be "
        "written were dead-lettered as 'stopped renewing its lease'"
    )
    name = "full disk: a client creates tasks while it fills, then room is made"
    with small_disk(folder / "small-disk") as disk:
        if disk is None:
            record(name, reported, "not run: no tmpfs can be mounted here (needs root)", None)
            return
        data = disk / "data"
        data.mkdir()
        db = data / "keel.db"
        server = noop_server(data)
        server.start()
        try:
            anyio.run(server.ready)
            done, size, alive = through_full_disk(server, disk)
            statuses = settled(db, len(done.acknowledged))
        finally:
            code = server.stop()
    kinds = {(e.code, e.message.split(": ", 1)[-1][:60]) for e in done.refusals}
    named = bool(done.refusals) and all(
        e.code == STORE_UNAVAILABLE
        and "disk is full" in e.message
        and isinstance(e.error.data, dict)
        and "retryAfterMs" in e.error.data
        for e in done.refusals
    )
    first = done.refusals[0] if done.refusals else None
    said_then = (
        f"{len(done.refusals)} creates refused, the first {first.code} {first.message!r} "
        f"data={first.error.data} in {done.seconds[0]:.2f} s (kinds: {sorted(kinds)})"
        if first is not None
        else "no create refused"
    )
    acknowledged = len(done.acknowledged)
    completed = statuses.get("completed", 0)
    now = (
        f"filler {size // 1024} KiB; {said_then}; server alive: {alive}; "
        f"{acknowledged - (done.room or 0)} creates acknowledged once room was made; "
        f"{acknowledged} acknowledged in all, the store holds {statuses}; SIGTERM exit {code}"
    )
    ok = named and alive and completed == acknowledged == sum(statuses.values()) and code == 0
    record(name, reported, now, ok)


def deleted_wal_try(folder: Path, tasks: int) -> None:
    """SIGKILL a server whose tasks all completed, delete keel.db-wal and -shm, open the
    store again."""
    data = folder / "wal-deleted"
    data.mkdir()
    db = data / "keel.db"
    server = noop_server(data)
    server.start()
    try:
        anyio.run(server.ready)
        ids = anyio.run(create_tasks, server.url, tasks)
        before = settled(db, len(ids))
    finally:
        server.kill()
    wal = wal_bytes(db)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    file_alone = sqlite_statuses(db)
    runs = parallel(
        {
            "check": (("check", "--store", str(db)), {"cwd": HERE}),
            "list": (("tasks", "list", "--store", str(db), "--limit", "1"), {"cwd": HERE}),
        }
    )
    server.start()
    try:
        anyio.run(server.ready)
        serve = "keel serve started and served"
    except AssertionError as exc:
        serve = f"keel serve refused: {str(exc).splitlines()[-1][:160]}"
    finally:
        server.stop()
    after = sqlite_statuses(db)
    lost = before.get("completed", 0) - after.get("completed", 0)
    gone = len(ids) - sum(after.values())
    refused_all = all(run.code == 1 for run in runs.values()) and "refused" in serve
    now = (
        f"{len(ids)} acknowledged, {before.get('completed', 0)} completed before the SIGKILL; "
        f"-wal was {wal} bytes; keel.db alone then held {file_alone}; keel check: exit "
        f"{runs['check'].code} ({last_line(runs['check'])}); keel tasks list: exit "
        f"{runs['list'].code} ({last_line(runs['list'])}); {serve}; the store now holds "
        f"{after}: {lost} acknowledged completions lost ({gone} acknowledged tasks gone "
        "altogether)" + (", silently" if lost > 0 and not refused_all else "")
    )
    record(
        "WAL deleted after a crash (SIGKILL), then the store opened",
        "137 acknowledged completions silently rolled back",
        now,
        lost == 0 or refused_all,
    )


def wal_bytes(db: Path) -> int | None:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else None


def last_line(run: Run) -> str:
    lines = [line for line in (run.err or run.out).splitlines() if line.strip()]
    return lines[-1][:160] if lines else "nothing printed"


# --- the run ------------------------------------------------------------------------


def bridge_server(data: Path, store: str, log: Path) -> KeelServe:
    args = ["--data-dir", str(data), "--store", store, "--pace", "fast"]
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    return KeelServe(args, cwd=data.parent, env=env, log=log)


def postgres_reachable() -> str | None:
    try:
        with psycopg.connect(BASE_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return " ".join(str(exc).split())
    return None


def run_disk(tasks: int) -> None:
    """Only the tries of the disk and the WAL (``--only disk``)."""
    with tempfile.TemporaryDirectory(prefix="keel-adversarial-") as name:
        full_disk_try(Path(name))
        deleted_wal_try(Path(name), tasks)


def run(postgres: bool, tasks: int) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="keel-adversarial-") as name,
        contextlib.ExitStack() as stack,
    ):
        folder = Path(name)
        data = folder / "bridge-data"
        db = data / "keel.db"
        print("Incident Bridge on SQLite (its sample data generated now) …", flush=True)
        sqlite_server = bridge_server(data, str(db), folder / "bridge-sqlite.log")
        sqlite_server.start()
        stack.callback(sqlite_server.stop)
        anyio.run(sqlite_server.ready, 180.0)
        why = postgres_reachable() if postgres else "--no-postgres"
        servers = {"SQLite": (sqlite_server, str(db))}
        if why is None:
            schema = new_schema()
            stack.callback(drop_schema, schema)
            pg_server = bridge_server(data, store_url(schema), folder / "bridge-postgres.log")
            pg_server.start()
            stack.callback(pg_server.stop)
            anyio.run(pg_server.ready, 180.0)
            servers["PostgreSQL"] = (pg_server, store_url(schema))
        answers, waiting = {}, {}
        for label, (server, location) in servers.items():
            answers[label], task_id = wire_tries(Wire(server.url), location, label, data)
            waiting[label] = (location, task_id)
        if "PostgreSQL" in answers:
            compare_stores(answers["SQLite"], answers["PostgreSQL"])
        else:
            record("odd input on PostgreSQL", "-32603", f"not run: {why}", None)
        search_tries(Wire(sqlite_server.url))
        origin_tries(Wire(sqlite_server.url), sqlite_server.port)
        cli_tries(folder, waiting)
        stack.close()  # the Bridge servers stopped, the schema dropped
        not_a_store_tries(folder)
        good = file_tries(folder, tasks)
        damaged_tries(folder, good)
        full_disk_try(folder)
        deleted_wal_try(folder, tasks)
    record(
        "PostgreSQL down: tools/call, tasks/get",
        "307 s and 584 s, -32603",
        "see bench/failure_bench.py",
        None,
    )
    record(
        "2025-11-25 initialize flood",
        "89 -> 462 MB, clients locked out 30 min",
        "see bench/flood_bench.py",
        None,
    )


def table() -> str:
    lines = ["| try | issue reported | now | ok? |", "| --- | --- | --- | --- |"]
    for row in ROWS:
        mark = {True: "ok", False: "**fails**", None: "-"}[row.ok]
        now = row.now.replace("|", "\\|")
        lines.append(f"| {row.name} | {row.reported} | {now} | {mark} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-postgres", dest="postgres", action="store_false", help="SQLite only")
    parser.add_argument("--tasks", type=int, default=200, help="tasks created before the SIGTERM")
    parser.add_argument(
        "--only", choices=["all", "disk"], default="all", help="disk: the full disk and the WAL"
    )
    parser.add_argument("--out", default="bench/results/adversarial_bench.json")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    print(f"load average at the start: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min)")
    if args.only == "disk":
        run_disk(args.tasks)
    else:
        run(args.postgres, args.tasks)
    seconds = time.perf_counter() - started
    print()
    print(table())
    regressed = [row.name for row in ROWS if row.ok is False]
    print(
        f"\n{len(ROWS)} tries in {seconds:.0f} s: {sum(r.ok is True for r in ROWS)} ok, "
        f"{len(regressed)} failing, {sum(r.ok is None for r in ROWS)} not run here"
    )
    out = write_results(
        args.out,
        "adversarial_bench",
        args,
        seconds=seconds,
        load_average=load,
        tries=[asdict(row) for row in ROWS],
        regressed=regressed,
    )
    print(f"wrote {out}")
    sys.exit(1 if regressed else 0)


if __name__ == "__main__":
    main()
