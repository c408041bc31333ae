"""``keel bridge sample-data``: a realistic, deterministic dataset with known root causes.

Fifteen services of a small shop call each other along four request routes (checkout,
search, product page, add to cart). Hours of baseline traffic are written as OTLP/JSON
(``traces/traces-HH.jsonl``, one export request per minute per line, as the collector's
file exporter does), with a daily rhythm, log-normal latencies and a small base error
rate per service. Deploys and configuration changes happen throughout the day.

Incidents are injected one per slot of 50 minutes, of three kinds:

* ``bad_deploy``: a release of a downstream service makes it fail (and slow down) from
  a minute or two after the release; its callers fail with it;
* ``saturation``: a datastore or dependency slows down several-fold and times out, with
  no change anywhere near it;
* ``config_change``: a configuration change lowers a client timeout, so the service fails
  calls to a dependency that is itself healthy.

Many incidents also get a **red herring**: a harmless deploy shortly before the onset,
on the symptomatic service or on an unrelated one. About a quarter of the incidents do
not name the affected service. The seed's incident, ``INC-2026-0142`` (card payments
failing at checkout after configuration change ``d-8812`` of ``payments``; names no
service), is always there.

The truth is written to ``ground-truth.json`` beside the data, for tests and curious
people; the diagnosis never reads it. Same seed, same bytes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.bridge.records import NS_PER_MINUTE, NS_PER_S, format_time
from keel.bridge.sample_shop import (
    ANCESTORS,
    AUTHORS,
    BAD_DEPLOY_TARGETS,
    BAD_NOTES,
    CONFIG_NOTES,
    CONFIG_TARGETS,
    RELEASE_NOTES,
    ROUTES,
    SATURATION_TARGETS,
    SERVICES,
    SIGMA,
    Node,
    route_median,
)

__all__ = [
    "GROUND_TRUTH",
    "KINDS",
    "SEED_DEPLOY",
    "SEED_INCIDENT",
    "SEED_SERVICE",
    "SERVICES",
    "SampleSummary",
    "generate",
]

GROUND_TRUTH = "ground-truth.json"
KINDS = ("bad_deploy", "saturation", "config_change")
SEED_INCIDENT = "INC-2026-0142"
SEED_DEPLOY = "d-8812"
SEED_SERVICE = "payments"  # what the user answers in the seed's story
DAY = int(datetime(2026, 3, 14, tzinfo=UTC).timestamp()) * NS_PER_S
SLOT = 50  # minutes between two injected incidents
SEED_ONSET = DAY + (9 * 60 + 41) * NS_PER_MINUTE + 30 * NS_PER_S  # 09:41:30


@dataclass
class Effect:
    """What an incident does to the traffic between ``start`` and ``end`` (ns)."""

    start: int
    end: int
    service: str
    latency: float = 1.0  # multiplier of the service's own time
    delay_ms: float = 0.0  # queueing delay added to each of its spans (saturation)
    errors: float = 0.0  # extra probability that its spans fail
    timeout_ms: float | None = None  # config_change: client timeout towards `dependency`
    dependency: str | None = None


@dataclass
class Dataset:
    """What the generator accumulates before writing."""

    incidents: list[dict[str, Any]] = field(default_factory=list)
    deploys: list[dict[str, Any]] = field(default_factory=list)
    truth: list[dict[str, Any]] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)


@dataclass(frozen=True)
class SampleSummary:
    """What ``generate`` wrote."""

    directory: Path
    incidents: int
    deploys: int
    spans: int
    trace_files: int
    first: str
    last: str


MAX_INCIDENTS = 60
"""The most injected incidents one dataset holds: each takes one of as many incident
numbers, drawn once from the seeded stream (so a count below it keeps the same bytes)."""


class _Writer:
    """Makes ids, deploy records and incidents from one seeded random stream."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.versions: dict[str, list[int]] = {s: [1, rng.randrange(2, 9), 0] for s in SERVICES}
        self.numbers = rng.sample(range(200, 999), MAX_INCIDENTS)

    def hexid(self, size: int) -> str:
        return f"{self.rng.getrandbits(size * 8):0{size * 2}x}"

    def deploy(
        self,
        data: Dataset,
        service: str,
        at: int,
        summary: str,
        kind: str,
        *,
        did: str | None = None,
    ) -> str:
        version = self.versions[service]
        if kind == "code":
            version[2] += 1
            label = f"{version[0]}.{version[1]}.{version[2]}"
        else:
            label = f"{version[0]}.{version[1]}.{version[2]}+cfg{self.rng.randrange(10, 99)}"
        record = {
            "id": did or "",
            "service": service,
            "version": label,
            "commit": self.hexid(20)[:12],
            "author": self.rng.choice(AUTHORS),
            "deployed_at": format_time(at),
            "summary": summary,
            "kind": kind,
        }
        data.deploys.append(record)
        return did or ""


