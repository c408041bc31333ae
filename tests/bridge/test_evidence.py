"""The evidence the diagnosis rests on, on small hand-built traces: who is charged for
time and failures, and how suspects are scored and ranked (pure functions, no index)."""

from __future__ import annotations

import random
from typing import Any

from bridge.spans import MS, Spans
from keel.bridge.diagnosis import rank_hypotheses, score_suspects
from keel.bridge.evidence import DEPENDENCY, SERVICE, ScopedSpan, entity_of, gather

MINUTE = 60_000 * MS
BASELINE = (0, 30 * MINUTE)
DURING = (30 * MINUTE, 40 * MINUTE)
SERVICES = ("edge", "fanout", "orders", "a", "b", "c", "d", "e", "f", "g", "h")


def _request(t: Spans, start: int, *, own_ms: float, db_ms: float, db_error: bool = False) -> None:
    """edge -> orders (own work, then a call to the uninstrumented database)."""
    trace = f"{len(t.rows):032x}"
    edge = t.span(trace, None, "edge", start, own_ms + db_ms + 2, error=db_error)
    orders = t.span(trace, edge, "orders", start + MS, own_ms + db_ms, error=db_error)
    t.span(
        trace,
        orders,
        "orders",
        start + MS + int(own_ms * MS),
        db_ms,
        kind=3,
        peer="pg-orders",
        error=db_error,
    )


