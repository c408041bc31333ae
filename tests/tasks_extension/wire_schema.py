"""The published 2026-07-28 schemas as a checker of recorded wire answers (issue 12).

:class:`Wire` sends hand-written 2026-07-28 requests to a server (through
:func:`tasks_extension.support.post`) and records every answer with what it must be (its
:class:`Kind`). :func:`violations` checks one recorded answer three ways and says exactly
what failed where:

* the extension's JSON schema (``schemas/ext-tasks-2026-07-28.schema.json``) for the
  task answers: ``CreateTaskResult``, ``GetTaskResult``, ``UpdateTaskResult``,
  ``CancelTaskResult``;
* the core 2026-07-28 JSON schema (``schemas/mcp-2026-07-28.schema.json``) for the rest
  (``CallToolResult``, ``InputRequiredResult``, ``ListToolsResult``, ``DiscoverResult``),
  for the JSON-RPC envelope of every answer (``JSONRPCResultResponse``,
  ``JSONRPCErrorResponse``) and for the typed errors (-32602, -32603, -32020, -32021);
* the SDK's own pydantic models of 2026-07-28 (``mcp_types._v2026_07_28``, strict mode).
  That package is private, but it is the SDK's only model of the exact 2026-07-28 wire:
  the public ``mcp_types`` models are version-neutral (their ``CallToolResult`` defaults
  a missing ``resultType`` to ``"complete"``, so they could not catch one). The SDK has
  no model of the extension's task shapes, so a task answer is checked as a ``Result``
  and its parts as what they are: ``result`` a ``CallToolResult``, ``inputRequests``
  ``InputRequests``, ``error`` an ``Error``. Pydantic ignores unknown keys; the JSON
  schemas are the strict check.

``CHECKS_SCHEMA`` (at the URI ``CHECKS``) adds what the JSON files leave to prose but
the official TypeScript client (``@modelcontextprotocol/ext-tasks`` 0.2.2) enforces with
its zod schemas: a completed task's ``result`` is a ``CallToolResult`` with ``resultType:
"complete"`` (the client reported every Keel task as failed when it was not), and
``resultType`` is ``"complete"`` / ``"input_required"`` on inline results. See
``schemas/README.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from jsonschema import Draft202012Validator, ValidationError
from mcp_types import _v2026_07_28 as v26
from pydantic import TypeAdapter
from pydantic import ValidationError as ModelError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tasks_extension.support import WAIT, Answer, post

__all__ = [
    "CHECKS",
    "CHECKS_SCHEMA",
    "KINDS",
    "SCHEMAS",
    "Exchange",
    "Kind",
    "Wire",
    "tags",
    "violations",
]

SCHEMAS = Path(__file__).resolve().parent / "schemas"
EXT_FILE = "ext-tasks-2026-07-28.schema.json"
CORE_FILE = "mcp-2026-07-28.schema.json"
EXT = "https://modelcontextprotocol.io/ext-tasks/2026-07-28/schema.json"
CORE = "urn:mcp:2026-07-28:schema.json"  # the core file has no $id; this names it here
CHECKS = "urn:keel:tests:wire-checks"
FILES = {EXT: EXT_FILE, CORE: CORE_FILE, CHECKS: "wire_schema.CHECKS"}

CHECKS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        # ext-tasks 0.2.2 CompleteCallToolResultV2Schema (its client parses a completed
        # task's result and an inline tools/call answer with it).
        "CompleteCallToolResult": {
            "allOf": [
                {"$ref": f"{CORE}#/$defs/CallToolResult"},
                {"properties": {"resultType": {"const": "complete"}}},
            ]
        },
        # ext-tasks 0.2.2 InputRequiredCallToolResultV2Schema; the core schema says the
        # "at least one of" in its description only.
        "InputRequiredCallToolResult": {
            "allOf": [
                {"$ref": f"{CORE}#/$defs/InputRequiredResult"},
                {"properties": {"resultType": {"const": "input_required"}}},
                {"anyOf": [{"required": ["inputRequests"]}, {"required": ["requestState"]}]},
            ]
        },
        # The JSON schema's CompletedTask.result is any object; the client requires this.
        "CompletedTaskResult": {
            "if": {"properties": {"status": {"const": "completed"}}, "required": ["status"]},
            "then": {"properties": {"result": {"$ref": "#/$defs/CompleteCallToolResult"}}},
        },
    },
}


def _registry() -> Registry[Any]:
    ext = json.loads((SCHEMAS / EXT_FILE).read_text(encoding="utf-8"))
    core = json.loads((SCHEMAS / CORE_FILE).read_text(encoding="utf-8"))
    return Registry().with_resources(
        (uri, Resource.from_contents(contents, default_specification=DRAFT202012))
        for uri, contents in ((EXT, ext), (CORE, core), (CHECKS, CHECKS_SCHEMA))
    )


REGISTRY = _registry()


def _definition(uri: str, name: str) -> str:
    return f"{uri}#/$defs/{name}"


@dataclass(frozen=True)
class Model:
    """One SDK model check: the model applies to ``part(result_or_body)`` when not None."""

    name: str
    where: str
    part: Callable[[dict[str, Any]], Any]
    adapter: TypeAdapter[Any]


def _whole(value: dict[str, Any]) -> Any:
    return value


def _if_status(status: str, key: str) -> Callable[[dict[str, Any]], Any]:
    def part(result: dict[str, Any]) -> Any:
        return result.get(key, {}) if result.get("status") == status else None

    return part


def _model(name: str, where: str = "$", part: Callable[[dict[str, Any]], Any] = _whole) -> Model:
    return Model(name, where, part, TypeAdapter(getattr(v26, name)))


@dataclass(frozen=True)
class Kind:
    """What an answer must be: JSON schema definitions and SDK models for its ``result``
    (or, for ``error``, for the whole body)."""

    name: str
    schemas: tuple[str, ...]
    models: tuple[Model, ...] = ()
    error: bool = False


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("CreateTaskResult", (_definition(EXT, "CreateTaskResult"),), (_model("Result"),)),
        Kind(
            "GetTaskResult",
            (_definition(EXT, "GetTaskResult"), _definition(CHECKS, "CompletedTaskResult")),
            (
                _model("Result"),
                _model("CallToolResult", "$.result", _if_status("completed", "result")),
                _model(
                    "InputRequests",
                    "$.inputRequests",
                    _if_status("input_required", "inputRequests"),
                ),
                _model("Error", "$.error", _if_status("failed", "error")),
            ),
        ),
        Kind("UpdateTaskResult", (_definition(EXT, "UpdateTaskResult"),), (_model("Result"),)),
        Kind("CancelTaskResult", (_definition(EXT, "CancelTaskResult"),), (_model("Result"),)),
        Kind(
            "CallToolResult",
            (_definition(CHECKS, "CompleteCallToolResult"),),
            (_model("CallToolResult"),),
        ),
        Kind(
            "InputRequiredResult",
            (_definition(CHECKS, "InputRequiredCallToolResult"),),
            (_model("InputRequiredResult"),),
        ),
        Kind(
            "ListToolsResult", (_definition(CORE, "ListToolsResult"),), (_model("ListToolsResult"),)
        ),
        Kind("DiscoverResult", (_definition(CORE, "DiscoverResult"),), (_model("DiscoverResult"),)),
        Kind(
            "JSONRPCErrorResponse",
            (_definition(CORE, "JSONRPCErrorResponse"),),
            (_model("JSONRPCErrorResponse"),),
            error=True,
        ),
    )
}

# The typed errors of the core schema, by code: (definition, what it describes, SDK model).
# -32020 and -32021 describe the whole response, -32602 and -32603 the error object.
TYPED_ERRORS: dict[int, tuple[str, str, str]] = {
    -32020: ("HeaderMismatchError", "$", "HeaderMismatchError"),
    -32021: ("MissingRequiredClientCapabilityError", "$", "MissingRequiredClientCapabilityError"),
    -32602: ("InvalidParamsError", "$.error", "InvalidParamsError"),
    -32603: ("InternalError", "$.error", "InternalError"),
}


@dataclass(frozen=True)
class Exchange:
    """One request and its answer, with what the answer must be."""

    label: str
    method: str
    kind: str
    answer: Answer

    def describe(self) -> str:
        return f"{self.method} [{self.label}] (must be {self.kind})"


TERMINAL = {"completed", "failed", "cancelled"}
DISCRIMINATORS = {"status", "type", "method", "mode"}  # keys whose const picks a variant


def _leaves(error: ValidationError) -> list[ValidationError]:
    """The errors that say what is wrong: in an anyOf/oneOf, the branches whose
    discriminator (a ``const``) matched, else every branch."""
    if not error.context:
        return [error]
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    matching = [
        subs
        for subs in branches.values()
        if not any(s.validator == "const" and s.path and s.path[-1] in DISCRIMINATORS for s in subs)
    ]
    chosen = matching or list(branches.values())
    return [leaf for subs in chosen for sub in subs for leaf in _leaves(sub)]


def _schema_trail(definition: str, steps: Iterable[str | int]) -> str:
    """An error's schema path with each ``$ref`` it went through shown as the file and
    the definition it names: ``ext-tasks-….json#/$defs/GetTaskResult/allOf/1 > …``.

    jsonschema leaves ``$ref`` out of schema paths: a step a schema does not have is
    taken in the schema its ``$ref`` names."""
    resolver = REGISTRY.resolver()
    schema: Any = {"$ref": definition}
    base = ""
    trail = ""
    for step in steps:
        while isinstance(schema, dict) and step not in schema and "$ref" in schema:
            ref: str = schema["$ref"]
            base = base if ref.startswith("#") else ref.split("#", maxsplit=1)[0]
            resolved = resolver.lookup(ref)
            resolver, schema = resolved.resolver, resolved.contents
            where = f"{FILES[base]}#{ref.split('#', 1)[1]}"
            trail = f"{trail} > {where}" if trail else where
        schema = schema[step]
        trail += f"/{step}"
    return trail


def _schema_violations(where: str, instance: Any, definition: str) -> list[str]:
    validator = Draft202012Validator({"$ref": definition}, registry=REGISTRY)
    found = []
    for error in validator.iter_errors(instance):
        for leaf in _leaves(error):
            path = where + leaf.json_path.removeprefix("$")
            trail = _schema_trail(definition, leaf.absolute_schema_path)
            found.append(f"{path}: {leaf.message} [JSON schema {trail}]")
    return found


def _variant(loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The location up to the union member pydantic tried (``content.0.ImageContent``)."""
    for i, part in enumerate(loc):
        if isinstance(part, str) and part[:1].isupper():
            return loc[: i + 1]
    return None


