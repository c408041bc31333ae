"""Unit: task-transition logs (keel.telemetry.logs) — one line per committed transition,
with the task id, tool, attempt, worker and principal hash, never a payload.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from keel.model import InputRequest
from keel.store import MemoryStore
from keel.telemetry import Telemetry
from keel.telemetry.logs import JsonFormatter, principal_hash

pytestmark = pytest.mark.anyio

SECRET = "hunter2-do-not-log"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """What the keel.tasks logger writes, as JSON lines."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("keel.tasks")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_each_transition_is_logged_once_without_payloads(lines: io.StringIO) -> None:
    """create, claim, request input, answer, claim, complete: six lines, none of which
    holds the arguments, the answer or the result."""
    store = MemoryStore()
    Telemetry().attach(store)
    task = await store.create(name="job", arguments={"password": SECRET}, owner="alice")
    (claimed,) = await store.claim(["job"], worker="w1", lease_seconds=30)
    ask = InputRequest("Which?", {"type": "object"})
    await store.request_input(task.task_id, {"k": ask}, fence=claimed.fence)
    await store.provide_input(task.task_id, {"k": {"answer": SECRET}}, owner="alice")
    (again,) = await store.claim(["job"], worker="w2", lease_seconds=30)
    await store.complete(task.task_id, {"result": SECRET}, fence=again.fence)
    text = lines.getvalue()
    assert SECRET not in text
    records = [json.loads(line) for line in text.splitlines()]
    mine = [r for r in records if r["task_id"] == task.task_id]
    assert [(r["op"], r["from_status"], r["to_status"], r["worker"]) for r in mine] == [
        ("create", "-", "working", "(client)"),
        ("claim", "working", "working", "w1"),
        ("request_input", "working", "input_required", "w1"),
        ("provide_input", "input_required", "working", "(client)"),
        ("claim", "working", "working", "w2"),
        ("complete", "working", "completed", "w2"),
    ]
    assert {r["principal"] for r in mine} == {principal_hash("alice")}
    assert principal_hash("alice") != "alice"
    assert {r["tool"] for r in mine} == {"job"}
    assert [r["attempt"] for r in mine] == [1] * 6
    assert all(r["level"] == "info" and r["logger"] == "keel.tasks" for r in mine)
    await store.close()
