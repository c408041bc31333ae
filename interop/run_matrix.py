"""The interop matrix: real third-party MCP clients against Keel, one table of results.

    uv run python interop/run_matrix.py --out docs/interop.md

Needs ``npm ci`` in ``interop/`` and the FastMCP environment (``interop/.venv-fastmcp``,
from ``interop/requirements.txt``); ``.ci/run`` prepares both. Every client runs the
same operations against ``keel serve --app conformance`` and the Bridge, over HTTP and
stdio; then, once per client, its server is SIGKILLed with one task running and one
waiting for input (``interop_app.py``, a one-second lease) and started again on the same
store. Keel's own client also runs against a FastMCP server (``fastmcp_server.py``).

Each cell is ``pass``, ``n/a: why`` (the client has no way to do it), ``FAIL: what
happened``, or ``other side: …`` (a defect of the third-party client, reproduced by a
script in ``interop/repro/`` and described in ``docs/interop.md``). The exit status is 1
when any cell is ``FAIL``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cells import (
    OPS,
    Expect,
    bridge_plan,
    conformance_plan,
    fastmcp_plan,
    judge,
    push_plan,
    restart_plan,
)

HERE = Path(__file__).resolve().parent
NODE = HERE / "node_modules" / ".bin" / "node"
FASTMCP_PYTHON = HERE / ".venv-fastmcp" / "bin" / "python"
START_TIMEOUT = 30.0
ROW_TIMEOUT = 240.0  # one client process: conformance, Bridge and restart legs


@dataclass(frozen=True)
class ClientKind:
    key: str
    label: str
    argv: tuple[str, ...]  # the plan file goes after the script, before any flag
    push: bool = False  # runs the push cell (listen to a task, follow its notifications)


def _script(interpreter: Path | str, script: str, *flags: str) -> tuple[str, ...]:
    return (str(interpreter), str(HERE / "clients" / script), *flags)


CLIENTS = [
    ClientKind(
        "fastmcp",
        "FastMCP 4.1.4 `Client` + `fastmcp_tasks`",
        _script(FASTMCP_PYTHON, "py_fastmcp.py"),
    ),
    ClientKind(
        "ts-v2",
        "`@modelcontextprotocol/client` 2.4.0 + `ext-tasks` 0.2.2",
        _script(NODE, "ts_v2.mjs"),
        push=True,
    ),
    ClientKind(
        "ts-sdk1",
        "`@modelcontextprotocol/sdk` 1.32.2 (2025-11-25 tasks, `callToolStream`)",
        _script(NODE, "ts_sdk1.mjs"),
    ),
    ClientKind(
        "inspector", "MCP Inspector 2.12.0 `--cli`", _script(sys.executable, "inspector.py")
    ),
    ClientKind(
        "python-ext",
        "official Python `Client` (mcp 2.3.0) + Keel `TasksClientExtension`",
        _script(sys.executable, "py_official.py", "--ext"),
    ),
    ClientKind(
        "python",
        "official Python `Client` (mcp 2.3.0), no extension",
        _script(sys.executable, "py_official.py"),
    ),
]
TRANSPORTS = ("http", "stdio")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_port(port: int, proc: asyncio.subprocess.Process, deadline: float) -> bool:
    """Poll (bounded) until the port accepts connections or the process exits."""
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            return False
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return True
    return False


@dataclass
class Server:
    """One ``keel serve`` (or FastMCP) HTTP server on 127.0.0.1; restartable on its port."""

    name: str
    argv: list[str]  # without --port
    env: dict[str, str]
    log_dir: Path
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self, same_port: bool = False) -> None:
        """Start it; a port someone else took meanwhile is retried with another one."""
        for _ in range(5):
            if not same_port or not self.port:
                self.port = free_port()
            self.starts += 1
            log = open(self.log_dir / f"{self.name}.{self.starts}.log", "wb")  # noqa: SIM115, ASYNC230
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                "--port",
                str(self.port),
                env=self.env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
            log.close()
            if await wait_port(self.port, self.proc, time.monotonic() + START_TIMEOUT):
                return
            await self.stop()
            if not same_port:
                continue
            await asyncio.sleep(0.2)  # the old socket may linger a moment after SIGKILL
        raise RuntimeError(f"{self.name} did not start; see {self.log_dir}")

    async def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                await self.kill()


@dataclass
class Matrix:
    work: Path
    env: dict[str, str]
    bridge_data: Path
    rows: dict[str, dict[str, str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    limit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(3))

    def keel(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "keel", *args]

    def store(self, name: str) -> str:
        return str(self.work / f"{name}.db")

    def serve_argv(self, app: str, store: str) -> list[str]:
        if app == "bridge":
            return self.keel(
                "serve", "--data-dir", str(self.bridge_data), "--store", store, "--pace", "0.2"
            )
        # Its own data folder (the key that seals requestState lives there): the same on
        # a restart, and nothing written under the current directory.
        data = str(Path(store).with_suffix("")) + "-data"
        return self.keel("serve", "--app", app, "--store", store, "--data-dir", data)

    def server(self, name: str, app: str) -> Server:
        return Server(name, self.serve_argv(app, self.store(name)), self.env, self.work)

    def stdio_target(self, name: str, app: str, pidfile: Path | None = None) -> dict[str, Any]:
        argv = [*self.serve_argv(app, self.store(name)), "--transport", "stdio"]
        if pidfile is not None:  # the driver SIGKILLs what this wrapper became
            argv = ["sh", "-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *argv]
        return {"transport": "stdio", "command": argv, "env": self.env}

    async def run_client(
        self,
        kind: ClientKind,
        legs: list[tuple[dict[str, Any], list[dict[str, Any]]]],
        tag: str,
        on_ready: Callable[[dict[str, Any]], Any] | None = None,
    ) -> dict[str, Any]:
        """Run one client process over its legs; its outcomes by op id (or an error)."""
        plan = self.work / f"plan-{tag}.json"
        plan.write_text(json.dumps({"legs": [{"target": t, "ops": ops} for t, ops in legs]}))
        log = open(self.work / f"client-{tag}.log", "wb")  # noqa: SIM115, ASYNC230
        proc = await asyncio.create_subprocess_exec(
            *kind.argv[:2],
            str(plan),
            *kind.argv[2:],
            env=self.env,
            cwd=HERE / "clients",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        log.close()
        outcomes: dict[str, Any] = {}
        assert proc.stdout is not None
        assert proc.stdin is not None
        try:
            async with asyncio.timeout(ROW_TIMEOUT):
                async for raw in proc.stdout:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("{"):
                        continue
                    message = json.loads(line)
                    if message.get("event") == "ready" and on_ready is not None:
                        await on_ready(message)
                        with contextlib.suppress(ConnectionError):  # it may have died: see its log
                            proc.stdin.write(b"go\n")
                            await proc.stdin.drain()
                    elif "id" in message:
                        outcomes[message["id"]] = message["outcome"]
                await proc.wait()
        except TimeoutError:
            outcomes.setdefault("_", {"error": {"code": None, "message": "client timed out"}})
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode and not outcomes:
            tail = (self.work / f"client-{tag}.log").read_text(errors="replace")[-300:]
            outcomes["_"] = {"error": {"code": None, "message": f"exit {proc.returncode}: {tail}"}}
        return outcomes

    def record(
        self, row: str, label: str, plan: dict[str, Expect], outcomes: dict[str, Any], leg: str = ""
    ) -> None:
        """Judge a plan's cells from a client's outcomes (op ids prefixed ``leg:``)."""
        cells = self.rows.setdefault(row, {})
        self.labels[row] = label
        for op, expect in plan.items():
            outcome = (
                outcomes.get(f"{leg}:{op}" if leg else op)
                or outcomes.get("_")
                or {"error": {"code": None, "message": "the client reported nothing"}}
            )
            cells[op] = judge(op, expect, outcome, row)

    @contextlib.asynccontextmanager
    async def out_of_time(
        self, label: str, plans: dict[str, dict[str, Expect]]
    ) -> AsyncIterator[None]:
        """Cells of a job the time budget stopped say so, instead of vanishing."""
        try:
            yield
        except asyncio.CancelledError:
            message = "not finished within the matrix's time budget"
            for row, plan in plans.items():
                self.record(row, label, plan, {"_": {"error": {"code": None, "message": message}}})
            raise

    async def run_row(self, kind: ClientKind, transport: str, urls: dict[str, str]) -> None:
        """One client over one transport: the conformance and Bridge operations, then the
        restart, in one client process."""
        tag = f"{kind.key}-{transport}"
        row = f"{kind.key} · {transport} · "
        plans = {"conformance": conformance_plan(), "bridge": bridge_plan(self.bridge_data)}
        restart = Restart(self, f"{tag}-restart", restart_plan())
        if transport == "http":
            targets = {app: {"transport": "http", "url": urls[app]} for app in plans}
            restart.server = self.server(restart.tag, "interop_app:app")
        else:
            targets = {app: self.stdio_target(f"stdio-{tag}-{app}", app) for app in plans}
            restart.target = self.stdio_target(
                restart.tag, "interop_app:app", self.pidfile(restart.tag)
            )
        restart.store = self.store(restart.tag)
        # The restart leg's server also serves the push cell (``interop_app.py``).
        own = {"restart": restart.expect, **({"push": push_plan()} if kind.push else {})}
        here = [dict(own["push"].request, id="push")] if kind.push else None
        judged = {row + app: plan for app, plan in plans.items()}
        judged[row + "conformance"] = {**plans["conformance"], **own}
        async with self.out_of_time(kind.label, judged), self.limit:
            started = time.monotonic()
            legs = [
                (targets[app], [dict(op.request, id=f"{app}:{n}") for n, op in plan.items()])
                for app, plan in plans.items()
            ]
            outcomes = await restart.run(kind, legs, tag, ops_here=here)
            self.seconds[tag] = time.monotonic() - started
            (self.work / f"outcomes-{tag}.json").write_text(json.dumps(outcomes, indent=1))
        for app, plan in plans.items():
            self.record(row + app, kind.label, plan, outcomes, leg=app)
        self.record(row + "conformance", kind.label, own, outcomes)

    async def snapshot(self, store: str, task_id: str) -> dict[str, Any]:
        """A task as ``keel tasks show --json`` reads it from the store."""
        proc = await asyncio.create_subprocess_exec(
            *self.keel("tasks", "show", task_id, "--json", "--store", store),
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode:
            return {"status": f"unreadable ({err.decode().strip()[:80]})", "attempt": 0}
        return dict(json.loads(out))

    def pidfile(self, tag: str) -> Path:
        return self.work / f"{tag}.pid"


@dataclass
class Restart:
    """The restart leg: the client readies its two tasks, the server is SIGKILLed and
    started again on the same store (HTTP: ``server``, on the same port; stdio:
    ``target``, whose server the client starts again when it reconnects), the client
    follows both tasks to their end.

    With a Keel ``store``, the driver reads both tasks from it right after the kill (were
    they really running and waiting?) and at the end (was the running one run again?),
    and adds that to the outcome as ``store``."""

    matrix: Matrix
    tag: str
    expect: Expect
    server: Server | None = None
    target: dict[str, Any] | None = None
    store: str | None = None
    seen: dict[str, Any] = field(default_factory=dict)

    async def run(
        self,
        kind: ClientKind,
        legs: list[tuple[dict[str, Any], list[dict[str, Any]]]],
        tag: str,
        ops_here: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The client over ``legs`` (then ``ops_here`` against this very server) and
        then the restart leg; all its outcomes."""
        try:
            if self.server is not None:
                await self.server.start()
                self.target = {"transport": "http", "url": self.server.url}
            assert self.target is not None
            if ops_here:
                legs = [*legs, (self.target, ops_here)]
            legs = [*legs, (self.target, [dict(self.expect.request, id="restart")])]
            outcomes = await self.matrix.run_client(kind, legs, tag, self.on_ready)
        except RuntimeError as exc:  # a server that did not start
            return {"_": {"error": {"code": None, "message": str(exc)}}}
        else:
            await self.add_store(outcomes.get("restart"))
            return outcomes
        finally:
            if self.server is not None:
                await self.server.stop()

    async def on_ready(self, ready: dict[str, Any]) -> None:
        if self.server is not None:
            await self.server.kill()
        else:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(self.matrix.pidfile(self.tag).read_text().strip()), signal.SIGKILL)
        if self.store is not None:
            self.seen["ids"] = ready
            for name in ("running", "waiting"):
                task = await self.matrix.snapshot(self.store, ready[name])
                self.seen[f"{name}_at_kill"] = task["status"]
        if self.server is not None:
            await self.server.start(same_port=True)

    async def add_store(self, outcome: Any) -> None:
        if self.store is None or "ids" not in self.seen or not isinstance(outcome, dict):
            return
        final = await self.matrix.snapshot(self.store, self.seen["ids"]["running"])
        outcome["store"] = {
            "running_at_kill": self.seen["running_at_kill"],
            "waiting_at_kill": self.seen["waiting_at_kill"],
            "running_attempt": final["attempt"],
        }


