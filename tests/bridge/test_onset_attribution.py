"""When each suspect's own change began, and the changes that belong to another incident
(two faults minutes apart, two incidents): pure functions on hand-built minutes."""

from __future__ import annotations

from typing import Any

from keel.bridge.diagnosis import ELSEWHERE, _attribute
from keel.bridge.evidence import gather, own_onset

ONSET = 12  # the incident's onset, as index in the timeline (diagnosis.TIMELINE)


def _changed(median_ms: tuple[float, float], failure_rate: tuple[float, float]) -> dict[str, Any]:
    """An entity that got slower (its median own time rose) or else started failing."""
    slower = median_ms[1] > median_ms[0]
    return {
        "slower": slower,
        "failing": not slower,
        "time_z": 10.0 if slower else 0.0,
        "failure_z": 0.0 if slower else 10.0,
        "median_ms": list(median_ms),
        "failure_rate": list(failure_rate),
    }


def _slower(m0: float, m1: float) -> dict[str, Any]:
    """An entity that got slower, median own time m0 -> m1 ms."""
    return _changed((m0, m1), (0.0, 0.0))


def _failing(p0: float, p1: float) -> dict[str, Any]:
    return _changed((5.0, 5.0), (p0, p1))


LEAK = _slower(10.0 * 2 ** (-4 / 5), 10.0 * 2 ** (17 / 5))


def _step(at: int, before: float, after: float, n: int = 22, calls: int = 8) -> list[list[float]]:
    """Per minute [calls, median ms, failures]: ``before`` ms, and ``after`` from ``at``."""
    return [[calls, before if i < at else after, 0] for i in range(n)]


def test_an_abrupt_slowdown_is_dated_to_its_minute() -> None:
    minutes = _step(8, 10.0, 100.0)
    minutes[3][1] = 14.0  # a noisy minute before does not move it
    minutes[15][1] = 70.0
    at, fit = own_onset(minutes, _slower(10.0, 100.0))
    assert at == 8
    assert fit > 0.9


def test_a_jump_of_failures_is_dated_to_its_minute() -> None:
    minutes = [[20, 5.0, 0 if i < 13 else 10] for i in range(22)]
    at, fit = own_onset(minutes, _failing(0.0, 0.5))
    assert (at, fit > 0.9) == (13, True)


def test_a_gradual_drift_fits_no_step() -> None:
    # a slow leak: its own time doubles every 5 minutes, from well before the onset; the
    # baseline's median is its level of about 16 minutes before the onset (index -4),
    # the during window's that of 5 minutes after it (index 17)
    minutes = [[8, 10.0 * 2 ** (i / 5), 0] for i in range(22)]
    _at, fit = own_onset(minutes, LEAK)
    assert fit < 0.5


def test_too_few_minutes_say_nothing() -> None:
    minutes = [[0, 0.0, 0]] * 20 + [[3, 50.0, 0]] * 2
    assert own_onset(minutes, _slower(10.0, 50.0)) == (0, 0.0)


def _impacts(**changes: tuple[dict[str, Any], float]) -> dict[str, Any]:
    return {name: {**change, "weight": weight} for name, (change, weight) in changes.items()}


def test_a_change_that_began_before_this_incident_is_cut() -> None:
    # the major fault (a database 10x slower) began 4 minutes before this incident's onset;
    # this incident's own fault (a service 2x slower) began at it
    impacts = _impacts(db=(_slower(10.0, 100.0), 0.5), svc=(_slower(10.0, 20.0), 0.05))
    timeline = {
        "onset": ONSET,
        "entities": {"db": _step(ONSET - 4, 10.0, 100.0), "svc": _step(ONSET, 10.0, 20.0)},
    }
    _attribute(impacts, {"timeline": timeline})
    assert impacts["db"]["weight"] == round(0.5 * ELSEWHERE, 4)
    assert impacts["db"]["elsewhere"]
    assert "elsewhere" not in impacts["svc"]
    assert impacts["svc"]["weight"] == 0.05
    assert impacts["db"]["own_onset"][0] == -4
    assert impacts["svc"]["own_onset"][0] == 0


def test_a_change_that_began_after_this_incident_is_cut() -> None:
    impacts = _impacts(db=(_slower(10.0, 100.0), 0.5), svc=(_slower(10.0, 20.0), 0.5))
    timeline = {
        "onset": ONSET,
        "entities": {"db": _step(ONSET, 10.0, 100.0), "svc": _step(ONSET + 4, 10.0, 20.0)},
    }
    _attribute(impacts, {"timeline": timeline})
    assert impacts["svc"].get("elsewhere")
    assert not impacts["db"].get("elsewhere")


def test_one_fault_is_never_cut_however_late_the_onset_was_found() -> None:
    # the symptom's onset was found 6 minutes late: nothing matches it better
    impacts = _impacts(db=(_slower(10.0, 100.0), 0.5), caller=(_slower(10.0, 30.0), 0.2))
    timeline = {
        "onset": ONSET,
        "entities": {"db": _step(ONSET - 6, 10.0, 100.0), "caller": _step(ONSET - 6, 10.0, 30.0)},
    }
    _attribute(impacts, {"timeline": timeline})
    assert [s["weight"] for s in impacts.values()] == [0.5, 0.2]


def test_a_slow_leak_is_never_cut() -> None:
    leak = [[8, 10.0 * 2 ** (i / 5), 0] for i in range(22)]
    impacts = _impacts(
        leak=(LEAK, 0.5),
        other=(_slower(10.0, 20.0), 0.05),
    )
    timeline = {"onset": ONSET, "entities": {"leak": leak, "other": _step(ONSET, 10.0, 20.0)}}
    _attribute(impacts, {"timeline": timeline})
    assert impacts["leak"]["weight"] == 0.5
    assert not impacts["leak"].get("elsewhere")


def test_a_changes_minute_that_fits_no_step_cuts_nothing() -> None:
    # the only change near the onset is noise, not a step: the earlier fault stays
    noise = [[8, 10.0 if i % 2 else 20.0, 0] for i in range(22)]
    impacts = _impacts(db=(_slower(10.0, 100.0), 0.5), svc=(_slower(10.0, 20.0), 0.05))
    timeline = {"onset": ONSET, "entities": {"db": _step(ONSET - 4, 10.0, 100.0), "svc": noise}}
    _attribute(impacts, {"timeline": timeline})
    assert impacts["db"]["weight"] == 0.5


def test_no_timeline_no_attribution() -> None:
    impacts = _impacts(db=(_slower(10.0, 100.0), 0.5))
    _attribute(impacts, {})
    assert impacts == _impacts(db=(_slower(10.0, 100.0), 0.5))


def test_gather_counts_each_entity_minute_by_minute() -> None:
    ms, minute = 1_000_000, 60_000_000_000
    rows = [
        ("t1", "s1", None, "orders", 2, None, 0, 4 * ms, 0),
        ("t2", "s2", None, "orders", 2, None, minute, minute + 8 * ms, 1),
        ("t3", "s3", None, "orders", 2, None, minute + 5, minute + 5 + 2 * ms, 0),
        ("t4", "s4", None, "orders", 2, None, 3 * minute, 3 * minute + ms, 0),  # outside
    ]
    evidence = gather(
        rows, "orders", [(0, minute), (minute, 2 * minute)], ["orders"], (0, 2 * minute)
    )
    assert evidence["timeline"] == {
        "start": 0,
        "minutes": 2,
        "entities": {"orders": [[1, 4.0, 0], [2, 5.0, 1]]},
    }
