"""Unit: the row codec every adapter shares (keel.store.rows). Pure."""

from __future__ import annotations

import dataclasses

import pytest

from keel.model import Event, InputRequest, Status, Task
from keel.model.drafts import draft_class
from keel.model.machine import replace
from keel.model.task import task_of
from keel.model.validation import normalize
from keel.store.rows import compact_json, task_from_row, task_reader, task_to_row


def _every_field_set() -> Task:
    return Task(
        task_id="t-1",
        status=Status.FAILED,
        owner="alice",
        name="build",
        arguments={"n": 1},
        created_at=1.0,
        updated_at=2.0,
        status_message="boom",
        input_requests={"ok": InputRequest("Proceed?", {"type": "boolean"})},
        input_responses={"ok": True},
        result=[1, "two"],
        error={"code": -32603, "message": "boom"},
        idempotency_key="key",
        attempt=3,
        max_attempts=4,
        lease_owner="w1",
        lease_expires_at=5.0,
        fence=6,
        ready_at=7.0,
        ttl=8.0,
        closed_fence=9,
        request_digest="digest",
        trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        claimed_at=10.0,
    )


def _fields(task: Task) -> dict[str, object]:
    return {f.name: getattr(task, f.name) for f in dataclasses.fields(Task)}


def test_task_of_builds_the_task_its_init_builds() -> None:
    """task_of (no __init__: slot stores, then __class__) sets every field, in order, and
    gives a real Task: equal, hashable like one, frozen."""
    task = _every_field_set()
    values = [getattr(task, f.name) for f in dataclasses.fields(Task)]
    built = task_of(values)
    assert type(built) is Task
    assert built == task
    assert _fields(built) == _fields(task)
    assert repr(built) == repr(task)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.status = Status.WORKING  # type: ignore[misc]
    with pytest.raises(ValueError, match="not enough values"):
        task_of(values[:-1])  # a field left out is an error, never an unset slot


def test_a_draft_becomes_only_a_class_of_its_own_layout() -> None:
    """The layout check that keel.model.drafts relies on: a draft of Event's slots
    cannot become a Task."""
    draft = draft_class(Event)()
    with pytest.raises(TypeError, match="layout differs"):
        draft.__class__ = Task


def test_replace_changes_the_named_fields_only() -> None:
    """machine.replace is dataclasses.replace without __init__: the same Task, the
    original untouched, an unknown field refused."""
    task = _every_field_set()
    before = _fields(task)
    moved = replace(task, status=Status.COMPLETED, lease_owner=None, closed_fence=6)
    assert moved == dataclasses.replace(
        task, status=Status.COMPLETED, lease_owner=None, closed_fence=6
    )
    assert _fields(task) == before
    with pytest.raises(KeyError):
        replace(task, no_such_field=1)


def test_a_row_decodes_to_every_field_it_was_encoded_from() -> None:
    task = _every_field_set()
    assert {f.name: getattr(task, f.name) for f in dataclasses.fields(Task)} == {
        f.name: getattr(task_from_row(task_to_row(task)), f.name) for f in dataclasses.fields(Task)
    }


def test_a_driver_tuple_decodes_like_the_mapping_of_its_columns() -> None:
    """task_reader finds each column by name: any order, columns beyond the task's (the
    table's ``seq``, ``expires_at``) ignored."""
    row = {"seq": 42, **task_to_row(_every_field_set())}
    columns = sorted(row, reverse=True)
    read = task_reader(columns)
    assert read(tuple(row[c] for c in columns)) == task_from_row(row) == _every_field_set()


def test_a_just_normalized_result_is_stored_as_the_text_it_was_normalized_from() -> None:
    text, result = normalize(
        {"content": [{"type": "text", "text": "é"}]}, "result", 1 << 20, keep_text=True
    )
    row = task_to_row(dataclasses.replace(_every_field_set(), result=result))
    assert row["result"] == text == compact_json(result)
    # Handed out once: a second encoding of the same copy encodes it afresh, to the same text.
    assert task_to_row(dataclasses.replace(_every_field_set(), result=result))["result"] == text
