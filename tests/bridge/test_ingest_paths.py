"""The trace index is the same whichever path read the spans: the fast path (a request on
one line, decoded by msgspec) and the general path (a pretty-printed request, decoded by
``json`` or walked span by span) store the same rows, and those rows are the ones the
general-path-only reader of ``main`` stored (a digest fixed from it)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

from keel.bridge import otlp
from keel.bridge.index import build_index
from keel.bridge.otlp import read_spans

# sha256 of the spans and minute_stats rows built from `export(...)` below by the reader
# before the fast path (main at 68a9052); see `table_digest`.
MAIN_DIGEST = "d00f80e381e9dad61295f2a196773a30c1b2b5eedf2c90e27aaa43d251d3b91b"

# The columns of main's spans table at 68a9052 (``aka`` came later: test_skew_retries).
MAIN_COLUMNS = "trace_id, span_id, parent_id, service, name, start_ns, end_ns, error, kind, peer"

PEERS = ["peer.service", "db.name", "server.address", "messaging.destination.name", "http.route"]


def odd_span(rng: random.Random, n: int, odd: bool) -> dict[str, Any]:
    """A span; if ``odd``, now and then with a field the fast path leaves to the general
    path (a request with one such span is read by the general path)."""
    trace = f"{rng.getrandbits(128):032x}"
    span_id = f"{n + 1:016x}"
    start = 1773481200000000000 + rng.randrange(3 * 60 * 10**9)
    q = n if odd else 1  # a clean span: none of the odd fields below
    out: dict[str, Any] = {
        "traceId": trace.upper() if q % 17 == 0 else trace,
        "spanId": base64.b64encode(bytes.fromhex(span_id)).decode() if q % 19 == 0 else span_id,
        "name": f"op-{n % 7}",
        "startTimeUnixNano": start if q % 23 == 0 else str(start),
        "endTimeUnixNano": str(start + rng.randrange(10**9)),
        "kind": rng.choice([0, 1, 2, 3, 3, 4, 5, *(["SPAN_KIND_CLIENT", "3"] if odd else [])]),
        "status": rng.choice([{}, {"code": 2}, {"code": "STATUS_CODE_ERROR"}, {"code": 1}, None]),
        "attributes": [
            {"key": rng.choice(PEERS), "value": rng.choice([{"stringValue": f"svc-{n % 5}"}, {}])},
            {"key": "http.response.status_code", "value": {"intValue": "200"}},
            {"key": "server.address", "value": {"stringValue": "  "}},
        ],
        "droppedAttributesCount": 0,
    }
    if rng.random() < 0.7:
        out["parentSpanId"] = f"{rng.getrandbits(64) | 1:016x}"
    elif rng.random() < 0.5:
        out["parentSpanId"] = ""
    if q % 29 == 0:
        out["attributes"] = "not a list"
    return out


def export(rng: random.Random, requests: int = 40) -> list[dict[str, Any]]:
    """Requests of several resources and scopes, some with the old field names."""
    out = []
    for r in range(requests):
        resources = []
        for k in range(2):
            spans = [odd_span(rng, r * 100 + k * 50 + i, r % 3 == 0) for i in range(30)]
            scopes = [{"scope": {"name": "s"}, "spans": spans}]
            attributes = [{"key": "service.name", "value": {"stringValue": f"svc-{r % 4}"}}]
            resource: dict[str, Any] = {"resource": {"attributes": attributes} if r % 9 else {}}
            resource["instrumentationLibrarySpans" if r % 11 == 0 else "scopeSpans"] = scopes
            resources.append(resource)
        out.append({"resourceSpans": resources})
    return out


def table_digest(db: Path) -> str:
    """sha256 of every row of the spans (main's columns, in rowid order) and minute_stats
    tables."""
    conn = sqlite3.connect(db)
    try:
        spans = conn.execute(f"SELECT {MAIN_COLUMNS} FROM spans ORDER BY rowid").fetchall()
        minutes = conn.execute("SELECT * FROM minute_stats ORDER BY service, minute").fetchall()
    finally:
        conn.close()
    return hashlib.sha256(json.dumps([spans, minutes]).encode()).hexdigest()


def test_fast_and_general_paths_build_the_same_index(tmp_path: Path) -> None:
    """One export as JSON lines (fast path, odd spans falling back) and pretty-printed
    (general path), and walked: the same rows, and the same index as main's reader."""
    requests = export(random.Random(19))
    lines = tmp_path / "lines.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in requests))
    pretty = tmp_path / "pretty.json"
    pretty.write_text("\n".join(json.dumps(r, indent=1) for r in requests))
    taken = 0
    for line in lines.read_text().splitlines():
        with contextlib.suppress(otlp._Refused):
            otlp._fast_rows(line)
            taken += 1
    assert 10 < taken < 40  # both paths are exercised by the JSON lines
    fast = [row for batch in read_spans(lines) for row in batch]
    assert len(fast) == 40 * 2 * 30
    assert fast == [row for batch in read_spans(pretty) for row in batch]
    assert fast == [row for batch in read_spans(pretty, whole_limit=64) for row in batch]
    build_index([lines], tmp_path / "fast.db")
    build_index([pretty], tmp_path / "general.db")
    assert table_digest(tmp_path / "fast.db") == table_digest(tmp_path / "general.db")
    assert table_digest(tmp_path / "fast.db") == MAIN_DIGEST