async def prepare_bridge(matrix: Matrix) -> None:
    proc = await asyncio.create_subprocess_exec(
        *matrix.keel("serve", "--check", "--data-dir", str(matrix.bridge_data)),
        env=matrix.env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"keel serve --check failed: {err.decode()[-500:]}")


@contextlib.asynccontextmanager
async def shared_servers(matrix: Matrix) -> AsyncIterator[dict[str, Server]]:
    servers = {app: matrix.server(f"shared-{app}", app) for app in ("conformance", "bridge")}
    try:
        await asyncio.gather(*(s.start() for s in servers.values()))
        yield servers
    finally:
        await asyncio.gather(*(s.stop() for s in servers.values()))


async def run_fastmcp_server_row(matrix: Matrix, redis_url: str) -> None:
    """Keel's client (the official client + TasksClientExtension) against FastMCP's server:
    the conformance operations, then the restart of that same server."""
    kind = next(k for k in CLIENTS if k.key == "python-ext")
    env = dict(matrix.env, INTEROP_REDIS_URL=redis_url)
    argv = [str(FASTMCP_PYTHON), str(HERE / "fastmcp_server.py")]
    row = "keel client · http · FastMCP 4.1.4 server"
    label = "Keel's client against FastMCP's server (fastmcp_tasks, Redis)"
    plan = fastmcp_plan()
    restart = Restart(matrix, "keel-vs-fastmcp", restart_plan(started=None))
    restart.server = Server("fastmcp-server", argv, env, matrix.work)
    async with matrix.out_of_time(label, {row: {**plan, "restart": restart.expect}}), matrix.limit:
        started = time.monotonic()
        ops = [dict(op.request, id=name) for name, op in plan.items()]
        outcomes = await restart.run(kind, [], "keel-vs-fastmcp", ops_here=ops)
        matrix.seconds["keel-vs-fastmcp"] = time.monotonic() - started
    matrix.record(row, label, {**plan, "restart": restart.expect}, outcomes)