def _slots(count: int, rng: random.Random) -> list[int]:
    """Onset times: one per slot, away from the seed incident's hour."""
    onsets: list[int] = []
    minute = 80  # an hour and more of quiet traffic first
    while len(onsets) < count:
        at = DAY + minute * NS_PER_MINUTE + rng.randrange(0, 50) * NS_PER_S
        if abs(at - SEED_ONSET) >= SLOT * NS_PER_MINUTE:
            onsets.append(at)
        minute += SLOT
    return onsets


def _symptom_of(service: str, rng: random.Random, *, itself: bool) -> str:
    """The service where people notice the trouble: the root itself, or a caller."""
    callers = sorted(ANCESTORS[service])
    if itself or not callers:
        return service
    return rng.choice(callers)


def _herrings(data: Dataset, writer: _Writer, root: str, symptom: str, onset: int) -> list[int]:
    """Maybe a harmless deploy shortly before the onset, on the symptomatic service or on
    one that is not anomalous; the indexes of the deploys written."""
    rng = writer.rng
    if rng.random() >= 0.65:
        return []
    anomalous = {root, *ANCESTORS[root]}
    target = (
        symptom
        if rng.random() < 0.5 and symptom != root
        else rng.choice([s for s in SERVICES if s not in anomalous])
    )
    config = rng.random() < 0.3
    note = rng.choice(CONFIG_NOTES) if config else f"Release: {rng.choice(RELEASE_NOTES)}"
    at = onset - rng.randrange(60, 480) * NS_PER_S
    writer.deploy(data, target, at, note, "config" if config else "code", did="?herring")
    return [len(data.deploys) - 1]


