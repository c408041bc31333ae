"""The teaching-store importer: every field survives, and a bad file imports nothing.

Runs over every store adapter (the ``store`` fixture), plus the facade on a SQLite file.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from keel import ImportFailed, Status, TaskStore
from keel.model import DEFAULT_INPUT_KEY
from keel.store import SqliteStore, Store
from keel.store.importer import (
    FAILED_BEFORE_IMPORT,
    import_file,
    parse_teaching_store,
    read_teaching_file,
)

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}
NOW = 1_800_000_000.0


@dataclass
class TeachingSnapshot:
    """The seed's ``TaskSnapshot``, with the exercise's ``updated_at``."""

    task_id: str
    status: str = "working"
    input_schema: dict[str, Any] | None = None
    input_value: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    idempotency_key: str | None = None
    updated_at: float | None = field(default=None)


def every_status() -> dict[str, TeachingSnapshot]:
    """One teaching task per status, in the shapes the teaching store produces them."""
    tasks = [
        TeachingSnapshot("t-working", "working", idempotency_key="k-working", updated_at=NOW - 50),
        TeachingSnapshot(
            "t-waiting", "input_required", SCHEMA, idempotency_key="incident-1", updated_at=NOW - 40
        ),
        TeachingSnapshot(
            "t-answered", "working", SCHEMA, {"service": "payments"}, updated_at=NOW - 30
        ),
        TeachingSnapshot(
            "t-done",
            "completed",
            SCHEMA,
            {"service": "payments"},
            {"summary": "deploy d-1 broke payments", "citations": ["deploys/d-1"]},
            "incident-2",
            NOW - 20,
        ),
        TeachingSnapshot("t-failed", "failed", SCHEMA, updated_at=NOW - 10),
        TeachingSnapshot("t-cancelled", "cancelled", idempotency_key="k-cancel", updated_at=NOW),
    ]
    return {t.task_id: t for t in tasks}


def save(path: Path, tasks: dict[str, Any]) -> Path:
    """Write a file exactly as the teaching store's ``_save()`` did."""
    payload = {k: asdict(v) if isinstance(v, TeachingSnapshot) else v for k, v in tasks.items()}
    path.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


async def everything(store: Store) -> list[Any]:
    """Every task with its history: what "store unchanged" compares."""
    return [(t, tuple(await store.history(t.task_id))) for t in await store.list(limit=10_000)]


async def test_every_status_round_trips_without_loss(store, tmp_path):
    """Each teaching field lands in the Keel task verbatim, for every status."""
    source = every_status()
    report = await import_file(store, save(tmp_path / "tasks.json", source), now=NOW + 99)
    assert len(report.tasks) == len(source)
    for task_id, teaching in source.items():
        task = await store.get(task_id)
        assert task.status is Status(teaching.status)
        assert task.idempotency_key == teaching.idempotency_key
        assert task.result == teaching.result
        assert task.updated_at == teaching.updated_at
        assert task.created_at == teaching.updated_at
        assert task.name is None
        assert task.arguments == {}
        assert task.lease_owner is None
        if teaching.input_schema is None:
            assert task.input_requests == {}
        else:
            assert task.input_requests[DEFAULT_INPUT_KEY].schema == teaching.input_schema
            assert task.input_requests[DEFAULT_INPUT_KEY].message == "input required: service"
        if teaching.input_value is None:
            assert DEFAULT_INPUT_KEY not in task.input_responses
        else:
            assert task.input_responses[DEFAULT_INPUT_KEY] == teaching.input_value
        history = await store.history(task_id)
        assert [(e.from_status, e.to_status) for e in history] == [(None, task.status)]


async def test_waiting_task_can_be_answered_after_import(store, tmp_path):
    """An imported input_required task still asks, validates and resumes."""
    await import_file(store, save(tmp_path / "tasks.json", every_status()))
    waiting = await store.get("t-waiting")
    assert list(waiting.pending_input) == [DEFAULT_INPUT_KEY]
    assert waiting.status_message == "input required: service"
    answered = await store.provide_input("t-waiting", {DEFAULT_INPUT_KEY: {"service": "payments"}})
    assert answered.status is Status.WORKING


