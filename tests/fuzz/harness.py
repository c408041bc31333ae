"""The fuzz harness: a real ``keel serve``, seeded tasks, one probe at a time, checked.

:func:`fuzz_server` starts ``keel serve`` (the conformance app or Incident Bridge) on a
fresh SQLite file or PostgreSQL schema, and :class:`Harness` aims the strategies of
:mod:`fuzz.strategies` at it through one protocol. :meth:`Harness.check` sends one probe
as raw HTTP and returns what went wrong (nothing, for a good answer):

* an HTTP 5xx, a timeout or a dropped connection;
* a JSON-RPC ``-32603`` anywhere in the answer;
* an answer that is not JSON-RPC (a 4xx that the SDK's transport gives without a
  JSON-RPC body is fine; a 2xx must be a JSON-RPC answer, or 202 with no body);
* a refusal (a 4xx, or a JSON-RPC error that refuses the request) after which the store
  is not as it was: a task created or gone, or a task that was at rest (finished, or
  waiting for input) changed. Tasks that run may move on by themselves meanwhile.

The store is read through ``keel.store`` (``list``), never through SQL. Tasks the probes
created are cancelled through the wire (``tasks/cancel``) after each probe, so that the
server's workers stay free; a seeded waiting task that a probe answered or cancelled is
replaced by a new one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx2
from hypothesis import HealthCheck, Phase, given, settings

from fuzz.strategies import V2026, Probe, Target, Waiting, probes, request
from keel.mcp.v2025 import V2025
from keel.model import Status, Task
from keel.store import open_store
from keel_serve import KeelServe
from postgres.pg import drop_schema, new_schema, require_postgres, store_url

__all__ = [
    "FUZZ",
    "REFUSALS",
    "Harness",
    "Outcome",
    "Seeds",
    "Served",
    "drive",
    "fuzz_server",
    "messages_of",
    "not_json_rpc",
    "store_changes",
]

REFUSALS = frozenset({-32700, -32600, -32601, -32602, -32020, -32022})
"""JSON-RPC codes that refuse a request (parse, envelope, method, params, headers,
version): after one of these the store must be as it was."""
INTERNAL = -32603
TIMEOUT = 30.0  # seconds one answer may take (store outages are not fuzzed here)
SETTLE = 20.0  # seconds a seeded task may take to reach the state it is seeded in
START = 120.0  # seconds keel serve may take to start (the Bridge indexes its sample data)
FUZZ = settings(
    derandomize=True,  # the same probes every run
    database=None,
    deadline=None,  # a probe's time is the server's, not Hypothesis's to judge
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=False,
    # No shrinking: each step of it is another request to the server, and a failure
    # already names its probe in full (Probe.describe).
    phases=(Phase.explicit, Phase.generate),
    report_multiple_bugs=False,
)
"""How every fuzz run draws (the tests and bench/fuzz_bench.py)."""
AT_REST = frozenset({Status.INPUT_REQUIRED, Status.COMPLETED, Status.FAILED, Status.CANCELLED})


@dataclass(frozen=True)
class Served:
    """A running ``keel serve``: its URL, app, store location and data folder."""

    url: str
    app: str
    store: str
    folder: Path


@contextmanager
def fuzz_server(app: str, store: str, folder: Path) -> Iterator[Served]:
    """``keel serve`` of ``app`` (``conformance`` or ``bridge``) on a new ``store``
    (``sqlite`` or ``postgres``) in ``folder``, stopped (and its schema dropped) after."""
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        if store == "postgres":
            require_postgres()
            schema = new_schema()
            stack.callback(drop_schema, schema)
            location = store_url(schema)
        else:
            location = str(folder / "keel.db")
        args = ["--store", location, "--data-dir", str(folder / "data")]
        args += ["--app", "conformance"] if app == "conformance" else ["--pace", "fast"]
        server = KeelServe(
            args, cwd=folder, env={**os.environ, "KEEL_STORE": ""}, log=folder / "serve.log"
        )
        server.start()
        stack.callback(server.stop)
        anyio.run(server.ready, START)
        yield Served(server.url, app, location, folder)


@dataclass
class Outcome:
    """What one probe got: HTTP status, JSON-RPC code (None for a result or no body),
    whether it was a refusal, and the problems found (empty: a good answer)."""

    kind: str
    method: str | None
    status: int
    code: int | None
    refused: bool
    problems: list[str] = field(default_factory=list)
    json_rpc: bool = False  # the body held a JSON-RPC message

    @property
    def answer(self) -> str:
        """How the bench tables name it: ``HTTP 400 -32602``, ``HTTP 200 result``, ``HTTP
        202 no JSON-RPC`` …"""
        if not self.status:
            return "no answer"
        if not self.json_rpc:
            return f"HTTP {self.status} no JSON-RPC"
        return f"HTTP {self.status} {'result' if self.code is None else self.code}"


def _rest(task: Task) -> tuple[Any, ...]:
    """What a task at rest keeps (lease renewals, which move updated_at, left out)."""
    return (
        task.status,
        task.owner,
        task.name,
        task.arguments,
        task.status_message,
        dict(task.input_requests),
        dict(task.input_responses),
        task.result,
        task.error,
        task.attempt,
        task.fence,
        task.ttl,
    )


@dataclass
class Seeds:
    """How the harness makes the tasks it aims at: tools/call requests (2026-07-28, the
    extension declared) and the status each settles in."""

    waiting: list[tuple[str, dict[str, Any]]]
    """Calls whose task waits for input (each kept waiting: replaced once answered)."""
    finished: list[tuple[str, dict[str, Any], bool]]
    """Calls whose task finishes (``True``: cancelled by the harness once created)."""


SEEDS = {
    "conformance": Seeds(
        waiting=[("confirm_delete", {"filename": "seed.txt"}), ("multi_input", {})],
        finished=[
            ("slow_compute", {"seconds": 0, "label": "done"}, False),
            ("slow_compute", {"seconds": 3600, "label": "stop"}, True),
        ],
    ),
    "bridge": Seeds(waiting=[], finished=[]),  # filled from the Bridge's own incidents
}
TASK_TOOLS = {
    "conformance": frozenset(
        {
            "slow_compute",
            "failing_job",
            "protocol_error_job",
            "confirm_delete",
            "multi_input",
            "test_tool_with_task",
        }
    ),
    "bridge": frozenset({"diagnose_root_cause"}),
}
SKIP_TOOLS = {
    # Its purpose is to answer -32603 (the conformance suite's "protocol error" task).
    "conformance": frozenset({"protocol_error_job"}),
    "bridge": frozenset(),
}


def bridge_seeds(folder: Path) -> Seeds:
    """The Bridge's seeds: an incident that names no service asks which one; one that
    names its service is diagnosed; a third is cancelled."""
    document = json.loads((folder / "data" / "bridge" / "incidents.json").read_text())
    incidents = document if isinstance(document, list) else document["incidents"]
    asks = next(i["id"] for i in incidents if not i.get("service"))
    named = next(i for i in incidents if i.get("service"))
    return Seeds(
        waiting=[("diagnose_root_cause", {"incident_id": asks})],
        finished=[
            ("diagnose_root_cause", {"incident_id": named["id"]}, False),
            ("diagnose_root_cause", {"incident_id": asks}, True),
        ],
    )


class Harness(AbstractContextManager["Harness"]):
    """Probes one served app through one protocol (see the module docstring)."""

    def __init__(self, served: Served, protocol: str) -> None:
        self.served = served
        self.protocol = protocol
        self._stack = ExitStack()
        self.http = self._stack.enter_context(httpx2.Client(timeout=TIMEOUT))
        self.portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.store = open_store(served.store)
        self._stack.callback(self.portal.call, self.store.close)
        self.seeds = bridge_seeds(served.folder) if served.app == "bridge" else SEEDS[served.app]
        self.waiting: list[tuple[Waiting, tuple[str, dict[str, Any]]]] = []
        self.finished: list[str] = []
        try:
            self.target = self._target()
        except BaseException:
            self._stack.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # --- the target -------------------------------------------------------------

    def _target(self) -> Target:
        tools = {t["name"]: t.get("inputSchema", {}) for t in self._rpc("tools/list", {})["tools"]}
        for seed in self.seeds.waiting:
            self.waiting.append((self._seed_waiting(*seed), seed))
        for name, args, cancel in self.seeds.finished:
            task_id = self._create(name, args)
            if cancel:
                self._rpc("tasks/cancel", {"taskId": task_id})
            self._settle(task_id, lambda t: t.status.terminal)
            self.finished.append(task_id)
        session = self._initialize() if self.protocol == V2025 else None
        return Target(
            protocol=self.protocol,
            tools=tools,
            waiting=tuple(w for w, _ in self.waiting),
            finished=tuple(self.finished),
            session=session,
            task_tools=TASK_TOOLS[self.served.app] & set(tools),
            skip_tools=SKIP_TOOLS[self.served.app],
        )

    def _rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A well-formed request of the harness's own (2026-07-28, extension declared)."""
        target = Target(V2026, {}, (), ())
        probe = request(target, "seed", method, params)
        response = self.http.post(self.served.url, content=probe.body, headers=probe.headers)
        body = json.loads(response.text)
        assert "result" in body, f"{method} {params}: {body}"
        result: dict[str, Any] = body["result"]
        return result

    def _create(self, name: str, args: dict[str, Any]) -> str:
        task_id: str = self._rpc("tools/call", {"name": name, "arguments": args})["taskId"]
        return task_id

    def _settle(self, task_id: str, done: Callable[[Task], bool]) -> Task:
        """Poll the store until the task satisfies ``done`` (bounded)."""
        deadline = time.monotonic() + SETTLE
        while True:
            task = self.portal.call(self.store.get, task_id)
            if done(task):
                return task
            assert time.monotonic() < deadline, f"task {task_id} never settled: {task}"
            time.sleep(0.02)  # polling the store: it offers no event across processes

    def _seed_waiting(self, name: str, args: dict[str, Any]) -> Waiting:
        task_id = self._create(name, args)
        task = self._settle(task_id, lambda t: t.status is Status.INPUT_REQUIRED)
        return Waiting(task_id, {key: req.schema for key, req in task.pending_input.items()})

    def _initialize(self) -> str:
        """A 2025-11-25 session (no elicitation capability: nothing would answer it)."""
        message = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": V2025,
                "capabilities": {"tasks": {"cancel": {}, "list": {}}},
                "clientInfo": {"name": "keel-fuzz", "version": "0"},
            },
        }
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        response = self.http.post(self.served.url, json=message, headers=headers)
        session = response.headers["mcp-session-id"]
        headers |= {"mcp-session-id": session, "MCP-Protocol-Version": V2025}
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert self.http.post(self.served.url, json=done, headers=headers).status_code == 202
        return session

    # --- one probe --------------------------------------------------------------

    def snapshot(self) -> dict[str, Task]:
        """Every task in the store, by id (read through keel.store)."""
        tasks: dict[str, Task] = {}
        after: str | None = None
        while True:
            page = self.portal.call(functools.partial(self.store.list, limit=500, after=after))
            tasks |= {t.task_id: t for t in page}
            if len(page) < 500:
                return tasks
            after = page[-1].task_id

    def check(self, probe: Probe) -> Outcome:
        """Send ``probe``; the outcome with every problem found (see the module doc)."""
        before = self.snapshot()
        outcome = self._send(probe)
        after = self.snapshot()
        if outcome.refused:
            outcome.problems += store_changes(before, after)
        self._tidy(before, after)
        return outcome

    def _send(self, probe: Probe) -> Outcome:
        try:
            response = self.http.post(self.served.url, content=probe.body, headers=probe.headers)
        except httpx2.HTTPError as exc:
            return Outcome(probe.kind, probe.method, 0, None, False, [f"no answer: {exc!r}"])
        status = response.status_code
        outcome = Outcome(probe.kind, probe.method, status, None, 400 <= status < 500)
        if status >= 500:
            outcome.problems.append(f"HTTP {status}: {response.text[:300]}")
        kind = response.headers.get("content-type", "")
        try:
            messages = messages_of(response.text, kind, status)
        except ValueError as exc:
            outcome.problems.append(f"HTTP {status} {kind}: not JSON-RPC ({exc})")
            return outcome
        if not messages and 200 <= status < 300 and status != 202:
            outcome.problems.append(f"HTTP {status} without JSON-RPC: {response.text[:200]!r}")
        outcome.json_rpc = bool(messages)
        for message in messages:
            outcome.problems += not_json_rpc(message)
            error = message.get("error")
            if isinstance(error, Mapping) and isinstance(error.get("code"), int):
                outcome.code = error["code"]
                outcome.refused |= error["code"] in REFUSALS
                if error["code"] == INTERNAL:
                    outcome.problems.append(f"-32603: {json.dumps(message)[:300]}")
        return outcome

    def _tidy(self, before: Mapping[str, Task], after: Mapping[str, Task]) -> None:
        """Cancel the tasks the probe created (through the wire, so workers stay free);
        replace a seeded waiting task that no longer waits."""
        for task_id, task in after.items():
            if task_id not in before and not task.status.terminal:
                with contextlib.suppress(AssertionError):  # it may have finished first
                    self._rpc("tasks/cancel", {"taskId": task_id})
        for waiting, seed in self.waiting:
            if after[waiting.task_id].status is not Status.INPUT_REQUIRED:
                waiting.task_id = self._seed_waiting(*seed).task_id


