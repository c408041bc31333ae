"""Where the time goes and where failures start, request by request.

The diagnosis looks at the requests of the symptomatic service (its entry spans: server,
consumer or unspecified spans not called by itself) and at each request's whole subtree
of spans, and charges everything in it to an *entity*:

* a service, for its own spans' **exclusive time** (a span's duration minus its direct
  children's) — so a service is judged by its own work, never by the calls it makes;
* a dependency (a database, queue, cache or external API, named by the client or
  producer spans that call it: ``peer.service``, ``db.name``, the destination, the host),
  for the time of calls to it that nothing instrumented answered — so an uninstrumented
  dependency is a suspect like any service. A call that an instrumented service answered
  charges its own exclusive time (the network) to the caller.

A failed request is **blamed** on where its failure started: the failed spans in its
subtree none of whose children failed (shared equally when there are several). A
failure that started in a client span nothing answered is the dependency's. A span that
failed while one of its calls took longer than that callee ever took in the baseline
(beyond its 99th percentile) timed out waiting: the blame moves down to the callee.

Comparing the charges per request before the onset (baseline) and after it (during)
says which entities the symptom's change comes from, however many healthy calls sit on
the path to them: there is no walk to stop early.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keel.bridge.otlp import OUTGOING

__all__ = [
    "DEPENDENCY",
    "Charges",
    "ScopedSpan",
    "WindowEvidence",
    "charge_requests",
    "entity_of",
]

DEPENDENCY = "dependency"
SERVICE = "service"
EXEMPLARS = 3  # spans kept per entity as citations

ScopedSpan = tuple[str, str, str | None, str, int, str | None, int, int, int]
"""(trace_id, span_id, parent_id, service, kind, peer, start_ns, end_ns, error)."""


@dataclass(slots=True)
class Charges:
    """One entity's share of one window's requests."""

    kind: str  # SERVICE or DEPENDENCY
    requests: int = 0  # requests whose subtree reached it
    calls: int = 0  # its spans (or calls to it)
    time_ns: float = 0.0  # exclusive time charged, summed over requests
    time_sq: float = 0.0  # sum over requests of (time charged in that request)^2, ns^2
    blamed: float = 0.0  # failed requests blamed on it (shares)
    failed_calls: int = 0  # its spans that failed where the failure started
    callers: set[str] = field(default_factory=set)
    exemplars: list[tuple[float, str, str, float, bool]] = field(default_factory=list)

    def to_json(self, requests: int) -> dict[str, Any]:
        mean = self.time_ns / requests if requests else 0.0
        var = max(0.0, self.time_sq / requests - mean * mean) if requests else 0.0
        return {
            "requests": self.requests,
            "calls": self.calls,
            "ms_per_request": mean / 1e6,
            "sd_ms": var**0.5 / 1e6,
            "blamed": round(self.blamed, 4),
            "failed_calls": self.failed_calls,
        }


@dataclass(slots=True)
class WindowEvidence:
    """The charges of one window's requests."""

    requests: int = 0
    failed: int = 0
    latency_ns: float = 0.0
    latency_sq: float = 0.0
    entities: dict[str, Charges] = field(default_factory=dict)
    edges: set[tuple[str, str]] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        n = self.requests
        mean = self.latency_ns / n if n else 0.0
        var = max(0.0, self.latency_sq / n - mean * mean) if n else 0.0
        return {
            "requests": n,
            "failed": self.failed,
            "error_rate": self.failed / n if n else 0.0,
            "ms_per_request": mean / 1e6,
            "sd_ms": var**0.5 / 1e6,
            "entities": {name: c.to_json(n) for name, c in sorted(self.entities.items())},
        }


def entity_of(span: ScopedSpan, answered: bool, services: frozenset[str]) -> tuple[str, str]:
    """(name, kind) of the entity a span's exclusive time is charged to."""
    service, kind, peer = span[3], span[4], span[5]
    if kind not in OUTGOING or answered:
        return service, SERVICE
    if peer is None:
        return service, SERVICE  # a call to nobody we can name: the caller's own time
    if peer in services:
        return peer, SERVICE  # an instrumented callee whose span was not sampled
    return peer, DEPENDENCY


def _entries(spans: Mapping[str, ScopedSpan], symptom: str) -> list[ScopedSpan]:
    """The symptom service's requests in one trace: its own spans not called by itself."""
    out = []
    for span in spans.values():
        if span[3] != symptom or span[4] in OUTGOING:
            continue
        parent = spans.get(span[2] or "")
        if parent is None or parent[3] != symptom:
            out.append(span)
    return out


