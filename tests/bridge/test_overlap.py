"""Overlapping incidents (``keel.bridge.overlap``): which incidents make a pair, when the
second-opened one is re-anchored, and which changes each of the two cuts; pure functions
on hand-built incidents, steps and suspects."""

from __future__ import annotations

from typing import Any

import pytest

from keel.bridge.diagnosis import _confidence
from keel.bridge.overlap import ELSEWHERE, attribute, later_onset, pair_of, steps
from keel.bridge.records import NS_PER_MINUTE, Incident

T0 = 1_780_000_000 * 10**9  # some whole minute


def _incident(incident_id: str, minute: float) -> Incident:
    return Incident(incident_id, "t", "SEV2", T0 + int(minute * NS_PER_MINUTE))


def test_incidents_opened_within_15_minutes_make_a_pair() -> None:
    """The nearest incident opened within 15 minutes is the partner; which was opened
    first decides the order; an incident alone has none."""
    incidents = [_incident("A", 0), _incident("B", 4), _incident("C", 40), _incident("D", 56)]
    first = pair_of(incidents, incidents[0].to_json())
    second = pair_of(incidents, incidents[1].to_json())
    assert first is not None
    assert second is not None
    assert (first["partner"], first["order"]) == ("B", "first")
    assert (second["partner"], second["order"]) == ("A", "second")
    assert pair_of(incidents, incidents[2].to_json()) is None  # 16 minutes from D
    same = [_incident("X", 0), _incident("Y", 0)]
    orders = [pair_of(same, i.to_json()) for i in same]
    assert [o["order"] for o in orders if o] == ["first", "second"]  # a tie goes by id


def test_the_second_opened_incident_moves_to_its_own_later_step() -> None:
    """Steps in two groups 2 minutes or more apart, before it was opened: the onset moves
    to the later group; one group, or a later step after the opening, moves nothing."""
    two_groups = {"db": [-2, 0.95], "api": [-2, 0.9], "svc": [3, 0.8]}
    assert later_onset(two_groups, opened=6) == 3
    assert later_onset(two_groups, opened=2) == 0  # svc's step came after the opening
    assert later_onset({"db": [-2, 0.95], "svc": [-1, 0.8]}, opened=6) == 0
    assert later_onset({"db": [-7, 0.9], "svc": [-4, 0.7]}, opened=6) == 0  # not after it
    assert later_onset({"svc": [3, 0.8]}, opened=6) == 0


def _suspects(**dated: tuple[int, float]) -> dict[str, Any]:
    return {name: {"weight": 1.0, "own_onset": [at, fit]} for name, (at, fit) in dated.items()}


def test_the_first_opened_incident_cuts_what_began_later() -> None:
    """First-opened: a change that began 2 minutes or more after its earliest step (or
    its detected onset) is the other incident's; a change already cut stays as it was."""
    impacts = _suspects(db=(0, 0.9), svc=(3, 0.8), noise=(4, 0.2))
    attribute(impacts, {"order": "first", "onset_found": True})
    assert impacts["svc"]["weight"] == ELSEWHERE
    assert impacts["svc"]["elsewhere"]
    assert impacts["db"]["weight"] == 1.0
    assert impacts["noise"]["weight"] == 1.0
    # the minor fault's incident opened first: the earlier step was cut already
    impacts = _suspects(db=(-2, 0.9), svc=(0, 0.7))
    impacts["db"].update(weight=ELSEWHERE, elsewhere=True)
    attribute(impacts, {"order": "first", "onset_found": False})
    assert impacts["svc"]["weight"] == 1.0
    assert impacts["db"]["weight"] == ELSEWHERE


def test_the_re_anchored_second_incident_cuts_what_began_before_its_step() -> None:
    """Second-opened and re-anchored: what began 2 minutes or more before the new onset,
    even loosely dated, is cut; not in a pair, nothing is."""
    impacts = _suspects(db=(-5, 0.9), drift=(-2, 0.35), svc=(0, 0.6))
    attribute(impacts, {"order": "second", "moved": 3})
    assert {n for n, s in impacts.items() if s.get("elsewhere")} == {"db", "drift"}
    impacts = _suspects(db=(-5, 0.9), svc=(0, 0.6))
    attribute(impacts, None)
    assert not any(s.get("elsewhere") for s in impacts.values())


