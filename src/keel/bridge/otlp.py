"""Read spans from OpenTelemetry OTLP/JSON files, streaming, in bounded memory.

The format is the JSON encoding of ``ExportTraceServiceRequest``::

    {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name",
                                                    "value": {"stringValue": "payments"}}]},
                        "scopeSpans": [{"scope": {...}, "spans": [
                            {"traceId": "5b8e…", "spanId": "eee1…", "parentSpanId": "…",
                             "name": "POST /charge", "kind": 2,
                             "startTimeUnixNano": "1710409440000000000",
                             "endTimeUnixNano": "1710409440120000000",
                             "status": {"code": 2}}]}]}]}

A file holds one such request (pretty-printed or not) or many, one after the other: the
collector's ``file`` exporter writes one request per line (JSON lines). Both are read as
a sequence of top-level objects. A request up to :data:`WHOLE_LIMIT` characters is
decoded at once; a larger one is walked structurally, span by span, so a single 1 GB
request needs no more memory than a small one.

A large JSON-lines file can be read in parts, each by another process:
:func:`read_lines` reads a byte range of it cut at newlines and gives the rows
:func:`read_spans` gives there, or refuses (:class:`NotLines`) a range that is not only
whole requests, one per line, read without error; the file is then read whole.

The fast path, for a request on one line (JSON lines): ``msgspec`` decodes the line into
the few typed fields read here (every other field is skipped in C, never made into
Python objects) and the spans become rows with the same checks. Anything that path does
not take as is (a request over several lines, a field of an unexpected type, a bad
span) is read again by the general path, which gives the same rows, or the same error.

Trace and span ids are hex, as OTLP/JSON asks; base64 ids (the generic protobuf JSON
mapping) are accepted and converted. ``status.code`` 2 (or ``"STATUS_CODE_ERROR"``) marks
an error. A span whose resource names no ``service.name`` gets ``unknown_service``, as
OpenTelemetry's SDKs do.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import msgspec

from keel.bridge.errors import MalformedSource
from keel.bridge.records import ENCODING

__all__ = [
    "OUTGOING",
    "PEER_KEYS",
    "WHOLE_LIMIT",
    "NotLines",
    "Row",
    "names_of",
    "peer_of",
    "read_lines",
    "read_spans",
]

CHUNK = 1 << 20  # characters read from a file at a time
WHOLE_LIMIT = 16 << 20  # characters: a larger request is walked span by span
UNKNOWN_SERVICE = "unknown_service"

Row = tuple[str, str, str | None, str, str, int, int, int, int, str | None, str | None]
"""(trace_id, span_id, parent_id, service, name, start_ns, end_ns, error 0/1, kind, peer,
aka): ``kind`` is OTLP's span kind (0 unspecified, 1 internal, 2 server, 3 client, 4
producer, 5 consumer); ``peer`` is what a client or producer span calls, and ``aka`` the
other name it gives that callee, if any (see :func:`names_of`)."""

KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
OUTGOING = (3, 4)  # client and producer spans: calls to something else
PEER_KEYS = (
    "peer.service",
    "db.name",
    "db.namespace",
    "messaging.destination.name",
    "messaging.destination",
    "server.address",
    "net.peer.name",
    "rpc.service",
    "db.system",
    "messaging.system",
)
"""Attributes that name the callee of a client or producer span, most specific first: the
name the caller gives the service, the database, the topic or queue, the host."""

_WS = re.compile(r"[ \t\n\r]*")
_HEX = {16: re.compile(r"[0-9a-f]{32}"), 8: re.compile(r"[0-9a-f]{16}")}
_DECODER = json.JSONDecoder()
_ERROR_CODES = {2, "2", "STATUS_CODE_ERROR"}


class _SpanError(ValueError):
    """A span that is not a valid OTLP span (its position is added by the reader)."""


def _span_id(value: Any, size: int, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise _SpanError(f"{field} is missing or not a string")
    text = value.lower()
    if _HEX[size].fullmatch(text):
        return text
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == size:
        return raw.hex()
    raise _SpanError(f"{field} {value!r} is not a {size}-byte id in hex (or base64)")


def _nanos(value: Any, field: str) -> int:
    if isinstance(value, bool):
        raise _SpanError(f"{field} must be nanoseconds since the epoch")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise _SpanError(f"{field} must be nanoseconds since the epoch, not {value!r}")


def _row(span: Any, service: str) -> Row:
    if not isinstance(span, dict):
        raise _SpanError("a span must be a JSON object")
    trace_id = _span_id(span.get("traceId"), 16, "traceId")
    span_id = _span_id(span.get("spanId"), 8, "spanId")
    parent = span.get("parentSpanId")
    parent_id = _span_id(parent, 8, "parentSpanId") if parent else None
    name = span.get("name")
    if not isinstance(name, str):
        raise _SpanError(f"span {span_id}: name is missing or not a string")
    start = _nanos(span.get("startTimeUnixNano"), "startTimeUnixNano")
    end = _nanos(span.get("endTimeUnixNano"), "endTimeUnixNano")
    if end < start:
        raise _SpanError(f"span {span_id} ends before it starts")
    status = span.get("status")
    code = status.get("code", 0) if isinstance(status, dict) else 0
    kind = _kind(span.get("kind", 0))
    peer, aka = names_of(span.get("attributes")) if kind in OUTGOING else (None, None)
    error = int(code in _ERROR_CODES)
    return (trace_id, span_id, parent_id, service, name, start, end, error, kind, peer, aka)


def _kind(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 5:
        return value
    if isinstance(value, str):
        return KINDS.get(value, int(value) if value.isdigit() and int(value) <= 5 else 0)
    return 0


def peer_of(attributes: Any) -> str | None:
    """The callee a client or producer span names (the first of :data:`PEER_KEYS` it
    carries as a non-empty string), or None."""
    return names_of(attributes)[0]


def names_of(attributes: Any) -> tuple[str | None, str | None]:
    """(peer, aka): the callee a client or producer span names (:func:`peer_of`), and,
    when that is its ``peer.service``, the name the span would have without it (the next
    of :data:`PEER_KEYS`: its database, topic or host), if another. Callers that set no
    ``peer.service`` name the callee by that other name: ``aka`` tells they are one."""
    if not isinstance(attributes, list):
        return None, None
    found: dict[str, str] = {}
    for attribute in attributes:
        if not isinstance(attribute, dict):
            continue
        key = attribute.get("key")
        if key in PEER_KEYS:
            value = attribute.get("value")
            text = value.get("stringValue") if isinstance(value, dict) else None
            if isinstance(text, str) and text.strip():
                found[key] = text.strip()
    return _names(found)


def _names(found: dict[str, str]) -> tuple[str | None, str | None]:
    """(peer, aka) from the :data:`PEER_KEYS` values a span carries (``names_of``)."""
    if not found:
        return None, None
    ranked = [found[key] for key in PEER_KEYS if key in found]
    if "peer.service" not in found:
        return ranked[0], None
    aka = next((name for name in ranked[1:] if name != ranked[0]), None)
    return ranked[0], aka


def _service(resource: Any) -> str:
    if not isinstance(resource, dict):
        return UNKNOWN_SERVICE
    attributes = resource.get("attributes")
    if not isinstance(attributes, list):
        return UNKNOWN_SERVICE
    for attribute in attributes:
        if isinstance(attribute, dict) and attribute.get("key") == "service.name":
            value = attribute.get("value")
            if isinstance(value, dict) and isinstance(value.get("stringValue"), str):
                return str(value["stringValue"])
    return UNKNOWN_SERVICE


# gc=False: these structs never hold a reference cycle, so the garbage collector need not
# track the hundreds of thousands of them a large file makes (msgspec's advice).
class _AnyValue(msgspec.Struct, gc=False):
    stringValue: Any = None  # OTLP's field names (camelCase)


class _KeyValue(msgspec.Struct, gc=False):
    key: Any = None
    value: _AnyValue | None = None


class _Status(msgspec.Struct, gc=False):
    code: Any = 0


class _ResourceFields(msgspec.Struct, gc=False):
    attributes: list[_KeyValue] | None = None


_TRACE_ID = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}\Z")]
_SPAN_ID = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16}\Z")]
_PARENT_ID = Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{16})?\Z")]
_NANOS = Annotated[str, msgspec.Meta(pattern=r"^[0-9]+\Z")]


class _Span(msgspec.Struct, gc=False):
    """The fields of a span the index reads, in the form exporters write them (lowercase
    hex ids, nanoseconds as a decimal string, kind as a number): msgspec checks them in C.
    A span in any other form is refused here, and the general path reads its request."""

    traceId: _TRACE_ID
    spanId: _SPAN_ID
    name: str
    startTimeUnixNano: _NANOS
    endTimeUnixNano: _NANOS
    parentSpanId: _PARENT_ID | None = None
    kind: Annotated[int, msgspec.Meta(ge=0, le=5)] = 0
    status: _Status | None = None
    attributes: msgspec.Raw = msgspec.Raw()  # decoded for client and producer spans only


class _Scope(msgspec.Struct, gc=False):
    spans: list[_Span] = []


class _Resource(msgspec.Struct, gc=False):
    resource: _ResourceFields | None = None  # typed: cheaper than a dict per attribute
    scopeSpans: list[_Scope] | msgspec.UnsetType = msgspec.UNSET
    instrumentationLibrarySpans: list[_Scope] | msgspec.UnsetType = msgspec.UNSET


class _Request(msgspec.Struct, gc=False):
    resourceSpans: list[_Resource] = []


_REQUEST = msgspec.json.Decoder(_Request)
_ATTRIBUTES = msgspec.json.Decoder(list[_KeyValue] | None)
_PEER_KEYS = frozenset(PEER_KEYS)


class _Refused(Exception):
    """The fast path does not take this request as is (the general path reads it)."""


# Client spans to one callee mostly carry the very same attributes (555 distinct lists
# among 146,000 client spans in an hour of the evaluation export): each is decoded once.
@functools.lru_cache(maxsize=4096)
def _fast_names(raw: bytes) -> tuple[str | None, str | None]:
    """:func:`names_of` over a span's attributes, still undecoded."""
    found = {
        a.key: text
        for a in (_ATTRIBUTES.decode(raw) if raw else None) or ()
        if a.key in _PEER_KEYS
        and a.value is not None
        and isinstance(a.value.stringValue, str)
        and (text := a.value.stringValue.strip())
    }
    return _names(found)


