"""The root-cause diagnosis, phase by phase: each phase is a plain function from JSON to
JSON, so the durable task can checkpoint it (``ctx.step``) and tests can run it directly.

Method (see docs/bridge.md):

1. **load-incident**: the incident, and the services the index knows.
2. **detect-onset**: the first minute (in the 20 before the incident was opened) from
   which the symptomatic service's error rate or median latency stays above what its
   previous 40 minutes allow (mean + 4 standard deviations of its per-minute values).
   The *baseline* window is the 28 minutes ending 2 minutes before the onset; the
   *during* window the 10 minutes from it.
3. **collect-spans**: per service, both windows' span counts, errors, latency
   percentiles, and exemplar spans (errors first, then the slowest).
4. **build-call-graph**: caller -> callee edges (a span's service -> its children's).
5. **score-services**: a service is anomalous when its error rate rose by >= 2 points
   and >= 4 standard errors, or its median latency rose >= 35 % (and >= 5 ms).
6. **walk-dependencies**: from the symptomatic service along anomalous callees to the
   deepest anomalous services (anomalous, with no anomalous callee): the suspects.
7. **correlate-deploys**: deploys and config changes from 60 minutes before the onset to
   2 minutes after, weighted by how close they are and where their service is (a
   suspect, upstream of one, or not anomalous at all).
8. **rank-hypotheses**: a change on a suspect explains it best; a suspect with no change
   is saturation (latency) or a failure of its own; changes elsewhere are alternatives.
   Every claim carries citations (incident, span and deploy ids) that the plain tools
   resolve.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from keel.bridge.core import Bridge
from keel.bridge.errors import UnknownService
from keel.bridge.records import NS_PER_MINUTE, format_time, parse_time

__all__ = [
    "PHASES",
    "build_call_graph",
    "collect_spans",
    "correlate_deploys",
    "detect_onset",
    "load_incident",
    "rank_hypotheses",
    "run_diagnosis",
    "score_services",
    "walk_dependencies",
]

PHASES = (
    ("load-incident", "loading the incident"),
    ("detect-onset", "finding the onset"),
    ("collect-spans", "collecting spans before and during"),
    ("build-call-graph", "building the call graph"),
    ("score-services", "scoring services against the baseline"),
    ("walk-dependencies", "walking to the deepest anomalous dependency"),
    ("correlate-deploys", "correlating deploys before the onset"),
    ("rank-hypotheses", "ranking hypotheses"),
)
LOOKBACK = 20  # minutes before the incident was opened where the onset is looked for
REFERENCE = 40  # minutes before that whose per-minute values set the onset threshold
BASELINE = 28  # minutes of baseline, ending GAP before the onset
GAP = 2  # minutes left out between baseline and onset
DURING = 10  # minutes analysed from the onset
DEPLOY_BEFORE = 60  # minutes before the onset in which changes are considered
DEPLOY_AFTER = 5  # minutes after the detected onset still considered (it is +-2 min)
MIN_SPANS = 10  # spans a service needs in a window to be scored
EXEMPLARS = 3

Json = dict[str, Any]


# --- 1. load-incident ------------------------------------------------------------------


def load_incident(bridge: Bridge, incident_id: str) -> Json:
    """The incident and the known services. Raises UnknownIncident."""
    incident = bridge.incidents.get(incident_id)
    return {"incident": incident.to_json(), "services": bridge.services()}


def check_service(service: str, services: Sequence[str]) -> str:
    """Raises UnknownService for a service the index has no span of."""
    if service not in services:
        raise UnknownService(service, list(services))
    return service


# --- 2. detect-onset -------------------------------------------------------------------


def _minute_values(bridge: Bridge, service: str, first: int, last: int) -> dict[int, list[float]]:
    """Per minute in [first, last): [error rate, median ms, spans]."""
    out: dict[int, list[float]] = {
        minute: [errors / count, 0.0, float(count)]
        for minute, count, errors, _ in bridge.index.minutes(service, first, last)
    }
    # Medians need the spans (the minute aggregates keep sums, not distributions).
    by_minute: dict[int, list[int]] = {}
    for start, end in bridge.index.span_times(service, first * NS_PER_MINUTE, last * NS_PER_MINUTE):
        by_minute.setdefault(start // NS_PER_MINUTE, []).append(end - start)
    for minute, durations in by_minute.items():
        if minute in out:
            out[minute][1] = statistics.median(durations) / 1e6
    return out


def detect_onset(bridge: Bridge, incident: Mapping[str, Any], service: str) -> Json:
    """The onset of the trouble on ``service``, and the windows the diagnosis compares."""
    opened = parse_time(incident["opened_at"], "opened_at") // NS_PER_MINUTE
    first = opened - LOOKBACK - REFERENCE
    onset, how = _onset_of(bridge, service, first, opened)
    if onset is None:
        onset, how = opened - 5, "no sustained change on the service; assumed 5 minutes before"
    baseline = [(onset - GAP - BASELINE) * NS_PER_MINUTE, (onset - GAP) * NS_PER_MINUTE]
    during = [onset * NS_PER_MINUTE, min(onset + DURING, opened + DURING) * NS_PER_MINUTE]
    return {
        "service": service,
        "onset": format_time(onset * NS_PER_MINUTE),
        "onset_ns": onset * NS_PER_MINUTE,
        "how": how,
        "baseline": baseline,
        "during": during,
    }


def _onset_of(bridge: Bridge, service: str, first: int, opened: int) -> tuple[int | None, str]:
    """The first minute from which ``service`` stays out of its usual range.

    Errors are tested on two-minute pools against the reference error rate (at least 3
    errors, 4 standard errors above it); latency on per-minute medians against the
    reference minutes' median + 4 robust standard deviations (at least +30 %). A minute
    counts as the onset when it and the next one are both out of range.
    """
    values = _minute_values(bridge, service, first, opened + 3)
    reference = [values[m] for m in range(first, opened - LOOKBACK) if m in values]
    if len(reference) < 10:
        return None, "too little traffic before the incident"
    # The reference may hold an earlier incident: leave out its worst quarter of minutes
    # for errors, and use median and MAD (robust to such minutes) for latency.
    calm = sorted(reference, key=lambda v: v[0])[: max(1, (len(reference) * 3) // 4)]
    p0 = max(sum(v[0] * v[2] for v in calm) / sum(v[2] for v in calm), 0.01)
    medians = [v[1] for v in reference]
    center = statistics.median(medians)
    spread = 1.4826 * statistics.median(abs(m - center) for m in medians)
    lat_limit = max(center + 4 * spread, 1.3 * center)

    def errors_up(minute: int) -> bool:
        pooled = [values[m] for m in (minute, minute + 1) if m in values]
        n = sum(v[2] for v in pooled)
        e = sum(v[0] * v[2] for v in pooled)
        first_minute = values.get(minute)
        return (
            first_minute is not None
            and first_minute[0] > p0
            and e >= 3
            and e / n > p0 + 4 * math.sqrt(p0 * (1 - p0) / n)
        )

    def slower(minute: int) -> bool:
        v = values.get(minute)
        return v is not None and v[2] >= 2 and v[1] > lat_limit

    for minute in range(opened - LOOKBACK, opened + 1):
        for name, test in (("error rate", errors_up), ("latency", slower)):
            if test(minute) and test(minute + 1):
                when = format_time(minute * NS_PER_MINUTE)
                return minute, f"the {name} of {service} left its usual range at {when}"
    return None, "no sustained change"


# --- 3. collect-spans ------------------------------------------------------------------


def _summary(durations: list[int], errors: int) -> Json:
    ordered = sorted(durations)
    n = len(ordered)
    logs = [math.log(max(d, 1)) for d in ordered]
    return {
        "log_sd": statistics.pstdev(logs) if n > 1 else 0.0,
        "spans": n,
        "errors": errors,
        "error_rate": errors / n if n else 0.0,
        "p50_ms": ordered[n // 2] / 1e6 if n else 0.0,
        "p95_ms": ordered[min(n - 1, (n * 95) // 100)] / 1e6 if n else 0.0,
    }


def collect_spans(bridge: Bridge, windows: Mapping[str, Any], services: Sequence[str]) -> Json:
    """Per service, a summary of its spans in the baseline and during windows."""
    base = bridge.index.window(services, *windows["baseline"], exemplars=0)
    now = bridge.index.window(services, *windows["during"], exemplars=EXEMPLARS)
    out: Json = {}
    for service in services:
        entry: Json = {}
        if service in base:
            entry["baseline"] = _summary(base[service].durations_ns, base[service].errors)
        if service in now:
            w = now[service]
            entry["during"] = _summary(w.durations_ns, w.errors)
            entry["exemplars"] = [
                {"trace_id": t, "span_id": s, "duration_ms": round(d / 1e6, 3), "error": bool(e)}
                for t, s, d, e in w.exemplars
            ]
        if entry:
            out[service] = entry
    return out


# --- 4. build-call-graph ---------------------------------------------------------------


def build_call_graph(bridge: Bridge, windows: Mapping[str, Any], services: Sequence[str]) -> Json:
    """Caller -> callee edges seen in either window, with call counts."""
    calls: dict[tuple[str, str], int] = {}
    for name in ("baseline", "during"):
        for caller, callee, count, _errors in bridge.index.callers(services, *windows[name]):
            calls[(caller, callee)] = calls.get((caller, callee), 0) + count
    return {"edges": [[a, b, n] for (a, b), n in sorted(calls.items())]}


# --- 5. score-services -----------------------------------------------------------------


def score_services(stats: Mapping[str, Any]) -> Json:
    """How far each service moved from its baseline, and whether that is an anomaly."""
    scores: Json = {}
    for service, entry in sorted(stats.items()):
        before, during = entry.get("baseline"), entry.get("during")
        if not before or not during or before["spans"] < MIN_SPANS or during["spans"] < MIN_SPANS:
            continue
        p0, p1, n1 = before["error_rate"], during["error_rate"], during["spans"]
        floor = max(p0, 0.01)  # a quiet baseline must not make two errors look alarming
        z = (p1 - p0) / math.sqrt(floor * (1 - floor) / n1)
        error_up = p1 - p0 >= 0.02 and z >= 4 and during["errors"] >= 3
        ratio = during["p50_ms"] / before["p50_ms"] if before["p50_ms"] > 0 else 1.0
        p95_ratio = during["p95_ms"] / before["p95_ms"] if before["p95_ms"] > 0 else 1.0
        # The median's standard error is ~1.25 sd/sqrt(n) (on log durations).
        se = 1.2533 * math.sqrt(
            before["log_sd"] ** 2 / before["spans"] + during["log_sd"] ** 2 / n1
        )
        latency_z = math.log(ratio) / se if se > 0 and ratio > 0 else 0.0
        slower = ratio >= 1.3 and latency_z >= 4 and during["p50_ms"] - before["p50_ms"] >= 2
        signals = []
        if error_up:
            signals.append(f"error rate {p0:.1%} -> {p1:.1%}")
        if slower:
            signals.append(f"median latency {before['p50_ms']:.0f} -> {during['p50_ms']:.0f} ms")
        score = (100 * (p1 - p0) if error_up else 0.0) + (20 * math.log2(ratio) if slower else 0.0)
        scores[service] = {
            "anomalous": bool(signals),
            "score": round(score, 3),
            "signals": signals,
            "error_rate_before": round(p0, 5),
            "error_rate_during": round(p1, 5),
            "error_z": round(z, 2),
            "p50_before_ms": round(before["p50_ms"], 3),
            "p50_during_ms": round(during["p50_ms"], 3),
            "p50_ratio": round(ratio, 3),
            "p95_ratio": round(p95_ratio, 3),
            "latency_z": round(latency_z, 2),
            "spans_during": n1,
        }
    return scores


# --- 6. walk-dependencies --------------------------------------------------------------


def walk_dependencies(graph: Mapping[str, Any], scores: Mapping[str, Any], service: str) -> Json:
    """From ``service`` to the deepest anomalous dependencies (the suspects)."""
    callees: dict[str, list[str]] = {}
    for caller, callee, _n in graph["edges"]:
        callees.setdefault(caller, []).append(callee)

    def anomalous(name: str) -> bool:
        return bool(scores.get(name, {}).get("anomalous"))

    def leaf(name: str) -> bool:
        return not any(anomalous(c) for c in callees.get(name, []))

    symptom_anomalous = anomalous(service)
    paths: dict[str, list[str]] = {}
    if symptom_anomalous:
        queue, seen = [[service]], {service}
        while queue:
            path = queue.pop(0)
            here = path[-1]
            if leaf(here):
                paths.setdefault(here, path)
            for callee in sorted(callees.get(here, [])):
                if anomalous(callee) and callee not in seen:
                    seen.add(callee)
                    queue.append([*path, callee])
    else:
        # The named service looks healthy: consider every anomalous service's roots.
        for name in sorted(scores):
            if anomalous(name) and leaf(name):
                paths[name] = [name]
    suspects = sorted(paths, key=lambda s: (-scores[s]["score"], -len(paths[s]), s))
    return {
        "symptom_anomalous": symptom_anomalous,
        "suspects": [{"service": s, "path": paths[s]} for s in suspects],
    }


# --- 7. correlate-deploys --------------------------------------------------------------


def _upstream(graph: Mapping[str, Any], service: str) -> set[str]:
    callers: dict[str, set[str]] = {}
    for caller, callee, _n in graph["edges"]:
        callers.setdefault(callee, set()).add(caller)
    found: set[str] = set()
    todo = [service]
    while todo:
        for caller in callers.get(todo.pop(), set()):
            if caller not in found:
                found.add(caller)
                todo.append(caller)
    return found


def correlate_deploys(
    bridge: Bridge,
    onset_ns: int,
    walk: Mapping[str, Any],
    scores: Mapping[str, Any],
    graph: Mapping[str, Any],
) -> Json:
    """The changes shortly before the onset, each weighted by timing and service."""
    first = onset_ns - DEPLOY_BEFORE * NS_PER_MINUTE
    last = onset_ns + DEPLOY_AFTER * NS_PER_MINUTE
    suspects = [s["service"] for s in walk["suspects"]]
    upstream = set().union(*(_upstream(graph, s) for s in suspects)) if suspects else set()
    out = []
    for deploy in bridge.deploys.all():
        if not first <= deploy.deployed_at <= last:
            continue
        minutes = (onset_ns - deploy.deployed_at) / NS_PER_MINUTE
        # After the detected onset: only the onset's own uncertainty can excuse it.
        proximity = math.exp(-minutes / 20) if minutes >= 0 else 0.8 * math.exp(minutes / 3)
        if deploy.service in suspects:
            relation, weight = "suspect", 1.0
        elif deploy.service in upstream and scores.get(deploy.service, {}).get("anomalous"):
            relation, weight = "upstream of a suspect", 0.35
        elif scores.get(deploy.service, {}).get("anomalous"):
            relation, weight = "anomalous", 0.25
        else:
            relation, weight = "not anomalous", 0.05
        out.append(
            {
                "deploy": deploy.to_json(),
                "minutes_before_onset": round((onset_ns - deploy.deployed_at) / NS_PER_MINUTE, 2),
                "relation": relation,
                "proximity": round(proximity, 4),
                "weight": weight,
            }
        )
    return {"window": [format_time(first), format_time(last)], "deploys": out}


# --- 8. rank-hypotheses ----------------------------------------------------------------


class _Citations:
    """Numbered citations, each with the tool call that resolves it."""

    def __init__(self) -> None:
        self.items: list[Json] = []
        self._by_key: dict[str, str] = {}

    def add(self, kind: str, ref: str, tool: str, arguments: Json, note: str) -> str:
        key = f"{kind}:{ref}"
        if key not in self._by_key:
            cid = f"C{len(self.items) + 1}"
            self._by_key[key] = cid
            self.items.append(
                {
                    "id": cid,
                    "kind": kind,
                    "ref": ref,
                    "tool": tool,
                    "arguments": arguments,
                    "note": note,
                }
            )
        return self._by_key[key]

    def incident(self, incident_id: str) -> str:
        return self.add(
            "incident", incident_id, "get_incident", {"incident_id": incident_id}, "the incident"
        )

    def deploy(self, deploy: Mapping[str, Any]) -> str:
        return self.add(
            "deploy",
            deploy["id"],
            "list_deploys",
            {"deploy_id": deploy["id"]},
            f"{deploy['kind']} change of {deploy['service']} at {deploy['deployed_at']}",
        )

    def span(self, service: str, exemplar: Mapping[str, Any]) -> str:
        state = "failed" if exemplar["error"] else "slow"
        return self.add(
            "span",
            f"{exemplar['trace_id']}/{exemplar['span_id']}",
            "search_traces",
            {"trace_id": exemplar["trace_id"], "span_id": exemplar["span_id"]},
            f"a {state} {service} span ({exemplar['duration_ms']:.0f} ms) during the incident",
        )

    def window(self, service: str, window: Sequence[int], name: str) -> str:
        start, end = format_time(window[0]), format_time(window[1])
        return self.add(
            "query",
            f"{service}@{start}..{end}",
            "search_traces",
            {"service": service, "start": start, "end": end},
            f"{service}'s spans in the {name} window",
        )


def _evidence(
    cites: _Citations,
    service: str,
    scores: Mapping[str, Any],
    stats: Mapping[str, Any],
    windows: Mapping[str, Any],
) -> Json:
    score = scores[service]
    ids = [cites.span(service, e) for e in stats.get(service, {}).get("exemplars", [])[:2]]
    ids.append(cites.window(service, windows["baseline"], "baseline"))
    ids.append(cites.window(service, windows["during"], "during"))
    return {
        "text": f"{service}: {'; '.join(score['signals'])} (baseline vs. during)",
        "citations": ids,
    }


def rank_hypotheses(  # noqa: PLR0917 - ctx.step passes a phase's inputs positionally
    incident: Mapping[str, Any],
    symptom: str,
    windows: Mapping[str, Any],
    stats: Mapping[str, Any],
    scores: Mapping[str, Any],
    walk: Mapping[str, Any],
    changes: Mapping[str, Any],
) -> Json:
    """The ranked hypotheses, the conclusion and its confidence, with citations."""
    cites = _Citations()
    incident_cite = cites.incident(incident["id"])
    suspects = walk["suspects"][:3]
    top_score = max((scores[s["service"]]["score"] for s in suspects), default=1.0) or 1.0
    hypotheses: list[Json] = []
    explained: set[str] = set()
    for suspect in suspects:
        service, path = suspect["service"], suspect["path"]
        strength = scores[service]["score"] / top_score
        claims = [_evidence(cites, service, scores, stats, windows)]
        if len(path) > 1:
            claims.append(
                {
                    "text": "anomalous call path: " + " -> ".join(path),
                    "citations": [
                        cites.span(s, stats[s]["exemplars"][0])
                        for s in path
                        if stats.get(s, {}).get("exemplars")
                    ],
                }
            )
        own = [c for c in changes["deploys"] if c["deploy"]["service"] == service]
        for change in sorted(own, key=lambda c: (-c["proximity"], c["deploy"]["id"])):
            deploy = change["deploy"]
            explained.add(deploy["id"])
            kind = "config_change" if deploy["kind"] == "config" else "bad_deploy"
            what = "configuration change" if kind == "config_change" else "deploy"
            hypotheses.append(
                {
                    "kind": kind,
                    "service": service,
                    "deploy_id": deploy["id"],
                    "score": round(strength * (0.5 + 0.5 * change["proximity"]), 4),
                    "summary": (
                        f"{what} {deploy['id']} of {service} ({deploy['summary']!r}, "
                        f"{_when(change['minutes_before_onset'])})"
                    ),
                    "claims": [
                        {
                            "text": f"{deploy['id']} changed {service} at {deploy['deployed_at']}, "
                            f"{_when(change['minutes_before_onset'])}",
                            "citations": [cites.deploy(deploy)],
                        },
                        *claims,
                    ],
                }
            )
        latency = any(sig.startswith("median latency") for sig in scores[service]["signals"])
        kind = "saturation" if latency else "degradation"
        label = "saturated (slower, with timeouts)" if latency else "failing on its own"
        hypotheses.append(
            {
                "kind": kind,
                "service": service,
                "deploy_id": None,
                "score": round(strength * (0.55 if not own else 0.3), 4),
                "summary": f"{service} {label}, with no change of it before the onset",
                "claims": claims,
            }
        )
    for change in changes["deploys"]:
        deploy = change["deploy"]
        if deploy["id"] in explained or change["minutes_before_onset"] < -DEPLOY_AFTER:
            continue
        kind = "config_change" if deploy["kind"] == "config" else "bad_deploy"
        hypotheses.append(
            {
                "kind": kind,
                "service": deploy["service"],
                "deploy_id": deploy["id"],
                "score": round(0.5 * change["weight"] * change["proximity"], 4),
                "summary": (
                    f"{deploy['kind']} change {deploy['id']} of {deploy['service']} "
                    f"({change['relation']}), "
                    f"{_when(change['minutes_before_onset'])}"
                ),
                "claims": [
                    {
                        "text": f"{deploy['id']} changed {deploy['service']} at "
                        f"{deploy['deployed_at']}; {deploy['service']} is {change['relation']}",
                        "citations": [cites.deploy(deploy)],
                    }
                ],
            }
        )
    hypotheses.sort(key=lambda h: (-h["score"], h["service"], h["deploy_id"] or ""))
    hypotheses = hypotheses[:6]
    for rank, hypothesis in enumerate(hypotheses, 1):
        hypothesis["rank"] = rank
    onset = windows["onset"]
    if hypotheses:
        top = hypotheses[0]
        second = hypotheses[1]["score"] if len(hypotheses) > 1 else 0.0
        confidence = top["score"] / (top["score"] + second) if top["score"] > 0 else 0.0
        if not walk["symptom_anomalous"]:
            confidence *= 0.6
        confidence = round(min(0.99, max(0.05, confidence)), 2)
        conclusion = f"Root cause of {incident['id']}: {top['summary']}."
    else:
        top, confidence = None, 0.0
        conclusion = (
            f"No root cause found for {incident['id']}: no service moved away from its "
            f"baseline around {onset}."
        )
    incident_claim = {
        "text": f"{incident['id']} ({incident['title']}) opened at {incident['opened_at']}; "
        f"onset of the trouble on {symptom} at {onset}",
        "citations": [incident_cite, cites.window(symptom, windows["during"], "during")],
    }
    incident_claim, hypotheses, citations = _keep_cited(incident_claim, hypotheses, cites.items)
    return {
        "incident_id": incident["id"],
        "service": symptom,
        "onset": onset,
        "windows": {
            "baseline": [format_time(t) for t in windows["baseline"]],
            "during": [format_time(t) for t in windows["during"]],
        },
        "conclusion": conclusion,
        "confidence": confidence,
        "root_cause": None
        if top is None
        else {k: top[k] for k in ("kind", "service", "deploy_id", "summary")},
        "path": walk["suspects"][0]["path"] if walk["suspects"] else [symptom],
        "incident_claim": incident_claim,
        "hypotheses": hypotheses,
        "anomalous_services": {
            s: {k: v for k, v in sc.items() if k != "anomalous"}
            for s, sc in scores.items()
            if sc["anomalous"]
        },
        "citations": citations,
    }


def _keep_cited(
    incident_claim: Json, hypotheses: list[Json], citations: list[Json]
) -> tuple[Json, list[Json], list[Json]]:
    """Keep the citations the kept claims use, numbered C1.. in order of first use (the
    claims are copied: hypotheses of one suspect share theirs)."""
    claims = [incident_claim, *(c for h in hypotheses for c in h["claims"])]
    used: dict[str, str] = {}
    for claim in claims:
        for cid in claim["citations"]:
            used.setdefault(cid, f"C{len(used) + 1}")

    def renumbered(claim: Json) -> Json:
        return {**claim, "citations": [used[c] for c in claim["citations"]]}

    kept = sorted(
        ({**c, "id": used[c["id"]]} for c in citations if c["id"] in used),
        key=lambda c: int(c["id"][1:]),
    )
    return (
        renumbered(incident_claim),
        [{**h, "claims": [renumbered(c) for c in h["claims"]]} for h in hypotheses],
        kept,
    )


def _when(minutes_before: float) -> str:
    if abs(minutes_before) < 0.05:  # onsets are found to the minute
        return "at the detected onset"
    if minutes_before > 0:
        return f"{minutes_before:.1f} min before the onset"
    return f"{-minutes_before:.1f} min after the detected onset"


def render(result: Mapping[str, Any]) -> str:
    """The result as text for people: conclusion, alternatives, citations."""
    lines = [f"{result['conclusion']} (confidence {result['confidence']:.2f})"]
    if len(result["path"]) > 1:
        lines.append("Path: " + " -> ".join(result["path"]))
    lines.append(f"Onset: {result['onset']} on {result['service']}")
    lines.append("Hypotheses:")
    for h in result["hypotheses"]:
        refs = sorted(
            {c for claim in h["claims"] for c in claim["citations"]}, key=lambda c: int(c[1:])
        )
        lines.append(f"  {h['rank']}. [{h['score']:.2f}] {h['summary']} [{', '.join(refs)}]")
    lines.append("Citations:")
    for c in result["citations"]:
        args = ", ".join(f"{k}={v}" for k, v in c["arguments"].items())
        lines.append(f"  [{c['id']}] {c['kind']} {c['ref']}: {c['note']} ({c['tool']}: {args})")
    return "\n".join(lines)


def run_diagnosis(bridge: Bridge, incident_id: str, service: str | None) -> Json:
    """All phases in a row, without the task machinery (tests, benchmarks).

    Raises:
        UnknownIncident, UnknownService.
        ValueError: the incident names no service and none was given.
    """
    loaded = load_incident(bridge, incident_id)
    incident = loaded["incident"]
    chosen = service or incident.get("service")
    if not chosen:
        raise ValueError(f"incident {incident_id} names no service: give one")
    check_service(chosen, loaded["services"])
    windows = detect_onset(bridge, incident, chosen)
    stats = collect_spans(bridge, windows, loaded["services"])
    graph = build_call_graph(bridge, windows, loaded["services"])
    scores = score_services(stats)
    walk = walk_dependencies(graph, scores, chosen)
    changes = correlate_deploys(bridge, windows["onset_ns"], walk, scores, graph)
    return rank_hypotheses(incident, chosen, windows, stats, scores, walk, changes)
