"""The root-cause diagnosis, phase by phase: each phase is a plain function from JSON to
JSON, so the durable task can checkpoint it (``ctx.step``) and tests can run it directly.

Method (docs/bridge.md has the long version):

1. **load-incident**: the incident, and the services the index knows.
2. **detect-onset**: the first minute (in the 20 before the incident was opened) from
   which the symptomatic service's own spans leave their usual range (error rate, or
   median latency); the *baseline* window is the 28 minutes ending 2 minutes before it,
   the *during* window the 10 minutes from it.
3. **collect-evidence**: every request of the symptomatic service in both windows, with
   its whole trace: the exclusive time of each span charged to its service, or to the
   dependency (database, queue, cache, external API) a client span calls; each failed
   request blamed on where its failure started (``keel.bridge.evidence``).
4. **score-suspects**: for every service and dependency, how much of the symptom's
   change (extra failures, extra time per request) its own change accounts for, and how
   sure that change is (z against the baseline's request-to-request variation).
5. **correlate-changes**: deploys and configuration changes before the onset, each
   related to the suspects it could explain (its own service, or a dependency its
   service calls), weighted by how plausibly its timing explains the onset (slow leaks
   included: up to 90 minutes).
6. **rank-hypotheses**: a change of a suspect explains it best; a suspect with no
   change failed on its own; a change with no anomaly on or below its service raises
   nothing. The confidence is the top cause's share of the evidence against its best
   rival; when the symptom did not change, or nothing accounts for it, the answer is
   "no clear cause", with what was checked. Every claim cites ids (incident, spans,
   deploys) that the plain tools resolve.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keel.bridge.core import Bridge
from keel.bridge.errors import UnknownService
from keel.bridge.evidence import DEPENDENCY, charge_requests
from keel.bridge.records import NS_PER_MINUTE, format_time, parse_time
from keel.bridge.report import Citations, keep_cited, render, when

__all__ = [
    "PHASES",
    "PIPELINE",
    "check_service",
    "collect_evidence",
    "correlate_changes",
    "detect_onset",
    "load_incident",
    "rank_hypotheses",
    "render",
    "run_diagnosis",
    "score_suspects",
]

LOOKBACK = 20  # minutes before the incident was opened where the onset is looked for
REFERENCE = 40  # minutes before that whose per-minute values set the onset threshold
BASELINE = 28  # minutes of baseline, ending GAP before the onset
GAP = 2  # minutes left out between baseline and onset
DURING = 10  # minutes analysed from the onset
CHANGES_BEFORE = 90  # minutes before the onset in which changes are considered (leaks)
CHANGES_AFTER = 3  # minutes after the detected onset still considered (it is +-1 min)
LEAK_SCALE = 45.0  # minutes: how fast a change's timing stops explaining an onset
MIN_REQUESTS = 20  # requests a window needs for the comparison to mean anything
SURE = 3.0  # z a suspect's change must reach to count
SYMPTOM_SURE = 2.5  # z the symptom's change must reach (the incident itself is evidence)
SHARP = 4.0  # z of one entity's change that shows the symptom changed, whatever its totals
MIN_SHARE = 0.15  # share of the symptom's change a suspect must account for
OWN = 0.7  # weight of "the suspect failed on its own" against a change that explains it
RELATIONS = {"own": 1.0, "caller": 0.45, "upstream": 0.15}
"""How well a change of a service explains an anomaly: on the service itself; on a
dependency or service it calls directly; further below it."""

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
    """Per minute in [first, last): [error rate, median ms, spans] of the service's own
    spans (not its calls to others)."""
    out: dict[int, list[float]] = {
        minute: [errors / count, 0.0, float(count)]
        for minute, count, errors, _ in bridge.index.minutes(service, first, last)
        if count
    }
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
    found = onset is not None
    if onset is None:
        onset, how = opened - 5, "no sustained change on the service; assumed 5 minutes before"
    baseline = [(onset - GAP - BASELINE) * NS_PER_MINUTE, (onset - GAP) * NS_PER_MINUTE]
    during = [onset * NS_PER_MINUTE, min(onset + DURING, opened + DURING) * NS_PER_MINUTE]
    return {
        "service": service,
        "onset": format_time(onset * NS_PER_MINUTE),
        "onset_ns": onset * NS_PER_MINUTE,
        "onset_found": found,
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
                when_ = format_time(minute * NS_PER_MINUTE)
                return minute, f"the {name} of {service} left its usual range at {when_}"
    return None, "no sustained change"


# --- 3. collect-evidence ---------------------------------------------------------------


def collect_evidence(bridge: Bridge, windows: Mapping[str, Any], services: Sequence[str]) -> Json:
    """The symptom's requests in both windows, charged to services and dependencies."""
    symptom = windows["service"]
    baseline, during = (tuple(windows[name]) for name in ("baseline", "during"))
    rows, share = bridge.index.scoped_spans(symptom, baseline[0], during[1])
    before, now = charge_requests(rows, symptom, [baseline, during], services)
    kinds = {name: c.kind for ev in (before, now) for name, c in ev.entities.items()}
    callers: dict[str, set[str]] = {}
    for caller, callee in before.edges | now.edges:
        callers.setdefault(callee, set()).add(caller)
    return {
        "sampled": round(share, 4),
        "baseline": before.to_json(),
        "during": now.to_json(),
        "kinds": dict(sorted(kinds.items())),
        "callers": {name: sorted(c) for name, c in sorted(callers.items())},
        "exemplars": {
            name: [
                {"trace_id": t, "span_id": s, "duration_ms": round(d, 3), "error": e}
                for _rank, t, s, d, e in charges.exemplars
            ]
            for name, charges in sorted(now.entities.items())
        },
    }