def _fast_service(resource: _ResourceFields | None) -> str:
    """:func:`_service` over a typed resource."""
    for a in (resource.attributes if resource is not None else None) or ():
        if a.key == "service.name" and a.value is not None and isinstance(a.value.stringValue, str):
            return a.value.stringValue
    return UNKNOWN_SERVICE


def _fast_row(span: _Span, service: str) -> Row:
    """:func:`_row` over a checked span: the same row, or ``_Refused``."""
    start, end = int(span.startTimeUnixNano), int(span.endTimeUnixNano)
    if end < start:
        raise _Refused
    status, kind = span.status, span.kind
    peer, aka = _fast_names(bytes(span.attributes)) if kind in OUTGOING else (None, None)
    return (
        span.traceId,
        span.spanId,
        span.parentSpanId or None,
        service,
        span.name,
        start,
        end,
        int(status is not None and status.code in _ERROR_CODES),
        kind,
        peer,
        aka,
    )


def _fast_rows(text: str) -> list[Row]:
    """The spans of a request on one line, or ``_Refused``."""
    try:
        request = _REQUEST.decode(text)
    except (msgspec.DecodeError, RecursionError, ValueError):
        raise _Refused from None
    rows: list[Row] = []
    append = rows.append
    try:
        for resource in request.resourceSpans:
            service = _fast_service(resource.resource)
            scopes = resource.scopeSpans
            if scopes is msgspec.UNSET:
                scopes = resource.instrumentationLibrarySpans
            for scope in scopes or ():
                for span in scope.spans:
                    append(_fast_row(span, service))
    except (msgspec.DecodeError, TypeError, ValueError):  # odd attributes, an unhashable
        # status code, digits int() refuses
        raise _Refused from None
    return rows


