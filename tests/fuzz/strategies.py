"""Hypothesis strategies of hostile MCP requests, as raw HTTP: what a client may send.

Every strategy draws a :class:`Probe` (the bytes of one HTTP POST body, its headers and
what kind of probe it is) for one :class:`Target`: a server seen through one protocol
(``2026-07-28`` with the tasks extension declared or not, or a ``2025-11-25`` session),
its tools and the tasks seeded on it. Four kinds, as issue 15 lists them:

``envelope``
    JSON-RPC envelopes: missing, extra and wrong-typed ``jsonrpc``/``id``/``method``/
    ``params``, unknown methods, batches, stray responses, non-JSON and huge bodies,
    wrong content types, wrong or missing routing and session headers.
``arguments``
    ``tools/call`` of each tool with arguments built from its input schema, each value
    valid or odd (wrong types, lone surrogates, NUL, 5,000-character strings, NaN,
    infinities, huge numbers, deep nesting), extra keys, arguments that are no object.
``task-id``
    ``tasks/*`` with task ids seeded (waiting, finished) or odd (wrong types, NUL, lone
    surrogates, huge, empty), and odd extra params.
``answer``
    ``tasks/update`` answers to a task that waits for input (2026-07-28): odd keys,
    actions and contents; on 2025-11-25 (whose answers are JSON-RPC responses to the
    server's ``elicitation/create``) stray and malformed responses.

The bench (``bench/fuzz_bench.py``) draws from these same strategies.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from mcp.shared.inbound import encode_header_value

from keel.mcp.v2025 import V2025
from keel.mcp.wire import TASKS_EXTENSION

__all__ = [
    "KINDS",
    "V2026",
    "Probe",
    "Target",
    "Waiting",
    "answers",
    "arguments",
    "envelopes",
    "probes",
    "task_ids",
]

V2026 = "2026-07-28"
KINDS = ("envelope", "arguments", "task-id", "answer")
LONG = 5_000  # characters of the long strings
DEEP = 300  # levels of the deeply nested values
HUGE_BODY = 1_000_000  # characters of the huge bodies (the SDK refuses over 4 MiB: 413)

TASK_METHODS = {
    V2026: ("tasks/get", "tasks/update", "tasks/cancel"),
    V2025: ("tasks/get", "tasks/result", "tasks/cancel"),
}
KNOWN_METHODS = (
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "tasks/result",
    "tasks/list",
    "initialize",
    "ping",
    "server/discover",
    "resources/list",
    "prompts/list",
    "notifications/initialized",
    "notifications/cancelled",
    "completion/complete",
    "logging/setLevel",
    "elicitation/create",
    "sampling/createMessage",
)


@dataclass
class Waiting:
    """A seeded task that waits for input: its questions (key -> requested schema), and
    its id, which the harness replaces when a probe answered or cancelled it (the draws
    stay the same, only the id they name changes)."""

    task_id: str
    questions: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Target:
    """One server seen through one protocol: what the strategies need to aim.

    ``tools`` maps each tool to its ``inputSchema`` (as ``tools/list`` gave it);
    ``waiting`` are the seeded tasks that wait for input; ``finished`` holds the ids of
    seeded finished tasks.
    ``task_tools`` are the tools that run as tasks; ``skip_tools`` those left out of the
    fuzz (an app's tool whose very purpose is to answer -32603).
    """

    protocol: str  # V2026 or V2025
    tools: Mapping[str, Mapping[str, Any]]
    waiting: tuple[Waiting, ...]
    finished: tuple[str, ...]
    session: str | None = None  # the 2025-11-25 session id
    task_tools: frozenset[str] = frozenset()
    skip_tools: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Probe:
    """One raw HTTP POST: ``body`` bytes and ``headers``; ``kind`` is one of KINDS,
    ``method`` the JSON-RPC method it names (if any, for the tables)."""

    kind: str
    body: bytes
    headers: dict[str, str | bytes] = field(default_factory=dict)
    method: str | None = None

    def describe(self) -> str:
        """The probe for a failure message (long bodies cut)."""
        text = self.body[:600].decode("utf-8", "backslashreplace")
        return f"{self.kind} {self.method!r}\nheaders: {self.headers}\nbody: {text}"


# --- odd values ---------------------------------------------------------------------


def odd_text() -> st.SearchStrategy[str]:
    """Text that stores, validators and drivers get wrong."""
    return st.one_of(
        st.text(max_size=20),
        st.sampled_from(
            [
                "",
                " ",
                "\ud800",
                "a\udfffb",
                "\udc80\ud800",
                "a\x00b",
                "\x00",
                "x" * LONG,
                "\u202eevil",
                "\U0001f600" * 50,
                "../../etc/passwd",
                "'; DROP TABLE tasks; --",
                "%s%n",
                "=?base64?AAAA?=",
                "\r\n\r\nX: y",
                "INC-2026-0288\x00",
            ]
        ),
    )


def odd_number() -> st.SearchStrategy[Any]:
    """Numbers at and past every edge (json.dumps writes NaN and Infinity as bare
    tokens, which strict JSON forbids and Python's parser accepts)."""
    return st.one_of(
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 10**400, 1e308, -1e308, 5e-324, -0.0]),
    )


