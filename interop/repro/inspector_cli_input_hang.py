"""Reproduces an MCP Inspector CLI defect (``@modelcontextprotocol/inspector`` 2.12.0):
``--cli`` calling a tool whose task asks for input hangs, silently, for ever.

The CLI shares the web UI's client: the task's ``inputRequests`` (ext-tasks) are queued
as a pending elicitation for a UI that the CLI does not have, so nothing answers,
declines or reports them, and no timeout ends the call. Expected: the CLI exits with an
error naming the input it cannot give (or declines it).

    uv run python interop/repro/inspector_cli_input_hang.py     (after npm ci in interop/)

Starts ``keel serve --app conformance`` on a free port, calls ``confirm_delete`` (one
confirmation) with the CLI, bounded to 20 s, then ``greet`` as a control. Exit status 0:
the defect is there (the control answered, the input call printed nothing and was
stopped at 20 s); 1: it is not (any more).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
NODE = HERE / "node_modules" / ".bin" / "node"
CLI = HERE / "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
BOUND = 20.0


def cli(url: str, tool: str, args: str) -> subprocess.CompletedProcess[str] | None:
    argv = [str(NODE), str(CLI), "--cli", "--protocol-era", "modern", "--method", "tools/call"]
    argv += ["--tool-name", tool, "--tool-args-json", args, url]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, check=False)  # noqa: S603
    except subprocess.TimeoutExpired:
        return None


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Path(tempfile.mkdtemp()) / "repro.db"
    argv = [sys.executable, "-m", "keel", "serve", "--app", "conformance"]
    server = subprocess.Popen(  # noqa: S603
        [*argv, "--port", str(port), "--store", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        control = cli(url, "greet", '{"name": "repro"}')
        if control is None or "Hello, repro!" not in control.stdout:
            print("control call failed; cannot judge:", control)
            return 1
        started = time.monotonic()
        hung = cli(url, "confirm_delete", '{"filename": "x"}')
        if hung is None:
            print(f"reproduced: confirm_delete printed nothing and was stopped after {BOUND:g} s")
            return 0
        took = time.monotonic() - started
        print(
            f"not reproduced: exit {hung.returncode} after {took:.1f} s: {hung.stdout}{hung.stderr}"
        )
        return 1
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