_TOO_BIG = object()


class _Reader:
    """A cursor over a text file: refills its buffer as needed, knows its line numbers."""

    def __init__(self, file: IO[str], path: Path) -> None:
        self.file = file
        self.path = path
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.first_line = 1  # line number of buf[0]
        self.offset = 0  # characters of the file before buf[0]

    def fill(self) -> bool:
        if self.eof:
            return False
        chunk = self.file.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        if self.pos:
            self.first_line += self.buf.count("\n", 0, self.pos)
            self.offset += self.pos
            self.buf = self.buf[self.pos :] + chunk
            self.pos = 0
        else:
            self.buf += chunk
        return True

    def mark(self) -> int:
        """The cursor's position in the file (for :meth:`line` later)."""
        return self.offset + self.pos

    def line(self, mark: int | None = None) -> int:
        """The line of a position (a :meth:`mark`; default the cursor). Only called for
        error messages: it counts newlines."""
        index = self.pos if mark is None else max(0, mark - self.offset)
        return self.first_line + self.buf.count("\n", 0, index)

    def error(self, reason: str, mark: int | None = None) -> MalformedSource:
        return MalformedSource(self.path, reason, self.line(mark))

    def peek(self) -> str:
        """The next non-blank character ("" at the end of the file)."""
        while True:
            match = _WS.match(self.buf, self.pos)
            self.pos = match.end() if match else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise self.error(f"expected {char!r}, found {found or 'the end of the file'!r}")
        self.pos += 1

    def value(self, limit: int | None = None) -> Any:
        """Decode the JSON value at the cursor; with ``limit``, return ``_TOO_BIG`` for
        one longer than that instead (the cursor stays put)."""
        if not self.peek():
            raise self.error("unexpected end of the file")
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                incomplete = not self.eof and (
                    exc.pos >= len(self.buf) - 8 or exc.msg.startswith("Unterminated")
                )
                if incomplete:
                    if limit is not None and len(self.buf) - self.pos > limit:
                        return _TOO_BIG
                    if self.fill():
                        continue
                raise self.error(f"not valid JSON: {exc.msg}", self.offset + exc.pos) from None
            except RecursionError:  # the parser's answer to arrays nested ~1,000 deep
                raise self.error("not valid JSON: nested too deep to read") from None
            except ValueError as exc:  # an integer of over 4,300 digits
                raise self.error(f"not valid JSON: {exc}") from None
            if end == len(self.buf) and self.fill():
                continue  # a number at the end of the buffer may go on in the next chunk
            self.pos = end
            return value

    def whole_line(self, limit: int) -> list[Row]:
        """The spans of the request at the cursor, alone on a line of fewer than ``limit``
        characters, read as :func:`read_spans` reads it (the cursor moves past it); else
        ``NotLines``. For :func:`read_lines`."""
        end = self.buf.find("\n", self.pos)
        while end < 0 and len(self.buf) - self.pos < limit and self.fill():
            end = self.buf.find("\n", self.pos)
        if end < 0 and self.eof:
            end = len(self.buf)
        if end < 0 or end - self.pos >= limit:
            raise NotLines  # read_spans may walk such a line: its buffer decides
        fast = self.one_line(limit)  # the line is in the buffer: as read_spans decides
        if fast is not None:
            return fast
        line = self.buf[self.pos : end]
        try:
            request, stop = _DECODER.raw_decode(line)
            if line[stop:].strip(" \t\r"):
                raise NotLines  # anything after a request on its line
            rows = _request_rows(request, self, self.mark())
        except (ValueError, RecursionError, MalformedSource):
            raise NotLines from None  # read whole, the file names the line and why
        self.pos = end
        return rows

    def one_line(self, limit: int) -> list[Row] | None:
        """The spans of the request at the cursor if it is alone on its line and the fast
        path takes it (the cursor then moves past it); else None, the cursor stays put."""
        end = self.buf.find("\n", self.pos)
        while end < 0 and len(self.buf) - self.pos <= limit and self.fill():
            end = self.buf.find("\n", self.pos)
        if end < 0:
            end = len(self.buf)
            if not self.eof or end - self.pos > limit:
                return None
        try:
            rows = _fast_rows(self.buf[self.pos : end])
        except _Refused:
            return None
        self.pos = end
        return rows

    def members(self) -> Iterator[str]:
        """The keys of the object at the cursor; after each, the cursor is at its value."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            start = self.mark()
            key = self.value()
            if not isinstance(key, str):
                raise self.error("an object key must be a string", start)
            self.expect(":")
            yield key
            found = self.peek()
            self.pos += 1
            if found == "}":
                return
            if found != ",":
                raise self.error(f"expected ',' or '}}' in an object, found {found!r}")

    def elements(self) -> Iterator[None]:
        """Yield once per element of the array at the cursor, with the cursor at it; the
        caller consumes the element before asking for the next."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            yield
            found = self.peek()
            self.pos += 1
            if found == "]":
                return
            if found != ",":
                raise self.error(f"expected ',' or ']' in an array, found {found!r}")