# --- 4. score-suspects -----------------------------------------------------------------


def _z_rate(p1: float, n1: int, p0: float, n0: int, floor: float) -> float:
    pooled = max((p1 * n1 + p0 * n0) / (n1 + n0), floor)
    return (p1 - p0) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n0))


def _z_mean(now: tuple[float, float, int], before: tuple[float, float, int]) -> float:
    """Welch's z of a mean (mean, sd, n) against an earlier one."""
    (m1, s1, n1), (m0, s0, n0) = now, before
    se = math.sqrt(s1 * s1 / n1 + s0 * s0 / n0)
    return (m1 - m0) / se if se > 0 else 0.0


def score_suspects(evidence: Mapping[str, Any]) -> Json:
    """How the symptom changed, and how much of that each service and dependency accounts
    for (``share``, 0..1) and how sure its own change is (``z``)."""
    before, now = evidence["baseline"], evidence["during"]
    n0, n1 = before["requests"], now["requests"]
    if n0 < MIN_REQUESTS or n1 < MIN_REQUESTS:
        return {"symptom": {"changed": False, "why": "too few requests to compare"}, "suspects": {}}
    d_err = now["error_rate"] - before["error_rate"]
    z_err = _z_rate(now["error_rate"], n1, before["error_rate"], n0, 0.002)
    d_ms = now["ms_per_request"] - before["ms_per_request"]
    z_ms = _z_mean((*_ms(now), n1), (*_ms(before), n0))
    blame_z, time_z = _sharpest(before, now)
    # The symptom's own totals carry every entity's noise; one entity's sharp change is
    # stronger evidence that the symptom changed than the totals can be.
    errors_rose = d_err >= 0.005 and max(z_err, blame_z * SYMPTOM_SURE / SHARP) >= SYMPTOM_SURE
    slower = d_ms > 0.1 * before["ms_per_request"] and (
        max(z_ms, time_z * SYMPTOM_SURE / SHARP) >= SYMPTOM_SURE
    )
    symptom = {
        "changed": errors_rose or slower,
        "error_rate": [round(before["error_rate"], 5), round(now["error_rate"], 5)],
        "ms_per_request": [round(before["ms_per_request"], 3), round(now["ms_per_request"], 3)],
        "error_z": round(z_err, 2),
        "latency_z": round(z_ms, 2),
        "errors_rose": errors_rose,
        "slower": slower,
    }
    suspects: Json = {}
    for name, during in now["entities"].items():
        base = before["entities"].get(name, {"ms_per_request": 0.0, "sd_ms": 0.0, "blamed": 0})
        b0, b1 = base["blamed"] / n0, during["blamed"] / n1
        t0, t1 = base["ms_per_request"], during["ms_per_request"]
        z_blame, z_time = _entity_z(before, now, name)
        error_share = (b1 - b0) / d_err if errors_rose and z_blame >= SURE else 0.0
        time_share = (t1 - t0) / d_ms if slower and z_time >= SURE else 0.0
        share = min(1.0, max(error_share, time_share, 0.0))
        if share < MIN_SHARE:
            continue
        suspects[name] = {
            "kind": evidence["kinds"].get(name, "service"),
            "share": round(share, 4),
            "error_share": round(min(1.0, max(0.0, error_share)), 4),
            "time_share": round(min(1.0, max(0.0, time_share)), 4),
            "blamed_rate": [round(b0, 5), round(b1, 5)],
            "blame_z": round(z_blame, 2),
            "ms_per_request": [round(t0, 3), round(t1, 3)],
            "time_z": round(z_time, 2),
            "signals": _signals(name, (b0, b1, error_share), (t0, t1, time_share)),
        }
    return {"symptom": symptom, "suspects": dict(sorted(suspects.items()))}


