"""The MCP Inspector's CLI (``mcp-inspector --cli``, 2.12.0): an interop matrix row.

Each call is one CLI run, ``--method tools/call`` with ``--protocol-era modern`` (its
tasks support is ext-tasks: it polls a task to its end). The CLI is one-shot: it has no
way to cancel or to follow a task after a restart (``na``). Input and decline are tried:
the CLI has no way to answer, and it hangs silently instead of saying so (see
``repro/inspector_cli_input_hang.py``), so those calls are stopped after a few seconds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from common import emit, load_plan

HERE = Path(__file__).resolve().parent.parent
NODE = HERE / "node_modules" / ".bin" / "node"
CLI = HERE / "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
CALL_TIMEOUT = 30.0
INPUT_TIMEOUT = 6.0  # a call that waits for input the CLI cannot give


def run(target: dict[str, Any], op: dict[str, Any], timeout: float) -> dict[str, Any]:
    argv = [str(NODE), str(CLI), "--cli", "--protocol-era", "modern", "--format", "json", "-q"]
    argv += ["--connect-timeout", str(int(CALL_TIMEOUT * 1000))]  # a stdio server on a busy box
    argv += ["--method", "tools/call", "--tool-name", op["tool"]]
    argv += ["--tool-args-json", json.dumps(op.get("args") or {})]
    if target["transport"] == "http":
        argv += [target["url"]]
    else:
        argv += ["--transport", "stdio", "--", *target["command"]]
    done = subprocess.run(  # noqa: S603 - the driver's own command line
        argv, capture_output=True, text=True, timeout=timeout, env=target.get("env"), check=False
    )
    for line in (done.stdout + "\n" + done.stderr).splitlines():  # errors go to stderr
        try:
            message = json.loads(line) if line.startswith("{") else {}
        except json.JSONDecodeError:
            continue
        if "result" in message:
            result = message["result"]
            text = "\n".join(b.get("text", "") for b in result.get("content", []))
            return {"result": {"isError": bool(result.get("isError")), "text": text}}
        if "error" in message:
            error = message["error"]
            code = error.get("code") if isinstance(error.get("code"), int) else None
            message = f"exit {done.returncode}: {error.get('message')}"
            return {"error": {"code": code, "message": message}}
    tail = (done.stderr or done.stdout)[-300:]
    return {"error": {"code": None, "message": f"exit {done.returncode}: {tail}"}}


def main() -> None:
    for target, ops in load_plan():
        run_leg(target, ops)


def run_leg(target: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    for op in ops:
        if op["kind"] != "call":
            emit({"id": op["id"], "outcome": {"na": f"the one-shot CLI has no {op['kind']}"}})
            continue
        limit = INPUT_TIMEOUT if op.get("answer") is not None else CALL_TIMEOUT
        try:
            outcome = run(target, op, limit)
        except subprocess.TimeoutExpired:
            message = f"the CLI printed nothing and was stopped after {limit:g} s"
            outcome = {"error": {"code": None, "message": message}}
        emit({"id": op["id"], "outcome": outcome})


if __name__ == "__main__":
    main()