def _request_rows(request: Any, reader: _Reader, start: int) -> list[Row]:
    """The spans of a decoded request (``start``: its mark, for error messages)."""
    if not isinstance(request, dict):
        raise reader.error("expected an ExportTraceServiceRequest object", start)
    resource_spans = request.get("resourceSpans", [])
    if not isinstance(resource_spans, list):
        raise reader.error("resourceSpans must be an array", start)
    rows: list[Row] = []
    for r, resource in enumerate(resource_spans):
        if not isinstance(resource, dict):
            raise reader.error(f"resourceSpans[{r}] must be an object", start)
        service = _service(resource.get("resource"))
        scopes = resource.get("scopeSpans", resource.get("instrumentationLibrarySpans", []))
        if not isinstance(scopes, list):
            raise reader.error(f"resourceSpans[{r}].scopeSpans: not an array", start)
        for s, scope in enumerate(scopes):
            spans = scope.get("spans", []) if isinstance(scope, dict) else None
            if not isinstance(spans, list):
                raise reader.error(f"resourceSpans[{r}].scopeSpans[{s}].spans: not an array", start)
            for n, span in enumerate(spans):
                try:
                    rows.append(_row(span, service))
                except _SpanError as exc:
                    where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{n}]"
                    raise reader.error(f"{where}: {exc}", start) from None
    return rows