def _inject(data: Dataset, writer: _Writer, kind: str, onset: int, number: int) -> None:
    rng = writer.rng
    length = rng.randrange(8, 14) * NS_PER_MINUTE + rng.randrange(0, 60) * NS_PER_S
    cause_deploy: str | None = None
    if kind == "bad_deploy":
        root = rng.choice(BAD_DEPLOY_TARGETS)
        at = onset - rng.randrange(30, 180) * NS_PER_S
        cause_deploy = writer.deploy(
            data, root, at, f"Release: {rng.choice(BAD_NOTES)}", "code", did="?"
        )
        effect = Effect(
            onset,
            onset + length,
            root,
            latency=rng.uniform(1.2, 1.8),
            errors=rng.uniform(0.12, 0.3),
        )
        symptom = _symptom_of(root, rng, itself=False)
    elif kind == "saturation":
        root = rng.choice(SATURATION_TARGETS)
        effect = Effect(
            onset,
            onset + length,
            root,
            latency=rng.uniform(2.0, 4.0),
            delay_ms=rng.uniform(80, 300),
            errors=rng.uniform(0.04, 0.1),
        )
        symptom = _symptom_of(root, rng, itself=False)
    else:
        root, dependency = rng.choice(CONFIG_TARGETS)
        median = route_median(dependency)
        timeout = round(median * rng.uniform(1.1, 1.4))
        at = onset - rng.randrange(20, 120) * NS_PER_S
        note = f"config: lower {dependency} client timeout from 2s to {timeout}ms"
        cause_deploy = writer.deploy(data, root, at, note, "config", did="?")
        effect = Effect(onset, onset + length, root, timeout_ms=timeout, dependency=dependency)
        symptom = _symptom_of(root, rng, itself=rng.random() < 0.3)
    data.effects.append(effect)
    if cause_deploy is not None:  # the fix: a rollback when the incident is over
        writer.deploy(
            data, root, onset + length + 20 * NS_PER_S, "Roll back the previous release", "code"
        )
    herrings = _herrings(data, writer, root, symptom, onset)
    opened = onset + rng.randrange(120, 300) * NS_PER_S
    incident_id = f"INC-2026-{number:04d}"
    named = rng.random() < 0.75
    slow = kind == "saturation"
    data.incidents.append(
        {
            "id": incident_id,
            "title": f"{'Slow responses' if slow else 'Elevated errors'} on {symptom}",
            "severity": rng.choice(("SEV1", "SEV2", "SEV2", "SEV3")),
            "opened_at": format_time(opened),
            "symptoms": [
                f"{symptom}: {'p95 latency above SLO' if slow else '5xx rate above SLO'}",
                "alert fired by the SLO burn-rate monitor",
            ],
            "service": symptom if named else None,
        }
    )
    data.truth.append(
        {
            "incident_id": incident_id,
            "kind": kind,
            "root_service": root,
            "deploy_index": len(data.deploys) - (3 if herrings else 2)
            if cause_deploy is not None
            else None,
            "symptom_service": symptom,
            "onset": format_time(onset),
            "herring_indexes": herrings,
        }
    )


def _seed_incident(data: Dataset, writer: _Writer) -> None:
    """The seed's story: card payments fail at checkout after a payments config change."""
    onset = SEED_ONSET
    writer.deploy(
        data,
        "web-frontend",
        onset - 330 * NS_PER_S,
        "Release: new copy on the checkout button",
        "code",
        did="d-8809",
    )
    writer.deploy(
        data,
        "payments",
        onset - 30 * NS_PER_S,
        "config: lower card-gateway client timeout from 2s to 200ms",
        "config",
        did=SEED_DEPLOY,
    )
    end = onset + 14 * NS_PER_MINUTE
    data.effects.append(Effect(onset, end, "payments", timeout_ms=200, dependency="card-gateway"))
    writer.deploy(data, "payments", end + 20 * NS_PER_S, "Roll back d-8812", "config", did="d-8815")
    data.incidents.append(
        {
            "id": SEED_INCIDENT,
            "title": "Checkout failing for card payments",
            "severity": "SEV2",
            "opened_at": format_time(onset + 150 * NS_PER_S),
            "symptoms": [
                "checkout error rate above 5% (SLO 1%)",
                "customers report 'payment declined' for valid cards",
            ],
            "service": None,
        }
    )
    data.truth.append(
        {
            "incident_id": SEED_INCIDENT,
            "kind": "config_change",
            "root_service": "payments",
            "deploy_id": SEED_DEPLOY,
            "symptom_service": "payments",
            "onset": format_time(onset),
            "herring_ids": ["d-8809"],
        }
    )


def _background_deploys(data: Dataset, writer: _Writer, end: int) -> None:
    """Harmless deploys all day long (never on a root cause's service near its onset)."""
    rng = writer.rng
    at = DAY + rng.randrange(5, 30) * NS_PER_MINUTE
    quiet = [(e.service, e.start - 90 * NS_PER_MINUTE, e.end) for e in data.effects]
    while at < end:
        service = rng.choice(SERVICES)
        if not any(s == service and a <= at <= b for s, a, b in quiet):
            config = rng.random() < 0.25
            note = rng.choice(CONFIG_NOTES) if config else f"Release: {rng.choice(RELEASE_NOTES)}"
            writer.deploy(data, service, at, note, "config" if config else "code")
        at += int(rng.expovariate(1 / 35) * NS_PER_MINUTE) + NS_PER_MINUTE


