"""The root-cause diagnosis, phase by phase: each phase is a plain function from JSON to
JSON, so the durable task can checkpoint it (``ctx.step``) and tests can run it directly.

Method (docs/bridge.md has the long version):

1. **load-incident**: the incident, and the services the index knows.
2. **detect-onset**: the first minute (in the 20 before the incident was opened) from
   which the symptomatic service's own spans leave their usual range (error rate, or
   median latency); the *baseline* window is the 28 minutes ending 2 minutes before it,
   the *during* window the 10 minutes from it.
3. **collect-evidence**: every span of both windows, cut into calls and charged to its
   entity: a service for its own (exclusive) time, or the dependency (database, queue,
   cache, external API) a client span calls; where each failure started; and how the
   symptomatic service's requests reach each entity (``keel.bridge.evidence``).
4. **score-suspects**: every entity those requests reach, judged by its own calls
   against its own baseline (median own time per call, share of calls where failures
   start; no gate on the path), with the impact of its change on the symptom (time added,
   requests failed) and its share of all the evidence. An abrupt change that began
   clearly before or after this onset, while another suspect's began at it, belongs to
   another incident (two faults minutes apart): its weight is cut (``_attribute``).
5. **correlate-changes**: deploys and configuration changes before the onset, each
   related to the suspects it could explain (its own service, or a dependency its
   service calls), weighted by how plausibly its timing explains the onset (slow leaks
   included: up to 90 minutes).
6. **rank-hypotheses**: a change of a suspect explains it best; a suspect with no
   change failed on its own; a change with no anomaly on or below its service raises
   nothing. The confidence grows with the top suspect's share of the evidence, how sure
   its change is and whether it shows in the symptom; when nothing the symptom's
   requests reach changed, the answer is "no clear cause", with what was checked and
   the leads left (changes short of sure, recent deploys on the request path).
   Every claim cites ids (incident, spans, deploys) that the plain tools resolve.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keel.bridge.core import Bridge
from keel.bridge.errors import UnknownService
from keel.bridge.evidence import DEPENDENCY, gather, own_onset
from keel.bridge.leak import ramps
from keel.bridge.overlap import attribute, later_onset, pair_of, steps
from keel.bridge.records import NS_PER_MINUTE, format_time, parse_time
from keel.bridge.report import (
    Citations,
    change_leads,
    keep_cited,
    lead_text,
    numbered_leads,
    render,
    signals,
    tell,
    weak_leads,
    weak_signals,
    why_none,
)
from keel.bridge.waiting import waiting

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
TIMELINE = 12  # minutes before the onset whose calls are also counted minute by minute
CHANGES_BEFORE = 90  # minutes before the onset in which changes are considered (leaks)
CHANGES_AFTER = 3  # minutes after the detected onset still considered (it is +-1 min)
LEAK_SCALE = 45.0  # minutes: how fast a change's timing stops explaining an onset
SURE = 3.0  # z an entity's own change must reach to count
SLOWER = 1.3  # ratio of median own time per call that counts as slower
MORE_FAILURES = 0.01  # rise of the share of calls where failures start that counts
MIN_CALLS = 20  # baseline calls an entity needs to be judged
FAILURE_FLOOR = 0.02  # failures of a request taken as usual at least (impact's scale)
NOTICED = 0.05  # weight of a sure change that does not show in the symptom's numbers
MIN_SHARE = 0.02  # share of all the evidence a suspect needs to be listed
WEAK = 2.0  # z from which a change short of sure is listed as a weak signal
WEAK_RATIO = 1.15  # ratio of median own time per call a weak signal needs
# How well a step from usual to changed must fit a suspect's minute-by-minute calls
# (``own_onset``) for its change to be abrupt (and so cut when it began at another time),
# and, a little looser, for its minute to say when this incident's own change began.
ABRUPT = 0.6
STEP = 0.5
ONSET_SLACK = 2  # minutes by which another suspect's onset must match the incident's better
ELSEWHERE = 0.01  # weight kept by an abrupt change that began at another incident's time
CUT = 0.5  # confidence kept when the top suspect's change belongs to another incident
PAIRED = 0.75  # ... for an incident opened within minutes of another (keel.bridge.overlap)
MAX_WEAK = 3  # weak signals listed when there is no clear cause
MAX_LEADS = 5  # leads in all (weak signals, then recent changes on the path)
MAX_HYPOTHESES = 6  # hypotheses a result lists
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
    """The onset of the trouble on ``service``, and the windows the diagnosis compares.

    The second-opened incident of a pair (``keel.bridge.overlap``) is re-anchored at its
    own fault's step when the steps of what its requests reach fall in two groups."""
    opened = parse_time(incident["opened_at"], "opened_at") // NS_PER_MINUTE
    first = opened - LOOKBACK - REFERENCE
    onset, how = _onset_of(bridge, service, first, opened)
    found = onset is not None
    if onset is None:
        onset, how = opened - 5, "no sustained change on the service; assumed 5 minutes before"
    windows = _windows(service, onset, opened, found, how)
    pair = pair_of(bridge.incidents.all(), incident)
    if pair is None:
        return windows
    windows["pair"] = {**pair, "onset_found": found}
    if pair["order"] == "second":
        probe = collect_evidence(bridge, windows, bridge.services())
        found_steps = steps(probe, _own_change)
        moved = later_onset(found_steps, opened - onset)
        if moved:
            when_ = format_time((onset + moved) * NS_PER_MINUTE)
            how = f"{how}; re-anchored at {when_}, where a change began after the other's"
            pair = {**windows["pair"], "moved": moved}
            windows = {**_windows(service, onset + moved, opened, found, how), "pair": pair}
    return windows