def deep(depth: int = DEEP) -> Any:
    """A list nested ``depth`` levels deep, or an object as deep."""
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"d": value}
    return value


def odd_value() -> st.SearchStrategy[Any]:
    """Any JSON value, odd ones often."""
    leaves = st.one_of(st.none(), st.booleans(), odd_number(), odd_text())
    return st.one_of(
        leaves,
        st.recursive(
            leaves,
            lambda inner: st.one_of(
                st.lists(inner, max_size=4), st.dictionaries(odd_text(), inner, max_size=4)
            ),
            max_leaves=8,
        ),
        st.sampled_from([deep(), deep(40), [[[[[]]]]], {"": {}}]),
    )


def _dumps(value: Any) -> bytes:
    # ensure_ascii writes lone surrogates as \udXXX escapes: valid JSON text whose
    # decoded string cannot be encoded (what a hostile client sends).
    return json.dumps(value, allow_nan=True).encode()


# --- one request --------------------------------------------------------------------


def meta(*, declared: bool) -> dict[str, Any]:
    """A 2026-07-28 request's ``_meta`` (per-request protocol and capabilities)."""
    extensions = {TASKS_EXTENSION: {}} if declared else {}
    return {
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        "io.modelcontextprotocol/clientInfo": {"name": "keel-fuzz", "version": "0"},
    }


def header(value: str) -> str | bytes:
    """``value`` as a header can carry it: as the SDK's client sends it (verbatim, or
    its ``=?base64?…?=`` form for anything but plain ASCII); a lone surrogate, which
    no client can encode, as the base64 of its surrogate-escaped UTF-8."""
    try:
        return encode_header_value(value)
    except UnicodeEncodeError:
        raw = base64.b64encode(value.encode("utf-8", "surrogatepass")).decode()
        return f"=?base64?{raw}?="


def base_headers(target: Target) -> dict[str, str | bytes]:
    """The headers every request of ``target``'s protocol carries."""
    headers: dict[str, str | bytes] = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    if target.protocol == V2026:
        headers["MCP-Protocol-Version"] = V2026
    else:
        headers["MCP-Protocol-Version"] = V2025
        if target.session is not None:
            headers["mcp-session-id"] = target.session
    return headers


NAME_KEYS = {
    "tools/call": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/result": "taskId",
}


def request(
    target: Target,
    kind: str,
    method: str,
    params: dict[str, Any],
    *,
    declared: bool = True,
) -> Probe:
    """A well-formed request of ``target``'s protocol (routing headers as the official
    client sends them), whose params may be anything."""
    body_params = dict(params)
    if target.protocol == V2026:
        body_params["_meta"] = meta(declared=declared)
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": body_params}
    return Probe(kind, _dumps(message), routed(target, message), method)


