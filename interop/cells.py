"""What each cell of the interop matrix asks of a client, and how its outcome is judged.

An operation is a request the client scripts understand (``kind``: ``call``, ``cancel``
or ``restart``; ``tool``, ``args``, ``answer``) and a check of the outcome they report
(see ``clients/common.py`` for the outcome shapes). The same operations run for every
client; a client without a way to do one reports ``na``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPS = ["plain", "task", "input", "decline", "cancel", "failed", "isError", "restart", "push"]

NOT_DECLARED = -32021  # a task_mode="required" tool called by a client without the extension
BRIDGE_UNKNOWN = "INC-0000-0000"

Check = Callable[[dict[str, Any]], str | None]  # None when it passes, else the reason


@dataclass(frozen=True)
class Expect:
    request: dict[str, Any]
    check: Check
    required_task: bool = False  # a client without the extension may get -32021
    note: Callable[[dict[str, Any]], str] | None = None  # what a pass shows, if more


def _describe(outcome: dict[str, Any]) -> str:
    if "result" in outcome:
        r = outcome["result"]
        return f"{'isError ' if r.get('isError') else ''}result {r.get('text', '')!r}"
    if "error" in outcome:
        e = outcome["error"]
        code = f"{e['code']} " if e.get("code") is not None else ""
        return f"error {code}{e.get('message', '')!r}"
    if "status" in outcome:
        return f"status {outcome['status']}"
    return json.dumps(outcome)


def _short(text: str, limit: int = 140) -> str:
    text = re.sub(r"\\+n", " ", text)  # newlines escaped once or twice in nested JSON
    text = " ".join(re.sub(r"\\+\"", '"', text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def result_is(text: str, is_error: bool = False) -> Check:
    def check(outcome: dict[str, Any]) -> str | None:
        r = outcome.get("result")
        if r is not None and bool(r.get("isError")) == is_error and text in r.get("text", ""):
            return None
        want = f"{'isError ' if is_error else ''}result with {text!r}"
        return f"want {want}, got {_describe(outcome)}"

    return check


def fails_with(text: str) -> Check:
    """A failed task: the client raises, or reports an error result, naming ``text``."""

    def check(outcome: dict[str, Any]) -> str | None:
        r, e = outcome.get("result"), outcome.get("error")
        if r is not None and r.get("isError") and text in r.get("text", ""):
            return None
        if e is not None and text in e.get("message", ""):
            return None
        if outcome.get("status") == "failed":
            return None
        return f"want a failure naming {text!r}, got {_describe(outcome)}"

    return check


def status_is(status: str) -> Check:
    def check(outcome: dict[str, Any]) -> str | None:
        if outcome.get("status") == status:
            return None
        return f"want status {status}, got {_describe(outcome)}"

    return check


def both(running: Check, waiting: Check) -> Check:
    """Both tasks ended as wanted; and, where the driver read Keel's store, the kill
    really hit one running and one waiting task, and the running one ran again."""

    def check(outcome: dict[str, Any]) -> str | None:
        if "running" not in outcome:
            return f"got {_describe(outcome)}"
        reasons = []
        for name, sub in (("running", running), ("waiting", waiting)):
            reason = sub(outcome[name])
            if reason:
                reasons.append(f"{name}: {reason}")
        store = outcome.get("store")
        if store is not None:
            if store["running_at_kill"] != "working":
                reasons.append(f"running was {store['running_at_kill']} at the kill")
            if store["waiting_at_kill"] != "input_required":
                reasons.append(f"waiting was {store['waiting_at_kill']} at the kill")
            if store["running_attempt"] < 2:
                reasons.append("the running task was not run again after the kill")
        return "; ".join(reasons) or None

    return check


def _call(tool: str, args: dict[str, Any] | None = None, answer: Any = None) -> dict[str, Any]:
    return {"kind": "call", "tool": tool, "args": args or {}, "answer": answer}


ACCEPT = {"accept": {"confirm": True}}
DECLINE = {"decline": True}


def conformance_plan() -> dict[str, Expect]:
    """``keel serve --app conformance``: its fixture tools (``keel/conformance.py``)."""
    return {
        "plain": Expect(
            dict(_call("greet", {"name": "interop"}), task=False), result_is("Hello, interop!")
        ),
        "task": Expect(
            _call("slow_compute", {"seconds": 0.3, "label": "x"}),
            result_is("computed x after 0.3s"),
        ),
        "input": Expect(
            _call("confirm_delete", {"filename": "a.txt"}, ACCEPT), result_is("deleted a.txt")
        ),
        "decline": Expect(
            _call("confirm_delete", {"filename": "b.txt"}, DECLINE),
            result_is("was declined by the user", is_error=True),
        ),
        "cancel": Expect(
            {"kind": "cancel", "tool": "slow_compute", "args": {"seconds": 30}},
            status_is("cancelled"),
        ),
        "failed": Expect(_call("protocol_error_job"), fails_with("simulated protocol error")),
        "isError": Expect(
            _call("failing_job"),
            result_is("simulated tool error", is_error=True),
            required_task=True,
        ),
    }


def restart_plan(started: str | None = "started") -> Expect:
    """SIGKILL with ``long_step`` running and ``ask`` waiting (``interop_app.py``, and
    the same two tools in ``fastmcp_server.py``, which reports no status message)."""
    return Expect(
        {
            "kind": "restart",
            "running": {"tool": "long_step", "args": {"seconds": 2}, "message": started},
            "waiting": {"tool": "ask", "args": {}},
            "answer": ACCEPT,
        },
        both(result_is("long_step done after 2s"), result_is("ask answered confirm=True")),
    )


TERMINAL = ("completed", "failed", "cancelled")


def pushed_to_end(text: str) -> Check:
    """The client listened to its task and was pushed it to the end: the ack confirmed
    the task, every ``notifications/tasks`` carried the listen's subscription id, the last
    one is terminal, the client sent no ``tasks/get`` for it, and its result is ``text``.
    All of it from what crossed the client's own wire (``outcome["push"]``)."""

    def check(outcome: dict[str, Any]) -> str | None:
        push = outcome.get("push")
        if push is None:
            return f"got {_describe(outcome)}"
        received, polls = push.get("received", []), push.get("polls", 0)
        statuses = [frame.get("status") for frame in received]
        ack, listen = push.get("ack") or {}, push.get("listenId")
        reasons = []
        if push.get("taskId") not in ack.get("taskIds", []):
            reasons.append(f"the listen ack did not confirm the task (ack {ack or None})")
        if any(f.get("subscriptionId") != listen for f in [ack, *received] if f):
            reasons.append(f"a frame without subscriptionId {listen!r}")
        if not statuses or statuses[-1] not in TERMINAL:
            got = " → ".join(map(str, statuses)) or "none"
            only = f"; it only polled ({polls} tasks/get)" if polls else ""
            reasons.append(f"no terminal notifications/tasks (received: {got}){only}")
        elif polls:
            reasons.append(f"it polled too: {polls} tasks/get")
        wrong = result_is(text)(push)
        if wrong:
            reasons.append(wrong)
        return "; ".join(reasons) or None

    return check


