"""Is each injected fault visible in the spans? A sanity check of a dataset, not a diagnosis.

    uv run python bench/rca/visibility.py DATASET

For every incident (from ``answers.json``), compares the 30 minutes before the onset
(``baseline``) with the 10 minutes after it (``during``; noise-only incidents use their
opening time minus 5 minutes) on:

* the **symptom service**: its SERVER spans (error rate, p50 and p95 duration);
* the **cause**: a service's SERVER/CONSUMER spans, or a dependency's CLIENT/PRODUCER
  spans from its callers (matched by any alias in ``peer.service``, ``server.address``,
  ``db.name`` or ``messaging.destination.name``).

It reads the trace files directly (one pass, duplicates skipped) and uses nothing of the
Bridge, so a fault that does not show here is the generator's fault, not the diagnosis's.
"""

from __future__ import annotations

import bisect
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

NS_MIN = 60_000_000_000
KEYS = ("peer.service", "server.address", "db.name", "messaging.destination.name")


def _ns(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()) * 10**9


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str]) -> int:
    dataset = Path(argv[0])
    answers = json.loads((dataset / "answers.json").read_text())
    windows = []  # (from, to, incident index)
    for i, inc in enumerate(answers["incidents"]):
        onset = _ns(inc["onset"]) if inc["onset"] else _ns(inc["opened_at"]) - 5 * NS_MIN
        inc["_onset"] = onset
        windows.append((onset - 30 * NS_MIN, onset + 10 * NS_MIN, i))
    windows.sort()
    starts = [w[0] for w in windows]
    alias_of: dict[str, set[int]] = {}
    for i, inc in enumerate(answers["incidents"]):
        for a in inc["aliases"] if inc["cause_type"] not in {None, "service"} else []:
            alias_of.setdefault(a, set()).add(i)
    # stats[i][(role, phase)] = [durations_ms, errors]
    stats: list[dict[tuple[str, str], list[Any]]] = [{} for _ in answers["incidents"]]
    seen: set[str] = set()
    for path in sorted((dataset / "traces").iterdir()):
        for line in path.open(encoding="utf-8"):
            for rs in json.loads(line)["resourceSpans"]:
                svc = next(
                    a["value"]["stringValue"]
                    for a in rs["resource"]["attributes"]
                    if a["key"] == "service.name"
                )
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        if span["spanId"] in seen:
                            continue
                        seen.add(span["spanId"])
                        _account(span, svc, windows, starts, answers["incidents"], alias_of, stats)
    print(
        f"{'incident':<10}{'kind':<23}{'role':<8}{'name':<22}{'err b→d':>14}"
        f"{'p50 ms b→d':>18}{'p95 ms b→d':>20}"
    )
    for i, inc in enumerate(answers["incidents"]):
        for role, name in (("symptom", inc["symptom_service"]), ("cause", inc["cause"])):
            if name is None:
                continue
            b = stats[i].get((role, "b"), [[], 0])
            d = stats[i].get((role, "d"), [[], 0])
            eb = b[1] / len(b[0]) if b[0] else 0
            ed = d[1] / len(d[0]) if d[0] else 0
            print(
                f"{inc['id']:<10}{inc['kind'][:22]:<23}{role:<8}{name[:21]:<22}"
                f"{eb * 100:6.1f}→{ed * 100:5.1f}%"
                f"{_q(b[0], 0.5) or 0:9.0f}→{_q(d[0], 0.5) or 0:7.0f}"
                f"{_q(b[0], 0.95) or 0:10.0f}→{_q(d[0], 0.95) or 0:8.0f}"
                f"   n={len(b[0])}/{len(d[0])}"
            )
    return 0


def _account(
    span: dict[str, Any],
    svc: str,
    windows: list[Any],
    starts: list[int],
    incidents: list[Any],
    alias_of: dict[str, set[int]],
    stats: list[Any],
) -> None:
    start = int(span["startTimeUnixNano"])
    hi = bisect.bisect_right(starts, start)
    lo = max(0, hi - 3)
    hits = [w for w in windows[lo:hi] if w[0] <= start < w[1]]
    if not hits:
        return
    kind = span.get("kind")
    dur = (int(span["endTimeUnixNano"]) - start) / 1e6
    err = span.get("status", {}).get("code") == 2
    names: set[int] = set()
    if kind in (3, 4):
        for a in span.get("attributes", []):
            if a["key"] in KEYS:
                names |= alias_of.get(a["value"].get("stringValue", ""), set())
    for _, _, i in hits:
        inc = incidents[i]
        phase = "b" if start < inc["_onset"] else "d"
        roles = []
        if kind in (2, 5) and svc == inc["symptom_service"]:
            roles.append("symptom")
        if inc["cause_type"] == "service" and kind in (2, 5) and svc == inc["cause"]:
            roles.append("cause")
        if i in names:
            roles.append("cause")
        for role in roles:
            cell = stats[i].setdefault((role, phase), [[], 0])
            cell[0].append(dur)
            cell[1] += err


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
