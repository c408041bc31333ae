"""Overlapping incidents: which of two faults minutes apart belongs to which incident.

Two faults close in time (say a database outage, and minutes later a service elsewhere
slowing down) make two incidents, opened minutes apart. The symptom of each may reach
both faults; without care the bigger fault explains both. Incidents opened within
``PAIR`` minutes of each other form a pair, and each keeps the changes that began at its
own time:

* the **first-opened** one keeps the changes that began with its earliest anomaly: a
  change whose step (``keel.bridge.evidence.own_onset``) began ``LATE`` minutes or more
  after the earliest clear step of its suspects (or its detected onset) is cut;
* the **second-opened** one is judged from the latest clear step before it was opened:
  when the steps of what its requests reach fall in two groups ``SEPARATE`` minutes or
  more apart, its windows are re-anchored at the later group (its own fault), and the
  changes of the earlier group (the other incident's) are cut; not re-anchored, a clear
  step ``SEPARATE`` minutes or more before a change that began at its onset is cut.

The earliest step of the first-opened one, and the change at the onset of the second,
may be dated loosely (a fit of ``LOOSE``); what is cut must be dated clearly (``STEP``).

A cut keeps ``ELSEWHERE`` of a suspect's weight; when the top suspect itself was cut, the
confidence is lowered (``diagnosis._confidence``). With one group of steps nothing is cut:
two incidents of one fault both name it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keel.bridge.evidence import own_onset
from keel.bridge.records import NS_PER_MINUTE, Incident, format_time, parse_time

__all__ = ["PAIR", "attribute", "later_onset", "pair_of", "steps"]

PAIR = 15  # minutes between the openings of two incidents that make a pair
LATE = 2  # first-opened: minutes after its earliest step from which a change is another's
SEPARATE = 2  # second-opened: minutes between two groups of steps to tell them apart
STEP = 0.5  # how well a step must fit an entity's minutes to date its change
LOOSE = 0.3  # ... to date it loosely (a re-anchored incident: what began before it)
WEAK = 2.0  # z an entity's own change needs for its step to count
ELSEWHERE = 0.01  # weight kept by a change that belongs to the other incident

Json = dict[str, Any]


def pair_of(incidents: Sequence[Incident], incident: Mapping[str, Any]) -> Json | None:
    """The incident opened nearest to ``incident`` within PAIR minutes, if any, and which
    of the two was opened first (a tie goes by id)."""
    opened = parse_time(incident["opened_at"], "opened_at")
    near = [
        (abs(other.opened_at - opened), other.opened_at, other.id)
        for other in incidents
        if other.id != incident["id"] and abs(other.opened_at - opened) <= PAIR * NS_PER_MINUTE
    ]
    if not near:
        return None
    _, at, partner = min(near)
    first = (opened, incident["id"]) < (at, partner)
    order = "first" if first else "second"
    return {"partner": partner, "partner_opened": format_time(at), "order": order}


def steps(evidence: Mapping[str, Any], change_of: Callable[[Mapping[str, Any]], Json]) -> Json:
    """Every entity the symptom's requests reach whose own calls moved (z >= WEAK) and whose
    move fits a step: {name: [minute of the step from the onset, fit]}."""
    timeline = evidence.get("timeline") or {}
    out: Json = {}
    for name, entity in evidence["entities"].items():
        minutes = timeline.get("entities", {}).get(name)
        if entity["reach"] <= 0 or not minutes:
            continue
        change = change_of(entity)
        if "ratio" not in change or max(change["time_z"], change["failure_z"]) < WEAK:
            continue
        slower = change["time_z"] >= change["failure_z"]
        (m0, m1), (p0, p1) = change["median_ms"], change["failure_rate"]
        if (slower and (m0 <= 0 or m1 <= m0)) or (not slower and p1 <= p0):
            continue
        at, fit = own_onset(minutes, {**change, "slower": slower})
        if fit >= STEP:
            out[name] = [at - timeline["onset"], round(fit, 3)]
    return out


def later_onset(found: Mapping[str, Sequence[float]], opened: int) -> int:
    """For the second-opened incident of a pair: how many minutes after the detected onset
    its own fault began, from the steps ``found`` (minutes from the onset); 0 when they do
    not fall in two groups SEPARATE minutes apart before it was opened (``opened``, in
    minutes from the onset)."""
    minutes = sorted(int(at) for at, _ in found.values() if at <= opened)
    if len(minutes) < 2 or minutes[-1] - minutes[0] < SEPARATE:
        return 0
    return max(0, minutes[-1])


def attribute(impacts: Json, pair: Mapping[str, Any] | None) -> None:
    """Cut the suspects whose change belongs to the other incident of a pair (see the
    module docstring); ``impacts`` carry ``own_onset`` ([minute from the onset, fit]).
    Suspects cut already (``diagnosis._attribute``) are left as they are."""
    if not pair:
        return
    dated, loose = _dated(impacts, STEP), _dated(impacts, LOOSE)
    if pair["order"] == "first":
        if not loose:
            return
        earliest = min([*loose.values(), *([0] if pair.get("onset_found") else [])])
        other = {name for name, at in dated.items() if at >= earliest + LATE}
    elif pair.get("moved"):
        # re-anchored at this incident's own step: what began before it, even loosely
        # dated, is the other incident's
        other = {name for name, at in loose.items() if at <= -SEPARATE}
    else:
        # not re-anchored: a clear step well before a change that began at the onset
        at_onset = [at for at in loose.values() if at > -SEPARATE]
        if not at_onset:
            return
        other = {name for name, at in dated.items() if at <= min(at_onset) - SEPARATE}
    for name in other:
        impacts[name]["weight"] = round(impacts[name]["weight"] * ELSEWHERE, 4)
        impacts[name]["elsewhere"] = True


def _dated(impacts: Mapping[str, Any], fit: float) -> dict[str, int]:
    """The minute (from the onset) of each suspect not cut yet whose step fits ``fit``."""
    return {
        name: suspect["own_onset"][0]
        for name, suspect in impacts.items()
        if "own_onset" in suspect
        and suspect["own_onset"][1] >= fit
        and not suspect.get("elsewhere")
    }
