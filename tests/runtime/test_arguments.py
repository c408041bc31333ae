"""``Keel.submit`` checks a task's arguments against what its handler takes (issue 15):
the one home every way in goes through (both MCP generations, the CLI, the Python API)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, Optional, Union

import pytest

from keel.errors import ArgumentsRejected, ConfigurationError, InputRejected
from keel.runtime import Keel, TaskContext, arguments
from keel.store import Store

pytestmark = pytest.mark.anyio

OPEN_SCHEMA = {"type": "object", "properties": {"incident_id": {"type": "string"}}}
"""Allows extra properties, and requires nothing."""


class Opaque:
    """A type pydantic has no JSON Schema for."""


async def refused(app: Keel, name: str, arguments: dict[str, Any], field: str) -> str:
    """Submit, expect ArgumentsRejected naming ``field``; nothing may be stored."""
    with pytest.raises(ArgumentsRejected) as info:
        await app.submit(name, arguments)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert list(await app.store.list()) == []
    return str(info.value)


async def test_an_argument_the_handler_does_not_take_is_refused(store: Store) -> None:
    """Even where the input_schema allows extra properties: the handler would raise
    TypeError on every attempt, so no task is made (the message lists what it takes)."""
    app = Keel(store)

    @app.task("diagnose", input_schema=OPEN_SCHEMA)
    async def diagnose(ctx: TaskContext, incident_id: str, depth: int = 1) -> None:
        """Takes two arguments."""

    message = await refused(
        app, "diagnose", {"incident_id": "INC-1", "bogus": 1}, "arguments.bogus"
    )
    assert message.endswith("takes no argument 'bogus' (it takes: incident_id, depth)")
    await refused(app, "diagnose", {"depth": 2}, "arguments.incident_id")  # needed, not required


async def test_without_an_input_schema_the_signature_is_checked(store: Store) -> None:
    """A handler's annotations are its schema, on the Python API as over MCP."""
    app = Keel(store)

    @app.task("quick")
    async def quick(
        ctx: TaskContext, n: int, mode: Literal["a", "b"] = "a", tags: list[str] | None = None
    ) -> None:
        """Typed arguments."""

    await refused(app, "quick", {"n": "twelve"}, "arguments.n")
    await refused(app, "quick", {"n": 1, "mode": "c"}, "arguments.mode")
    await refused(app, "quick", {"n": 1, "tags": ["x", 2]}, "arguments.tags[1]")
    await refused(app, "quick", {}, "arguments.n")
    task = await app.submit("quick", {"n": 1, "tags": ["x"]})
    assert task.arguments == {"n": 1, "tags": ["x"]}


async def test_kwargs_handlers_take_any_name_and_unannotated_arguments_are_strings(
    store: Store,
) -> None:
    """``**kwargs`` opens the names; an unannotated parameter is a string (as the SDK
    publishes it); a parameter named like a pydantic method is an ordinary argument."""
    app = Keel(store)

    @app.task("open")
    async def open_(ctx: TaskContext, first, json: int = 0, **rest: Any) -> None:
        """Anything goes, after ``first``."""

    assert app.definition("open").arguments is not None
    await app.submit("open", {"first": "x", "json": 3, "anything": [1]})
    with pytest.raises(InputRejected, match=r"^arguments\.first: 1 is not of type 'string'"):
        await app.submit("open", {"first": 1})


async def test_a_parameter_type_without_a_json_schema_is_refused_at_registration(
    store: Store,
) -> None:
    """As for results: the tool could not publish its arguments, so it is not registered."""
    app = Keel(store)

    async def takes(ctx: TaskContext, thing: Opaque) -> None:
        """An argument no JSON can be."""

    with pytest.raises(ConfigurationError, match="arguments have no JSON Schema"):
        app.task("takes")(takes)
    assert app.tasks == {}


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks whose signature schema is built, in order, from now on."""
    seen: list[str] = []
    build = arguments.signature_schema

    def counted(task: str, parameters: list[inspect.Parameter]) -> dict[str, Any]:
        seen.append(task)
        return build(task, parameters)

    monkeypatch.setattr(arguments, "signature_schema", counted)
    return seen


async def test_a_plain_signature_s_schema_is_built_on_first_use(
    store: Store, built: list[str]
) -> None:
    """Issue 19: registering does not build it (a worker, which never checks arguments,
    does not pay for pydantic); the first submit does, once; what is checked is the same."""
    app = Keel(store)

    @app.task("plain")
    async def plain(ctx: TaskContext, n: int, tags: list[str] | None = None) -> None:
        """JSON's own types."""

    @app.task("bare")
    async def bare(ctx: TaskContext) -> None:
        """No arguments at all (the benchmark's tasks)."""

    assert built == []
    await refused(app, "plain", {"n": "twelve"}, "arguments.n")
    await app.submit("plain", {"n": 1, "tags": ["x"]})
    await app.submit("bare")
    assert built == ["plain", "bare"]


async def test_a_signature_that_might_not_be_described_is_built_at_registration(
    store: Store, built: list[str]
) -> None:
    """A type outside JSON's own, a name pydantic treats apart, a default that is not a
    JSON scalar: built at once, so that a failure is reported where it always was."""
    app = Keel(store)

    @app.task("dated")
    async def dated(ctx: TaskContext, when: datetime) -> None:
        """A datetime: pydantic describes it, but not every type is one it can."""

    @app.task("named")
    async def named(ctx: TaskContext, model_x: int) -> None:
        """A ``model_`` name: pydantic may warn about it."""

    @app.task("defaulted")
    async def defaulted(ctx: TaskContext, n: float = float("inf")) -> None:
        """A default JSON cannot carry."""

    assert built == ["dated", "named", "defaulted"]
    with pytest.raises(UserWarning, match="shadows an attribute"):

        @app.task("shadowing")
        async def shadowing(ctx: TaskContext, model_fields: int) -> None:
            """Pydantic warns at registration, as it always did."""


PLAIN: list[Callable[..., Any]] = [
    lambda ctx, a: None,
    lambda ctx, a=None, b=1, c=1.5, d="x", e=True: None,
]
"""Handlers whose schema waits for first use: each must build without error or warning."""


def _plain_handlers() -> list[Callable[..., Any]]:
    annotations: list[Any] = [
        str, int, float, bool, None, type(None), Any, list, dict, list[int],
        dict[str, list[float]], int | None, Optional[str], Union[int, str, None],  # noqa: UP007, UP045 - typing's spellings too
        Literal["a", 1, True, None], list[Literal["x"]] | dict[str, Any],
    ]  # fmt: skip
    handlers = list(PLAIN)
    for annotation in annotations:

        def handler(ctx: TaskContext, value: Any) -> None: ...

        handler.__annotations__ = {"value": annotation}
        handlers.append(handler)
    return handlers


@pytest.mark.parametrize("handler", _plain_handlers())
def test_every_signature_left_for_later_is_described(handler: Callable[..., Any]) -> None:
    """What the deferral rests on: pydantic describes every plain signature (warnings are
    errors here), so deferring it never moves an error from registration to a submit."""
    parameters = arguments.handler_parameters(handler)
    assert arguments._surely_described(parameters)
    schema = arguments.signature_schema("t", parameters)
    assert schema["type"] == "object"