def _model_violations(model: Model, value: Any) -> list[str]:
    try:
        model.adapter.validate_json(json.dumps(value), strict=True)
    except ModelError as exc:
        errors = exc.errors()
        # As for anyOf: leave out the union members whose discriminator did not match.
        mismatched = {
            _variant(e["loc"])
            for e in errors
            if e["type"] == "literal_error" and e["loc"] and e["loc"][-1] in DISCRIMINATORS
        } - {None}
        return [
            f"{model.where}{''.join(f'.{p}' for p in error['loc'])}: {error['msg']} "
            f"[SDK model mcp_types._v2026_07_28.{model.name}]"
            for error in errors
            if _variant(error["loc"]) not in mismatched
        ]
    return []


def violations(exchange: Exchange) -> list[str]:
    """Everything the answer breaks, one line each: the JSON path, what is wrong, and
    the schema definition (with its schema path) or SDK model that says so."""
    kind = KINDS[exchange.kind]
    body = exchange.answer.body
    if kind.error:
        if "error" not in body:
            return [f"$: expected a JSON-RPC error, got {json.dumps(body)[:300]}"]
        found = _schema_violations("$", body, kind.schemas[0])
        found += [v for m in kind.models for v in _model_violations(m, body)]
        code = body["error"].get("code") if isinstance(body["error"], Mapping) else None
        if isinstance(code, int) and code in TYPED_ERRORS:
            name, where, model = TYPED_ERRORS[code]
            part = body if where == "$" else body["error"]
            found += _schema_violations(where, part, _definition(CORE, name))
            found += _model_violations(_model(model, where), part)
        return found
    if "result" not in body:
        return [f"$: expected a JSON-RPC result, got {json.dumps(body)[:300]}"]
    found = _schema_violations("$", body, _definition(CORE, "JSONRPCResultResponse"))
    found += _model_violations(_model("JSONRPCResultResponse"), body)
    result = body["result"]
    for definition in kind.schemas:
        found += _schema_violations("$.result", result, definition)
    for model in kind.models:
        part = model.part(result) if isinstance(result, dict) else result
        if part is not None:
            found += _model_violations(
                Model(
                    model.name,
                    "$.result" + model.where.removeprefix("$"),
                    model.part,
                    model.adapter,
                ),
                part,
            )
    return found