def test_the_second_incident_not_re_anchored_cuts_a_clear_step_well_before_its_own() -> None:
    """Second-opened, not re-anchored: a clear step 2 minutes or more before a change
    that began at the onset (even loosely dated) is cut; alone, it is never cut."""
    impacts = _suspects(db=(-4, 0.86), svc=(0, 0.41))
    attribute(impacts, {"order": "second"})
    assert impacts["db"].get("elsewhere")
    assert not impacts["svc"].get("elsewhere")
    alone = _suspects(db=(-4, 0.94))
    attribute(alone, {"order": "second"})
    assert alone["db"]["weight"] == 1.0


def test_the_first_opened_incident_dates_its_earliest_change_loosely() -> None:
    """First-opened: a loosely dated change before a clear later one sets the earliest
    minute, so the clear later one is cut; a loosely dated later one is not."""
    impacts = _suspects(api=(-1, 0.48), svc=(2, 0.87))
    attribute(impacts, {"order": "first", "onset_found": False})
    assert impacts["svc"].get("elsewhere")
    assert not impacts["api"].get("elsewhere")
    impacts = _suspects(db=(-3, 0.94), svc=(0, 0.37))
    attribute(impacts, {"order": "first", "onset_found": False})
    assert not any(s.get("elsewhere") for s in impacts.values())


def test_a_top_suspect_that_was_cut_lowers_the_confidence() -> None:
    """All there is may be another incident's change: the confidence is halved."""
    suspect = {"share": 1.0, "time_z": 12.0, "failure_z": 0.0}
    scores = {"suspects": {"svc": suspect}, "symptom": {"impact": 0.5}}
    top = {"suspect": "svc"}
    sure = _confidence(top, scores)
    suspect["elsewhere"] = True
    assert _confidence(top, scores) == pytest.approx(sure * 0.5, abs=0.01)


def test_an_incident_of_a_pair_is_answered_less_surely() -> None:
    """Opened within minutes of another incident: which fault is whose is less sure, and
    the confidence says so (x0.75)."""
    suspect = {"share": 1.0, "time_z": 12.0, "failure_z": 0.0}
    scores: dict[str, Any] = {"suspects": {"svc": suspect}, "symptom": {"impact": 0.5}}
    alone = _confidence({"suspect": "svc"}, scores)
    scores["paired"] = True
    assert _confidence({"suspect": "svc"}, scores) == pytest.approx(alone * 0.75, abs=0.01)


def test_steps_dates_what_moved_and_leaves_out_what_did_not() -> None:
    """Each reached entity whose own time moved is dated by its step; one that did not
    move, or that the symptom's requests never reach, is not."""
    minutes = [[8, 10.0 if i < 15 else 40.0, 0] for i in range(22)]
    flat = [[8, 10.0, 0] for _ in range(22)]

    def entity(reach: float) -> dict[str, Any]:
        return {"reach": reach}

    def change_of(entity: Any) -> dict[str, Any]:
        moved = entity["reach"] != 0.5
        return {
            "slower": moved,
            "failing": False,
            "time_z": 9.0 if moved else 0.5,
            "failure_z": 0.0,
            "ratio": 4.0 if moved else 1.0,
            "median_ms": [10.0, 40.0 if moved else 10.0],
            "failure_rate": [0.0, 0.0],
        }

    evidence = {
        "entities": {"svc": entity(1.0), "calm": entity(0.5), "unreached": entity(0.0)},
        "timeline": {
            "onset": 12,
            "entities": {"svc": minutes, "calm": flat, "unreached": minutes},
        },
    }
    found = steps(evidence, change_of)
    assert list(found) == ["svc"]
    assert found["svc"][0] == 3
    assert found["svc"][1] > 0.9
