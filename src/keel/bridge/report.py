"""How a diagnosis is told: numbered citations that the Bridge's plain tools resolve, and
the result as text for people."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from keel.bridge.records import format_time

__all__ = ["Citations", "keep_cited", "render", "when"]

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