async def test_imported_keys_still_deduplicate(store, tmp_path):
    """After import, creating with a teaching idempotency key returns the imported task."""
    await import_file(store, save(tmp_path / "tasks.json", every_status()))
    again = await store.create(
        idempotency_key="incident-1",
        input_requests={DEFAULT_INPUT_KEY: (await store.get("t-waiting")).input_requests["input"]},
    )
    assert again.task_id == "t-waiting"


async def test_failed_task_gets_a_synthesized_error_and_says_so(store, tmp_path):
    """A failed teaching task had no error; Keel stores a -32603 one and a note."""
    report = await import_file(store, save(tmp_path / "tasks.json", every_status()))
    failed = await store.get("t-failed")
    assert failed.error == FAILED_BEFORE_IMPORT
    assert failed.error["code"] == -32603
    assert "failed before import" in (failed.status_message or "")
    assert any("t-failed" in note and "synthesized" in note for note in report.notes)


def test_facade_snapshots_match_the_source(tmp_path):
    """Through the seed-compatible facade, every TaskSnapshot field equals the source."""
    import anyio

    path = tmp_path / "keel.db"
    source = every_status()

    async def run() -> None:
        store = SqliteStore(path)
        try:
            await import_file(store, save(tmp_path / "tasks.json", source))
        finally:
            await store.close()

    anyio.run(run)
    with TaskStore(path) as facade:
        for task_id, teaching in source.items():
            snap = facade.get(task_id)
            assert snap.task_id == teaching.task_id
            assert snap.status == teaching.status
            assert snap.input_schema == teaching.input_schema
            assert snap.input_value == teaching.input_value
            assert snap.result == teaching.result
            assert snap.idempotency_key == teaching.idempotency_key
            assert snap.updated_at == teaching.updated_at


async def test_truncated_file_imports_nothing(store, tmp_path):
    """The teaching store's crash mid-rewrite (half the bytes) is refused; store unchanged."""
    existing = await store.create(idempotency_key="already-here")
    before = await everything(store)
    path = save(tmp_path / "tasks.json", every_status())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImportFailed) as info:
        await import_file(store, path)
    message = str(info.value)
    assert str(path) in message
    assert "line " in message
    assert "column " in message
    assert await everything(store) == before
    assert (await store.get(existing.task_id)).task_id == existing.task_id


