"""Unit: the seed-compatible blocking TaskStore, including the seed's injections 8A-8E."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel import (
    InputRejected,
    InvalidPayload,
    InvalidTransition,
    Reclaimed,
    Status,
    TaskAlreadyTerminal,
    TaskNotFound,
    TaskSnapshot,
    TaskStore,
    UnstorableText,
)
from keel.model import DEFAULT_INPUT_KEY, INTERNAL_ERROR
from keel.store import ENV_VAR, MemoryStore, SqliteStore

SCHEMA = {"type": "object", "required": ["service"]}


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    """No test here sees a KEEL_STORE from the environment it runs in."""
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """Where the facade's SQLite file lives."""
    return tmp_path / "tasks.db"


@pytest.fixture
def store(path: Path, clock) -> Iterator[TaskStore]:
    """A facade on a SQLite file, on the fake clock; closed afterwards."""
    with TaskStore(path, clock=clock) as store:
        yield store


# --- the seed's failure injections ------------------------------------------------------


def test_8a_same_idempotency_key_returns_the_same_task(store):
    """8A: the same key twice gives the same task_id and no second task."""
    first = store.create(SCHEMA, idempotency_key="incident-1")
    again = store.create(SCHEMA, idempotency_key="incident-1")
    assert again.task_id == first.task_id
    assert again.status is Status.INPUT_REQUIRED
    assert [t.task_id for t in store.list()] == [first.task_id]


def test_8b_input_to_a_working_task_is_refused_naming_its_status(store):
    """8B: provide_input on a working task raises, saying it is working."""
    working = store.create()
    with pytest.raises(InvalidTransition, match="task is not waiting for input: working") as info:
        store.provide_input(working.task_id, {"service": "payments"})
    assert not isinstance(info.value, TaskAlreadyTerminal)
    assert store.get(working.task_id).status is Status.WORKING


def test_8c_complete_twice_keeps_the_first_result_and_says_so(store):
    """8C: a second complete raises with the real outcome; the first result stands."""
    task = store.create()
    first = store.complete(task.task_id, {"summary": "no active incident"})
    with pytest.raises(TaskAlreadyTerminal) as info:
        store.complete(task.task_id, {"summary": "rewritten!"})
    assert info.value.task.result == {"summary": "no active incident"}
    assert info.value.status == "completed"
    assert store.get(task.task_id) == first


def test_8c_exact_repeat_of_complete_returns_the_snapshot(store, clock):
    """8C: retrying the very same completion is safe and returns the stored snapshot."""
    task = store.create()
    first = store.complete(task.task_id, {"summary": "ok"})
    clock.advance(5)
    again = store.complete(task.task_id, {"summary": "ok"})
    assert again == first
    assert again.updated_at == first.updated_at
    assert len(store.history(task.task_id)) == 2


def test_8d_cancel_after_complete_answers_like_8c(store):
    """8D: cancel after completed raises the same TaskAlreadyTerminal; it stays completed."""
    task = store.create()
    store.complete(task.task_id, {"summary": "ok"})
    with pytest.raises(TaskAlreadyTerminal, match="already completed") as info:
        store.cancel(task.task_id)
    assert info.value.task.status is Status.COMPLETED
    assert store.get(task.task_id).status is Status.COMPLETED


def test_8e_unknown_handle_is_an_explicit_error(store):
    """8E: an unknown id raises TaskNotFound 'unknown task: no-such-task', never None."""
    with pytest.raises(TaskNotFound) as info:
        store.get("no-such-task")
    assert str(info.value) == "unknown task: no-such-task"
    assert isinstance(info.value, LookupError)


# --- the seed's example 07 and the incident ---------------------------------------------


