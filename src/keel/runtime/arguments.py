"""What a task takes: the arguments of its handler, checked before a task is created.

Every way in (``Keel.submit``, so both MCP protocol generations, the CLI and the Python
API) checks a task's arguments here, before anything is stored:

* an argument the handler does not take is refused, even where the schema does not
  forbid extra properties (the handler would raise ``TypeError`` on every attempt);
* the arguments are validated against the task's ``input_schema`` if it has one, else
  against the schema of its handler's signature (the one its tool publishes);
* an argument the handler needs (no default) and the call left out is refused.

Plain (non-task) tools of a Keel server refuse an argument they do not take through
:func:`refuse_unknown` too (``keel.mcp.plain_tools``): the MCP SDK would drop it unseen.

The refusal is :class:`~keel.errors.ArgumentsRejected` naming the field
(``arguments.incident_id: …``); over MCP it is ``-32602``.

The signature's schema is built on first use, not at registration: building it imports
pydantic and makes a model, most of what a ``keel worker`` spent starting up, and a worker
never checks arguments (issue 19). A handler whose schema might fail to build (a type
outside :func:`_surely_described`'s plain JSON types) still has it built at registration,
so that it is refused there, as ever.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from keel.errors import ArgumentsRejected, ConfigurationError
from keel.model import JsonObject, JsonValue
from keel.model.validation import field_path, validate_arguments

__all__ = ["ArgumentsShape", "handler_parameters", "refuse_unknown"]


def handler_parameters(handler: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters a call's arguments fill: the handler's after its context, without
    ``*args`` / ``**kwargs`` (a tool's arguments are named, and no schema lists either)."""
    return _named(inspect.signature(handler, eval_str=True))