def _windows(service: str, onset: int, opened: int, found: bool, how: str) -> Json:
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
    """Every service's and dependency's calls in both windows (``keel.bridge.evidence``),
    and how the symptom's requests reach each."""
    baseline, during = (tuple(windows[name]) for name in ("baseline", "during"))
    rows, share = bridge.index.spans_between(services, baseline[0], during[1])
    timeline = (windows["onset_ns"] - TIMELINE * NS_PER_MINUTE, during[1])
    evidence = gather(rows, windows["service"], [baseline, during], services, timeline)
    evidence["timeline"]["onset"] = TIMELINE
    return {"sampled": round(share, 4), **evidence, "pair": windows.get("pair")}


# --- 4. score-suspects -----------------------------------------------------------------


def _z_rate(p1: float, n1: int, p0: float, n0: int, floor: float) -> float:
    pooled = max((p1 * n1 + p0 * n0) / (n1 + n0), floor)
    return (p1 - p0) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n0))


def _z_log(now: Mapping[str, Any], before: Mapping[str, Any]) -> float:
    """Welch's z of the mean log time per call against the baseline's."""
    n1, n0 = now.get("timed", now["calls"]), before.get("timed", before["calls"])
    if n1 < MIN_CALLS // 4 or n0 < MIN_CALLS // 2:
        return 0.0  # too few calls timed (the others stand for lost spans)
    se = math.sqrt(now["sd_log"] ** 2 / n1 + before["sd_log"] ** 2 / n0)
    delta = now["mean_log"] - before["mean_log"]
    return delta / se if se > 0 else (SURE * 2 if delta > 0 else 0.0)


def _own_change(entity: Mapping[str, Any]) -> Json:
    """How an entity's own calls changed: time per call and where failures started."""
    before, now = entity["baseline"], entity["during"]
    if before["calls"] < MIN_CALLS or now["calls"] < MIN_CALLS // 4:
        return {"slower": False, "failing": False, "time_z": 0.0, "failure_z": 0.0}
    time_z = _z_log(now, before)
    ratio = now["median_ms"] / before["median_ms"] if before["median_ms"] > 0 else 1.0
    p0, p1 = before["failure_rate"], now["failure_rate"]
    failure_z = _z_rate(p1, now["calls"], p0, before["calls"], 0.001)
    return {
        "slower": time_z >= SURE and ratio >= SLOWER,
        "failing": failure_z >= SURE and p1 - p0 >= MORE_FAILURES,
        "time_z": round(time_z, 2),
        "failure_z": round(failure_z, 2),
        "ratio": round(ratio, 3),
        "median_ms": [round(before["median_ms"], 3), round(now["median_ms"], 3)],
        "failure_rate": [round(p0, 5), round(p1, 5)],
    }