def messages_of(text: str, content_type: str, status: int) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an answer body (JSON or SSE); [] for an empty body or a
    transport error's text (a 4xx); ValueError for anything else."""
    if not text:
        return []
    if "text/event-stream" in content_type:
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        return [json.loads(d) for d in data if d]
    if "json" not in content_type:
        if 400 <= status < 500:
            return []  # the SDK's transport errors ("Invalid Content-Type header")
        raise ValueError(f"unexpected body {text[:100]!r}")
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not a JSON-RPC message")
    return [value]


def not_json_rpc(message: Mapping[str, Any]) -> list[str]:
    """What makes ``message`` no JSON-RPC 2.0 answer (or server request)."""
    problems = []
    if message.get("jsonrpc") != "2.0":
        problems.append(f"no jsonrpc 2.0: {message}")
    if "method" in message:
        return problems  # a notification or request of the server's, on a stream
    if "id" not in message:
        problems.append(f"an answer without id: {message}")
    if ("result" in message) == ("error" in message):
        problems.append(f"not exactly one of result/error: {str(message)[:200]}")
    error = message.get("error")
    if "error" in message and not (
        isinstance(error, Mapping)
        and isinstance(error.get("code"), int)
        and isinstance(error.get("message"), str)
    ):
        problems.append(f"a malformed error: {error}")
    return problems


def store_changes(before: Mapping[str, Task], after: Mapping[str, Task]) -> list[str]:
    """How the store changed in ways a refused request may not change it."""
    problems = []
    if created := sorted(set(after) - set(before)):
        problems.append(f"refused, yet tasks were created: {created}")
    if gone := sorted(set(before) - set(after)):
        problems.append(f"refused, yet tasks are gone: {gone}")
    for task_id, task in before.items():
        if task.status in AT_REST and task_id in after and _rest(after[task_id]) != _rest(task):
            problems.append(f"refused, yet task {task_id} changed: {task} -> {after[task_id]}")
    return problems


def drive(
    harness: Harness, kind: str, examples: int, each: Callable[[Probe, Outcome], None]
) -> None:
    """Draw ``examples`` probes of ``kind`` for ``harness``'s target (seeded: the same
    ones every run), check each, and hand it and its outcome to ``each``."""

    @settings(FUZZ, max_examples=examples)
    @given(probes(kind, harness.target))
    def probe_once(probe: Probe) -> None:
        each(probe, harness.check(probe))

    probe_once()