def _entity_z(before: Mapping[str, Any], now: Mapping[str, Any], name: str) -> tuple[float, float]:
    """(blame z, time z) of one entity's change between the windows."""
    n0, n1 = before["requests"], now["requests"]
    during = now["entities"][name]
    base = before["entities"].get(name, {"ms_per_request": 0.0, "sd_ms": 0.0, "blamed": 0})
    z_blame = _z_rate(during["blamed"] / n1, n1, base["blamed"] / n0, n0, 0.002)
    z_time = _z_mean(
        (during["ms_per_request"], during["sd_ms"], n1), (base["ms_per_request"], base["sd_ms"], n0)
    )
    return z_blame, z_time


def _sharpest(before: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[float, float]:
    """The largest blame z and time z of any one entity."""
    zs = [_entity_z(before, now, name) for name in now["entities"]]
    return max((z[0] for z in zs), default=0.0), max((z[1] for z in zs), default=0.0)


def _ms(window: Mapping[str, Any]) -> tuple[float, float]:
    return window["ms_per_request"], window["sd_ms"]


def _signals(
    name: str, blame: tuple[float, float, float], time: tuple[float, float, float]
) -> list[str]:
    (b0, b1, error_share), (t0, t1, time_share) = blame, time
    out = []
    if error_share > 0:
        out.append(f"failures starting in {name}: {b0:.1%} -> {b1:.1%} of requests")
    if time_share > 0:
        out.append(f"time spent in {name}: {t0:.1f} -> {t1:.1f} ms per request")
    return out


# --- 5. correlate-changes --------------------------------------------------------------


def _timing(minutes_before: float) -> float:
    """How plausibly a change this long before the onset explains it (0..1)."""
    if minutes_before >= 0:
        return math.exp(-minutes_before / LEAK_SCALE)
    return 0.8 * math.exp(minutes_before / 1.5)  # after the onset: only its uncertainty


def _relation(service: str, suspect: str, callers: Mapping[str, Sequence[str]]) -> str | None:
    """How a change of ``service`` could explain an anomaly of ``suspect``, if at all."""
    if service == suspect:
        return "own"
    if service in callers.get(suspect, ()):
        return "caller"
    seen, todo = set(), list(callers.get(suspect, ()))
    while todo:
        above = todo.pop()
        if above == service:
            return "upstream"
        if above not in seen:
            seen.add(above)
            todo.extend(callers.get(above, ()))
    return None


def correlate_changes(
    bridge: Bridge, windows: Mapping[str, Any], scores: Mapping[str, Any], evidence: Json
) -> Json:
    """The changes before the onset, each with the suspects it could explain."""
    onset = windows["onset_ns"]
    first = onset - CHANGES_BEFORE * NS_PER_MINUTE
    last = onset + CHANGES_AFTER * NS_PER_MINUTE
    out = []
    for deploy in bridge.deploys.all():
        if not first <= deploy.deployed_at <= last:
            continue
        minutes = (onset - deploy.deployed_at) / NS_PER_MINUTE
        explains = {
            suspect: relation
            for suspect in scores["suspects"]
            if (relation := _relation(deploy.service, suspect, evidence["callers"]))
        }
        out.append(
            {
                "deploy": deploy.to_json(),
                "minutes_before_onset": round(minutes, 2),
                "timing": round(_timing(minutes), 4),
                "explains": explains,
            }
        )
    return {"window": [format_time(first), format_time(last)], "changes": out}


# --- 6. rank-hypotheses ----------------------------------------------------------------


def _own_kind(suspect: Mapping[str, Any]) -> str:
    if suspect["kind"] == DEPENDENCY:
        return "dependency"
    # Slower (and maybe failing by timeouts): saturated; failing at its usual speed: broken.
    return "saturation" if suspect["time_share"] > 0 else "degradation"


def _hypotheses(scores: Mapping[str, Any], changes: Mapping[str, Any]) -> list[Json]:
    """Every hypothesis with its score, best first (no citations yet)."""
    suspects = scores["suspects"]
    out: list[Json] = []
    for name, suspect in suspects.items():
        out.append(
            {
                "kind": _own_kind(suspect),
                "service": name,
                "deploy_id": None,
                "score": OWN * suspect["share"],
                "suspect": name,
                "change": None,
            }
        )
    for change in changes["changes"]:
        best = max(
            (
                (suspects[s]["share"] * RELATIONS[rel], s, rel)
                for s, rel in change["explains"].items()
            ),
            default=None,
        )
        if best is None:
            continue  # no anomaly on or below its service: it explains nothing
        weight, suspect, _rel = best
        deploy = change["deploy"]
        out.append(
            {
                "kind": "config_change" if deploy["kind"] == "config" else "bad_deploy",
                "service": deploy["service"],
                "deploy_id": deploy["id"],
                "score": weight * (0.55 + 0.65 * change["timing"]),
                "suspect": suspect,
                "change": change,
            }
        )
    out.sort(key=lambda h: (-h["score"], h["service"], h["deploy_id"] or ""))
    return out


def _confidence(ranked: Sequence[Json], symptom: Mapping[str, Any]) -> float:
    """The top cause's share of the evidence against its best rival (another cause)."""
    top = ranked[0]
    rival: float = next((h["score"] for h in ranked[1:] if h["service"] != top["service"]), 0.0)
    score: float = top["score"]
    quality = min(1.0, score / OWN)  # how much of the symptom the top accounts for
    sure = min(1.0, max(abs(float(symptom["error_z"])), abs(float(symptom["latency_z"]))) / 8)
    value = quality * score / (score + rival + 0.05) * (0.6 + 0.4 * sure)
    return round(min(0.95, max(0.05, value)), 2)


def rank_hypotheses(
    incident: Mapping[str, Any],
    windows: Mapping[str, Any],
    evidence: Mapping[str, Any],
    scores: Mapping[str, Any],
    changes: Mapping[str, Any],
) -> Json:
    """The ranked hypotheses, the conclusion and its confidence, with citations."""
    symptom = windows["service"]
    cites = Citations()
    incident_cite = cites.incident(incident["id"])
    ranked = _hypotheses(scores, changes) if scores["symptom"]["changed"] else []
    distinct: list[Json] = []
    for hypothesis in ranked:
        if len(distinct) < 6 and all(
            (h["service"], h["deploy_id"]) != (hypothesis["service"], hypothesis["deploy_id"])
            for h in distinct
        ):
            distinct.append(hypothesis)
    hypotheses = [
        _told(h, rank, cites, windows, evidence, scores) for rank, h in enumerate(distinct, 1)
    ]
    top = hypotheses[0] if hypotheses else None
    if top is not None:
        confidence = _confidence(distinct, scores["symptom"])
        conclusion = f"Root cause of {incident['id']}: {top['summary']}."
    else:
        confidence = 0.0
        conclusion = f"No clear cause for {incident['id']}: {_why_none(scores, windows)}"
    incident_claim = {
        "text": f"{incident['id']} ({incident['title']}) opened at {incident['opened_at']}; "
        f"onset of the trouble on {symptom} at {windows['onset']} ({windows['how']})",
        "citations": [incident_cite, cites.window(symptom, windows["during"], "during")],
    }
    incident_claim, hypotheses, citations = keep_cited(incident_claim, hypotheses, cites.items)
    return {
        "incident_id": incident["id"],
        "service": symptom,
        "onset": windows["onset"],
        "windows": {
            "baseline": [format_time(t) for t in windows["baseline"]],
            "during": [format_time(t) for t in windows["during"]],
        },
        "conclusion": conclusion,
        "confidence": confidence,
        "root_cause": None
        if top is None
        else {k: top[k] for k in ("kind", "service", "type", "deploy_id", "summary")},
        "path": top["path"] if top is not None else [symptom],
        "incident_claim": incident_claim,
        "hypotheses": hypotheses,
        "symptom": scores["symptom"],
        "suspects": scores["suspects"],
        "sampled": evidence["sampled"],
        "citations": citations,
    }


def _why_none(scores: Mapping[str, Any], windows: Mapping[str, Any]) -> str:
    symptom = scores["symptom"]
    if not symptom["changed"]:
        checked = symptom.get("why") or (
            f"error rate {symptom['error_rate'][0]:.2%} -> {symptom['error_rate'][1]:.2%}, "
            f"{symptom['ms_per_request'][0]:.0f} -> {symptom['ms_per_request'][1]:.0f} ms "
            "per request"
        )
        return (
            f"{windows['service']}'s requests did not change beyond their usual variation "
            f"around {windows['onset']} ({checked}); no service, dependency or change "
            "stands out."
        )
    return (
        f"{windows['service']} changed around {windows['onset']}, but no single service, "
        "dependency or change accounts for it (every one checked explains under "
        f"{MIN_SHARE:.0%} of it)."
    )


def _path(windows: Mapping[str, Any], evidence: Mapping[str, Any], target: str) -> list[str]:
    """The call path from the symptomatic service down to ``target``."""
    start = windows["service"]
    callees: dict[str, list[str]] = {}
    for callee, callers in evidence["callers"].items():
        for caller in callers:
            callees.setdefault(caller, []).append(callee)
    paths, queue = {start: [start]}, [start]
    while queue:
        here = queue.pop(0)
        for callee in sorted(callees.get(here, [])):
            if callee not in paths:
                paths[callee] = [*paths[here], callee]
                queue.append(callee)
    return paths.get(target, [start] if target == start else [start, target])


def _told(  # noqa: PLR0917 - one hypothesis and everything needed to tell it
    hypothesis: Json,
    rank: int,
    cites: Citations,
    windows: Mapping[str, Any],
    evidence: Mapping[str, Any],
    scores: Mapping[str, Any],
) -> Json:
    """A ranked hypothesis as the result shows it: summary, claims, citations."""
    suspect = hypothesis["suspect"]
    facts = scores["suspects"][suspect]
    target = "dependency" if facts["kind"] == DEPENDENCY else "service"
    exemplars = evidence["exemplars"].get(suspect, [])[:2]
    label = f"call to {suspect}" if target == "dependency" else suspect
    claims = [
        {
            "text": f"{suspect}: {'; '.join(facts['signals'])} (baseline vs. during); it "
            f"accounts for {facts['share']:.0%} of the change of {windows['service']}",
            "citations": [cites.span(label, e) for e in exemplars]
            or [cites.window(windows["service"], windows["during"], "during")],
        }
    ]
    path = _path(windows, evidence, suspect)
    if len(path) > 1:
        claims.append(
            {"text": "call path: " + " -> ".join(path), "citations": claims[0]["citations"]}
        )
    change = hypothesis["change"]
    if change is None:
        what = "dependency" if target == "dependency" else hypothesis["kind"]
        summary = f"{suspect} ({what}) degraded on its own, with no change of it before the onset"
    else:
        deploy = change["deploy"]
        relation = change["explains"][suspect]
        what = "configuration change" if deploy["kind"] == "config" else "deploy"
        where = "" if relation == "own" else f", which explains the anomaly of {suspect}"
        summary = (
            f"{what} {deploy['id']} of {deploy['service']} ({deploy['summary']!r}, "
            f"{when(change['minutes_before_onset'])}){where}"
        )
        claims.insert(
            0,
            {
                "text": f"{deploy['id']} changed {deploy['service']} at {deploy['deployed_at']}, "
                f"{when(change['minutes_before_onset'])}",
                "citations": [cites.deploy(deploy)],
            },
        )
    return {
        "rank": rank,
        "kind": hypothesis["kind"],
        "service": hypothesis["service"],
        "type": "service" if change is not None else target,
        "deploy_id": hypothesis["deploy_id"],
        "score": round(hypothesis["score"], 4),
        "summary": summary,
        "path": path,
        "claims": claims,
    }


# --- the pipeline ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    """One checkpointed phase: its name, what the task says while it runs, the function,
    and which earlier values it takes (``bridge`` is the data itself, never stored)."""

    name: str
    label: str
    fn: Callable[..., Any]
    needs: tuple[str, ...]


PIPELINE = (
    Phase("detect-onset", "finding the onset", detect_onset, ("bridge", "incident", "service")),
    Phase(
        "collect-evidence",
        "charging each request's time and failures to services and dependencies",
        collect_evidence,
        ("bridge", "detect-onset", "services"),
    ),
    Phase(
        "score-suspects",
        "scoring suspects against the baseline",
        score_suspects,
        ("collect-evidence",),
    ),
    Phase(
        "correlate-changes",
        "correlating deploys and config changes",
        correlate_changes,
        ("bridge", "detect-onset", "score-suspects", "collect-evidence"),
    ),
    Phase(
        "rank-hypotheses",
        "ranking hypotheses",
        rank_hypotheses,
        ("incident", "detect-onset", "collect-evidence", "score-suspects", "correlate-changes"),
    ),
)
"""The phases after the incident is loaded and its service known, in order."""

PHASES = (("load-incident", "loading the incident"), *((p.name, p.label) for p in PIPELINE))


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
    values: Json = {"bridge": bridge, "incident": incident, "service": chosen, **loaded}
    for phase in PIPELINE:
        values[phase.name] = phase.fn(*(values[n] for n in phase.needs))
    result: Json = values[PIPELINE[-1].name]
    return result