def score_suspects(evidence: Mapping[str, Any]) -> Json:
    """Every service and dependency whose own calls changed, with how much of the
    symptom that change accounts for (``impact``: the time it adds to a request, as a
    share of the symptom's usual request time, plus the requests it now fails, as a
    share of the usual failures) and its share of all such impact (``share``)."""
    symptom = evidence["symptom"]
    usual_ms = max(symptom["baseline"]["median_ms"], 1.0)
    usual_failures = max(symptom["baseline"]["error_rate"], FAILURE_FLOOR)
    impacts: Json = {}
    weak: Json = {}
    for name, entity in evidence["entities"].items():
        if entity["reach"] <= 0:
            continue  # the symptom's requests never reach it: it explains nothing here
        change = _own_change(entity)
        added_ms = 0.0
        if change["slower"]:
            delta = entity["during"]["median_ms"] - entity["baseline"]["median_ms"]
            added_ms = entity["calls_per_request"] * delta
        failing = 0.0
        if change["failing"]:
            delta = entity["during"]["failure_rate"] - entity["baseline"]["failure_rate"]
            failing = entity["reach"] * delta * entity["propagation"]
        if not (change["slower"] or change["failing"]):
            if _weak(change):
                weak[name] = {
                    "kind": entity["kind"],
                    "z": round(max(change["time_z"], change["failure_z"]), 2),
                    "reach": round(entity["reach"], 4),
                    "signals": weak_signals(name, change),
                }
            continue
        impact = added_ms / usual_ms + failing / usual_failures
        # A sure change of something the symptom's requests reach counts a little even
        # when none of it shows in the symptom's numbers (a cache whose failures callers
        # tolerate, a few slow requests among many): it may be all there is.
        sure = min(3.0, max(change["time_z"], change["failure_z"]) / SURE)
        weight = impact + NOTICED * entity["reach"] * sure
        if weight > 0:
            impacts[name] = {
                "kind": entity["kind"],
                "weight": round(weight, 4),
                "impact": round(impact, 4),
                "added_ms": round(added_ms, 3),
                "failing_requests": round(failing, 5),
                **change,
                "reach": round(entity["reach"], 4),
                "signals": signals(name, entity, change),
            }
    # Listed if its share is enough, before or after the cut of changes that belong to
    # another incident (a change cut stays listed: it is still a change).
    listed = _enough(impacts)
    waiting(impacts, evidence, _own_change)  # a caller slower only where it waits for one
    _attribute(impacts, evidence)
    attribute(impacts, evidence.get("pair"))
    listed |= _enough(impacts)
    total = sum(s["weight"] for s in impacts.values())
    for suspect in impacts.values():
        suspect["share"] = round(suspect["weight"] / total, 4) if total else 0.0
    suspects = {k: v for k, v in sorted(impacts.items()) if k in listed}
    return {
        "symptom": {
            "changed": bool(suspects),
            "impact": round(sum(s["impact"] for s in impacts.values()), 4),
            "requests": [symptom["baseline"]["requests"], symptom["during"]["requests"]],
            "error_rate": [
                round(symptom["baseline"]["error_rate"], 5),
                round(symptom["during"]["error_rate"], 5),
            ],
            "median_ms": [
                round(symptom["baseline"]["median_ms"], 3),
                round(symptom["during"]["median_ms"], 3),
            ],
        },
        "suspects": suspects,
        "weak": dict(sorted(weak.items(), key=lambda kv: (-kv[1]["z"], kv[0]))[:MAX_WEAK]),
        "paired": bool(evidence.get("pair")),
    }


def _enough(impacts: Mapping[str, Any]) -> set[str]:
    """The suspects whose share of all the evidence reaches MIN_SHARE."""
    total = sum(s["weight"] for s in impacts.values())
    return {k for k, v in impacts.items() if total and round(v["weight"] / total, 4) >= MIN_SHARE}


def _attribute(impacts: Json, evidence: Mapping[str, Any]) -> None:
    """Down-weight the changes that belong to another incident.

    Two faults close in time (a major one, and minutes later a minor one elsewhere) make
    two incidents; the minor one's requests may also reach the major fault, which then
    carries more evidence there than the fault that started this incident. Each suspect
    whose own calls changed abruptly (``own_onset``) gets the minute of that change; when
    another abrupt suspect's minute matches this incident's onset better, by
    ONSET_SLACK minutes or more, the suspect's change began clearly before this onset
    (while the symptom stayed in its range: else the onset would be then) or clearly
    after it, and explains this onset less: its weight is cut to ELSEWHERE of itself. A
    gradual drift (a slow leak) fits no step and is never cut.
    """
    timeline = evidence.get("timeline")
    if not timeline:
        return
    onset = timeline["onset"]
    abrupt: dict[str, int] = {}
    stepped: list[int] = []
    for name, suspect in impacts.items():
        minutes = timeline["entities"].get(name)
        if minutes:
            at, fit = own_onset(minutes, suspect)
            suspect["own_onset"] = [at - onset, round(fit, 3)]
            if fit >= STEP:
                stepped.append(abs(at - onset))
            if fit >= ABRUPT:
                abrupt[name] = abs(at - onset)
    if not abrupt:
        return
    closest = min(stepped)
    for name, distance in abrupt.items():
        if distance >= closest + ONSET_SLACK:
            impacts[name]["weight"] = round(impacts[name]["weight"] * ELSEWHERE, 4)
            impacts[name]["elsewhere"] = True