def routed(target: Target, message: Any) -> dict[str, str | bytes]:
    """``target``'s headers for ``message``: on 2026-07-28 its ``Mcp-Method`` and
    ``Mcp-Name`` as the official client derives them from the body (when it can), so
    that a probe reaches past the SDK's header check."""
    headers = base_headers(target)
    if target.protocol != V2026 or not isinstance(message, dict):
        return headers
    method, params = message.get("method"), message.get("params")
    if isinstance(method, str):
        headers["Mcp-Method"] = header(method)
        name = params.get(NAME_KEYS.get(method, "")) if isinstance(params, dict) else None
        if isinstance(name, str):
            headers["Mcp-Name"] = header(name)
    return headers


# --- envelopes ----------------------------------------------------------------------

_MISSING = object()


@st.composite
def _message(draw: st.DrawFn, target: Target) -> tuple[Any, str | None]:
    """One JSON-RPC message with each member present or not, right or wrong."""
    method = draw(st.one_of(st.sampled_from(KNOWN_METHODS), odd_text(), odd_value()))
    params: Any = draw(
        st.one_of(
            st.just(_MISSING),
            st.dictionaries(odd_text(), odd_value(), max_size=3),
            odd_value(),
        )
    )
    if target.protocol == V2026 and draw(st.booleans()):
        params = dict(params) if isinstance(params, dict) else {}
        params["_meta"] = draw(st.one_of(st.just(meta(declared=draw(st.booleans()))), odd_value()))
    members: dict[str, Any] = {
        "jsonrpc": draw(st.one_of(st.just("2.0"), st.just(_MISSING), odd_value())),
        "id": draw(st.one_of(st.integers(0, 10**6), st.just(_MISSING), odd_value())),
        "method": method,
        "params": params,
    }
    if draw(st.booleans()):
        members["method"] = _MISSING
        members[draw(st.sampled_from(["result", "error"]))] = draw(odd_value())
    extra = draw(st.dictionaries(odd_text(), odd_value(), max_size=2))
    message = {k: v for k, v in members.items() if v is not _MISSING} | extra
    named = method if isinstance(method, str) else None
    return message, named


@st.composite
def envelopes(draw: st.DrawFn, target: Target) -> Probe:
    """A malformed or unusual JSON-RPC envelope, body or header set."""
    headers = base_headers(target)
    # Huge bodies are one draw in twelve: each costs the server a megabyte or more.
    shape = draw(
        st.sampled_from(
            ["message"] * 4 + ["batch"] * 2 + ["bytes"] * 2 + ["huge"] + ["headers"] * 3
        )
    )
    method: str | None = None
    if shape == "message":
        message, method = draw(_message(target))
        body = _dumps(message)
        if draw(st.booleans()):
            headers = routed(target, message)
    elif shape == "batch":
        batch = draw(st.lists(_message(target), max_size=3))
        body = _dumps([m for m, _ in batch])
    elif shape == "bytes":
        body = draw(
            st.one_of(
                st.binary(max_size=64),
                st.sampled_from(
                    [
                        b"",
                        b"{",
                        b"null",
                        b"[]",
                        b'"2.0"',
                        b"\xef\xbb\xbf{}",
                        b"\xff\xfe{}",
                        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {',
                        b'{"jsonrpc":"2.0","id":1,"method":"ping","id":2}',
                        b"1e999999",
                    ]
                ),
            )
        )
    elif shape == "huge":
        # a megabyte of nesting; a megabyte string; 6 MB of escapes (over the limit)
        filler = draw(st.sampled_from(["[", "x", "\u00e9"]))
        body = (
            b"[" * HUGE_BODY
            if filler == "["
            else _dumps({"jsonrpc": "2.0", "id": 1, "method": filler * HUGE_BODY})
        )
    else:
        message, method = draw(_message(target))
        body = _dumps(message)
        headers = draw(_headers(target, method))
    return Probe("envelope", body, headers, method)


@st.composite
def _headers(draw: st.DrawFn, target: Target, method: str | None) -> dict[str, str | bytes]:
    """Headers with a wrong content type, accept, version, method, name or session."""
    headers = base_headers(target)
    if method is not None and target.protocol == V2026:
        headers["Mcp-Method"] = header(method)
    names = st.sampled_from(
        [
            "Content-Type",
            "Accept",
            "MCP-Protocol-Version",
            "Mcp-Method",
            "Mcp-Name",
            "mcp-session-id",
            "Content-Encoding",
            "Transfer-Encoding-Ish",
        ]
    )
    values = st.one_of(
        st.sampled_from(
            [
                "",
                "text/plain",
                "application/json; charset=latin-1",
                "multipart/form-data",
                "application/x-www-form-urlencoded",
                "text/event-stream",
                "*/*",
                "application/*",
                "2024-11-05",
                "2025-11-25",
                "2026-07-28",
                "1999-01-01",
                "gzip",
                "tools/call",
                "tasks/get",
                "=?base64?!!!?=",
                "=?base64?AA==?=",
                "x" * 2000,
                "deadbeef",
            ]
        ),
        # HTTP clients refuse to send a value with edge whitespace (h11: "Illegal header
        # value"): stripped, so that every probe reaches the server.
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip),
    )
    for name, value in draw(st.lists(st.tuples(names, values), min_size=1, max_size=3)):
        if value == "" and draw(st.booleans()):
            headers.pop(name, None)
        else:
            headers[name] = value
    return headers


