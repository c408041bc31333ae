"""What every Python client of the interop matrix shares (standard library only: it runs
in Keel's environment and in the separate FastMCP one).

A client is started with one argument, a JSON file: ``{"legs": [{"target": …, "ops":
[…]}, …]}``, run leg after leg (one process per client and transport: their start-up is
most of the matrix's CPU). ``target`` is ``{"transport": "http", "url": …}`` or
``{"transport": "stdio", "command": […], "env": {…}}``. Each op is ``{"id", "kind":
"call"|"cancel"|"restart", "tool", "args", "answer"}``; the client prints one JSON line
per op, ``{"id", "outcome"}``, where an outcome is one of

- ``{"result": {"isError": bool, "text": str}}``: the client's final tool result;
- ``{"error": {"code": int | None, "message": str}}``: what the client raised;
- ``{"status": str, "text": str}``: a task's final status as the client reports it;
- ``{"na": reason}``: the client has no way to do this.

A restart op names two tasks, ``running`` and ``waiting`` (a tool, its args, and for
``running`` the status message that shows its handler started, when the server reports
one). The client prints ``{"event": "ready", "running": id, "waiting": id}`` once both
tasks are where they must be, waits for a line on stdin (the driver has SIGKILLed and
restarted the server meanwhile), reconnects, and reports ``{"running": outcome,
"waiting": outcome}``.

A push op (``ts_v2.mjs`` only, on a connection of its own) starts its tool as a task,
listens to it (``subscriptions/listen`` with ``notifications.taskIds``), settles it, and
reports ``{"push": {"taskId", "ack", "received", "listenId", "polls", "closed",
"result" | "error"}}``: the listen ack and every ``notifications/tasks`` for the task as
they came on the wire, and the ``tasks/get`` requests it sent for it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def load_plan() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The plan's legs: (target, ops) pairs."""
    with open(sys.argv[1], encoding="utf-8") as f:
        plan = json.load(f)
    return [(leg["target"], leg["ops"]) for leg in plan["legs"]]


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def wait_for_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected 'go' from the driver, got {line!r}")


def text_of(content: Any) -> str:
    """The text blocks of a CallToolResult's content, joined."""
    parts = []
    for block in content or []:
        text = block.get("text") if isinstance(block, dict) else getattr(block, "text", None)
        if text:
            parts.append(text)
    return "\n".join(parts)


def error_outcome(exc: BaseException) -> dict[str, Any]:
    """An exception as an outcome: the JSON-RPC code when the client kept one."""
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) if error is not None else getattr(exc, "code", None)
    message = str(exc) or type(exc).__name__
    if isinstance(exc, BaseExceptionGroup):
        return error_outcome(exc.exceptions[0])
    return {"error": {"code": code if isinstance(code, int) else None, "message": message[:300]}}


async def run_plan(make_row: Callable[[dict[str, Any]], Any]) -> None:
    """Every leg of the plan: its calls and cancels on one connection (``row.client()``,
    ``row.call`` / ``row.cancel``), then its restarts (``row.restart``), each reported."""
    for target, ops in load_plan():
        row = make_row(target)
        connected = [op for op in ops if op["kind"] != "restart"]
        reported: set[str] = set()
        try:
            if connected:
                async with row.client() as client:
                    for op in connected:
                        try:
                            outcome = await getattr(row, op["kind"])(client, op)
                        except Exception as exc:
                            outcome = error_outcome(exc)
                        emit({"id": op["id"], "outcome": outcome})
                        reported.add(op["id"])
        except Exception as exc:  # the connection itself failed (or failed closing)
            for op in connected:
                if op["id"] not in reported:
                    emit({"id": op["id"], "outcome": error_outcome(exc)})
        for op in ops:
            if op["kind"] == "restart":
                try:
                    outcome = await row.restart(op)
                except Exception as exc:
                    outcome = error_outcome(exc)
                emit({"id": op["id"], "outcome": outcome})
