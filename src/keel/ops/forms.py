"""An input request's JSON Schema as an HTML form, and the submitted form back as JSON.

Each property of the (object) schema is one field named after it: a ``<select>`` for an
enum or a boolean, a number input for ``integer`` / ``number``, a text input for a
string, a JSON text area for anything else. Turning the submitted strings back into JSON
is best effort only (``"12"`` for an integer becomes ``12``; ``"twelve"`` stays a
string): whether the answer is acceptable is decided by the store, by the very checks
``tasks/update`` goes through (:func:`keel.ops.actions.answer`), so a form can never
accept what the protocol refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keel.model import JsonValue

__all__ = ["RESERVED", "Field", "fields_of", "value_of"]

RESERVED = frozenset({"keel.csrf", "keel.request"})
"""Form field names the console itself uses (no schema property is read from them)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One form field of an input request."""

    name: str
    kind: str
    """``select``, ``number``, ``text`` or ``json``."""
    label: str
    description: str
    required: bool
    options: tuple[tuple[str, str], ...] = ()
    """``(value, label)`` of a select's choices."""
    step: str = "any"
    value: str = ""
    """What the field shows: the default, or what was submitted last."""


def _choices(spec: Mapping[str, Any]) -> list[tuple[Any, str]] | None:
    """An enumerated property's ``(value, label)`` choices (None: it is not one)."""
    if isinstance(spec.get("enum"), list):
        values = spec["enum"]
        names = spec.get("enumNames")
        if isinstance(names, list) and len(names) == len(values):
            return [(v, str(n)) for v, n in zip(values, names, strict=True)]
        return [(v, _text(v)) for v in values]
    for key in ("oneOf", "anyOf"):
        listed = spec.get(key)
        if isinstance(listed, list) and all(isinstance(c, dict) and "const" in c for c in listed):
            return [(c["const"], str(c.get("title", _text(c["const"])))) for c in listed]
    return None


def _text(value: Any) -> str:
    """How a JSON value is written in a form field."""
    return value if isinstance(value, str) else json.dumps(value)


def fields_of(schema: Mapping[str, Any], submitted: Mapping[str, str] | None = None) -> list[Field]:
    """The form fields of a requested schema, in the order of its properties."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return []
    required = set(schema.get("required") or [])
    fields = []
    for name, given in properties.items():
        spec = given if isinstance(given, dict) else {}
        default = spec.get("default")
        value = (submitted or {}).get(name, "" if default is None else _text(default))
        common = {
            "name": name,
            "label": str(spec.get("title") or name),
            "description": str(spec.get("description") or ""),
            "required": name in required,
            "value": value,
        }
        choices = _choices(spec)
        kind = spec.get("type")
        if choices is not None:
            options = tuple((_text(v), label) for v, label in choices)
            fields.append(Field(kind="select", options=options, **common))
        elif kind == "boolean":
            yes_no = (("true", "yes"), ("false", "no"))
            fields.append(Field(kind="select", options=yes_no, **common))
        elif kind in ("integer", "number"):
            step = "1" if kind == "integer" else "any"
            fields.append(Field(kind="number", step=step, **common))
        elif kind == "string":
            fields.append(Field(kind="text", **common))
        else:
            fields.append(Field(kind="json", **common))
    return fields


def value_of(schema: Mapping[str, Any], form: Mapping[str, str]) -> dict[str, JsonValue]:
    """The answer a submitted form stands for (empty fields left out).

    Values that do not convert stay the strings they were, for the schema to refuse.
    """
    properties = schema.get("properties")
    required = set(schema.get("required") or [])
    answer: dict[str, JsonValue] = {}
    for name, spec in (properties if isinstance(properties, dict) else {}).items():
        raw = form.get(name)
        if raw is None or name in RESERVED:
            continue
        if raw == "" and not (name in required and _wants_string(spec)):
            continue  # left empty: not given (a required string is the empty string)
        answer[name] = _convert(spec if isinstance(spec, dict) else {}, raw)
    return answer


def _wants_string(spec: Any) -> bool:
    return isinstance(spec, dict) and spec.get("type") == "string" and "enum" not in spec


def _convert(spec: Mapping[str, Any], raw: str) -> JsonValue:
    choices = _choices(spec)
    if choices is not None:
        for original, _ in choices:
            if _text(original) == raw:
                return original
        return raw
    kind = spec.get("type")
    if kind == "boolean":
        return {"true": True, "false": False}.get(raw, raw)
    if kind == "integer":
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind == "number":
        try:
            number = float(raw)
        except ValueError:
            return raw
        return int(number) if number.is_integer() and "." not in raw else number
    if kind == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw
