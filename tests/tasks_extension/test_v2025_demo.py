"""``keel demo --protocol 2025-11-25`` end to end: the real command, a real ``keel serve``
SIGKILLed and restarted while the task waits, the question asked through
``elicitation/create`` on ``tasks/result`` after the restart, and the seed's injected
root cause as the conclusion."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from acceptance.test_demo import in_order
from keel.cli.demo import DEMO_INCIDENT, DEMO_SERVICE
from keel.model import Status
from keel.store import SqliteStore

pytestmark = pytest.mark.slow
KEEL = Path(sys.executable).parent / "keel"

MOMENTS = [
    r"over MCP 2025-11-25",
    r"starting keel serve \(Incident Bridge, pid (\d+)\)",
    r"initialize at protocol 2025-11-25",
    r"tools/call diagnose_root_cause \{incident_id: INC-2026-0142\}, params.task",
    r"task (\S+): working \(durable handle",
    r"input_required: .*Which service",
    r"routine deploy: SIGKILL keel serve \(pid (\d+)\) while the task waits",
    r"restarting keel serve \(pid (\d+)\)",
    r"after the restart, tasks/get \S+: input_required",
    r"tasks/result \S+ \(blocks until the task ends\)",
    r"elicitation/create for task (\S+): '.*Which service",
    r"answer: service = 'payments'",
    r"task \S+: completed",
    r"^Conclusion: ",
    r"^Citations \(\d+\):",
]


@pytest.mark.requirement("K22")
def test_keel_demo_over_2025_11_25_plays_the_incident_to_the_injected_cause(
    tmp_path: Path,
) -> None:
    """Every moment in order, one task id throughout (the question names it), a new
    server process after the kill, and the stored task completed with the answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    result = subprocess.run(
        [str(KEEL), "demo", "--protocol", "2025-11-25", "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    found = in_order(out, MOMENTS)
    assert found[1].group(1) == found[6].group(1) != found[7].group(1)
    task_id = found[4].group(1)
    assert found[10].group(1) == task_id

    truth = json.loads((tmp_path / "data" / "bridge" / "ground-truth.json").read_text())
    [seed] = [i for i in truth["incidents"] if i["incident_id"] == DEMO_INCIDENT]
    conclusion = re.search(r"^Conclusion: (.*)$", out, re.MULTILINE)
    assert conclusion is not None
    assert seed["deploy_id"] in conclusion.group(1)
    assert seed["root_service"] in conclusion.group(1)

    async def read() -> None:
        store = SqliteStore(tmp_path / "data" / "keel.db")
        try:
            task = await store.get(task_id)
            history = await store.history(task_id)
        finally:
            await store.close()
        assert task.status is Status.COMPLETED
        assert task.input_responses == {"service": {"service": DEMO_SERVICE}}
        moves = [(e.from_status, e.to_status) for e in history if e.from_status != e.to_status]
        assert (Status.INPUT_REQUIRED, Status.WORKING) in moves
        assert moves[-1][1] is Status.COMPLETED

    anyio.run(read)