def _traffic(slow_own: float = 1.0, slow_db: float = 1.0, db_errors: float = 0.0) -> Spans:
    rng = random.Random(7)
    t = Spans()
    for i in range(1200):
        start = i * (40 * MINUTE // 1200)
        during = start >= DURING[0]
        own = rng.lognormvariate(0, 0.2) * 5 * (slow_own if during else 1)
        db = rng.lognormvariate(0, 0.2) * 8 * (slow_db if during else 1)
        failed = during and rng.random() < db_errors
        _request(t, start, own_ms=own, db_ms=db, db_error=failed)
    return t


def _diagnose(t: Spans) -> dict[str, Any]:
    evidence = {"sampled": 1.0, **gather(t.rows, "edge", [BASELINE, DURING], SERVICES)}
    scores = score_suspects(evidence)
    windows = {
        "service": "edge",
        "onset": "T",
        "how": "test",
        "baseline": list(BASELINE),
        "during": list(DURING),
    }
    incident = {"id": "INC-1", "title": "t", "opened_at": "T"}
    return rank_hypotheses(incident, windows, evidence, scores, {"changes": []})


def test_a_service_is_judged_by_its_own_time_not_its_calls() -> None:
    """orders' handler gets 8x slower while its database calls stay as they were: orders
    is the cause (a service), not the edge that calls it nor the database."""
    result = _diagnose(_traffic(slow_own=8.0))
    assert result["root_cause"]["service"] == "orders"
    assert result["root_cause"]["type"] == "service"
    assert result["confidence"] >= 0.5


def test_an_uninstrumented_dependency_is_a_suspect_of_its_own() -> None:
    """The database (only its callers' client spans) gets 10x slower: it is named, as a
    dependency, with a cited client span."""
    result = _diagnose(_traffic(slow_db=10.0))
    top = result["root_cause"]
    assert (top["service"], top["type"], top["kind"]) == ("pg-orders", DEPENDENCY, "dependency")
    cited = {c["kind"] for c in result["citations"]}
    assert "span" in cited


def test_failures_are_blamed_where_they_start() -> None:
    """Failures that start in the database's calls (the callers fail with them) are
    the database's."""
    result = _diagnose(_traffic(db_errors=0.3))
    assert result["root_cause"]["service"] == "pg-orders"


def test_no_change_is_no_clear_cause() -> None:
    """Nothing changed: no root cause, confidence 0, and the conclusion says so."""
    result = _diagnose(_traffic())
    assert result["root_cause"] is None
    assert result["confidence"] == 0.0
    assert result["conclusion"].startswith("No clear cause for INC-1")


def test_a_diluted_failure_below_a_fan_out_is_still_found() -> None:
    """The edge calls a fan-out that calls eight services in parallel and tolerates
    failures; one of them fails 40 % of its calls. The edge's own error rate hardly
    moves, yet that service is the cause."""
    rng = random.Random(3)
    t = Spans()
    for i in range(1200):
        start = i * (40 * MINUTE // 1200)
        trace = f"{i:032x}"
        edge = t.span(trace, None, "edge", start, 30)
        fanout = t.span(trace, edge, "fanout", start + MS, 25)
        for name in "abcdefgh":
            failed = name == "c" and start >= DURING[0] and rng.random() < 0.4
            t.span(
                trace, fanout, name, start + 2 * MS, rng.lognormvariate(0, 0.2) * 10, error=failed
            )
    result = _diagnose(t)
    assert result["root_cause"]["service"] == "c"


def test_a_timeout_waiting_on_a_slow_callee_is_the_callee_s() -> None:
    """A caller's span fails (a timeout) while its child, a callee, took far longer than
    its baseline calls ever did: the failure starts in the callee."""
    t = Spans()
    for i in range(400):
        start = i * (40 * MINUTE // 400)
        trace = f"{i:032x}"
        slow = start >= DURING[0]
        edge = t.span(trace, None, "edge", start, 60 if slow else 12, error=slow)
        t.span(trace, edge, "orders", start + MS, 300 if slow else 10 + (i % 5))
    evidence = gather(t.rows, "edge", [BASELINE, DURING], SERVICES)
    assert evidence["entities"]["orders"]["during"]["failures"] > 0
    assert evidence["entities"]["edge"]["during"]["failures"] == 0


def test_a_publish_is_the_broker_s_and_so_is_the_delivery_lag() -> None:
    """A producer span whose consumer starts after it ended is a call to the broker (the
    topic), charged the publish and the wait until a consumer took the message."""
    t = Spans()
    producer = t.span("t" * 32, None, "orders", 0, 2, kind=4, peer="order-events")
    t.span("t" * 32, producer, "worker", 50 * MS, 5, kind=5)
    evidence = gather(t.rows, "orders", [(0, MINUTE), (MINUTE, 2 * MINUTE)], ["orders", "worker"])
    broker = evidence["entities"]["order-events"]
    assert broker["kind"] == DEPENDENCY
    assert broker["baseline"]["median_ms"] == 50  # 2 ms publish + 48 ms until consumed


def test_entity_names() -> None:
    """Own spans are their service's; an unanswered client call is the callee's, named
    by its attributes; a host name of a known service is that service."""
    services = frozenset({"orders", "billing"})
    own: ScopedSpan = ("t", "s", None, "orders", 2, None, 0, 1, 0)
    call: ScopedSpan = ("t", "s", None, "orders", 3, "pg-orders", 0, 1, 0)
    host: ScopedSpan = ("t", "s", None, "orders", 3, "billing.prod.svc.cluster.local", 0, 1, 0)
    assert entity_of(own, False, services) == ("orders", SERVICE)
    assert entity_of(call, False, services) == ("pg-orders", DEPENDENCY)
    assert entity_of(call, True, services) == ("orders", SERVICE)  # answered: the network
    assert entity_of(host, False, services) == ("billing", SERVICE)


def _calls(n: int, mean_log: float, median: float) -> dict[str, Any]:
    return {
        "calls": n,
        "median_ms": median,
        "mean_log": mean_log,
        "sd_log": 1.0,
        "failures": 0,
        "failure_rate": 0.0,
    }


def _quiet_evidence(orders_mean_log: float, orders_median: float) -> dict[str, Any]:
    """edge's requests reach orders (moved by ``orders_mean_log``) and billing (unmoved)."""

    def entity(mean_log: float, median: float) -> dict[str, Any]:
        return {
            "kind": "service",
            "baseline": _calls(100, 0.0, 10.0),
            "during": _calls(40, mean_log, median),
            "calls_per_request": 1.0,
            "reach": 1.0,
            "propagation": 1.0,
            "exemplars": [],
        }

    window = {"requests": 100, "failed": 0, "error_rate": 0.0, "median_ms": 20.0}
    return {
        "sampled": 1.0,
        "symptom": {"baseline": window, "during": {**window, "requests": 40}},
        "entities": {
            "orders": entity(orders_mean_log, orders_median),
            "billing": entity(0.0, 10.0),
        },
        "callers": {"orders": ["edge"], "billing": ["edge"]},
    }


QUIET_WINDOWS = {
    "service": "edge",
    "onset": "T",
    "how": "test",
    "baseline": list(BASELINE),
    "during": list(DURING),
}


def _change(deploy_id: str, service: str, minutes: float) -> dict[str, Any]:
    deploy = {
        "id": deploy_id,
        "service": service,
        "kind": "deploy",
        "deployed_at": "2026-03-14T09:00:00Z",
    }
    return {"deploy": deploy, "minutes_before_onset": minutes, "timing": 0.5, "explains": {}}


def test_a_change_short_of_sure_is_a_lead_not_a_cause() -> None:
    """An entity a little slower (z about 2.4, x1.2): no clear cause (root_cause null,
    confidence 0), but the entity is listed as a weak signal to look at."""
    evidence = _quiet_evidence(0.45, 12.0)
    scores = score_suspects(evidence)
    assert scores["suspects"] == {}
    assert list(scores["weak"]) == ["orders"]
    result = rank_hypotheses(
        {"id": "INC-1", "title": "t", "opened_at": "T"},
        QUIET_WINDOWS,
        evidence,
        scores,
        {"changes": []},
    )
    assert (result["root_cause"], result["confidence"]) == (None, 0.0)
    assert [(h["kind"], h["service"]) for h in result["hypotheses"]] == [("weak_signal", "orders")]
    assert "Weak signals" in result["conclusion"]


def test_with_no_clear_cause_recent_changes_on_the_path_are_leads_too() -> None:
    """A slow leak may not stand out between the windows: with no clear cause, the deploys
    of services the symptom's requests reach are listed after the weak signals (score 0,
    each citing its deploy), those whose service moved most first; a deploy of a service
    off the path is not listed, nor a second lead for a service already listed."""
    evidence = _quiet_evidence(0.2, 10.5)  # orders moved a little (z about 1), not weak
    scores = score_suspects(evidence)
    assert (scores["suspects"], scores["weak"]) == ({}, {})
    changes = {
        "changes": [
            _change("d-1", "billing", 2.0),  # latest, but billing did not move
            _change("d-2", "orders", 40.0),  # a leak's deploy: long before, orders moved
            _change("d-3", "warehouse", 1.0),  # not on edge's request path
            _change("d-4", "orders", 60.0),  # a second change of orders: one lead each
        ]
    }
    result = rank_hypotheses(
        {"id": "INC-1", "title": "t", "opened_at": "T"}, QUIET_WINDOWS, evidence, scores, changes
    )
    assert (result["root_cause"], result["confidence"]) == (None, 0.0)
    leads = [(h["rank"], h["kind"], h["deploy_id"], h["score"]) for h in result["hypotheses"]]
    assert leads == [(1, "recent_change", "d-2", 0.0), (2, "recent_change", "d-1", 0.0)]
    assert (
        "Recent changes on the request path: d-2 of orders, d-1 of billing."
        in (result["conclusion"])
    )
    cited = {c["ref"]: c for c in result["citations"]}
    assert cited["d-2"]["tool"] == "list_deploys"
    assert cited["d-2"]["arguments"] == {"deploy_id": "d-2"}
