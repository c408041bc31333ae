"""A service that waits for a slower callee: its own time grows with the callee's.

A saturated database makes its callers wait before their calls even start (a connection
pool, a lock, a client-side queue): the wait is the caller's own time, so the caller
looks slower too, sometimes more than the database does for the symptom. Such a caller
is slower only in the calls that call that callee; its other calls run as they did. A
service suspect whose calls without a changed callee (``evidence``'s ``without``) are
not surely slower, and slowed less than half as much (in log terms) as all its calls,
is waiting for that callee: its weight is cut to ``WAITING`` of itself. A service slower
in all its calls (its own handler, a bad deploy) is left as it is, and so is one whose
calls without the callee are too few to tell (``diagnosis._own_change``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["WAITING", "waiting"]

WAITING = 0.01  # weight kept by a suspect whose slowdown is waiting for a callee
HALF = 0.5  # share of the whole slowdown (log ratio) its other calls must stay below

Json = dict[str, Any]


def waiting(
    impacts: Json,
    evidence: Mapping[str, Any],
    change_of: Callable[[Mapping[str, Any]], Json],
) -> None:
    """Cut the service suspects of ``impacts`` that wait for a changed callee (see the
    module docstring); each cut one gets ``waits_for``, the callee."""
    for name, suspect in impacts.items():
        if not suspect.get("slower") or suspect.get("failing") or suspect.get("elsewhere"):
            continue
        whole = math.log(max(float(suspect.get("ratio", 1.0)), 1.0))
        without = evidence["entities"].get(name, {}).get("without", {})
        for callee, calls in sorted(without.items()):
            other = impacts.get(callee)
            if callee == name or other is None or not (other["slower"] or other["failing"]):
                continue
            rest = change_of(calls)
            if "ratio" not in rest or rest["slower"]:
                continue
            if math.log(max(rest["ratio"], 1e-9)) < HALF * whole:
                suspect["weight"] = round(suspect["weight"] * WAITING, 4)
                suspect["waits_for"] = callee
                break
