"""Unit: payload checks (JSON-ness, sizes, names, schemas, input validation). Pure."""

from __future__ import annotations

import math

import pytest

from keel import ArgumentsRejected, InputRejected, InvalidPayload, PayloadTooLarge, UnstorableText
from keel.model import Limits
from keel.model.validation import (
    MAX_DEPTH,
    canonical,
    check_key,
    check_message,
    check_schema,
    check_seconds,
    encode,
    encoded_text,
    field_path,
    normalize,
    unstorable,
    validate_arguments,
    validate_input,
)

SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}


# --- encode / normalize -----------------------------------------------------------------


def test_encode_is_compact_and_keeps_unicode():
    """encode writes compact JSON with non-ASCII characters as themselves."""
    assert encode({"a": [1, 2], "b": "é"}, "x", 100) == '{"a":[1,2],"b":"é"}'


@pytest.mark.parametrize(
    "value",
    [{1, 2}, math.nan, math.inf, -math.inf, b"bytes", object(), {(1, 2): "tuple key"}],
    ids=["set", "nan", "inf", "-inf", "bytes", "object", "tuple-key"],
)
def test_encode_refuses_what_json_cannot_hold(value):
    """Sets, NaN, infinities, bytes, objects and tuple keys raise InvalidPayload naming it
    (and, for a number JSON has no form for, where it is: ``thing.v: nan is not JSON``)."""
    with pytest.raises(InvalidPayload, match=r"^thing(\.v: \S+)? is not JSON") as info:
        encode({"v": value}, "thing", 1000)
    assert not isinstance(info.value, PayloadTooLarge)


def test_encode_turns_scalar_keys_into_strings():
    """Number, boolean and null keys become strings, as in json (documented, not refused)."""
    assert normalize({2: "a", True: "b", None: "c"}, "thing", 1000)[1] == {
        "2": "a",
        "true": "b",
        "null": "c",
    }


def test_encode_limit_is_inclusive_and_counts_utf8_bytes():
    """A payload exactly at the limit passes; one byte over raises PayloadTooLarge."""
    assert encode("é" * 4, "v", 10) == '"éééé"'  # 2 quotes + 4 * 2 bytes = 10 bytes
    with pytest.raises(PayloadTooLarge) as info:
        encode("é" * 5, "v", 10)
    assert (info.value.what, info.value.size, info.value.limit) == ("v", 12, 10)
    assert str(info.value) == "v is 12 bytes as JSON; the limit is 10 bytes"


def test_encoded_text_hands_out_a_normalized_copys_text_once():
    _, other = normalize({"a": [1]}, "x", 100)
    assert encoded_text(other) is None  # not kept
    text, copy = normalize({"a": [1]}, "x", 100, keep_text=True)
    assert encoded_text({"a": [1]}) is None  # an equal value is not the copy
    assert encoded_text(copy) == text
    assert encoded_text(copy) is None


def test_normalize_returns_a_private_decoded_copy():
    """normalize returns the text and a fresh copy: tuples become lists, no shared objects."""
    value = {"a": (1, 2), "b": {"c": [3]}}
    text, copy = normalize(value, "v", 1000)
    assert text == '{"a":[1,2],"b":{"c":[3]}}'
    assert copy == {"a": [1, 2], "b": {"c": [3]}}
    copy["b"]["c"].append(4)
    assert value["b"]["c"] == [3]


def test_canonical_ignores_key_order():
    """Equal JSON objects have equal canonical forms, whatever their key order."""
    assert canonical({"b": 1, "a": {"d": 2, "c": 3}}) == canonical({"a": {"c": 3, "d": 2}, "b": 1})
    assert canonical({"a": 1}) != canonical({"a": 1.5})


def test_default_limits():
    """The default limits are generous (MiB) and documented in bytes/characters."""
    limits = Limits()
    assert limits.max_arguments_bytes == limits.max_input_bytes == 1 << 20
    assert limits.max_result_bytes == limits.max_step_bytes == 8 << 20
    assert (limits.max_name_chars, limits.max_message_chars) == (256, 16_384)