# --- tool arguments -----------------------------------------------------------------


def _valid(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """A value a property schema accepts (enough of JSON Schema for these tools)."""
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    for option in schema.get("anyOf", ()):
        if option.get("type") != "null":
            return st.one_of(st.none(), _valid(option))
    kind = schema.get("type")
    if kind == "string":
        return st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
    if kind == "integer":
        return st.integers(1, 100)
    if kind == "number":
        return st.floats(0, 0.05)
    if kind == "boolean":
        return st.booleans()
    return st.none()


@st.composite
def arguments(draw: st.DrawFn, target: Target) -> Probe:
    """``tools/call`` of a tool with fuzzed arguments (and, now and then, of no tool)."""
    names = sorted(set(target.tools) - target.skip_tools)
    name = draw(st.one_of(st.sampled_from(names), odd_text()))
    schema = target.tools.get(name, {})
    properties: Mapping[str, Any] = schema.get("properties", {})
    task = draw(st.booleans())
    declared = task if target.protocol == V2026 else True
    # A task tool called without a task handle (2026-07-28 without the extension,
    # 2025-11-25 without params.task) waits for the outcome: the client chose to wait.
    # Such a call never gets a number its schema accepts from the odd values (a
    # duration of 1e308 s would be waited on for good): those go as a wrong type.
    waits = name in target.task_tools and not task
    args: Any = {}
    for key, prop in properties.items():
        if draw(st.integers(0, 3)) == 0:
            continue  # left out
        value = draw(st.one_of(odd_value(), _valid(prop)))
        if waits and _number_it_takes(value, prop):
            value = [value]
        args[key] = value
    if draw(st.integers(0, 3)) == 0:
        args |= draw(st.dictionaries(odd_text(), odd_value(), min_size=1, max_size=2))
    if draw(st.integers(0, 7)) == 0:
        args = draw(st.one_of(st.lists(odd_value(), max_size=2), odd_text(), odd_number()))
    params: dict[str, Any] = {"name": name, "arguments": args}
    if draw(st.integers(0, 7)) == 0:
        del params["arguments"]
    if target.protocol == V2025 and task:
        params["task"] = draw(st.one_of(st.just({}), st.fixed_dictionaries({"ttl": odd_number()})))
    return request(target, "arguments", "tools/call", params, declared=declared)


def _number_it_takes(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether ``value`` is a number outside what :func:`_valid` draws that a property
    schema (perhaps nullable) would take."""
    kinds = {schema.get("type")} | {o.get("type") for o in schema.get("anyOf", ())}
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and bool(kinds & {"number", "integer"}) and not 0 <= value <= 0.05


# --- task ids -----------------------------------------------------------------------


@st.composite
def task_ids(draw: st.DrawFn, target: Target) -> Probe:
    """``tasks/*`` naming a seeded task or an odd id."""
    methods = TASK_METHODS[target.protocol]
    method = draw(st.sampled_from(methods))
    # tasks/result waits for a live task to end: it is aimed at finished ones only.
    seeded = list(target.finished)
    if method != "tasks/result":
        seeded += [w.task_id for w in target.waiting]
    task_id = draw(
        st.one_of(
            st.sampled_from(seeded),
            odd_text(),
            odd_value(),
            st.sampled_from(seeded).map(lambda s: s + "\x00"),
            st.sampled_from(seeded).map(lambda s: s.upper()),
            st.sampled_from(seeded).map(lambda s: s[:-1]),
        )
    )
    params: dict[str, Any] = {"taskId": task_id}
    if draw(st.integers(0, 5)) == 0:
        del params["taskId"]
    if method == "tasks/update":
        params["inputResponses"] = draw(st.one_of(st.just({}), odd_value()))
    if draw(st.integers(0, 3)) == 0:
        params |= draw(st.dictionaries(odd_text(), odd_value(), min_size=1, max_size=2))
    return request(target, "task-id", method, params)


# --- input answers ------------------------------------------------------------------


@st.composite
def _content(draw: st.DrawFn, schema: Mapping[str, Any]) -> Any:
    properties: Mapping[str, Any] = schema.get("properties", {})
    content: dict[str, Any] = {}
    for key, prop in properties.items():
        if draw(st.integers(0, 3)):
            content[key] = draw(st.one_of(odd_value(), _valid(prop)))
    if draw(st.booleans()):
        content |= draw(st.dictionaries(odd_text(), odd_value(), max_size=2))
    return content if draw(st.integers(0, 5)) else draw(odd_value())


@st.composite
def answers(draw: st.DrawFn, target: Target) -> Probe:
    """An answer to a waiting task: tasks/update (2026-07-28), or a JSON-RPC response
    to no request of the server's (2025-11-25)."""
    if target.protocol == V2025:
        reply: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": draw(st.one_of(st.integers(0, 50), odd_value())),
        }
        if draw(st.booleans()):
            reply["result"] = draw(
                st.one_of(
                    st.fixed_dictionaries(
                        {
                            "action": st.sampled_from(["accept", "decline", "cancel"]),
                            "content": odd_value(),
                        }
                    ),
                    odd_value(),
                )
            )
        else:
            reply["error"] = draw(
                st.one_of(
                    st.fixed_dictionaries({"code": odd_number(), "message": odd_text()}),
                    odd_value(),
                )
            )
        return Probe("answer", _dumps(reply), base_headers(target), "(response)")
    waiting = draw(st.sampled_from(target.waiting))
    task_id, questions = waiting.task_id, waiting.questions
    responses: dict[str, Any] = {}
    for key, schema in questions.items():
        if draw(st.integers(0, 3)) == 0:
            continue
        action = draw(st.one_of(st.sampled_from(["accept", "decline", "cancel"]), odd_value()))
        answer: Any = {"action": action, "content": draw(_content(schema))}
        if draw(st.integers(0, 5)) == 0:
            answer = draw(odd_value())
        responses[key] = answer
    if draw(st.booleans()):
        responses |= draw(st.dictionaries(odd_text(), odd_value(), min_size=1, max_size=2))
    params: dict[str, Any] = {"taskId": task_id, "inputResponses": responses}
    if draw(st.integers(0, 7)) == 0:
        params["inputResponses"] = draw(odd_value())
    return request(target, "answer", "tasks/update", params)


STRATEGIES = {"envelope": envelopes, "arguments": arguments, "task-id": task_ids, "answer": answers}


def probes(kind: str, target: Target) -> st.SearchStrategy[Probe]:
    """The strategy of one kind of probe for ``target``."""
    return STRATEGIES[kind](target)