def _named(signature: inspect.Signature) -> list[inspect.Parameter]:
    return [
        p
        for p in list(signature.parameters.values())[1:]
        if p.kind not in {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    ]


@dataclass(frozen=True)
class ArgumentsShape:
    """The arguments one task's handler takes, and the schema they are checked against."""

    task: str
    names: tuple[str, ...]
    """The named arguments the handler takes, in its order."""
    needed: tuple[str, ...]
    """Those without a default."""
    open: bool
    """The handler takes ``**kwargs``: any further name is accepted."""
    parameters: tuple[inspect.Parameter, ...]
    """The named parameters (see :func:`handler_parameters`)."""
    input_schema: JsonObject | None
    """The task's own ``input_schema``, if it has one."""

    @functools.cached_property
    def schema(self) -> JsonObject:
        """The task's ``input_schema``, else its handler signature's (see
        :func:`signature_schema`), built the first time it is read.

        Raises:
            ConfigurationError: a parameter whose type has no JSON Schema (only for a
                signature :meth:`of` did not check at registration: never, in practice).
        """
        if self.input_schema is not None:
            return self.input_schema
        return signature_schema(self.task, list(self.parameters))

    @classmethod
    def of(
        cls, task: str, handler: Callable[..., Any], input_schema: JsonObject | None
    ) -> ArgumentsShape:
        """Raises ConfigurationError: an annotation that cannot be evaluated, or a
        parameter whose type has no JSON Schema."""
        # Evaluated annotations: strings (``from __future__ import annotations``) would
        # reach pydantic as forward references it cannot resolve from another module.
        try:
            signature = inspect.signature(handler, eval_str=True)
        except NameError as exc:
            raise ConfigurationError(
                f"task {task!r}: cannot evaluate its annotations: {exc}"
            ) from exc
        parameters = _named(signature)
        kinds = {p.kind for p in signature.parameters.values()}
        shape = cls(
            task=task,
            names=tuple(p.name for p in parameters),
            needed=tuple(p.name for p in parameters if p.default is inspect.Parameter.empty),
            open=inspect.Parameter.VAR_KEYWORD in kinds,
            parameters=tuple(parameters),
            input_schema=input_schema,
        )
        if input_schema is None and not _surely_described(parameters):
            _ = shape.schema  # built now: a type without a JSON Schema is refused here
        return shape

    def check(self, arguments: Mapping[str, JsonValue]) -> None:
        """Raises ArgumentsRejected naming the first argument that is wrong."""
        if not self.open:
            refuse_unknown(f"task {self.task!r}", self.names, arguments)
        validate_arguments(self.schema, dict(arguments))
        for name in self.needed:
            if name not in arguments:
                raise ArgumentsRejected(
                    field_path("arguments", [name]), name, f"task {self.task!r} needs this argument"
                )


def refuse_unknown(what: str, takes: Collection[str], arguments: Mapping[str, object]) -> None:
    """Refuse an argument that ``what`` (``task 'triage'``, ``tool 'search_traces'``) does
    not take: its handler would never see it (a plain tool's SDK drops it silently) or
    would raise ``TypeError`` on every attempt (a task's).

    Raises:
        ArgumentsRejected: naming the first such argument and the ones it takes.
    """
    for name in arguments:
        if name not in takes:
            shown = ", ".join(takes) or "none"
            # repr escapes NUL and lone surrogates: the message stays printable and sendable.
            raise ArgumentsRejected(
                field_path("arguments", [name]),
                name,
                f"{what} takes no argument {name!r} (it takes: {shown})",
            )


_PLAIN_TYPES: tuple[object, ...] = (str, int, float, bool, None, type(None), Any, list, dict)
"""Annotations pydantic describes as JSON Schema whatever surrounds them."""
_LITERAL_VALUES = (str, int, bool, type(None))


def _surely_described(parameters: Sequence[inspect.Parameter]) -> bool:
    """Whether :func:`signature_schema` certainly describes these parameters without an
    error or a warning, so that building their schema can wait for its first use: names
    pydantic takes as they are (no ``_`` or ``model_`` prefix: those it hides or warns
    about), JSON scalar defaults, and types made of JSON's own (str, int, float, bool,
    None, Any, lists, str-keyed dicts, unions and literals of these; or no annotation).
    Anything else is described at registration, where a failure is reported.
    """
    for p in parameters:
        if p.name.startswith(("_", "model_")):
            return False
        if p.default is not inspect.Parameter.empty and not _json_scalar(p.default):
            return False
        if p.annotation is not inspect.Parameter.empty and not _plain(p.annotation):
            return False
    return True


def _json_scalar(value: object) -> bool:
    if isinstance(value, float):
        return type(value) is float and math.isfinite(value)
    return any(type(value) is t for t in (str, int, bool, type(None)))


def _plain(annotation: object) -> bool:
    if any(annotation is t for t in _PLAIN_TYPES):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return all(any(type(a) is t for t in _LITERAL_VALUES) for a in args)
    if origin is typing.Union or origin is types.UnionType or origin is list:
        return all(_plain(a) for a in args)
    if origin is dict:
        return len(args) == 2 and args[0] is str and _plain(args[1])
    return False


def signature_schema(task: str, parameters: list[inspect.Parameter]) -> JsonObject:
    """The JSON Schema of a handler's named arguments, as the MCP SDK derives a tool's
    ``inputSchema`` from its signature (``mcp.server.mcpserver.utilities.func_metadata``):
    a pydantic model named ``<task>Arguments``, an unannotated parameter a string. The
    same schema, so that what ``tools/list`` shows is what is checked (a test compares
    the two for every kind of parameter).

    Raises:
        ConfigurationError: a parameter whose type has no JSON Schema.
    """
    from pydantic import (
        BaseModel,
        ConfigDict,
        Field,
        PydanticUserError,
        WithJsonSchema,
        create_model,
    )

    fields: dict[str, Any] = {}
    for p in parameters:
        metadata: list[Any] = [Field()]
        if callable(getattr(BaseModel, p.name, None)):  # it would shadow a BaseModel method
            name, metadata = f"field_{p.name}", [Field(alias=p.name)]
        else:
            name = p.name
        if p.annotation is inspect.Parameter.empty:
            metadata.insert(0, WithJsonSchema({"title": p.name, "type": "string"}))
            annotation: Any = Any
        else:
            annotation = p.annotation
        spec = Annotated[(annotation, *metadata)]
        fields[name] = spec if p.default is inspect.Parameter.empty else (spec, p.default)
    try:
        model = create_model(
            f"{task}Arguments",
            __config__=ConfigDict(arbitrary_types_allowed=True),
            **fields,
        )
        schema: JsonObject = model.model_json_schema(by_alias=True)
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"task {task!r}: its arguments have no JSON Schema: {exc}"
        ) from exc
    return schema
