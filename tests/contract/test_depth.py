"""Contract: JSON nested deeper than MAX_DEPTH is refused alike on every adapter, in
every value a store keeps (arguments, input answers, results, errors, step values),
as InvalidPayload naming the field, and the store is left exactly as it was; a value
exactly at the bound is stored whole."""

from __future__ import annotations

from typing import Any

import pytest

from keel import InvalidPayload, Status
from keel.model.validation import MAX_DEPTH

from .support import ask, claimed, refused

pytestmark = pytest.mark.anyio


def nested(levels: int) -> Any:
    """``levels`` lists, one inside the other, around a number."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


TOO_DEEP = f"nests deeper than {MAX_DEPTH} levels"


@pytest.mark.parametrize("levels", [MAX_DEPTH, 100_000])
async def test_arguments_nested_too_deep_create_nothing(store: Any, levels: int) -> None:
    """An argument of MAX_DEPTH levels inside the arguments object (itself one level),
    or of 100,000: refused naming the argument, no task created."""
    error = await refused(
        store, InvalidPayload, lambda: store.create(name="job", arguments={"tree": nested(levels)})
    )
    assert str(error) == f"arguments.tree: {TOO_DEEP}"


async def test_a_value_at_the_bound_is_stored_whole(store: Any) -> None:
    """MAX_DEPTH levels in all (the arguments object and its argument): kept as given."""
    arguments = {"tree": nested(MAX_DEPTH - 1)}
    task = await store.create(name="job", arguments=arguments)
    assert (await store.get(task.task_id)).arguments == arguments


async def test_answers_nested_too_deep_are_refused_and_the_request_stays(store: Any) -> None:
    task = await store.create(input_requests={"svc": ask()})
    answers = {"svc": {"service": nested(MAX_DEPTH)}}
    error = await refused(store, InvalidPayload, lambda: store.provide_input(task.task_id, answers))
    assert str(error) == f"input.svc.service: {TOO_DEEP}"
    assert (await store.get(task.task_id)).status is Status.INPUT_REQUIRED


async def test_results_errors_and_steps_nested_too_deep_are_refused(store: Any) -> None:
    """A handler's writes: the result, an error's data, a step value; the task stays
    claimed, as before each refused write."""
    task = await claimed(store)
    fence = task.fence
    deep = nested(MAX_DEPTH + 1)
    writes = {
        "result": lambda: store.complete(task.task_id, {"rows": deep}, fence=fence),
        "step 'fetch'": lambda: store.save_step(task.task_id, "fetch", deep, fence=fence),
        "error": lambda: store.fail(
            task.task_id, {"code": 1, "message": "m", "data": deep}, fence=fence
        ),
    }
    for field, write in writes.items():
        error = await refused(store, InvalidPayload, write)
        assert str(error).startswith(field), (field, error)
        assert str(error).endswith(TOO_DEEP), (field, error)
