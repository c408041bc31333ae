"""The registry: what ``Keel.task`` accepts, and ``submit`` checking arguments first."""

from __future__ import annotations

from typing import Any

import pytest

from keel.errors import ConfigurationError, InputRejected, KeelError
from keel.runtime import Keel, TaskContext, TaskOptions, Worker
from keel.store import Store

pytestmark = pytest.mark.anyio

ARGS_SCHEMA = {
    "type": "object",
    "required": ["incident_id"],
    "properties": {"incident_id": {"type": "string"}, "depth": {"type": "integer"}},
    "additionalProperties": False,
}


async def noop(ctx: TaskContext, **arguments: Any) -> None:
    """A handler that does nothing."""


async def test_options_are_stored_with_the_definition(store: Store) -> None:
    """Every option given to ``task`` (task_mode included) is kept on the definition."""
    app = Keel(store)

    @app.task(
        "diagnose",
        input_schema=ARGS_SCHEMA,
        task_mode="required",
        max_attempts=5,
        lease_seconds=12.0,
        deadline_seconds=3.0,
        ttl_seconds=60.0,
        retry_base=0.5,
        retry_cap=4.0,
    )
    async def diagnose(ctx: TaskContext, incident_id: str) -> str:
        """Find the root cause."""
        return incident_id

    options = app.definition("diagnose").options
    assert options.task_mode == "required"
    assert (options.max_attempts, options.lease_seconds, options.deadline_seconds) == (5, 12.0, 3.0)
    assert (options.ttl_seconds, options.retry_base, options.retry_cap) == (60.0, 0.5, 4.0)
    assert options.input_schema == ARGS_SCHEMA
    assert options.description == "Find the root cause."
    assert app.definition("diagnose").handler is diagnose


async def test_defaults_and_name_from_the_function(store: Store) -> None:
    """Without a name the function's name is used; task_mode defaults to optional."""
    app = Keel(store)
    app.task()(noop)
    assert list(app.tasks) == ["noop"]
    assert app.tasks["noop"].options.task_mode == "optional"
    assert app.tasks["noop"].options.max_attempts == 3


async def test_options_given_whole_with_overrides_by_keyword(store: Store) -> None:
    """``options=`` gives a TaskOptions whole; keywords override single fields of it."""
    app = Keel(store)
    shared = TaskOptions(max_attempts=5, lease_seconds=12.0, description="Shared.")
    app.task("a", shared)(noop)
    app.task("b", shared, max_attempts=1)(noop)
    a, b = app.definition("a").options, app.definition("b").options
    assert (a.max_attempts, a.lease_seconds, a.description) == (5, 12.0, "Shared.")
    assert (b.max_attempts, b.lease_seconds, b.description) == (1, 12.0, "Shared.")
    assert shared.max_attempts == 5  # the given options are not changed


async def test_an_unknown_override_is_a_type_error_naming_it(store: Store) -> None:
    """A keyword that is no TaskOptions field is refused at once, by name."""
    app = Keel(store)
    with pytest.raises(TypeError, match="max_attempt'"):
        app.task("t", max_attempt=2)
    assert app.tasks == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task_mode": "sometimes"}, "task_mode"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"input_schema": {"type": "no-such-type"}}, "input_schema"),
    ],
)
async def test_bad_options_are_refused(store: Store, options: dict[str, Any], message: str) -> None:
    """A bad option is a ConfigurationError (or schema error) naming it, at registration."""
    app = Keel(store)
    with pytest.raises(KeelError, match=message):
        app.task("t", **options)(noop)
    assert app.tasks == {}


async def test_duplicate_names_and_sync_handlers_are_refused(store: Store) -> None:
    """A name registered twice, or a handler that is not ``async def``, is refused."""
    app = Keel(store)
    app.task("t")(noop)
    with pytest.raises(ConfigurationError, match="registered twice"):
        app.task("t")(noop)

    def sync(ctx: TaskContext) -> None:
        """Not a coroutine function."""

    with pytest.raises(ConfigurationError, match="async def"):
        app.task("s")(sync)
    assert list(app.tasks) == ["t"]


async def test_invalid_arguments_create_no_task(store: Store) -> None:
    """Arguments that violate the schema raise InputRejected naming the field; nothing is stored."""
    app = Keel(store)
    app.task("diagnose", input_schema=ARGS_SCHEMA)(noop)
    with pytest.raises(InputRejected, match="depth") as info:
        await app.submit("diagnose", {"incident_id": "INC-1", "depth": "deep"})
    assert info.value.path == "depth"
    with pytest.raises(InputRejected, match="incident_id"):
        await app.submit("diagnose", {})
    with pytest.raises(InputRejected):
        await app.submit("diagnose", {"incident_id": "INC-1", "extra": 1})
    assert list(await store.list()) == []


async def test_valid_arguments_create_a_working_task(store: Store) -> None:
    """A valid submit stores a working task with the name, arguments and options' attempts."""
    app = Keel(store)
    app.task("diagnose", input_schema=ARGS_SCHEMA, max_attempts=4, ttl_seconds=90.0)(noop)
    task = await app.submit("diagnose", {"incident_id": "INC-1"}, owner="alice")
    stored = await store.get(task.task_id)
    assert stored.status.value == "working"
    assert (stored.name, stored.arguments, stored.owner) == (
        "diagnose",
        {"incident_id": "INC-1"},
        "alice",
    )
    assert (stored.max_attempts, stored.ttl, stored.lease_owner) == (4, 90.0, None)


async def test_submit_is_idempotent_by_key(store: Store) -> None:
    """The same idempotency key returns the same task instead of a second one."""
    app = Keel(store)
    app.task("t")(noop)
    first = await app.submit("t", {"n": 1}, idempotency_key="k")
    again = await app.submit("t", {"n": 1}, idempotency_key="k")
    assert again.task_id == first.task_id
    assert len(await store.list()) == 1


async def test_unknown_task_name_is_refused(store: Store) -> None:
    """Submitting a name the app does not register is a ConfigurationError; nothing is stored."""
    app = Keel(store)
    app.task("t")(noop)
    with pytest.raises(ConfigurationError, match="no task named 'nope'"):
        await app.submit("nope", {})
    assert list(await store.list()) == []


async def test_a_worker_needs_registered_tasks(store: Store) -> None:
    """A worker of an app without tasks refuses to run; concurrency must be >= 1."""
    with pytest.raises(KeelError, match="registers no tasks"):
        await Worker(Keel(store)).run()
    with pytest.raises(ValueError, match="concurrency"):
        Worker(Keel(store), concurrency=0)
