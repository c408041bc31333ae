"""Typed results: a handler whose return annotation is a typed object (a TypedDict, a
pydantic model, a dataclass, ``dict[str, X]``, or ``ToolResult[T]`` of one) has a
``ResultShape``: its schema is the tool's ``outputSchema``, and every value the handler
returns becomes structured content that matches it, or the task fails at once saying
why. ``str`` and untyped results promise nothing and stay as they were.
"""

from __future__ import annotations

import json
import sys
import typing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, NotRequired

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, PlainSerializer, computed_field
from typing_extensions import TypedDict  # pydantic's choice below Python 3.12

from keel.errors import ConfigurationError
from keel.model import INTERNAL_ERROR, Status
from keel.runtime import Keel, TaskContext, ToolResult
from keel.runtime.outcomes import ResultShape
from keel.store import Store

from .support import running, settles, worker

pytestmark = pytest.mark.anyio


class Span(TypedDict):
    name: str
    ms: float


class Report(TypedDict):
    service: str
    errors: int
    spans: list[Span]
    note: NotRequired[str]


@dataclass(frozen=True, slots=True)
class Deploy:
    id: str
    at: datetime
    tags: list[str] = field(default_factory=list)


class Verdict(BaseModel):
    healthy: bool
    score: float = 0.0
    reasons: list[str] = []


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


