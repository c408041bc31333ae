"""Where the time goes and where failures start, call by call.

Every span of the two windows is charged to an *entity*:

* a **service**, for its own spans' **exclusive time** (a span's duration minus its direct
  children's), summed per *call* of the service (one of its entry spans — server,
  consumer, or a span its own service did not call — and the spans of that service below
  it): a service is judged by its own work, never by the calls it makes;
* a **dependency** (a database, queue, cache or external API, named by the client or
  producer spans that call it: ``peer.service``, ``db.name``, the destination, the host),
  for each call to it that nothing instrumented answered: an uninstrumented dependency is
  a suspect like any service. A call that an instrumented service answered charges its
  own exclusive time (the network) to the caller; a client span whose host names a known
  service (``orders.prod.svc.cluster.local``) is that service's call.

A failure **starts** in a failed span none of whose children failed. A span that failed
while one of its calls took longer than that callee's calls ever took in the baseline
(beyond their 99th percentile) timed out waiting: the failure is moved down to the callee.

Each entity's calls are compared before the onset (baseline) and after it (during): the
change of its own time per call and of the share of its calls where a failure started.
The symptomatic service's requests (its entry spans, with their whole subtree) say how
much each entity matters to the symptom: how many calls to it a request makes, how many
requests reach it, and how often a failure started there reaches the symptom.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keel.bridge.otlp import OUTGOING

__all__ = ["DEPENDENCY", "SERVICE", "ScopedSpan", "entity_of", "gather", "own_onset"]

DEPENDENCY = "dependency"
SERVICE = "service"
SERVER, CLIENT, PRODUCER = 2, 3, 4  # OTLP span kinds
FRAGMENTS = (1, CLIENT, PRODUCER)
"""Kinds of a span whose parent is missing (a sampled trace) that begin no call of their
service: its internal, client and producer spans, the rest of a call whose entry span
was lost. Their failures count; their own time (a call's part) would blur the service's.
"""
EXEMPLARS = 3  # calls kept per entity as citations
SLOW_QUANTILE = 0.99  # a call slower than this share of the callee's baseline calls is slow
MIN_CALLS = 20  # baseline calls an entity needs for a slow limit
MINUTE_NS = 60_000_000_000
FLOOR_NS = 100_000  # 0.1 ms: a call's time is never taken as less (logs stay finite)

ScopedSpan = tuple[str, str, str | None, str, int, str | None, int, int, int]
"""(trace_id, span_id, parent_id, service, kind, peer, start_ns, end_ns, error)."""


def entity_of(span: ScopedSpan, answered: bool, services: frozenset[str]) -> tuple[str, str]:
    """(name, kind) of the entity a span's exclusive time is charged to; ``answered``:
    an instrumented span answered it while it waited (a synchronous child)."""
    service, kind, peer = span[3], span[4], span[5]
    if kind not in OUTGOING or answered or peer is None:
        return service, SERVICE  # its own work, the network to a callee, or an unnamed call
    if peer in services:
        return peer, SERVICE  # an instrumented callee whose span was not kept
    host = peer.split(".", 1)[0]
    if "." in peer and host in services:
        return host, SERVICE  # a cluster host name of an instrumented service
    return peer, DEPENDENCY


@dataclass(slots=True)
class _Call:
    """One call of an entity: its entry span, time of its own, and whether a failure
    started in it."""

    entity: str
    entry: ScopedSpan
    own_ns: int = 0
    started_failure: bool = False
    callees: set[str] = field(default_factory=set)  # entities of the calls it made


@dataclass(slots=True)
class _Window:
    """Per entity, its calls in one window."""

    own: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    exemplars: dict[str, list[tuple[float, str, str, float, bool]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    callees: dict[str, list[set[str]]] = field(default_factory=lambda: defaultdict(list))


@dataclass(slots=True)
class _Scope:
    """What the symptom's requests reach, pooled over both windows."""

    requests: list[int] = field(default_factory=lambda: [0, 0])
    failed: list[int] = field(default_factory=lambda: [0, 0])
    latency: list[list[int]] = field(default_factory=lambda: [[], []])
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    reached: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    started: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # requests
    propagated: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # of those


class _Trace:
    """One trace's spans as a tree, cut into calls."""

    def __init__(self, spans: Mapping[str, ScopedSpan], services: frozenset[str]) -> None:
        self.spans = spans
        self.children: dict[str, list[ScopedSpan]] = defaultdict(list)
        for span in spans.values():
            if span[2] is not None and span[2] in spans:
                self.children[span[2]].append(span)
        self.services = services
        self.call_of: dict[str, _Call] = {}
        self.calls: list[_Call] = []
        for span in spans.values():
            if span[2] is None or span[2] not in spans:
                self._cut(span, None)

    def entity(self, span: ScopedSpan) -> tuple[str, str]:
        return entity_of(span, self.answered(span), self.services)

    def answered(self, span: ScopedSpan) -> bool:
        """Whether a child span ran while ``span`` waited (a consumer that starts after
        its producer ended does not answer the publish: the broker did)."""
        return any(c[6] < span[7] or _answers(span, c) for c in self.children.get(span[1], []))

    def waited(self, span: ScopedSpan) -> int:
        """How long ``span`` waited within it: while any of its children ran (the union of
        their times, clipped to the span; parallel calls overlap), and in the backoff
        before each retry of a failed call (``_backoff``)."""
        children = self.children.get(span[1], [])
        if not children:
            return 0
        length = span[7] - span[6]
        busy = [
            (span[6], span[6] + min(c[7] - c[6], length))
            if _answers(span, c)
            else (max(c[6], span[6]), min(c[7], span[7]))
            for c in children
        ]
        busy += _backoff(span, children)
        total, reached = 0, span[6]
        for lo, hi in sorted(busy):
            if hi > reached and hi > lo:
                total += hi - max(lo, reached)
                reached = hi
        return total

    def _cut(self, root: ScopedSpan, parent_call: _Call | None) -> None:
        todo = [(root, parent_call)]
        while todo:
            span, above = todo.pop()
            name, kind = self.entity(span)
            if above is None or above.entity != name or span[3] != above.entry[3]:
                call = _Call(name, span)
                self.calls.append(call)
            else:
                call = above
            self.call_of[span[1]] = call
            below = self.children.get(span[1], [])
            call.own_ns += max(0, (span[7] - span[6]) - self.waited(span))
            if span[4] == PRODUCER and kind == DEPENDENCY and below:
                # A publish's delivery: until the first consumer took the message.
                call.own_ns += max(0, min(c[6] for c in below) - span[7])
            todo.extend((child, call) for child in below)

    def duration(self, call: _Call) -> int:
        return call.entry[7] - call.entry[6]

    def blame(self, span: ScopedSpan, limits: Mapping[str, int]) -> _Call:
        """The call a failure that started at ``span`` is charged to (see the module)."""
        while True:
            slow = [
                c
                for c in self.children.get(span[1], [])
                if c[7] - c[6] > limits.get(self.call_of[c[1]].entity, 1 << 62)
            ]
            if not slow:
                return self.call_of[span[1]]
            span = max(slow, key=lambda c: (c[7] - c[6], c[1]))

    def failures(self, limits: Mapping[str, int]) -> None:
        """Mark the calls where this trace's failures started."""
        for span in self.spans.values():
            if span[8] and not any(c[8] for c in self.children.get(span[1], [])):
                self.blame(span, limits).started_failure = True

    def subtree_calls(self, entry: ScopedSpan) -> list[_Call]:
        """The calls in the subtree of ``entry`` (its own call first)."""
        seen: dict[int, _Call] = {}
        todo = [entry]
        while todo:
            span = todo.pop()
            call = self.call_of[span[1]]
            seen.setdefault(id(call), call)
            todo.extend(self.children.get(span[1], []))
        return list(seen.values())


def _answers(span: ScopedSpan, child: ScopedSpan) -> bool:
    """Whether ``child`` is the server span answering the client span ``span``: it ran
    while ``span`` waited, whatever the two hosts' clocks say (another host's clock may be
    tens of milliseconds off, so the child is counted by its length, not clipped to the
    parent's times: clipping would charge the skew to the caller as its own time)."""
    return span[4] == CLIENT and child[4] == SERVER and child[3] != span[3]


def _backoff(span: ScopedSpan, children: Sequence[ScopedSpan]) -> list[tuple[int, int]]:
    """When ``span`` waited between a failed call and its retry (the next call from it to
    the same callee): a retry's backoff, which the callee's failure caused, not ``span``'s
    own work."""
    out = []
    for failed in children:
        if not failed[8] or failed[4] not in OUTGOING or failed[5] is None:
            continue
        retry = min(
            (
                c[6]
                for c in children
                if c[5] == failed[5] and c[4] == failed[4] and c[6] >= failed[7]
            ),
            default=None,
        )
        if retry is not None:
            out.append((max(failed[7], span[6]), min(retry, span[7])))
    return out


def _limits(traces: Sequence[_Trace], baseline: tuple[int, int]) -> dict[str, int]:
    """Per entity, the call duration only 1 % of its baseline calls exceed."""
    durations: dict[str, list[int]] = defaultdict(list)
    for trace in traces:
        for call in trace.calls:
            if baseline[0] <= call.entry[6] < baseline[1]:
                durations[call.entity].append(trace.duration(call))
    out = {}
    for name, values in durations.items():
        if len(values) >= MIN_CALLS:
            values.sort()
            out[name] = values[min(len(values) - 1, int(len(values) * SLOW_QUANTILE))]
    return out


def _window_of(start: int, windows: Sequence[tuple[int, int]]) -> int | None:
    for i, (first, last) in enumerate(windows):
        if first <= start < last:
            return i
    return None


def gather(
    rows: Iterable[ScopedSpan],
    symptom: str,
    windows: Sequence[tuple[int, int]],
    services: Iterable[str],
    timeline: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The evidence of the baseline and during windows (``[start, end)`` in ns): each
    entity's calls in both, and how the symptom's requests reach it (JSON); with
    ``timeline`` (``[start, end)`` in ns, whole minutes), each entity's calls minute by
    minute over it too (``_Minutes``)."""
    known = frozenset(services)
    grouped: dict[str, dict[str, ScopedSpan]] = defaultdict(dict)
    for row in rows:
        grouped[row[0]].setdefault(row[1], row)
    traces = [_Trace(spans, known) for spans in grouped.values()]
    limits = _limits(traces, windows[0])
    seen = [_Window() for _ in windows]
    minutes = _Minutes(*timeline) if timeline else None
    scope = _Scope()
    kinds: dict[str, str] = {}
    callers: dict[str, set[str]] = defaultdict(set)
    for trace in traces:
        trace.failures(limits)
        for call in trace.calls:
            parent = trace.spans.get(call.entry[2] or "")
            if parent is not None and trace.call_of[parent[1]].entity != call.entity:
                trace.call_of[parent[1]].callees.add(call.entity)
        for call in trace.calls:
            kinds.setdefault(call.entity, trace.entity(call.entry)[1])
            parent = trace.spans.get(call.entry[2] or "")
            if parent is not None and trace.call_of[parent[1]].entity != call.entity:
                callers[call.entity].add(trace.call_of[parent[1]].entity)
            # a piece of a call whose entry span was lost: its failures count, not its time
            piece = (
                parent is None
                and call.entry[2] is not None
                and call.entry[4] in FRAGMENTS
                and call.entry[3] == call.entity  # not a whole call to a dependency
            )
            w = _window_of(call.entry[6], windows)
            if w is not None:
                _count(seen[w], call, trace.duration(call), kinds[call.entity], piece)
            if minutes is not None and not piece:
                minutes.count(call)
        _scope(trace, symptom, windows, scope)
    out = _to_json(seen, scope, kinds, callers)
    if minutes is not None:
        out["timeline"] = minutes.to_json()
    return out


class _Minutes:
    """Each entity's calls minute by minute over ``[start, end)``: when its own calls left
    their usual range is told from these (``keel.bridge.diagnosis``)."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.own: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.failures: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    def count(self, call: _Call) -> None:
        start = call.entry[6]
        if self.start <= start < self.end:
            minute = (start - self.start) // MINUTE_NS
            self.own[call.entity][minute].append(max(call.own_ns, FLOOR_NS))
            self.failures[call.entity][minute] += call.started_failure

    def to_json(self) -> dict[str, Any]:
        """``{"start": ns, "minutes": n, "entities": {name: [[calls, median ms,
        failures] per minute]}}``."""
        count = (self.end - self.start) // MINUTE_NS
        entities = {}
        for name in sorted(self.own):
            own, failures = self.own[name], self.failures[name]
            entities[name] = [
                [
                    len(own.get(m, ())),
                    round(statistics.median(own[m]) / 1e6, 3) if own.get(m) else 0.0,
                    failures.get(m, 0),
                ]
                for m in range(count)
            ]
        return {"start": self.start, "minutes": count, "entities": entities}


def own_onset(minutes: Sequence[Sequence[float]], change: Mapping[str, Any]) -> tuple[int, float]:
    """When a changed entity's own calls stepped from their usual level to their changed
    one: (the minute, how well a step fits, 0..1).

    ``minutes`` holds ``[calls, median ms, failures]`` per minute (a ``timeline`` entry of
    ``gather``); ``change`` is how the entity changed (``keel.bridge.diagnosis``:
    ``slower``, ``failing``, ``time_z``, ``failure_z``, and ``median_ms`` and
    ``failure_rate`` before and during). Each minute's level is placed on a scale from
    the baseline's (0) to the during window's (1): the log of its median own time when
    the entity got slower, else its share of calls where failures started (clipped to
    -0.5..1.5: one odd minute of few calls must not decide). The step from 0 to 1 that
    fits those levels best (calls weigh in; at most 5 for a median) gives the minute;
    the fit is the share of the levels' variation that the step explains. An abrupt fault
    fits a step well (0.8-1 on clear faults); a gradual drift (a leak that doubles every
    few minutes) fits no step (below 0.5), so its minute means little.
    """
    points: list[tuple[int, float, float]] = []
    slower = change["slower"] and (not change["failing"] or change["time_z"] >= change["failure_z"])
    for i, (calls, median_ms, failures) in enumerate(minutes):
        if not calls:
            continue
        if slower:
            m0, m1 = change["median_ms"]
            level = math.log(max(median_ms, 1e-3) / m0) / math.log(m1 / m0)
            weight = min(calls, 5)
        else:
            p0, p1 = change["failure_rate"]
            level, weight = (failures / calls - p0) / (p1 - p0), calls
        points.append((i, min(1.5, max(-0.5, level)), weight))
    if len(points) < 4:
        return 0, 0.0
    total = sum(w for _, _, w in points)
    mean = sum(u * w for _, u, w in points) / total
    spread = sum(w * (u - mean) ** 2 for _, u, w in points)
    # cost of a step at points[k]: levels before it should be 0, from it on 1
    after = sum(w * (u - 1) ** 2 for _, u, w in points)
    before, best, at = 0.0, math.inf, points[0][0]
    for k in range(1, len(points)):
        _, u, w = points[k - 1]
        before += w * u**2
        after -= w * (u - 1) ** 2
        if before + after < best:
            best, at = before + after, points[k][0]
    return at, 1 - best / spread if spread > 0 else 0.0


def _count(window: _Window, call: _Call, duration: int, kind: str, piece: bool) -> None:
    """Count a call; its own time unless it stands for a service's lost span (a caller's
    client span that no span of the callee answered: its length is the callee's whole
    subtree, not the callee's own time) or is a ``piece`` of a call (``FRAGMENTS``)."""
    if not piece and (kind != SERVICE or call.entry[3] == call.entity):
        window.own[call.entity].append(max(call.own_ns, FLOOR_NS))
        window.callees[call.entity].append(call.callees)
    window.calls[call.entity] += 1
    window.failures[call.entity] += call.started_failure
    rank = (1e18 if call.started_failure else 0.0) + call.own_ns
    kept = window.exemplars[call.entity]
    if len(kept) < EXEMPLARS or rank > kept[-1][0]:
        entry = call.entry
        kept.append((rank, entry[0], entry[1], duration / 1e6, call.started_failure))
        kept.sort(key=lambda e: (-e[0], e[1], e[2]))
        del kept[EXEMPLARS:]


def _scope(trace: _Trace, symptom: str, windows: Sequence[tuple[int, int]], scope: _Scope) -> None:
    """Count what each of the symptom's requests in this trace reaches."""
    for call in trace.calls:
        entry = call.entry
        if call.entity != symptom or entry[3] != symptom or entry[4] in OUTGOING:
            continue
        w = _window_of(entry[6], windows)
        if w is None:
            continue
        scope.requests[w] += 1
        scope.failed[w] += bool(entry[8])
        scope.latency[w].append(entry[7] - entry[6])
        reached = trace.subtree_calls(entry)
        for name in {c.entity for c in reached}:
            scope.reached[name] += 1
        for below in reached:
            scope.calls[below.entity] += 1
        for name in {c.entity for c in reached if c.started_failure}:
            scope.started[name] += 1
            scope.propagated[name] += bool(entry[8])


def _stats(own: Sequence[int], failures: int, calls: int) -> dict[str, Any]:
    """A window's ``calls`` of an entity: their failures, and the ``timed`` ones' own time."""
    logs = [math.log(ns / 1e6) for ns in own]
    n = len(own)
    return {
        "calls": calls,
        "timed": n,
        "median_ms": statistics.median(own) / 1e6 if n else 0.0,
        "mean_log": statistics.fmean(logs) if n else 0.0,
        "sd_log": statistics.pstdev(logs) if n > 1 else 0.0,
        "failures": failures,
        "failure_rate": failures / calls if calls else 0.0,
    }


def _without(name: str, seen: Sequence[_Window]) -> dict[str, Any]:
    """{callee: {"baseline": stats, "during": stats}} of the calls of ``name`` that did
    not call that callee (a service slower only in the calls that wait for a slower
    callee is waiting for it: ``diagnosis``)."""
    pairs = [list(zip(w.own.get(name, []), w.callees.get(name, []), strict=True)) for w in seen]
    callees = sorted({c for calls in pairs for _own, made in calls for c in made})
    out: dict[str, Any] = {}
    for callee in callees:
        rest = [[own for own, made in calls if callee not in made] for calls in pairs]
        if all(rest) and len(rest[0]) < len(pairs[0]):
            out[callee] = {
                label: _stats(values, 0, len(values))
                for label, values in (("baseline", rest[0]), ("during", rest[1]))
            }
    return out


def _to_json(
    seen: Sequence[_Window],
    scope: _Scope,
    kinds: Mapping[str, str],
    callers: Mapping[str, set[str]],
) -> dict[str, Any]:
    requests = sum(scope.requests)
    entities: dict[str, Any] = {}
    for name in sorted(kinds):
        started = scope.started.get(name, 0)
        entities[name] = {
            "kind": kinds[name],
            **{
                label: _stats(w.own.get(name, []), w.failures.get(name, 0), w.calls.get(name, 0))
                for label, w in zip(("baseline", "during"), seen, strict=True)
            },
            "calls_per_request": scope.calls.get(name, 0) / requests if requests else 0.0,
            "reach": scope.reached.get(name, 0) / requests if requests else 0.0,
            "propagation": scope.propagated.get(name, 0) / started if started else 1.0,
            "exemplars": [
                {"trace_id": t, "span_id": s, "duration_ms": round(d, 3), "error": e}
                for _rank, t, s, d, e in seen[1].exemplars.get(name, [])
            ],
        }
        if kinds[name] == SERVICE:
            entities[name]["without"] = _without(name, seen)
    symptom = {
        label: {
            "requests": scope.requests[i],
            "failed": scope.failed[i],
            "error_rate": scope.failed[i] / scope.requests[i] if scope.requests[i] else 0.0,
            "median_ms": statistics.median(scope.latency[i]) / 1e6 if scope.latency[i] else 0.0,
        }
        for i, label in enumerate(("baseline", "during"))
    }
    return {
        "symptom": symptom,
        "entities": entities,
        "callers": {name: sorted(c) for name, c in sorted(callers.items())},
    }