class _Traffic:
    """Generates the spans of one minute of requests under the active effects."""

    def __init__(self, writer: _Writer, effects: list[Effect]) -> None:
        self.writer = writer
        self.rng = writer.rng
        self.effects = effects
        self.base_errors = {s: self.rng.uniform(0.001, 0.006) for s in SERVICES}

    def active(self, at: int) -> list[Effect]:
        return [e for e in self.effects if e.start <= at < e.end]

    def span(  # noqa: PLR0917 - the hot recursive path of the generator
        self,
        node: Node,
        start: int,
        trace: str,
        parent: str | None,
        effects: list[Effect],
        out: dict[str, list[dict[str, Any]]],
    ) -> tuple[int, bool]:
        rng = self.rng
        span_id = self.writer.hexid(8)
        own = node.median_ms * math.exp(rng.gauss(0, SIGMA.get(node.service, 0.35)))
        failing = rng.random() < self.base_errors[node.service]
        timeout: Effect | None = None
        for e in effects:
            if e.service == node.service:
                own = own * e.latency + e.delay_ms * rng.uniform(0.5, 1.5)
                failing = failing or rng.random() < e.errors
                if e.timeout_ms is not None:
                    timeout = e
        cursor = start + int(own * 500_000)  # half the own time before the calls
        message = "internal error" if failing else ""
        for child, probability in node.children:
            if rng.random() >= probability:
                continue
            begin = cursor + rng.randrange(50_000, 400_000)
            child_end, child_failed = self.span(child, begin, trace, span_id, effects, out)
            limit = timeout.timeout_ms if timeout and timeout.dependency == child.service else None
            if limit is not None and child_end - begin > limit * 1_000_000:
                cursor = begin + int(limit * 1_000_000)  # the client gave up
                failing, message = True, f"{child.service}: deadline exceeded after {limit:g}ms"
            else:
                cursor = child_end
                if child_failed and rng.random() < 0.9:
                    failing, message = True, f"{child.service} failed"
        end = cursor + int(own * 500_000)
        span: dict[str, Any] = {
            "traceId": trace,
            "spanId": span_id,
            "name": node.operation,
            "kind": 2,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end),
            "status": {"code": 2, "message": message} if failing else {},
        }
        if parent is not None:
            span["parentSpanId"] = parent
        out.setdefault(node.service, []).append(span)
        return end, failing

    def minute(self, at: int, rate: float) -> tuple[dict[str, list[dict[str, Any]]], int]:
        rng = self.rng
        hour = (at - DAY) / (3600 * NS_PER_S)
        # A daily rhythm: quiet at night, busiest in the afternoon.
        mean = rate * (1.0 + 0.35 * math.sin((hour - 9) / 24 * 2 * math.pi))
        count = _poisson(rng, mean)
        out: dict[str, list[dict[str, Any]]] = {}
        routes = [r for r, _ in ROUTES]
        weights = [w for _, w in ROUTES]
        effects = self.active(at) + self.active(at + NS_PER_MINUTE - 1)
        effects = list({id(e): e for e in effects}.values())
        for start in sorted(at + rng.randrange(0, NS_PER_MINUTE) for _ in range(count)):
            route = rng.choices(routes, weights)[0]
            live = [e for e in effects if e.start <= start < e.end]
            self.span(route, start, self.writer.hexid(16), None, live, out)
        return out, sum(len(v) for v in out.values())


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method is fine for the means used here (tens to hundreds); a normal
    # approximation above 500 keeps it fast for benchmark-sized traffic.
    if mean > 500:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _request(spans: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [{"scope": {"name": "keel.bridge.sample"}, "spans": spans[service]}],
            }
            for service in sorted(spans)
        ]
    }


