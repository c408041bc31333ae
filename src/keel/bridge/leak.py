"""Slow causes: a change whose effect grew for tens of minutes before the onset.

A memory leak deployed 40 minutes before an incident degrades its service a little more
every minute: by the onset the baseline window (the half hour before it) already holds
most of the ramp, so the change between the windows is below significance and the
diagnosis finds no clear cause, or names a harmless change of the last minutes. When
nothing stands out, each change RAMP_MIN to ``diagnosis.CHANGES_BEFORE`` minutes before
the onset on a service the symptom's requests reach is checked against a baseline that
ends before it: the same BASELINE minutes, ending GAP minutes before the change. A
service that is surely slower, or failing more, now than before its own change is a
suspect of a slow cause, and that change its likely explanation (``ramps``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keel.bridge.evidence import gather
from keel.bridge.index import TraceIndex
from keel.bridge.records import NS_PER_MINUTE, parse_time
from keel.bridge.report import signals

__all__ = ["RAMP_MIN", "ramps"]

RAMP_MIN = 10  # minutes before the onset from which a change may be a slow cause
BASELINE = 28  # minutes of the baseline before the change
GAP = 2  # minutes left out between that baseline and the change
MAX_CHECKED = 4  # changes checked, the earliest first

Json = dict[str, Any]


def ramps(
    index: TraceIndex,
    windows: Mapping[str, Any],
    evidence: Mapping[str, Any],
    changes: Sequence[Mapping[str, Any]],
    *,
    services: Sequence[str],
    change_of: Callable[[Mapping[str, Any]], Json],
) -> Json:
    """The services whose own calls changed since a change of theirs long before the
    onset: {service: suspect, as ``diagnosis.score_suspects`` lists them}, each with
    ``ramp``, the id of the change it is measured from. ``change_of`` tells how an
    entity's calls changed from its baseline to its during window
    (``diagnosis._own_change``)."""
    reached = {n for n, e in evidence["entities"].items() if e["reach"] > 0}
    candidates = [
        c
        for c in changes
        if c["minutes_before_onset"] >= RAMP_MIN and c["deploy"]["service"] in reached
    ]
    candidates.sort(key=lambda c: -c["minutes_before_onset"])
    found: Json = {}
    for change in candidates[:MAX_CHECKED]:
        name = change["deploy"]["service"]
        if name in found:
            continue
        at = parse_time(change["deploy"]["deployed_at"], "deployed_at")
        before = (at - (GAP + BASELINE) * NS_PER_MINUTE, at - GAP * NS_PER_MINUTE)
        during = (windows["during"][0], windows["during"][1])
        rows = [row for window in (before, during) for row in _spans(index, services, window)]
        entity = gather(rows, windows["service"], [before, during], services)["entities"].get(name)
        if entity is None:
            continue
        moved = change_of(entity)
        if moved.get("slower") or moved.get("failing"):
            found[name] = _suspect(name, entity, moved, evidence["entities"][name], change)
    total = sum(s["weight"] for s in found.values())
    for suspect in found.values():
        suspect["share"] = round(suspect["weight"] / total, 4)
    return found


def _suspect(
    name: str,
    entity: Mapping[str, Any],
    moved: Mapping[str, Any],
    reached: Mapping[str, Any],
    change: Mapping[str, Any],
) -> Json:
    sure = min(3.0, max(moved["time_z"], moved["failure_z"]) / 3.0)
    return {
        "kind": reached["kind"],
        "weight": round(max(reached["reach"], 0.01) * sure, 4),
        "impact": 0.0,
        **moved,
        "reach": round(reached["reach"], 4),
        "signals": [
            f"{text} since {change['deploy']['id']} at {change['deploy']['deployed_at']}"
            for text in signals(name, entity, moved)
        ],
        "ramp": change["deploy"]["id"],
    }


def _spans(index: TraceIndex, services: Sequence[str], window: tuple[int, int]) -> list[Any]:
    rows, _share = index.spans_between(services, window[0], window[1])
    return rows