def render(matrix: Matrix, total: float) -> str:
    columns = [op for op in OPS if any(op in cells for cells in matrix.rows.values())]
    lines = [
        "| client · transport · server | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    order = {kind.key: n for n, kind in enumerate(CLIENTS)}

    def place(row: str) -> tuple[int, str, bool]:
        client, transport, server = row.split(" · ")
        return (order.get(client, len(order)), transport, server != "conformance")

    for row in sorted(matrix.rows, key=place):
        cells = matrix.rows[row]
        label = f"{matrix.labels[row]}<br>`{row}`"
        lines.append(f"| {label} | " + " | ".join(cells.get(op, "") for op in columns) + " |")
    counts = {"pass": 0, "n/a": 0, "FAIL": 0, "other side": 0}
    for cells in matrix.rows.values():
        for cell in cells.values():
            for prefix in counts:
                if cell.startswith(prefix):
                    counts[prefix] += 1
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    return "\n".join(lines) + f"\n\nCells: {summary}. Whole run: {total:.0f} s.\n"


def write_doc(out: Path, table: str) -> None:
    text = out.read_text() if out.exists() else ""
    begin, end = "<!-- matrix:begin -->", "<!-- matrix:end -->"
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text + ("\n" if text else "") + block + "\n"
    out.write_text(text)


async def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="keel-interop-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    matrix = Matrix(work, env, work / "bridge-data", limit=asyncio.Semaphore(args.parallel))
    clients = [k for k in CLIENTS if not args.only or k.key in args.only]
    await prepare_bridge(matrix)
    async with shared_servers(matrix) as servers:
        urls = {app: server.url for app, server in servers.items()}
        jobs = [
            matrix.run_row(kind, transport, urls) for kind in clients for transport in TRANSPORTS
        ]
        if not args.only or "fastmcp-server" in args.only:
            jobs.append(run_fastmcp_server_row(matrix, args.redis))
        # Whatever has not finished within the budget is stopped and reported as such.
        tasks = [asyncio.ensure_future(job) for job in jobs]
        _, pending = await asyncio.wait(tasks, timeout=args.budget - (time.monotonic() - started))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    total = time.monotonic() - started
    table = render(matrix, total)
    print(table)
    for tag, seconds in sorted(matrix.seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {tag}: {seconds:.1f} s", file=sys.stderr)
    if args.out:
        write_doc(Path(args.out), table)
    if args.keep:
        print(f"logs kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    failed = any(
        cell.startswith("FAIL") for cells in matrix.rows.values() for cell in cells.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the Markdown file whose matrix block is rewritten")
    parser.add_argument("--only", nargs="*", help="client keys (and/or fastmcp-server) to run")
    parser.add_argument("--parallel", type=int, default=4, help="client processes at once")
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379/7", help="for the FastMCP server"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs)")
    parser.add_argument(
        "--budget", type=float, default=330.0, help="seconds; later jobs are stopped as FAIL"
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