def tags(exchange: Exchange) -> set[str]:
    """What an answer shows, for coverage: its kind, and its status, isError and error
    code where it has them (``GetTaskResult:completed:isError``, ``error:-32602``)."""
    body = exchange.answer.body
    if "error" in body:
        return {f"error:{body['error'].get('code')}"}
    result = body.get("result", {})
    found = {exchange.kind}
    if "status" in result:
        found.add(f"{exchange.kind}:{result['status']}")
        if result.get("result", {}).get("isError"):
            found.add(f"{exchange.kind}:{result['status']}:isError")
    elif result.get("isError"):
        found.add(f"{exchange.kind}:isError")
    return found


@dataclass
class Wire:
    """Sends requests to ``url`` and records every answer with what it must be."""

    url: str
    exchanges: list[Exchange] = field(default_factory=list)

    async def send(
        self,
        kind: str,
        label: str,
        method: str,
        params: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Answer:
        assert kind in KINDS, kind
        answer = await post(self.url, method, params, **options)
        self.exchanges.append(Exchange(label, method, kind, answer))
        return answer

    async def call(self, kind: str, label: str, name: str, **params: Any) -> Answer:
        """``tools/call`` of ``name`` with ``params``; ``declared`` and ``capabilities`` go to
        :func:`~tasks_extension.support.post`."""
        options = {k: params.pop(k) for k in ("declared", "capabilities") if k in params}
        return await self.send(kind, label, "tools/call", {"name": name, **params}, **options)

    async def until(self, task_id: str, label: str, *statuses: str) -> dict[str, Any]:
        """``tasks/get`` until the task has one of ``statuses`` (bounded); every answer
        on the way is recorded."""
        with anyio.fail_after(WAIT):
            while True:
                answer = await self.send("GetTaskResult", label, "tasks/get", {"taskId": task_id})
                status = answer.result["status"]
                if status in statuses:
                    return answer.result
                assert status not in TERMINAL, f"{label}: ended {status}, not {statuses}"
                await anyio.sleep(0.02)
