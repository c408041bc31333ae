"""How a diagnosis is told: numbered citations that the Bridge's plain tools resolve, and
the result as text for people."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from keel.bridge.evidence import DEPENDENCY
from keel.bridge.records import format_time

__all__ = [
    "Citations",
    "call_path",
    "change_leads",
    "keep_cited",
    "lead_text",
    "numbered_leads",
    "render",
    "signals",
    "tell",
    "weak_leads",
    "weak_signals",
    "when",
    "why_none",
]

Json = dict[str, Any]


class Citations:
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


def keep_cited(
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


def when(minutes_before: float) -> str:
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


def weak_leads(
    scores: Mapping[str, Any],
    cites: Citations,
    windows: Mapping[str, Any],
    evidence: Mapping[str, Any],
) -> list[Json]:
    """With no clear cause, the changes short of sure, as unranked leads (score 0)."""
    out = []
    for rank, (name, weak) in enumerate(scores.get("weak", {}).items(), 1):
        target = "dependency" if weak["kind"] == DEPENDENCY else "service"
        label = f"call to {name}" if target == "dependency" else name
        exemplars = evidence["entities"][name]["exemplars"][:2]
        citations = [cites.span(label, e) for e in exemplars] or [
            cites.window(windows["service"], windows["during"], "during")
        ]
        out.append(
            {
                "rank": rank,
                "kind": "weak_signal",
                "service": name,
                "type": target,
                "deploy_id": None,
                "suspect": name,
                "score": 0.0,
                "summary": f"{name} changed a little (z {weak['z']:.1f}, short of sure)",
                "path": call_path(windows, evidence, name),
                "claims": [{"text": "; ".join(weak["signals"]), "citations": citations}],
            }
        )
    return out


def change_leads(
    changes: Sequence[Mapping[str, Any]],
    moved: Mapping[str, float],
    cites: Citations,
    windows: Mapping[str, Any],
    evidence: Mapping[str, Any],
) -> list[Json]:
    """With no clear cause, the recent changes (deploys, configuration) of services the
    symptom's requests reach, as unranked leads (score 0): a slow leak may not yet stand
    out between the windows. ``moved`` is how far each service's own calls moved (z,
    below sure); the changes of those that moved most come first, then the latest."""
    reached = {
        name
        for name, entity in evidence["entities"].items()
        if entity["reach"] > 0 and entity["kind"] != DEPENDENCY
    } | {windows["service"]}
    on_path = [c for c in changes if c["deploy"]["service"] in reached]
    on_path.sort(key=lambda c: (-moved.get(c["deploy"]["service"], 0.0), c["minutes_before_onset"]))
    out = []
    for change in on_path:
        deploy, minutes = change["deploy"], change["minutes_before_onset"]
        service, z = deploy["service"], moved.get(deploy["service"], 0.0)
        what = "configuration change" if deploy["kind"] == "config" else "deploy"
        out.append(
            {
                "rank": 0,
                "kind": "recent_change",
                "service": service,
                "type": "service",
                "deploy_id": deploy["id"],
                "suspect": service,
                "score": 0.0,
                "summary": f"{what} {deploy['id']} of {service}, {when(minutes)} "
                f"(its own calls moved by z {z:.1f}, short of sure)",
                "path": call_path(windows, evidence, service),
                "claims": [
                    {
                        "text": f"{deploy['id']} changed {service} at {deploy['deployed_at']}, "
                        f"{when(minutes)}, on the path of {windows['service']}'s requests",
                        "citations": [cites.deploy(deploy)],
                    }
                ],
            }
        )
    return out


def numbered_leads(leads: Sequence[Json], limit: int) -> list[Json]:
    """Leads in the order given, one per service (the first kept), at most ``limit``,
    ranked 1.. (what a reader looks at first comes first)."""
    seen: set[str] = set()
    kept: list[Json] = []
    for lead in leads:
        if lead["service"] not in seen and len(kept) < limit:
            seen.add(lead["service"])
            kept.append({**lead, "rank": len(kept) + 1})
    return kept


def lead_text(leads: Sequence[Mapping[str, Any]]) -> str:
    """What the conclusion says of the leads of a "no clear cause" answer."""
    weak = [h["service"] for h in leads if h["kind"] == "weak_signal"]
    recent = [f"{h['deploy_id']} of {h['service']}" for h in leads if h["kind"] == "recent_change"]
    text = f" Weak signals, short of sure, worth a look: {', '.join(weak)}." if weak else ""
    if recent:
        text += f" Recent changes on the request path: {', '.join(recent)}."
    return text


def call_path(windows: Mapping[str, Any], evidence: Mapping[str, Any], target: str) -> list[str]:
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


def tell(  # noqa: PLR0917 - one hypothesis and everything needed to tell it
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
    exemplars = evidence["entities"][suspect]["exemplars"][:2]
    label = f"call to {suspect}" if target == "dependency" else suspect
    claims = [
        {
            "text": f"{suspect}: {'; '.join(facts['signals'])} (baseline vs. during); it "
            f"accounts for {facts['share']:.0%} of the change of {windows['service']}",
            "citations": [cites.span(label, e) for e in exemplars]
            or [cites.window(windows["service"], windows["during"], "during")],
        }
    ]
    path = call_path(windows, evidence, suspect)
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
        "suspect": suspect,
        "score": round(hypothesis["score"], 4),
        "summary": summary,
        "path": path,
        "claims": claims,
    }


def weak_signals(name: str, change: Mapping[str, Any]) -> list[str]:
    """The text of a weak signal on ``name``."""
    (m0, m1), (p0, p1) = change["median_ms"], change["failure_rate"]
    return [
        f"{name}: own time per call {m0:.1f} -> {m1:.1f} ms (z {change['time_z']:.1f}); "
        f"failures starting there {p0:.1%} -> {p1:.1%} (z {change['failure_z']:.1f})"
    ]


def signals(name: str, entity: Mapping[str, Any], change: Mapping[str, Any]) -> list[str]:
    """What changed in ``name``'s own calls, as text."""
    before, now = entity["baseline"], entity["during"]
    out = []
    if change["slower"]:
        out.append(
            f"{name}'s own time per call {before['median_ms']:.1f} -> {now['median_ms']:.1f} ms "
            f"(median, x{change['ratio']:.1f})"
        )
    if change["failing"]:
        out.append(
            f"failures starting in {name}: {before['failure_rate']:.1%} -> "
            f"{now['failure_rate']:.1%} of its calls"
        )
    return out


def why_none(scores: Mapping[str, Any], windows: Mapping[str, Any]) -> str:
    """Why there is no clear cause: what was checked."""
    symptom = scores["symptom"]
    checked = (
        f"{symptom['requests'][0]} and {symptom['requests'][1]} requests before and during; "
        f"error rate {symptom['error_rate'][0]:.2%} -> {symptom['error_rate'][1]:.2%}, median "
        f"{symptom['median_ms'][0]:.0f} -> {symptom['median_ms'][1]:.0f} ms"
    )
    return (
        f"no service or dependency that {windows['service']}'s requests reach changed "
        f"enough around {windows['onset']} to account for the incident ({checked}); no "
        "change stands out."
    )