def bad_files() -> list[Any]:
    """Malformed files, each with a fragment its error message must contain."""
    good = {k: asdict(v) for k, v in every_status().items()}

    def with_task(key: str, **changes: Any) -> dict[str, Any]:
        return {**good, key: {**good.get(key, {"task_id": key}), **changes}}

    return [
        pytest.param(
            '{\n  "a": {"task_id": "a" "status": 1}\n}',
            "line 2 column 24: Expecting ',' delimiter",
            id="syntax",
        ),
        pytest.param("", "empty", id="empty"),
        pytest.param(json.dumps([1, 2]), "not an array", id="top-level-array"),
        pytest.param(
            json.dumps(with_task("t-done", status="done")),
            "task 't-done': status 'done' is not one of",
            id="unknown-status",
        ),
        pytest.param(
            json.dumps(with_task("t-done", task_id="other")),
            "task_id field is 'other'",
            id="key-mismatch",
        ),
        pytest.param(
            json.dumps(with_task("t-done", idempotency_key="incident-1")),
            "idempotency key 'incident-1' is used by both",
            id="duplicate-idempotency-key",
        ),
        pytest.param(
            json.dumps(with_task("t-done", owner="x")), "unknown field(s) 'owner'", id="extra-field"
        ),
        pytest.param(
            json.dumps(with_task("t-x", status="input_required")),
            "no input_schema",
            id="waiting-without-schema",
        ),
        pytest.param(
            json.dumps(with_task("t-waiting", input_value={"service": "x"})),
            "input_value is already set",
            id="waiting-but-answered",
        ),
        pytest.param(
            json.dumps(with_task("t-done", input_schema={"type": "nope"})),
            "not a valid JSON Schema",
            id="invalid-schema",
        ),
        pytest.param(
            json.dumps(with_task("t-done", input_schema=[1])),
            "JSON object or null",
            id="schema-list",
        ),
        pytest.param(
            json.dumps({**good, "t-y": "working"}), "must be a JSON object", id="not-object"
        ),
        pytest.param(
            json.dumps(with_task("t-done", updated_at="yesterday")),
            "not an ISO 8601 time",
            id="bad-time",
        ),
        pytest.param(
            json.dumps(with_task("t-done", result=math.nan)), "NaN is not a JSON number", id="nan"
        ),
        pytest.param(
            '{"a": {"task_id": "a", "status": "working"}, '
            '"a": {"task_id": "a", "status": "failed"}}',
            "key 'a' appears twice",
            id="duplicate-json-key",
        ),
        pytest.param(
            json.dumps(with_task("t-done", idempotency_key="")),
            "idempotency_key must be a non-empty string",
            id="empty-key",
        ),
        # Text no store can hold, named by task, field and place (json.dumps writes a lone
        # surrogate as the escape \udc80, a NUL as \u0000: the file itself is clean UTF-8).
        pytest.param(
            json.dumps(with_task("t-done", result={"note": ["ok", "\udc80"]})),
            "task 't-done': result.note[1]: the lone surrogate U+DC80 at index 0",
            id="surrogate-in-result",
        ),
        pytest.param(
            json.dumps(with_task("t-done", result="a\x00b")),
            "task 't-done': result: NUL (U+0000) at index 1 cannot be stored",
            id="nul-in-result",
        ),
        pytest.param(
            json.dumps(with_task("t-answered", input_value={"\ud800": 1})),
            "task 't-answered': input_value[\"\\ud800\"]: the key itself",
            id="surrogate-in-a-key",
        ),
        pytest.param(
            json.dumps({"n\x00": {"task_id": "n\x00", "status": "working"}}),
            "the task id: NUL (U+0000) at index 1 cannot be stored",
            id="nul-in-task-id",
        ),
        pytest.param(
            json.dumps(with_task("t-done", idempotency_key="k\udcff")),
            "task 't-done': idempotency_key: the lone surrogate U+DCFF at index 1",
            id="surrogate-in-idempotency-key",
        ),
        pytest.param(
            json.dumps(with_task("t-done", result=nested(65))),
            "task 't-done': result nests deeper than 64 levels",
            id="result-nested-65-deep",
        ),
        pytest.param(
            "[" * 100_000 + "]" * 100_000,
            "the file nests deeper than 64 levels",
            id="file-100k-deep",
        ),
        pytest.param(
            json.dumps(with_task("t-done", updated_at=1e308)),
            "task 't-done': updated_at 1e+308 is not a time from 1970 to 9999",
            id="updated-at-1e308",
        ),
        pytest.param(
            json.dumps(with_task("t-done", updated_at=10**400)),
            "task 't-done': updated_at 1000000000000000000000000000000000000000… (401 characters)",
            id="updated-at-400-digits",
        ),
        pytest.param(
            json.dumps(with_task("t-done", created_at=-1)),
            "created_at -1 is not a time from 1970 to 9999",
            id="created-at-negative",
        ),
        pytest.param(
            json.dumps(with_task("t-done", updated_at=253_402_300_800)),
            "updated_at 253402300800 is not a time from 1970 to 9999",
            id="updated-at-year-10000",
        ),
        pytest.param(
            json.dumps(with_task("t-done", created_at="0001-01-01T00:00:00+00:00")),
            "created_at '0001-01-01T00:00:00+00:00' is not",
            id="created-at-year-1",
        ),
    ]


