"""Three things a caller is not charged for, and one callee under two names: another
host's clock skew, the backoff before a retry of a failed call, and a dependency that
some callers name by ``peer.service`` and others by its database or host (small
hand-built traces, and a real index built from OTLP/JSON)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from bridge.spans import MS, Spans
from keel.bridge.diagnosis import rank_hypotheses, score_suspects
from keel.bridge.evidence import ScopedSpan, gather
from keel.bridge.index import TraceIndex, build_index
from keel.bridge.otlp import names_of

MINUTE = 60_000 * MS
BASELINE = (0, 30 * MINUTE)
DURING = (30 * MINUTE, 40 * MINUTE)
SERVICES = ("edge", "orders")


def _diagnose(rows: list[ScopedSpan]) -> tuple[dict[str, Any], dict[str, Any]]:
    evidence = {"sampled": 1.0, **gather(rows, "edge", [BASELINE, DURING], SERVICES)}
    scores = score_suspects(evidence)
    windows = {"service": "edge", "onset": "T", "how": "test"}
    windows |= {"baseline": list(BASELINE), "during": list(DURING)}
    incident = {"id": "INC-1", "title": "t", "opened_at": "T"}
    return evidence, rank_hypotheses(incident, windows, evidence, scores, {"changes": []})


def _ratio(evidence: dict[str, Any], name: str) -> float:
    entity = evidence["entities"][name]
    return float(entity["during"]["median_ms"] / entity["baseline"]["median_ms"])


def test_another_hosts_clock_skew_is_not_the_callers_own_time() -> None:
    """orders' host clock runs 60 ms ahead of edge's, and orders gets 4x slower: its
    server span, as recorded, ends well after edge's client span. Edge's own time (its
    handler and the network) stays what it was; orders is the cause."""
    rng = random.Random(3)
    t = Spans()
    for i in range(1200):
        start = i * (40 * MINUTE // 1200)
        trace = f"{i:032x}"
        work = rng.lognormvariate(0, 0.2) * 20 * (4 if start >= DURING[0] else 1)
        edge = t.span(trace, None, "edge", start, work + 4)
        client = t.span(trace, edge, "edge", start + MS, work + 2, kind=3, peer="orders")
        t.span(trace, client, "orders", start + 2 * MS + 60 * MS, work)
    evidence, result = _diagnose(t.rows)
    assert _ratio(evidence, "edge") < 1.2
    assert _ratio(evidence, "orders") > 3
    assert result["root_cause"]["service"] == "orders"


def test_the_backoff_before_a_retry_is_not_the_callers_own_time() -> None:
    """orders' database fails 40% of its calls from the onset; orders waits 100 ms and
    calls it again. The wait is the database's doing: orders' own time stays as it was,
    and the database is the cause."""
    rng = random.Random(5)
    t = Spans()
    for i in range(1200):
        start = i * (40 * MINUTE // 1200)
        trace = f"{i:032x}"
        failed = start >= DURING[0] and rng.random() < 0.4
        own = rng.lognormvariate(0, 0.2) * 5
        total = own + 8 + (108 if failed else 0)
        edge = t.span(trace, None, "edge", start, total + 2)
        orders = t.span(trace, edge, "orders", start + MS, total)
        at = start + MS + int(own * MS)
        t.span(trace, orders, "orders", at, 8, kind=3, peer="pg-orders", error=failed)
        if failed:
            t.span(trace, orders, "orders", at + 108 * MS, 8, kind=3, peer="pg-orders")
    evidence, result = _diagnose(t.rows)
    assert _ratio(evidence, "orders") < 1.2
    assert result["root_cause"]["service"] == "pg-orders"


def test_names_of_a_callee() -> None:
    """``peer.service`` first; the next name is kept as its other name only then."""

    def attrs(**values: str) -> list[dict[str, Any]]:
        return [
            {"key": k.replace("_", "."), "value": {"stringValue": v}} for k, v in values.items()
        ]

    assert names_of(attrs(peer_service="google-maps", server_address="maps.googleapis.com")) == (
        "google-maps",
        "maps.googleapis.com",
    )
    assert names_of(attrs(server_address="maps.googleapis.com")) == ("maps.googleapis.com", None)
    assert names_of(attrs(peer_service="pg", db_name="pg")) == ("pg", None)
    assert names_of(attrs(db_name="orders", db_system="mysql")) == ("orders", None)
    assert names_of(attrs(peer_service="mysql-depots", db_name="inventory")) == (
        "mysql-depots",
        "inventory",
    )
    assert names_of(None) == (None, None)


def _request(service: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}


def _client(n: int, *names: tuple[str, str]) -> dict[str, Any]:
    start = 1773481200000000000 + n * 10**9
    return {
        "traceId": f"{n + 1:032x}",
        "spanId": f"{n + 1:016x}",
        "name": "SELECT",
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 5 * MS),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in names],
    }


def test_a_callee_named_two_ways_is_one(tmp_path: Path) -> None:
    """Some callers name the database ``mysql-depots`` (peer.service) and ``inventory``
    (db.name), others only ``inventory``: the index reads every call as ``mysql-depots``.
    A name two callees share (``shared``) is left as it is, and so is a service's name."""
    lines = [
        _request("a", [_client(0, ("peer.service", "mysql-depots"), ("db.name", "inventory"))]),
        _request("b", [_client(1, ("db.name", "inventory")), {**_client(9), "kind": 2}]),
        _request("a", [_client(2, ("peer.service", "pg-1"), ("db.name", "shared"))]),
        _request("a", [_client(3, ("peer.service", "pg-2"), ("db.name", "shared"))]),
        _request("b", [_client(4, ("db.name", "shared"))]),
        _request("a", [_client(5, ("peer.service", "billing"), ("server.address", "b"))]),
    ]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    build_index([path], tmp_path / "index.db")
    index = TraceIndex(tmp_path / "index.db")
    assert index.peer_names() == {"inventory": "mysql-depots"}
    rows, _share = index.spans_between(["a", "b"], 0, 2 * 1773481200000000000)
    assert sorted(row[5] for row in rows if row[4] == 3) == sorted(
        ["mysql-depots", "mysql-depots", "pg-1", "pg-2", "shared", "billing"]
    )