class Sized(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[str]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def count(self) -> int:
        return len(self.items)


class Lying(BaseModel):
    n: Annotated[int, PlainSerializer(str)]  # validates an integer, dumps a string


REPORT: Report = {"service": "payments", "errors": 3, "spans": [{"name": "charge", "ms": 2.5}]}
AT = datetime(2026, 3, 14, 9, 41, tzinfo=UTC)


def typed_app(store: Store) -> Keel:
    app = Keel(store)

    @app.task("report")
    async def report(ctx: TaskContext) -> Report:
        return {**REPORT, "undeclared": "left out"}  # type: ignore[typeddict-unknown-key]

    @app.task("deploy")
    async def deploy(ctx: TaskContext) -> Deploy:
        return Deploy("d-8812", AT)

    @app.task("verdict")
    async def verdict(ctx: TaskContext) -> Verdict:
        return Verdict(healthy=False, reasons=["pool exhausted"])

    @app.task("tree")
    async def tree(ctx: TaskContext) -> Tree:
        return Tree(name="root", children=[Tree(name="leaf")])

    @app.task("counts")
    async def counts(ctx: TaskContext) -> dict[str, int]:
        return {"a": 1, "b": 2}

    @app.task("summary")
    async def summary(ctx: TaskContext) -> ToolResult[Report]:
        return ToolResult("3 errors on payments", structured=REPORT)

    return app


async def test_typed_results_match_the_output_schema(store: Store) -> None:
    """Each typed handler's result carries structured content valid against its schema:
    the value as its declared type, in JSON (datetimes as strings, models dumped, keys a
    TypedDict does not declare left out); the text is that JSON, or the ToolResult's."""
    app = typed_app(store)
    submitted = {name: await app.submit(name) for name in app.tasks}
    async with running(worker(app)):
        done = {name: await settles(store, t.task_id) for name, t in submitted.items()}
    structured = {}
    for name, task in done.items():
        assert task.status is Status.COMPLETED, task.error
        shape = app.tasks[name].output
        assert shape is not None, name
        jsonschema.Draft202012Validator.check_schema(shape.schema)
        content = task.result["structuredContent"]
        jsonschema.validate(content, shape.schema)
        structured[name] = content
    assert structured == {
        "report": REPORT,
        "deploy": {"id": "d-8812", "at": "2026-03-14T09:41:00Z", "tags": []},
        "verdict": {"healthy": False, "score": 0.0, "reasons": ["pool exhausted"]},
        "tree": {"name": "root", "children": [{"name": "leaf", "children": []}]},
        "counts": {"a": 1, "b": 2},
        "summary": REPORT,
    }
    assert json.loads(done["deploy"].result["content"][0]["text"]) == structured["deploy"]
    assert done["summary"].result["content"][0]["text"] == "3 errors on payments"


def test_schemas_are_those_of_the_declared_types() -> None:
    """The schema is pydantic's for the type, with an object root even for a
    self-referential model (MCP's outputSchema must be an object)."""
    app = typed_app(Keel("memory://").store)
    schemas = {name: d.output.schema for name, d in app.tasks.items() if d.output}
    assert schemas["report"]["required"] == ["service", "errors", "spans"]
    assert schemas["report"]["properties"]["spans"]["items"] == {"$ref": "#/$defs/Span"}
    assert schemas["deploy"]["properties"]["at"] == {
        "format": "date-time",
        "title": "At",
        "type": "string",
    }
    assert schemas["counts"] == {"additionalProperties": {"type": "integer"}, "type": "object"}
    assert schemas["summary"] == schemas["report"]
    assert schemas["tree"]["type"] == "object"
    assert "$ref" not in schemas["tree"]
    assert schemas["tree"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Tree"}


def test_untyped_results_promise_nothing() -> None:
    """str, no annotation, a bare ToolResult, a list: no shape (no outputSchema)."""
    app = Keel("memory://")

    @app.task("text")
    async def text(ctx: TaskContext) -> str:
        return "ok"

    @app.task("bare")
    async def bare(ctx: TaskContext):  # type: ignore[no-untyped-def]
        return {"any": "thing"}

    @app.task("explicit")
    async def explicit(ctx: TaskContext) -> ToolResult:  # type: ignore[type-arg]
        return ToolResult("ok")

    @app.task("listed")
    async def listed(ctx: TaskContext) -> list[int]:
        return [1]

    @app.task("keyed_by_int")
    async def keyed_by_int(ctx: TaskContext) -> dict[int, str]:
        return {1: "a"}

    assert {name: d.output for name, d in app.tasks.items()} == dict.fromkeys(app.tasks)


async def test_a_result_of_the_wrong_shape_fails_the_task_at_once(store: Store) -> None:
    """A value that is not the declared type: failed on the first attempt (a retry would
    return the same), with a message naming the field; a ToolResult[T] without
    structured content, likewise."""
    app = Keel(store)

    @app.task("wrong", max_attempts=3)
    async def wrong(ctx: TaskContext) -> Report:
        return {"service": "payments", "errors": "many", "spans": []}  # type: ignore[typeddict-item]

    @app.task("missing", max_attempts=3)
    async def missing(ctx: TaskContext) -> ToolResult[Report]:
        return ToolResult("no structure")

    tasks = [await app.submit("wrong"), await app.submit("missing")]
    async with running(worker(app)):
        failed = [await settles(store, t.task_id) for t in tasks]
    assert [(t.status, t.attempt) for t in failed] == [(Status.FAILED, 1)] * 2
    assert failed[0].error == {
        "code": INTERNAL_ERROR,
        "message": "the result of task 'wrong' does not match its outputSchema: errors: "
        "Input should be a valid integer, unable to parse string as an integer",
    }
    assert failed[1].error is not None
    assert (
        failed[1]
        .error["message"]
        .startswith("the result of task 'missing' does not match its outputSchema: the value: ")
    )


async def test_types_that_dump_otherwise_than_they_validate_are_checked(store: Store) -> None:
    """Where a type's serialization schema differs from the published (validation) one,
    each result is also checked against the published schema with jsonschema: a computed
    field beside extra="forbid", a serializer that changes the type. Such results fail
    the task rather than go out contradicting the outputSchema."""
    app = Keel(store)

    @app.task("sized")
    async def sized(ctx: TaskContext) -> Sized:
        return Sized(items=["a", "b"])

    @app.task("lying")
    async def lying(ctx: TaskContext) -> Lying:
        return Lying(n=1)

    @app.task("plain")
    async def plain(ctx: TaskContext) -> Report:
        return REPORT

    checked = {name: d.output.checked for name, d in app.tasks.items() if d.output}
    assert checked == {"sized": True, "lying": True, "plain": False}
    tasks = [await app.submit(name) for name in ("sized", "lying")]
    async with running(worker(app)):
        done = [await settles(store, t.task_id) for t in tasks]
    assert [(t.status, t.attempt) for t in done] == [(Status.FAILED, 1)] * 2
    messages = [t.error["message"] for t in done if t.error]
    assert messages == [
        "the result of task 'sized' does not match its outputSchema: $: Additional "
        "properties are not allowed ('count' was unexpected)",
        "the result of task 'lying' does not match its outputSchema: $.n: '1' is not of "
        "type 'integer'",
    ]


def test_return_types_without_a_schema_are_refused_at_registration() -> None:
    """An annotation that cannot be evaluated, or a type pydantic cannot describe, is a
    ConfigurationError when the task is registered, not at its first result."""
    app = Keel("memory://")

    async def unknown(ctx: TaskContext) -> NoSuchType:  # type: ignore[name-defined]  # noqa: F821
        return None

    with pytest.raises(ConfigurationError, match="cannot evaluate the return annotation"):
        app.task("unknown")(unknown)

    @dataclass
    class Opaque:
        handle: typing.Callable[[], None]

    async def opaque(ctx: TaskContext) -> Any:
        return None

    opaque.__annotations__["return"] = Opaque
    with pytest.raises(ConfigurationError, match="task 'opaque' returns Opaque, which has no"):
        app.task("opaque")(opaque)
    assert not app.tasks


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic reads typing.TypedDict there")
def test_a_stdlib_typeddict_below_3_12_is_refused_with_pydantic_s_advice() -> None:
    class Old(typing.TypedDict):
        n: int

    async def old(ctx: TaskContext) -> Any:
        return {"n": 1}

    old.__annotations__["return"] = Old
    with pytest.raises(ConfigurationError, match=r"typing_extensions\.TypedDict"):
        Keel("memory://").task("old")(old)


def test_descriptions_are_cleaned_docstrings_or_cleaned_descriptions() -> None:
    """A docstring or an explicit description loses its indentation (inspect.cleandoc)."""
    app = Keel("memory://")

    @app.task("documented")
    async def documented(ctx: TaskContext) -> str:
        """Diagnose an incident.

        Asks which service is affected
            when the incident names none.
        """
        return ""

    @app.task(
        "described",
        description="""
        First line.
          Indented line.
        """,
    )
    async def described(ctx: TaskContext) -> str:
        return ""

    @app.task("silent")
    async def silent(ctx: TaskContext) -> str:
        return ""

    descriptions = {name: d.options.description for name, d in app.tasks.items()}
    assert descriptions == {
        "documented": "Diagnose an incident.\n\nAsks which service is affected\n"
        "    when the incident names none.",
        "described": "First line.\n  Indented line.",
        "silent": None,
    }


def test_shape_of_a_handler_reads_only_the_return_annotation() -> None:
    """Parameters may name types imported for type checkers only; the return is enough."""

    async def handler(ctx: TaskContext, later: OnlyForTypeCheckers) -> Report:  # type: ignore[name-defined]  # noqa: F821
        return REPORT

    shape = ResultShape.of("h", handler)
    assert shape is not None
    assert shape.type is Report
