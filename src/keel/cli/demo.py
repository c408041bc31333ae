"""``keel demo``: the seed's incident, played over MCP against a real ``keel serve``.

1. start ``keel serve`` (Incident Bridge) as a subprocess on a free loopback port;
2. call ``diagnose_root_cause`` for the seed's incident without a service: the task
   asks which service is affected (``input_required``);
3. the "routine deploy": SIGKILL the server while the task waits, and start it again;
4. the task is still there, still asking; answer it through ``tasks/update``;
5. poll to ``completed``, showing each phase, and print the cited conclusion.

With ``--protocol 2025-11-25`` the client speaks the 2025-11-25 tasks protocol instead
(``params.task`` on the call, ``tasks/get`` polls; after the restart ``tasks/result`` asks
the question through ``elicitation/create`` and answers the diagnosis).

Every moment is one line, timed from the start. The server runs on the data directory
``keel serve`` uses (default ``keel-data``), so ``keel tasks show ID`` afterwards shows
the task and its history. Exit code 0 only if the task completed with its citations.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import anyio

from keel.errors import ConfigurationError, KeelError
from keel.store import parse_location

__all__ = ["DEMO_INCIDENT", "DEMO_SERVICE", "PROTOCOLS", "run_demo"]

DEMO_INCIDENT = "INC-2026-0142"
"""The seed's incident in the Bridge's sample dataset: it names no affected service."""
DEMO_SERVICE = "payments"
"""What the on-call engineer answers when the diagnosis asks which service is affected."""
MODERN = "2026-07-28"
V2025 = "2025-11-25"
PROTOCOLS = (MODERN, V2025)
"""The tasks protocols ``keel demo --protocol`` can speak."""
READY_WAIT = 30.0  # seconds a starting server may take before the demo gives up
STEP_WAIT = 120.0  # seconds any one step may take

Echo = Callable[[str], None]

_CALLER_SETTINGS = frozenset(
    {
        "KEEL_CONFIG", "KEEL_APP", "KEEL_TRANSPORT", "KEEL_HOST", "KEEL_PORT",
        "KEEL_NO_WORKER", "KEEL_STORE", "KEEL_DATA_DIR",
    }
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """``keel serve`` as a child process: started, SIGKILLed, started again."""

    def __init__(self, data_dir: Path, store: str | None, log: IO[bytes]) -> None:
        self.data_dir = data_dir
        self.store = store
        self.port = _free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        command = [sys.executable, "-m", "keel", "serve", "--app", "bridge"]
        command += ["--transport", "http", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--data-dir", str(self.data_dir)]
        if self.store:
            command += ["--store", self.store]
        # The demo's own settings only: no keel.toml (it runs in the data directory) and
        # none of the serve settings of the caller's environment.
        env = {k: v for k, v in os.environ.items() if k not in _CALLER_SETTINGS}
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            command,
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            cwd=self.data_dir,
            env=env,
        )

    async def ready(self) -> None:
        """Until the port accepts connections; an exited server is an error."""
        with anyio.fail_after(READY_WAIT):
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise KeelError(
                        f"keel serve exited with code {self.process.returncode} before it "
                        f"was ready; see {self.log.name}"
                    )
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    await anyio.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Demo:
    def __init__(self, server: _Server, echo: Echo) -> None:
        self.server = server
        self.echo = echo
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        self.echo(f"[{time.monotonic() - self.started:5.1f}s] {text}")

    async def _client(self) -> Any:
        from mcp import Client

        from keel.mcp.client import TasksClientExtension

        return Client(self.server.url, extensions=[TasksClientExtension()])

    async def get(self, task_id: str) -> dict[str, Any]:
        from keel.mcp.client import get_task

        async with await self._client() as client:
            task = await get_task(client, task_id)
        return task.model_dump(by_alias=True)

    async def until(self, task_id: str, statuses: set[str], *, progress: bool) -> dict[str, Any]:
        """Poll tasks/get (a fresh client each time, as a restarting client would) until
        the task reaches one of ``statuses``; print each new status message."""
        last = None
        with anyio.fail_after(STEP_WAIT):
            while True:
                task = await self.get(task_id)
                message = task.get("statusMessage")
                if progress and message and message != last:
                    self.say(f"  {task['status']}: {message}")
                    last = message
                if task["status"] in statuses:
                    return task
                interval = (task.get("pollIntervalMs") or 500) / 1000
                await anyio.sleep(min(interval, 0.5))

    async def run(self) -> dict[str, Any]:
        from mcp_types import CallToolResult

        from keel.mcp.client import Created, accept, update_task

        server = self.server
        self.say(f"starting keel serve (Incident Bridge, pid {self._start()}) at {server.url}")
        await server.ready()
        self.say("server ready")

        self.say(f"tools/call diagnose_root_cause {{incident_id: {DEMO_INCIDENT}}}, no service")
        async with await self._client() as client:
            created = await client.session.call_tool(
                "diagnose_root_cause", {"incident_id": DEMO_INCIDENT}, allow_claimed=True
            )
        if isinstance(created, CallToolResult) or not isinstance(created, Created):
            raise KeelError(f"expected a task, the server answered {created!r}")
        task_id = created.task_id
        self.say(f"task {task_id}: {created.status} (durable handle, committed before the answer)")

        waiting = await self.until(
            task_id, {"input_required", "completed", "failed"}, progress=True
        )
        if waiting["status"] != "input_required":
            raise KeelError(f"expected the task to ask for a service; it is {waiting['status']}")
        [(key, request)] = waiting["inputRequests"].items()
        params = request["params"]
        services = params["requestedSchema"].get("properties", {}).get("service", {}).get("enum")
        self.say(f"task {task_id}: input_required, asks {params['message']!r}")
        if services:
            self.say(f"  (the schema allows: {', '.join(services)})")

        self.say(f"routine deploy: SIGKILL keel serve (pid {server.pid}) while the task waits")
        server.kill()
        self.say(f"restarting keel serve (pid {self._start()})")
        await server.ready()
        after = await self.get(task_id)
        self.say(
            f"after the restart, tasks/get {task_id}: {after['status']}, still asking "
            f"{list(after.get('inputRequests') or {})}"
        )
        if after["status"] != "input_required":
            raise KeelError(f"the task did not survive the restart: {after['status']}")

        self.say(f"tasks/update: {key} -> service = {DEMO_SERVICE!r}")
        async with await self._client() as client:
            await update_task(client, task_id, {key: accept({"service": DEMO_SERVICE})})
        done = await self.until(task_id, {"completed", "failed", "cancelled"}, progress=True)
        if done["status"] != "completed":
            raise KeelError(f"the diagnosis ended {done['status']}: {done.get('error')}")
        self.say(f"task {task_id}: completed")
        return done

    def _start(self) -> int:
        self.server.start()
        return self.server.pid

    async def run_v2025(self) -> dict[str, Any]:
        """The same incident over the 2025-11-25 tasks protocol: ``params.task`` on the
        call, tasks/get polls, and after the restart a tasks/result that asks the question
        through elicitation/create and answers the diagnosis."""
        from keel.mcp.client_v2025 import LegacyClient

        server = self.server
        self.say(f"starting keel serve (Incident Bridge, pid {self._start()}) at {server.url}")
        await server.ready()
        self.say("server ready; initialize at protocol 2025-11-25")
        self.say(f"tools/call diagnose_root_cause {{incident_id: {DEMO_INCIDENT}}}, params.task")
        async with LegacyClient(server.url, timeout=STEP_WAIT) as client:
            created = await client.call_task("diagnose_root_cause", {"incident_id": DEMO_INCIDENT})
            task_id = created["taskId"]
            self.say(f"task {task_id}: {created['status']} (durable handle, committed first)")
            waiting = await self.until_v2025(client, task_id, {"input_required", "completed"})
        if waiting["status"] != "input_required":
            raise KeelError(f"expected the task to ask for a service; it is {waiting['status']}")
        self.say(f"task {task_id}: input_required (the question comes with tasks/result)")

        self.say(f"routine deploy: SIGKILL keel serve (pid {server.pid}) while the task waits")
        server.kill()
        self.say(f"restarting keel serve (pid {self._start()})")
        await server.ready()

        async def answer(message: str, schema: dict[str, Any], related: str | None) -> Any:
            self.say(f"elicitation/create for task {related}: {message!r}")
            self.say(f"  answer: service = {DEMO_SERVICE!r}")
            return {"service": DEMO_SERVICE}

        async with LegacyClient(server.url, on_input=answer, timeout=STEP_WAIT) as client:
            after = await client.get(task_id)
            self.say(f"after the restart, tasks/get {task_id}: {after['status']}")
            if after["status"] != "input_required":
                raise KeelError(f"the task did not survive the restart: {after['status']}")
            self.say(f"tasks/result {task_id} (blocks until the task ends)")
            with anyio.fail_after(STEP_WAIT):
                result = await client.result(task_id)
            done = await client.get(task_id)
        if done["status"] != "completed" or result.get("isError"):
            raise KeelError(f"the diagnosis ended {done['status']}: {done.get('statusMessage')}")
        self.say(f"task {task_id}: completed")
        return {"taskId": task_id, "status": "completed", "result": result}

    async def until_v2025(self, client: Any, task_id: str, statuses: set[str]) -> dict[str, Any]:
        """Poll 2025-11-25 tasks/get until one of ``statuses``, showing status messages."""
        last = None
        with anyio.fail_after(STEP_WAIT):
            while True:
                task: dict[str, Any] = await client.get(task_id)
                message = task.get("statusMessage")
                if message and message != last:
                    self.say(f"  {task['status']}: {message}")
                    last = message
                if task["status"] in statuses | {"failed", "cancelled"}:
                    return task
                await anyio.sleep(min(task.get("pollInterval", 500) / 1000, 0.5))


def _render(echo: Echo, task: dict[str, Any]) -> None:
    result = task["result"]
    structured = result.get("structuredContent")
    if not isinstance(structured, dict):
        for block in result.get("content", []):
            if block.get("type") == "text":
                echo(block["text"])
        return
    echo("")
    echo(f"Conclusion: {structured.get('conclusion')}")
    if "confidence" in structured:
        echo(f"Confidence: {structured['confidence']}")
    alternatives = structured.get("alternatives") or []
    if alternatives:
        echo("Alternatives:")
        for alternative in alternatives:
            echo(f"  - {_one_line(alternative)}")
    citations = structured.get("citations") or []
    echo(f"Citations ({len(citations)}):")
    for citation in citations:
        echo(f"  - {_one_line(citation)}")


def _one_line(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if not isinstance(v, dict | list))
    return json.dumps(value) if not isinstance(value, str) else value


def _leaf_messages(exc: BaseException) -> str:
    """The messages of an exception, or of the exceptions grouped in it."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaf_messages(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def run_demo(
    data_dir: Path, store: str | None, echo: Echo, *, protocol: str = MODERN
) -> dict[str, Any]:
    """Play the incident; return the completed task (``tasks/get`` shape, with ``result``).

    ``protocol`` is the tasks protocol the demo's client speaks: ``2026-07-28`` (the
    extension, through the official client) or ``2025-11-25`` (over plain HTTP).

    Raises:
        ConfigurationError: a store that cannot survive a restart (memory://).
        KeelError: the server could not start, or the task did not end as it should.
    """
    if store and parse_location(store).kind == "memory":
        raise ConfigurationError(
            "keel demo restarts the server: it needs a store that survives (not memory://)"
        )
    data_dir = data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "demo-serve.log"
    if protocol not in PROTOCOLS:
        raise ConfigurationError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol}")
    echo(f"keel demo: the seed's incident, over MCP {protocol}, against a real keel serve")
    with log_path.open("ab") as log:
        server = _Server(data_dir, store, log)
        demo = _Demo(server, echo)
        try:
            done = anyio.run(demo.run_v2025 if protocol == V2025 else demo.run)
        except KeelError:
            raise
        except Exception as exc:  # the client's errors (MCP, HTTP), often in a group
            raise KeelError(f"the demo failed: {_leaf_messages(exc)}; see {log_path}") from exc
        finally:
            server.stop()
    _render(echo, done)
    echo("")
    used = store or str(data_dir / "keel.db")
    default = str(Path("keel-data", "keel.db").absolute())
    where = "" if used == default else f"--store {used} "
    echo(f"keel {where}tasks show {done['taskId']}   (the task and its history)")
    echo(f"server log: {log_path}")
    return done


if __name__ == "__main__":  # pragma: no cover - `keel demo` is the entry point
    run_demo(Path(os.environ.get("KEEL_DATA_DIR", "keel-data")), None, print)
