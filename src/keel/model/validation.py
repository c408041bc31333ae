"""Checks every payload passes before it is stored: JSON-ness, size, schemas. Pure."""

from __future__ import annotations

import functools
import json
import math
import re
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from keel.errors import (
    ArgumentsRejected,
    InputRejected,
    InvalidPayload,
    PayloadTooLarge,
    UnknownInputKey,
    UnstorableText,
)
from keel.model.task import JsonObject, JsonValue, Task

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

# jsonschema is imported on first use, not here: it takes a third of a second to import,
# and most commands (`keel tasks list`, `keel --help`) never validate anything.

__all__ = [
    "MAX_DEPTH",
    "Limits",
    "canonical",
    "check_answer_keys",
    "check_depth",
    "check_key",
    "check_schema",
    "check_text",
    "describe_schema",
    "encode",
    "encoded_text",
    "field_path",
    "loads_bounded",
    "normalize",
    "storable",
    "unstorable",
    "validate_arguments",
    "validate_input",
]

MiB = 1 << 20

# Built once: json.dumps builds a new encoder per call whenever an option is not default.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_DECODE = msgspec.json.Decoder().decode
"""Decodes what :data:`_ENCODE` wrote (checked: no NaN, no lone surrogate, not too deep) to
the values ``json.loads`` gives, in C: a quarter of the instructions of ``json.loads``."""
_CANONICAL = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=True
).encode


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits, in bytes of the JSON encoding (UTF-8) or characters for names."""

    max_arguments_bytes: int = 1 * MiB
    max_input_bytes: int = 1 * MiB
    max_result_bytes: int = 8 * MiB
    max_step_bytes: int = 8 * MiB
    max_name_chars: int = 256
    """Task names, idempotency keys, input keys, step names, owners, worker ids."""
    max_message_chars: int = 16_384
    """Status messages, input request messages, reasons."""


DEFAULT_LIMITS = Limits()

# --- text no store keeps ---------------------------------------------------------------
# A lone surrogate (U+D800..U+DFFF in a Python str) is not Unicode text: it has no UTF-8
# form, so no adapter can write it. NUL is refused as well, in every text and on every
# store: PostgreSQL's text cannot hold it, and a store must not accept what another
# refuses (a task moved between stores, or a handler that puts an argument into its
# status message, would fail later instead of now).
_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_NUL = "\\u0000"  # how the JSON encoder writes NUL in a string


def unstorable(text: str) -> str | None:
    """Why no store can keep ``text`` (a NUL or a lone surrogate in it), or None."""
    at = text.find("\x00")
    if at >= 0:
        return f"NUL (U+0000) at index {at} cannot be stored"
    if not text.isascii():
        found = _SURROGATE.search(text)
        if found is not None:
            return (
                f"the lone surrogate U+{ord(found.group()):04X} at index {found.start()} is not "
                "Unicode text and cannot be stored"
            )
    return None


def storable(text: str) -> bool:
    """Whether every store can keep ``text`` (see :func:`unstorable`)."""
    return unstorable(text) is None


def check_text(value: str, what: str) -> str:
    """Refuse a string no store can keep.

    Raises:
        UnstorableText: naming ``what`` and the character.
    """
    reason = unstorable(value)
    if reason is not None:
        raise UnstorableText(what, reason)
    return value


def field_path(root: str, parts: Iterable[str | int]) -> str:
    """``root`` followed by a path into a JSON value, printable whatever the keys hold:
    ``arguments.incident_id``, ``arguments.items[0]``, ``arguments["odd key"]``."""
    shown = [root]
    for part in parts:
        if isinstance(part, int):
            shown.append(f"[{part}]")
        elif part.isidentifier():
            shown.append(f".{part}")
        else:  # escaped: a key with NUL or a lone surrogate still prints
            shown.append(f"[{json.dumps(part)}]")
    return "".join(shown)


def _first_unstorable(value: object) -> tuple[list[str | int], str] | None:
    """Where in a JSON value the first string (or key) no store keeps is, or the first
    number JSON has no form for (NaN, an infinity), and why."""
    stack: list[tuple[object, list[str | int]]] = [(value, [])]
    seen: set[int] = set()  # containers walked: a value that holds itself ends the walk
    while stack:  # a stack, not recursion: nesting as deep as the encoder allows
        item, path = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, str):
            reason = unstorable(item)
            if reason is not None:
                return path, reason
        elif isinstance(item, float) and not math.isfinite(item):
            return path, f"{item} is not JSON (no JSON number is NaN or infinite)"
        elif isinstance(item, Mapping):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and not storable(key):
                    return [*path, key], f"the key itself: {unstorable(key)}"
                stack.append((child, [*path, key]))
        elif isinstance(item, list | tuple):
            stack.extend((child, [*path, i]) for i, child in reversed(list(enumerate(item))))
    return None


# --- how deep ----------------------------------------------------------------------------

MAX_DEPTH = 64
"""How deep arrays and objects may nest in any JSON Keel stores (arguments, input
answers, results, errors, step values) and in JSON the CLI is given: far beyond any
real value, and far below the ~1,000 levels where Python's recursive JSON decoder and
encoder give up (fewer still deep inside a call stack). The same on every store."""


def _too_deep(value: object, max_depth: int) -> list[str | int] | None:
    """The path to the first array or object nested ``max_depth`` deep in ``value`` (the
    value itself is depth 0), or None. Walks only containers, without recursion, so a
    value of any depth (or one that holds itself) is answered."""
    stack: list[tuple[object, list[str | int]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if len(path) >= max_depth:
            return path
        if isinstance(item, Mapping):
            stack.extend(
                (child, [*path, key])
                for key, child in item.items()
                if isinstance(child, Mapping | list | tuple)
            )
        elif isinstance(item, list | tuple):
            stack.extend(
                (child, [*path, i])
                for i, child in enumerate(item)
                if isinstance(child, Mapping | list | tuple)
            )
    return None


def check_depth(value: object, what: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse JSON whose arrays and objects nest deeper than ``max_depth`` (see
    :data:`MAX_DEPTH`); :func:`encode` does it for every value a store keeps.

    Raises:
        InvalidPayload: naming ``what``.
    """
    if isinstance(value, Mapping | list | tuple) and _too_deep(value, max_depth) is not None:
        raise InvalidPayload(f"{what} nests deeper than {max_depth} levels")


