"""How a handler's ending becomes a task's outcome: an :data:`AttemptOutcome`, which the
worker writes, and the :class:`ToolOutput` a completed task stores.

* a returned value -> ``completed`` with a tool result (``content`` + ``structuredContent``);
  a handler whose return annotation is a typed object (:class:`ResultShape`) promises its
  ``outputSchema``, and every value it returns is turned into structured content that
  matches it (or the task fails, saying which field did not);
* :class:`ToolError` -> ``completed`` with ``isError: true``: a domain error the model
  should see, as MCP asks (not a failure of the task machinery);
* :class:`TaskFailed` -> ``failed`` at once with that JSON-RPC error (no retry);
* any other exception -> retried with jittered backoff, then ``failed`` (dead letter).
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import typing_extensions

from keel.errors import ConfigurationError, InputDeclined, TaskFailed, ToolError
from keel.model import INTERNAL_ERROR, JsonObject, JsonValue, Task
from keel.telemetry import tracing

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from opentelemetry.trace import Span
    from pydantic import BaseModel, TypeAdapter
    from pydantic.json_schema import GenerateJsonSchema

__all__ = [
    "AttemptOutcome",
    "Completed",
    "Failed",
    "InputDeclined",
    "Parked",
    "ResultShape",
    "Retry",
    "Stopped",
    "TaskFailed",
    "ToolError",
    "ToolOutput",
    "ToolResult",
    "backoff",
    "crash_error",
    "deadline_error",
    "error_result",
    "tool_result",
    "traced_end",
]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ToolResult(Generic[S]):
    """An explicit tool result: text for people, structured content for programs.

    Annotate a handler ``-> ToolResult[Report]`` (``Report`` a typed object, as for
    :class:`ResultShape`) to give its tool an ``outputSchema``: ``structured`` is then
    required and checked against it.
    """

    text: str
    structured: S | None = None
    extra_content: list[JsonObject] = field(default_factory=list)


class ResultShape:
    """The JSON object a handler promises by its return annotation, and its schema.

    A TypedDict (``typing_extensions.TypedDict`` below Python 3.12, as pydantic asks), a
    pydantic model, a dataclass or ``dict[str, X]``, returned as is or as
    ``ToolResult[T]``, makes the handler's tool advertise :attr:`schema` as its
    ``outputSchema``; :meth:`structured` turns each returned value into the
    ``structuredContent`` that matches it: the value as its declared type (keys a
    TypedDict does not declare are left out, as the MCP SDK does), in JSON. Other
    annotations (``str``, none, ``ToolResult``) promise nothing: no ``outputSchema``.
    """

    def __init__(self, task: str, annotation: Any) -> None:
        from pydantic import PydanticUserError, TypeAdapter  # only for typed handlers

        self.task = task
        self.type = annotation
        try:
            self.adapter: TypeAdapter[Any] = TypeAdapter(annotation)
            self.model = _stand_in(task, self.adapter)
            """A model whose schema is the result type's (a tool's return annotation)."""
            schema = TypeAdapter(self.model).json_schema(schema_generator=_strict_generator())
        except (PydanticUserError, TypeError, NameError, ValueError) as exc:
            raise ConfigurationError(
                f"task {task!r} returns {_name(annotation)}, which has no JSON Schema: {exc}"
            ) from exc
        self.schema: JsonObject = _inline_root(schema)
        """The ``outputSchema``: what the MCP SDK publishes for :attr:`model`, exactly."""
        # pydantic dumps a value as its serialization schema describes; where that differs
        # from the published (validation) schema — computed fields, custom serializers —
        # each result is checked against the published one as well (jsonschema: ~40 times
        # the cost of the dump, so not where the two schemas agree).
        self.checked = self.adapter.json_schema(mode="serialization") != self.adapter.json_schema()
        self._validator: Draft202012Validator | None = None

    @classmethod
    def of(cls, task: str, handler: Callable[..., Any]) -> ResultShape | None:
        """The shape ``handler``'s return annotation promises, or None.

        Raises:
            ConfigurationError: the annotation cannot be evaluated, or its type has no
                JSON Schema.
        """
        annotation = _return_annotation(task, handler)
        if annotation is ToolResult:
            return None  # structured content of any shape, or none
        if typing.get_origin(annotation) is ToolResult:
            (annotation,) = typing.get_args(annotation)
        return cls(task, annotation) if _is_object_type(annotation) else None

    def structured(self, value: Any) -> JsonObject:
        """``value`` as structured content matching :attr:`schema`.

        Raises:
            TaskFailed: the value is not of the promised type (the task fails at once: a
                retry would return the same).
        """
        from pydantic import ValidationError

        try:
            content = self.adapter.dump_python(
                self.adapter.validate_python(value), mode="json", by_alias=True
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the value"
            raise TaskFailed(
                f"the result of task {self.task!r} does not match its outputSchema: "
                f"{where}: {first['msg']}"
            ) from exc
        problem = self._check(content) if self.checked else None
        if problem is not None:
            raise TaskFailed(
                f"the result of task {self.task!r} does not match its outputSchema: {problem}"
            )
        return typing.cast(JsonObject, content)

    def _check(self, content: Any) -> str | None:
        if self._validator is None:
            from jsonschema import Draft202012Validator

            self._validator = Draft202012Validator(self.schema)
        error = next(iter(self._validator.iter_errors(content)), None)
        return None if error is None else f"{error.json_path}: {error.message}"


def _stand_in(task: str, adapter: TypeAdapter[Any]) -> type[BaseModel]:
    """A model whose JSON Schema is the result type's: what a tool's stand-in function
    declares as its return type, since the MCP SDK derives a tool's outputSchema from
    that annotation only (it has no parameter for one), and cannot derive one from every
    type accepted here (a slots dataclass, say). pydantic's schema hook is the seam: the
    schema is generated from the result type's own core schema, within the generator the
    SDK runs, so what it publishes is :attr:`ResultShape.schema`."""
    from pydantic import BaseModel, GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import CoreSchema

    core = adapter.core_schema

    class Output(BaseModel):
        @classmethod
        def __get_pydantic_json_schema__(
            cls, _core_schema: CoreSchema, handler: GetJsonSchemaHandler
        ) -> JsonSchemaValue:
            return handler(core)

    Output.__name__ = Output.__qualname__ = f"{task}Output"
    return Output


def _strict_generator() -> type[GenerateJsonSchema]:
    """A schema generator that raises where pydantic would warn (a default that is not
    JSON, say), as the MCP SDK's does: such a type is refused at registration here rather
    than when a server is built."""
    from pydantic.json_schema import GenerateJsonSchema, JsonSchemaWarningKind

    class Strict(GenerateJsonSchema):
        def emit_warning(self, kind: JsonSchemaWarningKind, detail: str) -> None:
            raise ValueError(f"{kind}: {detail}")

    return Strict


def _return_annotation(task: str, handler: Callable[..., Any]) -> Any:
    """The handler's return annotation, evaluated (only it: parameters may name types
    imported for type checkers only)."""
    raw = getattr(handler, "__annotations__", {}).get("return")
    if not isinstance(raw, str):
        return raw

    def probe() -> None: ...

    probe.__annotations__ = {"return": raw}
    try:
        return typing.get_type_hints(probe, globalns=getattr(handler, "__globals__", None))[
            "return"
        ]
    except (NameError, SyntaxError, TypeError) as exc:
        raise ConfigurationError(
            f"cannot evaluate the return annotation {raw!r} of task {task!r}: {exc} "
            "(define the type at module level)"
        ) from exc


def _is_object_type(annotation: Any) -> bool:
    """Whether values of ``annotation`` are JSON objects of a declared shape."""
    if typing.get_origin(annotation) is dict:
        return typing.get_args(annotation)[:1] == (str,)
    if not isinstance(annotation, type):
        return False
    if dataclasses.is_dataclass(annotation) or typing_extensions.is_typeddict(annotation):
        return True
    pydantic = sys.modules.get("pydantic")  # a pydantic model implies pydantic is loaded
    return pydantic is not None and issubclass(annotation, pydantic.BaseModel)


def _inline_root(schema: JsonObject) -> JsonObject:
    """An object root for a schema whose root is a bare ``$ref`` (a self-referential
    model), as MCP's ``outputSchema`` needs; ``$defs`` stays for the nested references.
    The MCP SDK does the same to the schema it publishes."""
    ref = schema.get("$ref")
    prefix = "#/$defs/"
    if not isinstance(ref, str) or not ref.startswith(prefix):
        return schema
    definitions = typing.cast(JsonObject, schema["$defs"])
    siblings = {key: value for key, value in schema.items() if key != "$ref"}
    return {**typing.cast(JsonObject, definitions[ref.removeprefix(prefix)]), **siblings}


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool result as its task stores it: content blocks for people, structured content
    for programs, and whether it reports a domain error.

    Its stored form (:meth:`to_json`) has the field names of MCP's ``CallToolResult``
    (``content``, ``structuredContent``, ``isError``, ``_meta``) on purpose: it is the
    durable record that ``keel tasks show`` prints and that every version of Keel has
    stored. This class is its one codec; the wire shapes made of it (which differ by
    protocol generation) are built in ``keel.mcp.wire`` only.
    """

    content: tuple[JsonObject, ...]
    structured: JsonObject | None = None
    is_error: bool = False
    meta: JsonObject | None = None

    @classmethod
    def of_text(cls, text: str, *, structured: JsonObject | None = None) -> ToolOutput:
        """A result of one text block."""
        return cls(({"type": "text", "text": text},), structured)

    @classmethod
    def of_error(cls, message: str, *, structured: JsonObject | None = None) -> ToolOutput:
        """A domain error (``isError``): the model sees it as the tool's answer."""
        return cls(({"type": "text", "text": message},), structured, is_error=True)

    @classmethod
    def of_json(cls, value: JsonValue) -> ToolOutput:
        """Any JSON value as its JSON text; an object is its structured content too."""
        structured = dict(value) if isinstance(value, dict) else None
        return cls.of_text(_TEXT_JSON(value), structured=structured)

    @classmethod
    def of_value(cls, value: JsonValue) -> ToolOutput:
        """A handler's plain return value: a string is its text, any other JSON as
        :meth:`of_json`."""
        return cls.of_text(value) if isinstance(value, str) else cls.of_json(value)

    def to_json(self) -> JsonObject:
        """The stored form (see the class docstring)."""
        stored: JsonObject = {"content": list(self.content), "isError": self.is_error}
        if self.structured is not None:
            stored["structuredContent"] = self.structured
        if self.meta is not None:
            stored["_meta"] = self.meta
        return stored

    @classmethod
    def from_json(cls, stored: JsonValue) -> ToolOutput | None:
        """The tool result a task's stored result holds, or None when it holds other
        JSON (a task finished through the store's own API may hold any)."""
        if not isinstance(stored, dict) or not set(stored) <= _STORED_FIELDS:
            return None
        content, structured = stored.get("content"), stored.get("structuredContent")
        is_error, meta = stored.get("isError", False), stored.get("_meta")
        if not isinstance(content, list) or not all(_is_block(b) for b in content):
            return None
        if not isinstance(is_error, bool) or not _object_or_none(structured, meta):
            return None
        return cls(tuple(content), structured, is_error, meta)