WALK_BATCH = 10_000  # spans per batch when a large request is walked


def _walk_request(reader: _Reader) -> Iterator[list[Row]]:  # noqa: PLR0912 - mirrors the format's nesting
    """The spans of the (large) request at the cursor, walked without decoding it whole.

    Memory stays bounded by the batch size, except for spans that come before their
    ``resource`` in the file (exporters write the resource first), kept until it comes.
    """
    batch: list[Row] = []
    for key in reader.members():
        if key != "resourceSpans":
            reader.value()
            continue
        for _ in reader.elements():
            service: str | None = None
            pending: list[tuple[Any, int]] = []
            for member in reader.members():
                if member == "resource":
                    service = _service(reader.value())
                    continue
                if member not in {"scopeSpans", "instrumentationLibrarySpans"}:
                    reader.value()
                    continue
                for _ in reader.elements():
                    for inner in reader.members():
                        if inner != "spans":
                            reader.value()
                            continue
                        for _ in reader.elements():
                            where = reader.mark()
                            span = reader.value()
                            if service is None:
                                pending.append((span, reader.line(where)))
                                continue
                            try:
                                batch.append(_row(span, service))
                            except _SpanError as exc:
                                raise reader.error(str(exc), where) from None
                            if len(batch) >= WALK_BATCH:
                                yield batch
                                batch = []
            for span, line in pending:
                try:
                    batch.append(_row(span, service or UNKNOWN_SERVICE))
                except _SpanError as exc:
                    raise MalformedSource(reader.path, str(exc), line) from None
    if batch:
        yield batch