# --- names and messages -----------------------------------------------------------------


@pytest.mark.parametrize("value", ["", None, 5, b"k", "k" * 9])
def test_check_key_refuses_empty_non_string_and_long(value):
    """Keys must be non-empty strings within max_name_chars."""
    with pytest.raises(InvalidPayload, match="idempotency key"):
        check_key(value, "idempotency key", Limits(max_name_chars=8))


def test_check_key_accepts_a_key_at_the_limit():
    """A key exactly max_name_chars long is accepted and returned."""
    assert check_key("k" * 8, "key", Limits(max_name_chars=8)) == "k" * 8


def test_check_message_bounds_length_and_type():
    """Messages must be strings within max_message_chars; empty is fine."""
    limits = Limits(max_message_chars=3)
    assert check_message("", "m", limits) == ""
    assert check_message("abc", "m", limits) == "abc"
    for bad in ("abcd", 3, None):
        with pytest.raises(InvalidPayload):
            check_message(bad, "m", limits)


@pytest.mark.parametrize(
    ("value", "allow_zero", "ok"),
    [
        (0, True, True),
        (0, False, False),
        (1.5, False, True),
        (-1, True, False),
        (math.nan, True, False),
        (math.inf, True, False),
        (True, True, False),
        ("5", True, False),
    ],
)
def test_check_seconds(value, allow_zero, ok):
    """Durations are finite, non-negative numbers (and positive where zero is not allowed)."""
    if ok:
        assert check_seconds(value, "d", allow_zero=allow_zero) == float(value)
    else:
        with pytest.raises(InvalidPayload):
            check_seconds(value, "d", allow_zero=allow_zero)


# --- schemas ----------------------------------------------------------------------------


def test_check_schema_accepts_a_schema_and_copies_it():
    """A valid schema is returned as a new dict."""
    got = check_schema(SERVICE, "schema")
    assert got == SERVICE
    assert got is not SERVICE


@pytest.mark.parametrize(
    "schema",
    [[], "object", {"type": "nope"}, {"required": "service"}, {"minLength": -1}],
    ids=["list", "str", "bad-type", "required-str", "negative-min"],
)
def test_check_schema_refuses_invalid_schemas(schema):
    """A non-object or invalid JSON Schema raises InvalidPayload naming what it was."""
    with pytest.raises(InvalidPayload, match="the schema"):
        check_schema(schema, "the schema")


def test_empty_schema_accepts_anything():
    """The empty schema {} accepts any JSON value."""
    for value in (None, 1, "x", [1], {"a": 1}):
        validate_input("t", "k", {}, value)


def test_valid_input_passes():
    """An answer satisfying its schema raises nothing."""
    validate_input("t", "svc", SERVICE, {"service": "payments"})


@pytest.mark.parametrize(
    ("schema", "value", "path"),
    [
        pytest.param(SERVICE, {}, "service", id="missing-required"),
        pytest.param(SERVICE, {"service": 1}, "service", id="wrong-type"),
        pytest.param(SERVICE, [], "", id="root"),
        pytest.param(
            {"type": "object", "properties": {"a": SERVICE}}, {"a": {}}, "a/service", id="nested"
        ),
        pytest.param(
            {"type": "array", "items": {"type": "integer"}}, [1, "x"], "1", id="array-index"
        ),
        pytest.param({"type": "object", "required": ["a", "b"]}, {"b": 1}, "a", id="first-missing"),
    ],
)
def test_validate_input_names_the_offending_field(schema, value, path):
    """InputRejected carries the path of the first violation and the task, key and reason."""
    with pytest.raises(InputRejected) as info:
        validate_input("task-1", "svc", schema, value)
    error = info.value
    assert (error.task_id, error.key, error.path) == ("task-1", "svc", path)
    assert error.reason
    assert "task-1" in str(error)
    assert "'svc'" in str(error)
    assert isinstance(error, InvalidPayload)