def loads_bounded(text: str, what: str = "the JSON", **options: Any) -> Any:
    """``json.loads`` that answers JSON nested too deep for Python's parser as
    :func:`check_depth` answers JSON nested deeper than :data:`MAX_DEPTH`.

    Raises:
        json.JSONDecodeError: not JSON.
        InvalidPayload: nested too deep for the parser (a ``ValueError`` too).
        ValueError: whatever a hook given in ``options`` raises.
    """
    try:
        return json.loads(text, **options)
    except RecursionError:
        # The parser's own answer to depth: one clear line, the same limit as for a value.
        raise InvalidPayload(f"{what} nests deeper than {MAX_DEPTH} levels") from None


_ONLY_BRACKETS = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))


def _may_be_deep(text: str) -> bool:
    """Whether compact JSON ``text`` may nest deeper than :data:`MAX_DEPTH`, from its
    brackets alone, at C speed (the walk of the value costs as much as encoding it).

    Strings go first (an escaped backslash or quote, then every quoted run), then all but
    the brackets; each pass then removes the empty ``[]`` and ``{}``, that is at least one
    level and at most two (a ``{}`` freed by removing ``[]`` goes in the same pass). A
    text still holding brackets after ``MAX_DEPTH // 2`` passes may be too deep; one
    emptied sooner is not."""
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    brackets = "".join(text.split('"')[::2]).translate(_ONLY_BRACKETS)
    for _ in range(MAX_DEPTH // 2):
        if not brackets:
            return False
        brackets = brackets.replace("[]", "").replace("{}", "")
    return bool(brackets)


def _refuse_deep(value: object, what: str) -> None:
    """Refuse a value nested deeper than :data:`MAX_DEPTH`, naming the field of ``what``
    it is in (``arguments.tree: nests deeper than 64 levels``)."""
    path = _too_deep(value, MAX_DEPTH)
    if path is not None:
        raise InvalidPayload(f"{field_path(what, path[:1])}: nests deeper than {MAX_DEPTH} levels")


def _check_encoded(value: object, text: str, what: str) -> None:
    # Fast on the encoded text; the value is walked only when it may hold such text.
    if _JSON_NUL in text or (not text.isascii() and _SURROGATE.search(text) is not None):
        found = _first_unstorable(value)
        if found is not None:  # else an escaped backslash before "u0000": storable
            raise UnstorableText(field_path(what, found[0]), found[1])


def encode(value: JsonValue, what: str, limit: int) -> str:
    """Encode ``value`` as compact JSON, refusing what JSON cannot hold, what no store
    keeps, or what is too big.

    Raises:
        InvalidPayload: the value is not JSON (a set, bytes, NaN, an object key that is not
            a string, number, boolean or null; such keys become strings, as in ``json``),
            or nests deeper than :data:`MAX_DEPTH` (naming the field it is in).
        UnstorableText: a string (or key) in it holds NUL or a lone surrogate; the error
            names where (``what`` then the path: ``arguments.note``).
        PayloadTooLarge: the encoding is longer than ``limit`` bytes.
    """
    try:
        text = _ENCODE(value)
    except ValueError as exc:  # NaN or an infinity (named where it is), or a cycle
        found = _first_unstorable(value)
        if found is not None:
            raise InvalidPayload(f"{field_path(what, found[0])}: {found[1]}") from exc
        raise InvalidPayload(f"{what} is not JSON: {exc}") from exc
    except TypeError as exc:
        raise InvalidPayload(f"{what} is not JSON: {exc}") from exc
    except RecursionError:
        _refuse_deep(value, what)
        raise InvalidPayload(f"{what} is nested too deeply to store") from None
    # Nesting MAX_DEPTH deep takes that many brackets at least, and it shows in them.
    if (
        len(text) > 2 * MAX_DEPTH
        and text.count("[") + text.count("{") > MAX_DEPTH
        and _may_be_deep(text)
    ):
        _refuse_deep(value, what)
    _check_encoded(value, text, what)
    # Every UTF-8 character is at most 4 bytes: skip the byte count when it cannot matter.
    if len(text) * 4 > limit:
        size = len(text.encode("utf-8"))
        if size > limit:
            raise PayloadTooLarge(what, size, limit)
    return text


def normalize(
    value: JsonValue, what: str, limit: int, *, keep_text: bool = False
) -> tuple[str, JsonValue]:
    """Encode ``value`` and decode it again: the stored text and a private copy of the value.

    The copy is what the store keeps and returns, so a caller mutating its own object
    afterwards cannot change a snapshot, and tuples come back as lists on every adapter.
    ``keep_text``: the copy is about to be stored; :func:`encoded_text` gives its text.
    """
    text = encode(value, what, limit)
    copy = _DECODE(text)
    if keep_text and isinstance(copy, (dict, list)) and len(text) <= _MEMO_CHARS:
        _remember(copy, text)
    return text, copy


_MEMO = threading.local()
_MEMO_SIZE = 128  # more than a write group's outcomes; cleared when full
_MEMO_CHARS = 1 << 16  # a larger value is encoded again rather than held here


def _remember(copy: JsonValue, text: str) -> None:
    memo: dict[int, tuple[JsonValue, str]] | None = getattr(_MEMO, "texts", None)
    if memo is None or len(memo) >= _MEMO_SIZE:
        memo = _MEMO.texts = {}
    memo[id(copy)] = (copy, text)  # the copy is held: its id cannot be reused meanwhile


def encoded_text(value: object) -> str | None:
    """The text :func:`normalize` (``keep_text``) decoded ``value`` from in this thread, if
    ``value`` is that very copy; None otherwise. Each copy's text is handed out once.

    A store encodes a result it has just normalized without encoding it again: the copy
    is private to the store until its transaction ends (nothing can mutate it), and
    decoding then encoding compact JSON gives the same text back.
    """
    memo: dict[int, tuple[JsonValue, str]] | None = getattr(_MEMO, "texts", None)
    if memo is None:
        return None
    found = memo.pop(id(value), None)
    return found[1] if found is not None and found[0] is value else None


def canonical(value: JsonValue) -> str:
    """A byte-exact comparison form: keys sorted, so that equal JSON compares equal."""
    return _CANONICAL(value)


def check_key(value: object, what: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """Check a name-like string (task name, idempotency key, input key, owner …).

    Raises:
        InvalidPayload: not a non-empty string, or longer than the limit.
    """
    if not isinstance(value, str) or not value:
        raise InvalidPayload(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > limits.max_name_chars:
        raise InvalidPayload(
            f"{what} is {len(value)} characters; the limit is {limits.max_name_chars}"
        )
    return check_text(value, what)


def check_message(value: object, what: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """Check a human-readable message.

    Raises:
        InvalidPayload: not a string, or longer than the limit.
    """
    if not isinstance(value, str):
        raise InvalidPayload(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > limits.max_message_chars:
        raise InvalidPayload(
            f"{what} is {len(value)} characters; the limit is {limits.max_message_chars}"
        )
    return check_text(value, what)


def check_schema(schema: object, what: str) -> JsonObject:
    """Check that ``schema`` is a JSON Schema object (draft 2020-12).

    Raises:
        InvalidPayload: it is not an object, or not a valid schema.
    """
    if not isinstance(schema, Mapping):
        raise InvalidPayload(f"{what} must be a JSON Schema object, not {type(schema).__name__}")
    try:
        _validator(canonical(schema))
    except _jsonschema().SchemaError as exc:
        raise InvalidPayload(f"{what} is not a valid JSON Schema: {exc.message}") from exc
    return dict(schema)


def validate_input(task_id: str, key: str, schema: JsonObject, value: JsonValue) -> None:
    """Check an answer against the schema it was requested with.

    Raises:
        InputRejected: naming the first offending field and why.
    """
    found = _violation(schema, value)
    if found is not None:
        path, reason = found
        raise InputRejected(task_id, key, "/".join(str(part) for part in path), reason)


def validate_arguments(schema: JsonObject, arguments: JsonValue) -> None:
    """Check a new task's (or a plain tool's) arguments against its input schema; a NaN
    or an infinity is refused whatever the schema says.

    Raises:
        ArgumentsRejected: naming the first offending field (``arguments.incident_id``).
    """
    found = _first_non_finite(arguments) or _violation(schema, arguments)
    if found is not None:
        path, reason = found
        raise ArgumentsRejected(
            field_path("arguments", path), "/".join(str(part) for part in path), reason
        )


def _first_non_finite(value: object) -> tuple[list[str | int], str] | None:
    """Where in a JSON value the first NaN or infinity is (which a JSON Schema's bounds
    let through: every comparison with NaN is false), and why it is refused."""
    stack: list[tuple[object, list[str | int]]] = [(value, [])]
    while stack:  # a stack, not recursion: arguments may nest deeply
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path, f"{item} is not JSON (no JSON number is NaN or infinite)"
        if isinstance(item, Mapping):
            stack.extend((child, [*path, str(key)]) for key, child in reversed(list(item.items())))
        elif isinstance(item, list | tuple):
            stack.extend((child, [*path, i]) for i, child in reversed(list(enumerate(item))))
    return None


def _violation(schema: JsonObject, value: JsonValue) -> tuple[list[str | int], str] | None:
    """The path of the first field ``value`` gets wrong, and what the schema says of it."""
    validator = _validator(canonical(schema))
    try:
        if validator.is_valid(value):
            return None
        error = _jsonschema().exceptions.best_match(validator.iter_errors(value))
        if error is None:  # pragma: no cover - is_valid said otherwise
            return None
        message = error.message
    except RecursionError:
        return [], "nested too deeply to check"
    path: list[str | int] = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [p for p in error.validator_value if p not in error.instance]
        if missing:
            path.append(str(missing[0]))
    return path, message


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Draft202012Validator:
    validator_class = _jsonschema().Draft202012Validator
    schema: Any = json.loads(schema_text)
    validator_class.check_schema(schema)
    validator: Draft202012Validator = validator_class(schema)
    return validator


def _jsonschema() -> Any:
    import jsonschema

    return jsonschema


def describe_schema(schema: Mapping[str, Any]) -> str:
    """A human question for a schema that came without a message: its ``description``,
    else the fields it requires."""
    description = schema.get("description")
    if isinstance(description, str) and description:
        return description
    required = schema.get("required")
    if isinstance(required, list) and required:
        return "input required: " + ", ".join(str(r) for r in required)
    return "input required"


def check_seconds(value: object, what: str, *, allow_zero: bool = True) -> float:
    """Check a duration in seconds.

    Raises:
        InvalidPayload: not a finite, non-negative number.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidPayload(f"{what} must be a finite number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidPayload(f"{what} must be {'>= 0' if allow_zero else '> 0'}, not {value!r}")
    return float(value)


def check_answer_keys(task: Task, keys: Collection[str]) -> None:
    """Refuse answers to a waiting task none of whose keys is an open input request.

    The store ignores answers to keys that are unknown or already answered (``tasks/update``
    must, per the spec); callers that a person drives (``Keel.answer``, ``keel tasks
    answer``) check first, so that a mistake is reported instead of silently dropped.

    Raises:
        UnknownInputKey: no key names a pending request; the error names those expected.
    """
    pending = task.pending_input
    if not any(key in pending for key in keys):
        answered = [key for key in task.input_requests if key not in pending]
        raise UnknownInputKey(task.task_id, list(keys), list(pending), answered)
