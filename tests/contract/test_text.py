"""Contract: text no store can keep is refused alike on every adapter (issue 15, item 1).

A lone surrogate (no UTF-8 form) or a NUL (PostgreSQL's text cannot hold it) in any
text a store would keep is refused as :class:`~keel.errors.UnstorableText` naming the
field, and the store is left exactly as it was; a task id holding one names no task
(TaskNotFound), on memory, SQLite and PostgreSQL the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from keel import Status, TaskNotFound, UnstorableText

from .support import JOB, LEASE, WORKER, ask, claimed, everything, refused

pytestmark = pytest.mark.anyio

SURROGATE = "\ud800"
NUL = "\x00"
BAD = [pytest.param(SURROGATE, id="lone-surrogate"), pytest.param(NUL, id="nul")]


def _ok(error: UnstorableText, field: str) -> None:
    assert error.field == field
    assert str(error).startswith(f"{field}: ")
    # The message itself is text every store, terminal and wire can carry.
    str(error).encode("utf-8")
    assert NUL not in str(error)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        pytest.param(lambda b: {"note": f"a{b}"}, "arguments.note", id="value"),
        pytest.param(lambda b: {"hosts": ["ok", b]}, "arguments.hosts[1]", id="in-a-list"),
        pytest.param(lambda b: {"a": {"b": b}}, "arguments.a.b", id="nested"),
        pytest.param(lambda b: {f"k{b}": 1}, "arguments[{key}]", id="key"),
    ],
)
async def test_arguments_with_unstorable_text_create_nothing(
    store: Any, bad: str, arguments: Any, field: str
) -> None:
    """Anywhere in the arguments, value or key: refused naming the field, nothing stored."""
    await store.create(name=JOB)  # a task already there must stay as it is
    args = arguments(bad)
    field = field.format(key='"k\\ud800"' if bad == SURROGATE else '"k\\u0000"')
    error = await refused(store, UnstorableText, lambda: store.create(name=JOB, arguments=args))
    _ok(error, field)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize(
    ("create", "field"),
    [
        pytest.param(lambda b: {"idempotency_key": f"key-{b}"}, "idempotency key", id="key"),
        pytest.param(lambda b: {"name": f"job{b}"}, "task name", id="name"),
        pytest.param(lambda b: {"owner": f"alice{b}"}, "owner", id="owner"),
        pytest.param(
            lambda b: {"input_requests": {"svc": ask(f"Which{b}?")}},
            "message of input request 'svc'",
            id="request-message",
        ),
    ],
)
async def test_keys_names_and_messages_with_unstorable_text_are_refused(
    store: Any, bad: str, create: Any, field: str
) -> None:
    """Idempotency keys, task names, owners, messages: the same refusal, named."""
    error = await refused(store, UnstorableText, lambda: store.create(**create(bad)))
    assert error.field.startswith(field.split(" '", maxsplit=1)[0])


@pytest.mark.parametrize("bad", BAD)
async def test_answers_with_unstorable_text_are_refused_and_the_request_stays(
    store: Any, bad: str
) -> None:
    """provide_input with such text in an answer: refused naming ``input.KEY.field``,
    nothing accepted (not even a good answer given with it); the task still waits."""
    task = await store.create(input_requests={"svc": ask(), "other": ask()})
    answers = {"other": {"service": "db"}, "svc": {"service": f"pay{bad}ments"}}
    error = await refused(store, UnstorableText, lambda: store.provide_input(task.task_id, answers))
    _ok(error, "input.svc.service")
    assert (await store.get(task.task_id)).status is Status.INPUT_REQUIRED


@pytest.mark.parametrize("bad", BAD)
async def test_a_new_tasks_answers_with_unstorable_text_create_nothing(
    store: Any, bad: str
) -> None:
    """Answers given with a new task (an MCP client's ask-first input): the same."""
    error = await refused(
        store,
        UnstorableText,
        lambda: store.create(
            input_requests={"svc": ask()}, input_responses={"svc": {"service": bad}}
        ),
    )
    _ok(error, "input.svc.service")


@pytest.mark.parametrize("bad", BAD)
async def test_results_steps_and_messages_with_unstorable_text_are_refused(
    store: Any, bad: str
) -> None:
    """A handler's writes too: result, step value, status message, error."""
    task = await claimed(store)
    fence = task.fence
    writes = {
        "result": lambda: store.complete(task.task_id, {"text": bad}, fence=fence),
        "step 'fetch'": lambda: store.save_step(task.task_id, "fetch", [bad], fence=fence),
        "status message": lambda: store.set_status_message(task.task_id, bad, fence=fence),
        "error": lambda: store.fail(task.task_id, {"code": 1, "message": bad}, fence=fence),
    }
    for field, write in writes.items():
        error = await refused(store, UnstorableText, write)
        assert error.field.startswith(field), (field, error)


async def test_an_escaped_backslash_before_u0000_is_ordinary_text(store: Any) -> None:
    """The six characters ``\\u0000`` (a backslash, not NUL) are stored like any text."""
    task = await store.create(arguments={"pattern": "\\u0000", "smile": "\U0001f600"})
    assert (await store.get(task.task_id)).arguments == {
        "pattern": "\\u0000",
        "smile": "\U0001f600",
    }


@pytest.mark.parametrize(
    "task_id", [pytest.param(f"a{NUL}b", id="nul"), pytest.param(SURROGATE, id="surrogate")]
)
async def test_a_task_id_no_store_can_hold_is_an_unknown_task(store: Any, task_id: str) -> None:
    """Every operation by id answers TaskNotFound for it, on every adapter alike (the id
    never reaches a driver); lists and status reads find nothing."""
    await claimed(store)
    before = await everything(store)
    calls = [
        lambda: store.get(task_id),
        lambda: store.history(task_id),
        lambda: store.steps(task_id),
        lambda: store.cancel(task_id),
        lambda: store.provide_input(task_id, {"svc": {"service": "x"}}),
        lambda: store.complete(task_id, "done", fence=1),
        lambda: store.renew(task_id, fence=1, lease_seconds=LEASE),
        lambda: store.save_step(task_id, "s", 1, fence=1),
    ]
    for call in calls:
        with pytest.raises(TaskNotFound) as info:
            await call()
        str(info.value).encode("utf-8")  # the message shows the id escaped
    assert await store.list(after=task_id) == []
    assert await store.list(owner=task_id) == []
    assert await store.statuses([task_id]) == {}
    assert await everything(store) == before
    assert [t.lease_owner for t in await store.list()] == [WORKER]