def test_example_07_two_instances_on_one_file(path):
    """Example 07: a second TaskStore on the same file restores, resumes and completes."""
    with TaskStore(path) as first:
        task = first.create({"type": "object", "required": ["service"]}, "incident-1")
        with TaskStore(path) as second:
            restored = second.get(task.task_id)
            assert (restored.task_id, restored.status) == (task.task_id, Status.INPUT_REQUIRED)
            assert restored.input_schema == {"type": "object", "required": ["service"]}
            resumed = second.provide_input(task.task_id, {"service": "payments"})
            assert resumed.status is Status.WORKING
            done = second.complete(task.task_id, {"summary": "deploy 42 broke payments"})
            assert done.status is Status.COMPLETED
        assert first.get(task.task_id) == done


def test_a_waiting_task_survives_closing_the_store(path):
    """The incident: a task waiting at minute seven is still there after a restart."""
    with TaskStore(path) as before_deploy:
        task = before_deploy.create(SCHEMA, idempotency_key="incident-1")
    with TaskStore(path) as after_deploy:
        assert after_deploy.get(task.task_id).status is Status.INPUT_REQUIRED
        again = after_deploy.create(SCHEMA, idempotency_key="incident-1")
        assert again.task_id == task.task_id


def test_default_store_is_a_file_under_the_cwd(tmp_path, monkeypatch):
    """TaskStore() opens keel-data/keel.db under the cwd, never a memory dict."""
    monkeypatch.chdir(tmp_path)
    with TaskStore() as store:
        task = store.create(SCHEMA)
        assert isinstance(store.store, SqliteStore)
        assert store.location.kind == "sqlite"
    assert (tmp_path / "keel-data" / "keel.db").is_file()
    with TaskStore(tmp_path / "keel-data" / "keel.db") as again:
        assert again.get(task.task_id).status is Status.INPUT_REQUIRED


def test_default_store_follows_keel_store(tmp_path, monkeypatch):
    """TaskStore() with $KEEL_STORE set opens that location."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_VAR, f"sqlite:///{tmp_path}/env.db")
    with TaskStore() as store:
        store.create()
    assert (tmp_path / "env.db").is_file()
    assert not (tmp_path / "keel-data").exists()


def test_memory_is_an_explicit_choice():
    """TaskStore("memory://") is in memory, and says so."""
    with TaskStore("memory://") as store:
        assert isinstance(store.store, MemoryStore)
        assert "lost" in store.location.describe()


# --- the seed's exercise: reclaim -------------------------------------------------------


def test_reclaim_fails_stale_tasks_and_leaves_completed_ones(store, clock):
    """The exercise: a task past the timeout is failed with an explanation; completed stays."""
    stale = store.create(SCHEMA)
    done = store.create()
    done = store.complete(done.task_id, {"ok": True})
    clock.advance(700)
    fresh = store.create()
    [why] = store.reclaim(timeout_seconds=600)
    assert isinstance(why, Reclaimed)
    assert (why.task_id, why.previous_status, why.idle_seconds) == (
        stale.task_id,
        Status.INPUT_REQUIRED,
        700.0,
    )
    assert "700" in why.reason
    got = store.get(stale.task_id)
    assert got.status is Status.FAILED
    assert got.error == {"code": INTERNAL_ERROR, "message": why.reason}
    assert store.get(done.task_id) == done
    assert store.get(fresh.task_id).status is Status.WORKING


# --- the snapshot and the rest of the API -----------------------------------------------


def test_snapshot_has_the_seeds_fields(store, clock):
    """A snapshot carries task_id, status, schema, value, result, key and times."""
    created = store.create(SCHEMA, idempotency_key="k")
    assert isinstance(created, TaskSnapshot)
    assert (created.input_schema, created.input_value, created.result) == (SCHEMA, None, None)
    assert created.idempotency_key == "k"
    assert created.created_at == created.updated_at == clock.now
    assert created.status_message == "input required: service"
    assert created.task.name is None, "facade tasks are never claimed by a worker"
    assert set(created.task.input_requests) == {DEFAULT_INPUT_KEY}
    clock.advance(3)
    answered = store.provide_input(created.task_id, {"service": "payments"})
    assert answered.input_value == {"service": "payments"}
    assert answered.updated_at == clock.now
    done = store.complete(created.task_id, {"summary": "x"})
    assert done.result == {"summary": "x"}


def test_schema_description_becomes_the_message(store):
    """The schema's description (or an explicit message) is what the task asks."""
    described = store.create({"type": "object", "description": "Which service?"})
    assert described.status_message == "Which service?"
    explicit = store.create(SCHEMA, message="Name the service")
    assert explicit.status_message == "Name the service"