_TEXT_JSON = json.JSONEncoder(ensure_ascii=False).encode
"""``json.dumps(value, ensure_ascii=False)`` built once: ``dumps`` builds an encoder per
call whenever an option is not its default."""

_STORED_FIELDS = frozenset({"content", "structuredContent", "isError", "_meta"})


def _is_block(block: Any) -> bool:
    return isinstance(block, dict) and isinstance(block.get("type"), str)


def _object_or_none(*values: Any) -> bool:
    return all(value is None or isinstance(value, dict) for value in values)


def tool_result(value: Any, shape: ResultShape | None = None) -> ToolOutput:
    """A handler's return value as a tool result.

    With the handler's ``shape``, the structured content is made to match its
    ``outputSchema`` (see :class:`ResultShape`); the one place results get it.

    Raises:
        TaskFailed: the value does not match ``shape``.
    """
    if isinstance(value, ToolResult):
        structured = value.structured if shape is None else shape.structured(value.structured)
        text = {"type": "text", "text": value.text}
        return ToolOutput((text, *value.extra_content), structured)
    if shape is not None:
        value = shape.structured(value)
    return ToolOutput.of_value(value)


def error_result(error: ToolError, shape: ResultShape | None = None) -> ToolOutput:
    """A :class:`ToolError` as a tool result with ``isError``.

    Its structured content is kept only for a tool that publishes no ``outputSchema``
    (``shape`` None): clients (the TypeScript SDK, the Inspector) check any structured
    content against the tool's output schema, error or not, and an error's seldom fits.
    """
    return ToolOutput.of_error(
        error.message, structured=error.structured if shape is None else None
    )