def nested(depth: int) -> Any:
    """A list nested ``depth`` deep: ``[[[…]]]``."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(("text", "fragment"), bad_files())
async def test_malformed_file_imports_nothing(store, tmp_path, text, fragment):
    """A file with any problem raises ImportFailed naming the file and the problem."""
    await store.create(idempotency_key="already-here")
    before = await everything(store)
    path = tmp_path / "tasks.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ImportFailed) as info:
        await import_file(store, path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)
    assert await everything(store) == before


async def test_every_problem_is_reported(tmp_path):
    """Problems in several tasks are all collected, not just the first."""
    tasks = {
        "a": {"task_id": "a", "status": "done"},
        "b": {"task_id": "x", "status": "working"},
    }
    with pytest.raises(ImportFailed) as info:
        read_teaching_file(save(tmp_path / "t.json", tasks))
    assert len(info.value.problems) == 2
    assert "task 'a'" in info.value.problems[0]
    assert "task 'b'" in info.value.problems[1]


async def test_ids_already_in_the_store_import_nothing(store, tmp_path):
    """Importing the same file twice fails the second time and adds nothing."""
    path = save(tmp_path / "tasks.json", every_status())
    await import_file(store, path)
    before = await everything(store)
    with pytest.raises(ImportFailed) as info:
        await import_file(store, path)
    assert str(path) in str(info.value)
    assert "already exists" in str(info.value)
    assert await everything(store) == before


async def test_key_already_bound_in_the_store_imports_nothing(store, tmp_path):
    """A teaching idempotency key already bound to a Keel task refuses the whole file."""
    await store.create(idempotency_key="incident-1")
    before = await everything(store)
    with pytest.raises(ImportFailed, match="incident-1"):
        await import_file(store, save(tmp_path / "tasks.json", every_status()))
    assert await everything(store) == before


def test_missing_and_undecodable_files_are_import_failures(tmp_path):
    """A missing file or bytes that are not UTF-8 are ImportFailed, naming the file."""
    with pytest.raises(ImportFailed, match="cannot read the file"):
        read_teaching_file(tmp_path / "missing.json")
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"\xe9": 1}')
    with pytest.raises(ImportFailed, match="not UTF-8"):
        read_teaching_file(path)


def test_storable_limits_themselves_are_accepted(tmp_path):
    """JSON nested exactly 64 deep, and times at the ends of the range, import."""
    tasks = {
        "a": {"task_id": "a", "status": "completed", "result": nested(64), "created_at": 0},
        "b": {"task_id": "b", "status": "completed", "updated_at": 253_402_300_799.0},
        "c": {"task_id": "c", "status": "completed", "updated_at": "9999-12-31T00:00:00+00:00"},
    }
    report = parse_teaching_store(json.dumps(tasks), now=NOW)
    assert [t.task_id for t in report.tasks] == ["a", "b", "c"]
    assert report.tasks[0].result == nested(64)


def test_times_in_seconds_or_iso_8601():
    """updated_at may be epoch seconds or ISO 8601 (naive: local time); created_at too."""
    text = json.dumps(
        {
            "a": {"task_id": "a", "status": "working", "updated_at": 1234.5},
            "b": {"task_id": "b", "status": "working", "updated_at": "2026-11-30T10:00:00+00:00"},
            "c": {"task_id": "c", "status": "working", "updated_at": "2026-11-30T10:00:00"},
            "d": {"task_id": "d", "status": "working", "created_at": 10, "updated_at": 20},
        }
    )
    tasks = {t.task_id: t for t in parse_teaching_store(text, now=NOW).tasks}
    assert tasks["a"].updated_at == tasks["a"].created_at == 1234.5
    assert tasks["b"].updated_at == datetime.fromisoformat("2026-11-30T10:00:00+00:00").timestamp()
    assert tasks["c"].updated_at == datetime.fromisoformat("2026-11-30T10:00:00").timestamp()
    assert (tasks["d"].created_at, tasks["d"].updated_at) == (10, 20)


async def test_tasks_without_times_keep_the_file_order(store):
    """Without timestamps, tasks are listed in the order the teaching store wrote them."""
    ids = ["zz", "aa", "mm"]
    text = json.dumps({i: {"task_id": i, "status": "working"} for i in ids})
    report = parse_teaching_store(text, now=NOW)
    await store.import_tasks(report.tasks)
    assert [t.task_id for t in await store.list()] == ids
    assert all(t.updated_at <= NOW for t in report.tasks)


def test_counts_by_status():
    """The report counts tasks per status, in status order."""
    report = parse_teaching_store(
        json.dumps({k: asdict(v) for k, v in every_status().items()}), now=NOW
    )
    assert report.counts() == {s: (2 if s is Status.WORKING else 1) for s in Status}


def test_an_empty_object_imports_nothing_and_is_fine():
    """``{}`` is a valid (empty) teaching store."""
    assert parse_teaching_store("{}", now=NOW).tasks == ()