def pushed_note(outcome: dict[str, Any]) -> str:
    push = outcome["push"]
    statuses = " → ".join(frame["status"] for frame in push["received"])
    return f"{len(push['received'])} notifications/tasks: {statuses}; 0 tasks/get"


def push_plan() -> Expect:
    """``pushed`` (``interop_app.py``, ``pollIntervalMs`` 60000): start it, listen to it
    (``subscriptions/listen`` with ``notifications.taskIds``), settle it from what is
    pushed; the client's step timeout (30 s) is far below the poll interval."""
    return Expect(
        {"kind": "push", "tool": "pushed", "args": {"steps": 2, "seconds": 0.3}},
        pushed_to_end("pushed done after 2 steps"),
        note=pushed_note,
    )


def bridge_plan(data_dir: Path) -> dict[str, Expect]:
    """``keel serve`` (Incident Bridge) on its sample dataset, at a fast pace."""
    incidents = json.loads((data_dir / "bridge" / "incidents.json").read_text())
    named = next(i for i in incidents if i.get("service"))
    unnamed = next(
        (i for i in incidents if i["id"] == "INC-2026-0142"),
        next(i for i in incidents if not i.get("service")),
    )
    services = sorted({i["service"] for i in incidents if i.get("service")})
    answer = {"accept": {"service": "checkout" if "checkout" in services else services[0]}}
    diagnose = "diagnose_root_cause"
    return {
        "plain": Expect(
            dict(_call("get_incident", {"incident_id": named["id"]}), task=False),
            result_is(named["id"]),
        ),
        "task": Expect(_call(diagnose, {"incident_id": named["id"]}), result_is(named["id"])),
        "input": Expect(
            _call(diagnose, {"incident_id": unnamed["id"]}, answer), result_is(unnamed["id"])
        ),
        "decline": Expect(
            _call(diagnose, {"incident_id": unnamed["id"]}, DECLINE),
            result_is("declined", is_error=True),
        ),
        "cancel": Expect(
            {"kind": "cancel", "tool": diagnose, "args": {"incident_id": named["id"]}},
            status_is("cancelled"),
        ),
        "isError": Expect(
            _call(diagnose, {"incident_id": BRIDGE_UNKNOWN}),
            result_is(BRIDGE_UNKNOWN, is_error=True),
        ),
    }


def fastmcp_plan() -> dict[str, Expect]:
    """``fastmcp_server.py``: the same fixture tools, served by FastMCP + fastmcp_tasks."""
    return conformance_plan()


# Defects of the other side, each reproduced by a script in interop/repro/ and described
# in docs/interop.md: (client key, op) -> (a pattern of the failure, the note shown in the
# cell instead of FAIL). A failure that does not match the pattern stays a FAIL.
INSPECTOR_HANG = (
    "the CLI printed nothing",
    "the Inspector CLI hangs silently on a task's input request it cannot answer"
    " (repro/inspector_cli_input_hang.py)",
)
SDK1_FAILED = (
    r"Task \S+ failed'",
    "sdk 1.32.2's callToolStream reports a failed task as 'Task <id> failed' without"
    " asking tasks/result, which has the tool's error (repro/sdk1_failed_task_result.mjs)",
)
OTHER_SIDE: dict[tuple[str, str], tuple[str, str]] = {
    ("inspector", "input"): INSPECTOR_HANG,
    ("inspector", "decline"): INSPECTOR_HANG,
    ("ts-sdk1", "failed"): SDK1_FAILED,
    ("ts-sdk1", "isError"): SDK1_FAILED,
}


def judge(op: str, expect: Expect, outcome: dict[str, Any], row: str) -> str:
    if "na" in outcome:
        return f"n/a: {_short(outcome['na'], 90)}"
    if expect.required_task and outcome.get("error", {}).get("code") == NOT_DECLARED:
        return "pass (-32021: required task, no extension declared)"
    reason = expect.check(outcome)
    if reason is None:
        return f"pass ({expect.note(outcome)})" if expect.note else "pass"
    known = OTHER_SIDE.get((row.split(" · ", 1)[0], op))
    if known and re.search(known[0], reason):
        return f"other side: {known[1]}"
    return f"FAIL: {_short(reason)}"
