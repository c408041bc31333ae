"""Slow causes (``keel.bridge.leak``): a service whose own time grew since a change long
before the onset is found by measuring from before that change, on a real trace index
built from OTLP/JSON; a service that did not change, and a change of the last minutes,
are not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from keel.bridge.diagnosis import _own_change
from keel.bridge.index import TraceIndex, build_index
from keel.bridge.leak import ramps
from keel.bridge.records import NS_PER_MINUTE, format_time

T0 = 1_780_000_000 * 10**9 // NS_PER_MINUTE * NS_PER_MINUTE  # a whole minute
DEPLOY = 40  # minute of the leaking deploy
ONSET = 80  # minute of the onset: the leak has grown for 40 minutes


def _own_ms(service: str, minute: float, i: int) -> float:
    """The leaking service doubles its time every 20 minutes after its deploy; the other
    stays as it was; both with a little deterministic jitter."""
    jitter = 1 + ((i * 7919) % 41 - 20) / 100
    if service == "leaky" and minute >= DEPLOY:
        return 10.0 * 2 ** ((minute - DEPLOY) / 20) * jitter
    return 10.0 * jitter


def _export(path: Path) -> None:
    """One request every 6 seconds to each service, for 100 minutes."""
    with path.open("w") as out:
        for i in range(1000):
            for n, service in enumerate(("leaky", "calm")):
                start = T0 + i * 6 * 10**9
                end = start + int(_own_ms(service, i / 10, i) * 1e6)
                span = {
                    "traceId": f"{i * 2 + n + 1:032x}",
                    "spanId": f"{i * 2 + n + 1:016x}",
                    "name": "GET /x",
                    "kind": 2,
                    "startTimeUnixNano": str(start),
                    "endTimeUnixNano": str(end),
                    "status": {},
                }
                resource = {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                }
                request = {
                    "resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]
                }
                out.write(json.dumps(request) + "\n")


def _change(deploy_id: str, service: str, minute: int) -> dict[str, Any]:
    at = T0 + minute * NS_PER_MINUTE
    deploy = {"id": deploy_id, "service": service, "deployed_at": format_time(at), "kind": "code"}
    return {"deploy": deploy, "minutes_before_onset": ONSET - minute, "explains": {}}


def test_a_slow_leak_is_measured_from_before_its_change(tmp_path: Path) -> None:
    """Against the half hour before its deploy the leaking service is surely slower and
    is a suspect measured since that deploy; the calm service, deployed at the same
    time, is not; a deploy of the leaking service 2 minutes before the onset is not
    checked at all."""
    export = tmp_path / "traces.jsonl"
    _export(export)
    build_index([export], tmp_path / "index.db")
    index = TraceIndex(tmp_path / "index.db")
    onset = T0 + ONSET * NS_PER_MINUTE
    windows = {"service": "leaky", "during": [onset, onset + 10 * NS_PER_MINUTE]}
    reached = {"reach": 1.0, "kind": "service"}
    evidence = {"entities": {"leaky": reached, "calm": reached}}
    changes = [
        _change("d-leak", "leaky", DEPLOY),
        _change("d-calm", "calm", DEPLOY),
        _change("d-late", "leaky", ONSET - 2),
    ]
    found = ramps(
        index, windows, evidence, changes, services=["calm", "leaky"], change_of=_own_change
    )
    assert list(found) == ["leaky"]
    leak = found["leaky"]
    assert leak["ramp"] == "d-leak"
    assert leak["slower"]
    assert leak["ratio"] > 3
    assert leak["share"] == 1.0
    assert any("since d-leak" in text for text in leak["signals"])
    nothing = ramps(
        index, windows, evidence, changes[1:], services=["calm", "leaky"], change_of=_own_change
    )
    assert nothing == {}