def read_spans(
    path: Path,
    consumed: Callable[[int], object] | None = None,
    *,
    whole_limit: int = WHOLE_LIMIT,
) -> Iterator[list[Row]]:
    """The spans of one OTLP/JSON file, in batches (one per request, or less); before each
    batch, ``consumed`` (if given) hears how many bytes of the file were read so far (a
    chunk ahead of the batch at most), for a progress bar.

    Raises:
        MalformedSource: the file is not OTLP/JSON; names the file, the line and why.
    """
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise MalformedSource(path, f"cannot open: {exc.strerror or exc}") from exc
    with raw, io.TextIOWrapper(raw, encoding=ENCODING) as file:
        for rows in _batches(_Reader(file, path), whole_limit):
            if consumed is not None:
                consumed(raw.tell())
            yield rows


class NotLines(Exception):
    """A byte range given to :func:`read_lines` is not only whole requests, one per line,
    each read without error: read the file whole (:func:`read_spans`) instead."""


class _Range(io.RawIOBase):
    """Bytes [start, end) of an open file, as a file of their own."""

    def __init__(self, file: IO[bytes], start: int, end: int) -> None:
        super().__init__()
        self.fd, self.at, self.end = file.fileno(), start, end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = os.pread(self.fd, min(len(buffer), self.end - self.at), self.at)
        buffer[: len(data)] = data
        self.at += len(data)
        return len(data)


def read_lines(path: Path, start: int, end: int) -> Iterator[list[Row]]:
    """The spans of bytes [start, end) of a JSON-lines file, ``start`` and ``end`` cut just
    after a newline (or at the file's ends), in batches: the rows :func:`read_spans` reads
    from those lines, in the same order.

    Raises:
        NotLines: a line there is not one whole request (under :data:`WHOLE_LIMIT`
            characters) read without error, or the bytes are not UTF-8. Nothing read
            from such a range may be kept: read the file with :func:`read_spans`.
    """
    with path.open("rb") as raw:
        window = io.BufferedReader(_Range(raw, start, end), CHUNK)
        # The file's encoding strips a BOM at its start only; further on, one is refused.
        with io.TextIOWrapper(window, encoding=ENCODING if start == 0 else "utf-8") as file:
            reader = _Reader(file, path)
            try:
                while found := reader.peek():
                    if found != "{":
                        raise NotLines
                    rows = reader.whole_line(WHOLE_LIMIT)
                    if rows:
                        yield rows
            except UnicodeDecodeError:
                raise NotLines from None


def _batches(reader: _Reader, whole_limit: int) -> Iterator[list[Row]]:
    """The batches of spans of a file's requests, as :func:`read_spans` yields them."""
    try:
        while True:
            found = reader.peek()
            if not found:
                return
            if found != "{":
                raise reader.error(f"expected an OTLP request object, found {found!r}")
            fast = reader.one_line(whole_limit)
            if fast is not None:
                if fast:
                    yield fast
                continue
            start = reader.mark()
            request = reader.value(limit=whole_limit)
            if request is _TOO_BIG:
                yield from _walk_request(reader)
            else:
                rows = _request_rows(request, reader, start)
                del request
                if rows:
                    yield rows
    except UnicodeDecodeError as exc:
        raise MalformedSource(reader.path, f"not UTF-8 text ({exc.reason})") from None