# --- text no store keeps (issue 15) -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ok", None),
        ("\U0001f600 é \\u0000", None),  # astral, accented, an escaped backslash: fine
        ("a\x00b", "NUL (U+0000) at index 1 cannot be stored"),
        ("x\udfff", "the lone surrogate U+DFFF at index 1 is not Unicode text"),
    ],
)
def test_unstorable_names_the_character_and_where(text, reason):
    """NUL and lone surrogates are refused, with their index; other text is storable."""
    found = unstorable(text)
    assert (found is None) == (reason is None)
    if reason is not None:
        assert found is not None
        assert found.startswith(reason)


def test_field_path_prints_any_key():
    """Identifiers join with dots, indices in brackets, other keys escaped in quotes."""
    assert field_path("arguments", ["a", 0, "b c", "\x00", "\ud800"]) == (
        'arguments.a[0]["b c"]["\\u0000"]["\\ud800"]'
    )


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"note": "\ud800"}, "v.note"),
        ({"hosts": ["a", "b\x00"]}, "v.hosts[1]"),
        ({"k\x00": 1}, 'v["k\\u0000"]'),
        ("\x00", "v"),
    ],
)
def test_encode_refuses_unstorable_text_naming_the_field(value, field):
    """encode (so every payload a store keeps) refuses such text, naming where it is."""
    with pytest.raises(UnstorableText) as info:
        encode(value, "v", 1000)
    assert info.value.field == field
    assert isinstance(info.value, InvalidPayload)


def test_keys_and_messages_refuse_unstorable_text():
    """Names, keys and messages (stored as text columns) are refused the same way."""
    with pytest.raises(UnstorableText, match=r"^idempotency key: NUL"):
        check_key("k\x00", "idempotency key")
    with pytest.raises(UnstorableText, match=r"^status message: the lone surrogate"):
        check_message("\ud800", "status message")


def test_encode_refuses_a_value_that_holds_itself():
    """A cycle is not JSON (and finding where the fault is ends, too)."""
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(InvalidPayload, match="v is not JSON: Circular reference"):
        encode({"a": cycle}, "v", 1000)


def test_encode_refuses_nesting_too_deep_to_encode():
    """A value nested past the encoder's recursion limit is InvalidPayload naming where,
    not a crash; so is one just past MAX_DEPTH, which the encoder could still encode."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidPayload, match=r"^v\[0\]: nests deeper than 64 levels$"):
        encode(deep, "v", 10 << 20)
    at_the_bound: object = 1
    for _ in range(MAX_DEPTH):
        at_the_bound = {"k": at_the_bound}
    assert encode(at_the_bound, "v", 10 << 20)
    with pytest.raises(InvalidPayload, match=r"^v\.k: nests deeper than 64 levels$"):
        encode({"k": at_the_bound}, "v", 10 << 20)


def test_a_wide_value_is_not_too_deep():
    """Many containers side by side (brackets far over MAX_DEPTH) are not depth."""
    wide = {"rows": [{"a": [1, 2], "b": {"c": [3]}} for _ in range(1000)]}
    assert encode(wide, "v", 10 << 20).startswith('{"rows":')
    # Brackets in text, around escaped quotes and backslashes, are no nesting either.
    text = {'k\\"[': "[{" * 200 + '\\"' + "[" * 100, "n": [[["\\"]]] * 50}
    assert encode(text, "v", 10 << 20)
    deep: object = '\\"[[['
    for _ in range(MAX_DEPTH):
        deep = [deep, {"\\": "]]]}}}"}]
    with pytest.raises(InvalidPayload, match=r"^v\[0\]: nests deeper than 64 levels$"):
        encode(deep, "v", 10 << 20)


def test_validate_arguments_names_the_field_from_arguments():
    """Arguments against their schema: ArgumentsRejected (an InputRejected) naming
    ``arguments.<path>``, with the path inside the arguments as InputRejected has it."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
    }
    with pytest.raises(ArgumentsRejected) as info:
        validate_arguments(schema, {"a": [1, "x"]})
    assert str(info.value) == "arguments.a[1]: 'x' is not of type 'integer'"
    assert (info.value.field, info.value.path) == ("arguments.a[1]", "a/1")
    assert isinstance(info.value, InputRejected)