def _weak(change: Mapping[str, Any]) -> bool:
    """A change short of sure (z from WEAK to SURE) but in the right direction."""
    if "ratio" not in change:
        return False
    p0, p1 = change["failure_rate"]
    slower = change["time_z"] >= WEAK and change["ratio"] >= WEAK_RATIO
    failing = change["failure_z"] >= WEAK and p1 - p0 >= MORE_FAILURES / 2
    return bool(slower or failing)


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
    found: Json = {"window": [format_time(first), format_time(last)], "changes": out}
    if not scores["symptom"]["changed"]:  # nothing stands out: a slow cause, maybe
        slow = ramps(
            bridge.index, windows, evidence, out, services=bridge.services(), change_of=_own_change
        )
        for change in out:
            if change["deploy"]["service"] in slow:
                change["explains"] = {change["deploy"]["service"]: "own"}
        found["ramps"] = slow
    return found


# --- 6. rank-hypotheses ----------------------------------------------------------------


def _own_kind(suspect: Mapping[str, Any]) -> str:
    if suspect["kind"] == DEPENDENCY:
        return "dependency"
    # Slower (and maybe failing by timeouts): saturated; failing at its usual speed: broken.
    return "saturation" if suspect["slower"] else "degradation"


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


def _confidence(top: Mapping[str, Any], scores: Mapping[str, Any]) -> float:
    """How likely the top hypothesis is right, from what it rests on: its suspect's share
    of all the evidence, how sure that suspect's own change is (z), and whether the change
    shows in the symptom's numbers at all (impact). The form and its constants were fitted
    on the development seeds of the independent evaluation (bench/rca, seeds 2001-2003)
    and are checked on held-out seeds (docs/bridge.md)."""
    suspect = scores["suspects"][top["suspect"]]
    z = max(float(suspect["time_z"]), float(suspect["failure_z"]))
    sure = min(1.0, max(0.0, (z - 3.5) / 5))
    shows = min(1.0, float(scores["symptom"]["impact"]) / 0.2)
    value = 0.2 + 0.7 * float(suspect["share"]) * (0.5 + 0.5 * sure) * (0.7 + 0.3 * shows)
    if suspect.get("elsewhere"):
        value *= CUT  # its change began at another incident's time: all there is, not sure
    if scores.get("paired"):
        value *= PAIRED  # two faults minutes apart: which is whose is less sure
    return round(value, 2)


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
    if changes.get("ramps"):  # a slow cause: measured from before its change
        changed = {**scores["symptom"], "changed": True}
        scores = {**scores, "symptom": changed, "suspects": changes["ramps"]}
    ranked = _hypotheses(scores, changes) if scores["symptom"]["changed"] else []
    # The best explanation of each anomaly first, then other explanations of the same
    # ones: the alternatives a reader sees are other causes, not variations of the top.
    best: dict[str, Json] = {}
    for hypothesis in ranked:
        best.setdefault(hypothesis["suspect"], hypothesis)
    distinct: list[Json] = []
    for hypothesis in [*best.values(), *ranked]:
        if len(distinct) < MAX_HYPOTHESES and all(
            (h["service"], h["deploy_id"]) != (hypothesis["service"], hypothesis["deploy_id"])
            for h in distinct
        ):
            distinct.append(hypothesis)
    hypotheses = [
        tell(h, rank, cites, windows, evidence, scores) for rank, h in enumerate(distinct, 1)
    ]
    top = hypotheses[0] if hypotheses else None
    if top is not None:
        confidence = _confidence(distinct[0], scores)
        conclusion = f"Root cause of {incident['id']}: {top['summary']}."
    else:
        confidence = 0.0
        conclusion = f"No clear cause for {incident['id']}: {why_none(scores, windows)}"
        found = weak_leads(scores, cites, windows, evidence)
        found += change_leads(changes["changes"], _moved(evidence), cites, windows, evidence)
        hypotheses = numbered_leads(found, MAX_LEADS)
        conclusion += lead_text(hypotheses)
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
        "weak": scores.get("weak", {}),
        "sampled": evidence["sampled"],
        "citations": citations,
    }


def _moved(evidence: Mapping[str, Any]) -> dict[str, float]:
    """How far the own calls of each entity the symptom's requests reach moved (z, >= 0)."""
    return {
        name: max(change["time_z"], change["failure_z"], 0.0)
        for name, entity in evidence["entities"].items()
        if entity["reach"] > 0 and "ratio" in (change := _own_change(entity))
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