def test_invalid_input_is_rejected_and_changes_nothing(store):
    """Input violating the schema raises InputRejected naming the field; the task waits on."""
    task = store.create(SCHEMA)
    with pytest.raises(InputRejected) as info:
        store.provide_input(task.task_id, {"team": "sre"})
    assert info.value.path == "service"
    assert store.get(task.task_id) == task


@pytest.mark.parametrize("bad", ["pay\x00ments", "pay\ud800"], ids=["nul", "lone-surrogate"])
def test_unstorable_text_in_input_is_refused_naming_the_field(store, bad):
    """Input holding NUL or a lone surrogate: UnstorableText naming the field, the task
    unchanged and still waiting; a task id holding one is an unknown task."""
    task = store.create(SCHEMA)
    with pytest.raises(UnstorableText) as info:
        store.provide_input(task.task_id, {"service": bad})
    assert info.value.field == f"input.{DEFAULT_INPUT_KEY}.service"
    assert store.get(task.task_id) == task
    with pytest.raises(TaskNotFound):
        store.provide_input(bad, {"service": "payments"})


def test_invalid_schema_is_refused(store):
    """create() with an invalid JSON Schema raises InvalidPayload and stores nothing."""
    with pytest.raises(InvalidPayload):
        store.create({"type": "not-a-type"})
    assert store.list() == []


def test_fail_with_a_message_stores_a_json_rpc_error(store):
    """fail(id, "message") stores {code: -32603, message}."""
    task = store.create()
    failed = store.fail(task.task_id, "the upstream is down")
    assert failed.status is Status.FAILED
    assert failed.error == {"code": INTERNAL_ERROR, "message": "the upstream is down"}


def test_fail_with_an_object_keeps_its_code_and_data(store):
    """fail(id, {message, code, data}) keeps what it is given."""
    task = store.create()
    error = {"message": "quota", "code": -32001, "data": {"retry_after": 60}}
    assert store.fail(task.task_id, error).error == error


@pytest.mark.parametrize("error", [42, {"code": 1}, {"message": ""}], ids=str)
def test_fail_with_a_malformed_error_is_refused(store, error):
    """fail with a non-message, or an object without a usable message, raises InvalidPayload."""
    task = store.create()
    with pytest.raises(InvalidPayload):
        store.fail(task.task_id, error)
    assert store.get(task.task_id).status is Status.WORKING


def test_cancel_records_the_reason(store):
    """cancel(id, reason) ends the task and the history says why and by whom."""
    task = store.create(SCHEMA)
    cancelled = store.cancel(task.task_id, reason="duplicate incident")
    assert cancelled.status is Status.CANCELLED
    event = store.history(task.task_id)[-1]
    assert event.actor == "facade"
    assert "duplicate incident" in event.reason


def test_list_filters_by_status_given_as_text(store, clock):
    """list("completed") works like list(Status.COMPLETED)."""
    a = store.create()
    clock.advance(1)
    store.create()
    store.complete(a.task_id, 1)
    assert [t.task_id for t in store.list("completed")] == [a.task_id]
    assert len(store.list()) == 2


def test_purge_removes_expired_finished_tasks(store, clock):
    """purge() deletes finished tasks whose ttl ran out, and returns their ids."""
    task = store.create(ttl=10)
    store.complete(task.task_id, 1)
    clock.advance(11)
    assert store.purge() == [task.task_id]
    with pytest.raises(TaskNotFound):
        store.get(task.task_id)


def test_close_twice_is_safe(path):
    """close() may be called twice."""
    store = TaskStore(path)
    store.close()
    store.close()