@dataclass(frozen=True, slots=True)
class Completed:
    """The handler returned (or raised :class:`ToolError`): the task completes with this
    tool result, ``isError`` included."""

    output: ToolOutput


@dataclass(frozen=True, slots=True)
class Failed:
    """The handler raised :class:`TaskFailed` (or its result does not match its shape):
    the task fails at once with this JSON-RPC error."""

    error: JsonObject


@dataclass(frozen=True, slots=True)
class Retry:
    """The attempt crashed or ran past its deadline: the task is retried after a backoff,
    or dead-lettered after its last attempt."""

    error: JsonObject


@dataclass(frozen=True, slots=True)
class Stopped:
    """The attempt was stopped from outside (a cancel, a takeover, a lost lease, a
    shutdown): it writes nothing, except that a worker shutting down gives the task back
    (``release``)."""

    reason: str
    release: bool = False


@dataclass(frozen=True, slots=True)
class Parked:
    """The handler waits for input: the task is ``input_required`` already (the request
    was stored with it), and the attempt ends holding nothing."""

    keys: tuple[str, ...]


AttemptOutcome: TypeAlias = Completed | Failed | Retry | Stopped | Parked
"""How one attempt ended, as the worker writes it."""


def crash_error(exc: BaseException) -> JsonObject:
    """An unexpected exception as a JSON-RPC error: its type and message (no traceback),
    and ``data.exception``, the type's name, which marks it as a crash: the MCP layer
    shows clients only the type (see :func:`keel.mcp.wire.public_error`)."""
    return {
        "code": INTERNAL_ERROR,
        "message": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
        "data": {"exception": type(exc).__name__},
    }


def backoff(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential, capped, full jitter."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)


def deadline_error(seconds: float | None) -> JsonObject:
    """The error of an attempt stopped by its task's deadline."""
    return {"code": INTERNAL_ERROR, "message": f"deadline of {seconds:g}s exceeded"}


def traced_end(span: Span, task: Task, outcome: AttemptOutcome) -> None:
    """Say on the attempt's span how it ended (see :mod:`keel.telemetry.tracing`)."""
    match outcome:
        case Completed(output):
            tracing.end_attempt(span, "completed", "completed",
                                error="tool error" if output.is_error else None)  # fmt: skip
        case Failed(error):
            tracing.end_attempt(span, "failed", "failed", error=str(error.get("message")))
        case Retry(error):
            last = task.attempt >= task.max_attempts
            tracing.end_attempt(span, "error", "failed" if last else "working",
                                error=str(error.get("message")))  # fmt: skip
        case Parked(keys):
            tracing.input_requested(span, keys)
            tracing.end_attempt(span, "input_required", "input_required")
        case Stopped(reason, release=release):
            status = "working" if release else reason.removeprefix("task is ")
            tracing.end_attempt(span, "released" if release else "stopped", status)
