"""``keel demo`` end to end: the real command starts a real ``keel serve``, the task
waits for input, the server is SIGKILLed and restarted, the answer goes in over MCP, and
the diagnosis completes with the injected root cause of the seed's incident, cited."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from keel.cli.demo import DEMO_INCIDENT, DEMO_SERVICE
from keel.model import Status
from keel.store import SqliteStore

pytestmark = pytest.mark.slow
KEEL = Path(sys.executable).parent / "keel"

MOMENTS = [
    r"starting keel serve \(Incident Bridge, pid (\d+)\)",
    r"server ready",
    r"tools/call diagnose_root_cause \{incident_id: INC-2026-0142\}, no service",
    r"task (\S+): working \(durable handle",
    r"task \S+: input_required, asks '.*Which service",
    r"routine deploy: SIGKILL keel serve \(pid (\d+)\) while the task waits",
    r"restarting keel serve \(pid (\d+)\)",
    r"after the restart, tasks/get \S+: input_required, still asking \['service'\]",
    r"tasks/update: service -> service = 'payments'",
    r"working: \[6/6\] ranking hypotheses",
    r"task \S+: completed",
    r"^Conclusion: ",
    r"^Citations \(\d+\):",
]


def in_order(out: str, moments: list[str]) -> list[re.Match[str]]:
    """Each of ``moments`` (regexes, multiline) found in ``out`` after the previous one;
    the matches."""
    position = 0
    found = []
    for moment in moments:
        match = re.compile(moment, re.MULTILINE).search(out, position)
        assert match is not None, f"{moment!r} missing after position {position}:\n{out}"
        found.append(match)
        position = match.end()
    return found


def test_keel_demo_plays_the_incident_and_ends_with_the_injected_cause(tmp_path: Path) -> None:
    """Whatever serve settings the caller has (a keel.toml here, serve variables in the
    environment), the demo runs its own Bridge over HTTP on a store that survives."""
    (tmp_path / "keel.toml").write_text('[serve]\nstore = "memory://"\napp = "conformance"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env |= {"KEEL_TRANSPORT": "stdio", "KEEL_APP": "conformance", "KEEL_NO_WORKER": "1"}
    result = subprocess.run(
        [str(KEEL), "demo", "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    in_order(out, MOMENTS)
    first_pid = re.search(MOMENTS[0], out)
    killed = re.search(MOMENTS[5], out)
    second_pid = re.search(MOMENTS[6], out)
    assert first_pid is not None
    assert killed is not None
    assert second_pid is not None
    assert first_pid.group(1) == killed.group(1) != second_pid.group(1)

    # The result is the injected cause of the seed's incident, per the ground truth the
    # generator wrote beside the data (which the diagnosis never reads).
    truth = json.loads((tmp_path / "data" / "bridge" / "ground-truth.json").read_text())
    [seed] = [i for i in truth["incidents"] if i["incident_id"] == DEMO_INCIDENT]
    conclusion = re.search(r"^Conclusion: (.*)$", out, re.MULTILINE)
    assert conclusion is not None
    assert seed["deploy_id"] in conclusion.group(1)
    assert seed["root_service"] in conclusion.group(1)
    citations = re.findall(r"^  - (id=C\d+, kind=(\w+), ref=(\S+?),)", out, re.MULTILINE)
    kinds = {kind: ref for _, kind, ref in citations}
    assert kinds["incident"] == DEMO_INCIDENT
    assert seed["deploy_id"] in {ref for _, kind, ref in citations if kind == "deploy"}
    assert "span" in kinds

    # One task, in the store the server used: completed with that answer, and its
    # history shows the wait, the answer and the end.
    task_id = re.search(r"^keel (?:--store \S+ )?tasks show (\S+)", out, re.MULTILINE)
    assert task_id is not None

    async def read() -> None:
        store = SqliteStore(tmp_path / "data" / "keel.db")
        try:
            task = await store.get(task_id.group(1))
            history = await store.history(task.task_id)
        finally:
            await store.close()
        assert task.status is Status.COMPLETED
        assert task.input_responses == {"service": {"service": DEMO_SERVICE}}
        assert task.result is not None
        structured = task.result["structuredContent"]
        assert seed["deploy_id"] in structured["conclusion"]
        moves = [(e.from_status, e.to_status) for e in history if e.from_status != e.to_status]
        assert (Status.WORKING, Status.INPUT_REQUIRED) in moves
        assert (Status.INPUT_REQUIRED, Status.WORKING) in moves
        assert moves[-1][1] is Status.COMPLETED

    anyio.run(read)