def test_a_caller_waiting_for_a_slower_database_is_not_the_cause() -> None:
    """From the onset the database is 6x slower, and orders waits for a connection before
    each call to it (its own time, 3x, in the requests that call the database only; the
    others run as they did): the database is the cause, orders only waits for it."""
    rng = random.Random(11)
    t = Spans()
    for i in range(2400):
        start = i * (40 * MINUTE // 2400)
        trace = f"{i:032x}"
        during = start >= DURING[0]
        calls_db = i % 5 < 3
        own = rng.lognormvariate(0, 0.2) * 10 * (3 if during and calls_db else 1)
        db = rng.lognormvariate(0, 0.2) * 4 * (6 if during else 1) if calls_db else 0
        edge = t.span(trace, None, "edge", start, own + db + 2)
        orders = t.span(trace, edge, "orders", start + MS, own + db)
        if calls_db:
            at = start + MS + int(own * MS)
            t.span(trace, orders, "orders", at, db, kind=3, peer="pg-orders")
    evidence, result = _diagnose(t.rows)
    assert _ratio(evidence, "orders") > 1.5  # it does look slower...
    assert evidence["entities"]["orders"]["without"]["pg-orders"]["during"]["calls"] > 100
    assert result["root_cause"]["service"] == "pg-orders"  # ...but only where it waits
    assert result["suspects"]["orders"]["waits_for"] == "pg-orders"


def test_a_callers_span_standing_for_a_lost_one_is_not_timed() -> None:
    """orders loses a third of its spans; the callers' client spans to it that no span of
    orders answered count as its calls (and failures) but not as its own time (they hold
    everything below it)."""
    t = Spans()
    for i in range(300):
        start = i * (40 * MINUTE // 300)
        trace = f"{i:032x}"
        edge = t.span(trace, None, "edge", start, 40)
        client = t.span(trace, edge, "edge", start + MS, 35, kind=3, peer="orders")
        if i % 3:
            t.span(trace, client, "orders", start + 2 * MS, 33)
    evidence = gather(t.rows, "edge", [BASELINE, DURING], SERVICES)
    baseline = evidence["entities"]["orders"]["baseline"]
    assert baseline["timed"] < baseline["calls"]
    assert baseline["median_ms"] == 33
