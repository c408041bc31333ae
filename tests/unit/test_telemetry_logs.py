"""Unit: task-transition logs (keel.telemetry.logs) — one line per committed transition,
with the task id, tool, attempt, worker and principal hash, never a payload unless
asked for (KEEL_LOG_PAYLOADS).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from keel.errors import ConfigurationError
from keel.model import InputRequest
from keel.store import MemoryStore
from keel.telemetry import Telemetry
from keel.telemetry.logs import (
    MAX_PAYLOAD_CHARS,
    PAYLOADS_VAR,
    JsonFormatter,
    payloads_asked,
    principal_hash,
)

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


async def test_each_transition_is_logged_once_without_payloads(
    lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create, claim, request input, answer, claim, complete: six lines, none of which
    holds the arguments, the answer or the result (payloads not asked for)."""
    monkeypatch.delenv(PAYLOADS_VAR, raising=False)
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


async def test_payloads_are_logged_only_when_asked_for(
    lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KEEL_LOG_PAYLOADS=on: the create carries its arguments, the answer its input, the
    completion its result and a failure its error, as JSON cut at MAX_PAYLOAD_CHARS;
    other lines carry none."""
    monkeypatch.setenv(PAYLOADS_VAR, "on")
    store = MemoryStore()
    Telemetry().attach(store)
    ask = InputRequest("Which?", {"type": "object"})
    task = await store.create(name="job", arguments={"note": SECRET}, input_requests={"k": ask})
    await store.provide_input(task.task_id, {"k": {"answer": "db"}})
    (claimed,) = await store.claim(["job"], worker="w1", lease_seconds=30)
    await store.complete(task.task_id, {"text": "x" * 3000}, fence=claimed.fence)
    failed = await store.create(name="job")
    await store.fail(failed.task_id, {"code": -32000, "message": "no"})
    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    payloads = [
        (r["op"], {k: r[k] for k in ("arguments", "input", "result", "error") if k in r})
        for r in records
    ]
    cut = json.dumps({"text": "x" * 3000}, separators=(",", ":"))[:MAX_PAYLOAD_CHARS] + "…"
    assert payloads == [
        ("create", {"arguments": f'{{"note":"{SECRET}"}}'}),
        ("provide_input", {"input": '{"k":{"answer":"db"}}'}),
        ("claim", {}),
        ("complete", {"result": cut}),
        ("create", {"arguments": "{}"}),
        ("fail", {"error": '{"code":-32000,"message":"no"}'}),
    ]
    await store.close()


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_payloads_setting_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """KEEL_LOG_PAYLOADS takes on/off (1/0, true/false, yes/no): anything else names it."""
    for off in ("", "off", "0", "No"):
        monkeypatch.setenv(PAYLOADS_VAR, off)
        assert payloads_asked() is False
    monkeypatch.setenv(PAYLOADS_VAR, value)
    with pytest.raises(ConfigurationError, match=PAYLOADS_VAR):
        Telemetry()
