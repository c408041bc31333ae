"""Tasks extension: polls of a task join the task's trace (keel.mcp.trace_polls).

With an SDK tracer provider set (in a process of its own: OpenTelemetry allows one per
process), a task created by ``tools/call`` and polled with ``tasks/get`` until it
completed: the SDK's spans of the polls, the attempt's span and the ``tools/call`` span
are one trace, the polls and the attempt children of the ``tools/call`` span.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).with_name("_trace_polls_run.py")


def test_polls_and_attempts_are_in_the_creating_calls_trace(tmp_path: Path) -> None:
    """One trace: tools/call slow, below it each tasks/get and the attempt."""
    done = subprocess.run(
        [sys.executable, str(RUN), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    spans = report["spans"]
    (call,) = [s for s in spans if s["name"] == "tools/call slow"]
    polls = [s for s in spans if s["name"] == "tasks/get"]
    (attempt,) = [s for s in spans if s["name"] == "keel.attempt slow"]
    assert polls
    assert {s["trace"] for s in [*polls, attempt]} == {call["trace"]}
    assert {s["parent"] for s in [*polls, attempt]} == {call["span"]}
    assert attempt["task"] == report["task_id"]