def charge_requests(
    rows: Iterable[ScopedSpan],
    symptom: str,
    windows: Sequence[tuple[int, int]],
    services: Iterable[str],
) -> list[WindowEvidence]:
    """The evidence of each window (``[start, end)`` in ns) from the spans of the traces
    that reach the symptomatic service; a request belongs to the window its entry span
    starts in."""
    known = frozenset(services)
    traces: dict[str, dict[str, ScopedSpan]] = defaultdict(dict)
    for row in rows:
        traces[row[0]].setdefault(row[1], row)
    out = [WindowEvidence() for _ in windows]
    trees = []
    for spans in traces.values():
        children: dict[str, list[ScopedSpan]] = defaultdict(list)
        for span in spans.values():
            if span[2] is not None and span[2] in spans:
                children[span[2]].append(span)
        trees.append((spans, children))
    limits = _slow_limits(trees, windows[0], known)
    for spans, children in trees:
        for entry in _entries(spans, symptom):
            for evidence, (start, end) in zip(out, windows, strict=True):
                if start <= entry[6] < end:
                    _charge(evidence, entry, children, _Rules(known, limits))
    return out


SLOW_QUANTILE = 0.99  # a call slower than this share of its callee's baseline calls is slow
MIN_CALLS = 20  # baseline calls an entity needs for a slow limit


@dataclass(frozen=True, slots=True)
class _Rules:
    services: frozenset[str]
    limits: Mapping[str, int]  # entity -> the duration (ns) beyond which a call is slow


def _slow_limits(
    trees: Sequence[tuple[Mapping[str, ScopedSpan], Mapping[str, list[ScopedSpan]]]],
    baseline: tuple[int, int],
    services: frozenset[str],
) -> dict[str, int]:
    """Per entity, the duration of its calls that only 1 % of baseline calls exceed."""
    durations: dict[str, list[int]] = defaultdict(list)
    for spans, children in trees:
        for span in spans.values():
            if baseline[0] <= span[6] < baseline[1]:
                name = entity_of(span, span[1] in children, services)[0]
                durations[name].append(span[7] - span[6])
    limits = {}
    for name, values in durations.items():
        if len(values) >= MIN_CALLS:
            values.sort()
            limits[name] = values[min(len(values) - 1, int(len(values) * SLOW_QUANTILE))]
    return limits


def _blame(span: ScopedSpan, children: Mapping[str, list[ScopedSpan]], rules: _Rules) -> str:
    """The entity a failure that started at ``span`` is blamed on: the span's own, or,
    if it waited on a call slower than that callee's baseline ever was, the callee's
    (followed down as far as such slow calls go)."""
    while True:
        below = children.get(span[1], [])
        slow = [
            c for c in below if c[7] - c[6] > rules.limits.get(_name(c, children, rules), 1 << 62)
        ]
        if not slow:
            return _name(span, children, rules)
        span = max(slow, key=lambda c: (c[7] - c[6], c[1]))


def _name(span: ScopedSpan, children: Mapping[str, list[ScopedSpan]], rules: _Rules) -> str:
    return entity_of(span, span[1] in children, rules.services)[0]


def _charge(
    evidence: WindowEvidence,
    entry: ScopedSpan,
    children: Mapping[str, list[ScopedSpan]],
    rules: _Rules,
) -> None:
    """Charge one request (``entry`` and its subtree) to the entities it touched."""
    spent: dict[str, float] = defaultdict(float)
    origins: list[str] = []
    todo: list[tuple[ScopedSpan, str | None]] = [(entry, None)]
    while todo:
        span, caller = todo.pop()
        below = children.get(span[1], [])
        name, kind = entity_of(span, bool(below), rules.services)
        charges = evidence.entities.get(name)
        if charges is None:
            charges = evidence.entities[name] = Charges(kind)
        duration = span[7] - span[6]
        own = max(0, duration - sum(c[7] - c[6] for c in below))
        spent[name] += own
        charges.calls += 1
        if caller is not None and caller != name:
            charges.callers.add(caller)
            evidence.edges.add((caller, name))
        started_here = bool(span[8]) and not any(c[8] for c in below)
        if started_here:
            origins.append(_blame(span, children, rules))
            charges.failed_calls += 1
        _exemplar(charges, span, own, started_here)
        todo.extend((child, name) for child in below)
    failed = bool(entry[8])
    evidence.requests += 1
    evidence.failed += failed
    latency = entry[7] - entry[6]
    evidence.latency_ns += latency
    evidence.latency_sq += latency * latency
    for name, ns in spent.items():
        charges = evidence.entities[name]
        charges.requests += 1
        charges.time_ns += ns
        charges.time_sq += ns * ns
    if failed:
        for name in origins or [_name(entry, children, rules)]:
            charges = evidence.entities.get(name) or evidence.entities.setdefault(
                name, Charges(SERVICE)
            )
            charges.blamed += 1 / max(1, len(origins))


def _exemplar(charges: Charges, span: ScopedSpan, own: float, failed: bool) -> None:
    """Keep the entity's worst spans: failures first, then the most exclusive time."""
    rank = (1e18 if failed else 0.0) + own
    kept = charges.exemplars
    if len(kept) < EXEMPLARS or rank > kept[-1][0]:
        kept.append((rank, span[0], span[1], (span[7] - span[6]) / 1e6, failed))
        kept.sort(key=lambda e: (-e[0], e[1], e[2]))
        del kept[EXEMPLARS:]