def _number_deploys(data: Dataset, rng: random.Random) -> list[dict[str, Any]]:
    """Give deploys ids in time order (so they read like a real deploy log); resolve the
    ground truth's references to them. Returns the deploys in time order."""
    order = sorted(range(len(data.deploys)), key=lambda i: data.deploys[i]["deployed_at"])
    fixed = {d["id"] for d in data.deploys if d["id"].startswith("d-")}
    ids: dict[int, str] = {}
    counter = 6100
    for i in order:
        if data.deploys[i]["id"].startswith("d-"):
            ids[i] = data.deploys[i]["id"]
            continue
        counter += rng.randrange(1, 4)
        while f"d-{counter}" in fixed:
            counter += 1
        ids[i] = f"d-{counter}"
    for i, record in enumerate(data.deploys):
        record["id"] = ids[i]
    for truth in data.truth:
        if "deploy_index" in truth:
            index = truth.pop("deploy_index")
            truth["deploy_id"] = ids[index] if index is not None else None
            truth["herring_ids"] = [ids[i] for i in truth.pop("herring_indexes")]
    return [data.deploys[i] for i in order]


def _write_traces(dest: Path, traffic: _Traffic, end: int, rate: float) -> tuple[int, int]:
    """One OTLP/JSON request per minute, one file per hour; returns (spans, files)."""
    traces = dest / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    for old in traces.glob("traces-*.jsonl"):
        old.unlink()
    spans = files = 0
    for hour in range(0, (end - DAY) // NS_PER_MINUTE, 60):
        with (traces / f"traces-{hour // 60:02d}.jsonl").open("w", encoding="utf-8") as file:
            files += 1
            for minute in range(hour, min(hour + 60, (end - DAY) // NS_PER_MINUTE)):
                batch, count = traffic.minute(DAY + minute * NS_PER_MINUTE, rate)
                spans += count
                file.write(json.dumps(_request(batch), separators=(",", ":")) + "\n")
    return spans, files


def generate(
    dest: Path,
    *,
    seed: int = 7,
    incidents: int = 12,
    rate: float = 30.0,
    log: Callable[[str], object] | None = None,
) -> SampleSummary:
    """Write a sample dataset into ``dest`` (created if needed; files there are replaced).

    Args:
        seed: the random seed: the same seed gives the same bytes.
        incidents: injected incidents besides the seed's own.
        rate: root requests per minute on average (spans are ~8.6 times that).

    Raises:
        ValueError: more than :data:`MAX_INCIDENTS` incidents.
    """
    if not 0 <= incidents <= MAX_INCIDENTS:
        raise ValueError(f"incidents must be 0 to {MAX_INCIDENTS}, not {incidents}")
    rng = random.Random(seed)  # noqa: S311 - sample data, reproducible by seed
    writer = _Writer(rng)
    data = Dataset()
    _seed_incident(data, writer)
    kinds = [KINDS[i % len(KINDS)] for i in range(incidents)]
    rng.shuffle(kinds)
    numbers = iter(n for n in writer.numbers if n != 142)
    for kind, onset in zip(kinds, _slots(incidents, rng), strict=True):
        _inject(data, writer, kind, onset, next(numbers))
    last = max(e.end for e in data.effects)
    end = (last // NS_PER_MINUTE + 20) * NS_PER_MINUTE
    _background_deploys(data, writer, end)
    dest.mkdir(parents=True, exist_ok=True)
    deploys = _number_deploys(data, rng)
    spans, files = _write_traces(dest, _Traffic(writer, data.effects), end, rate)

    incidents_sorted = sorted(data.incidents, key=lambda i: (i["opened_at"], i["id"]))
    _write_json(dest / "incidents.json", incidents_sorted)
    _write_json(dest / "deploys.json", deploys)
    truth_sorted = sorted(data.truth, key=lambda t: t["onset"])
    _write_json(
        dest / GROUND_TRUTH,
        {
            "about": "The injected root causes. The diagnosis never reads this file.",
            "seed": seed,
            "incidents": truth_sorted,
        },
    )
    summary = SampleSummary(
        dest, len(incidents_sorted), len(deploys), spans, files, format_time(DAY), format_time(end)
    )
    if log is not None:
        log(
            f"sample data in {dest}: {summary.incidents} incidents, {summary.deploys} deploys, "
            f"{spans:,} spans in {files} OTLP/JSON files ({summary.first} .. {summary.last})"
        )
    return summary


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
