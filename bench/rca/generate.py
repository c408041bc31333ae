"""Write a blinded root-cause evaluation dataset for the Incident Bridge.

    uv run python bench/rca/generate.py --seed 2001 --out /tmp/rca-2001 [--spans 1000000]

The dataset directory holds what the Bridge reads (``incidents.json``, ``deploys.csv``
or ``deploys.json``, ``traces/*.jsonl`` in the OpenTelemetry Collector ``file`` exporter
format: one ``ExportTraceServiceRequest`` per line) and ``answers.json``, the injected
truth (never give it to the Bridge). See ``bench/rca/README.md``.

Seeds 1001-1003 are the held-out evaluation seeds, 2001-2003 the ones to look at while
developing; nothing here depends on which is which. Same seed and ``--spans``, same bytes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import random
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import NS_MIN, NS_MS, Effect, Effects, Simulator
from topology import Endpoint, Service, Topology, build

NS_S = 1_000_000_000
KINDS = [
    "service_self_slowdown",
    "dependency_saturation",
    "queue_or_external",
    "fanout_dilution",
    "bad_deploy",
    "overlapping",
    "noise_only",
]
AUTHORS = [
    "a.mensah",
    "j.kowalski",
    "p.nair",
    "l.ferreira",
    "s.okonkwo",
    "m.tanaka",
    "r.haddad",
    "e.lindqvist",
    "d.obi",
    "c.moreau",
    "h.ivanova",
    "t.silva",
]
SUMMARIES_CODE = [
    "bump grpc-java to 1.64.2",
    "refactor retry policy for downstream client",
    "add index hint for lookup query",
    "upgrade base image to debian bookworm 12.8",
    "feature flag: new pricing explanation text",
    "log request ids at debug level",
    "split handler into smaller functions",
    "update carrier code mapping table",
    "remove dead code for v1 labels",
    "cache warmup on start",
    "connection pool metrics",
    "switch JSON library to faster one",
    "new endpoint behind flag (off)",
    "batch writes to event store",
    "tighten input validation on addresses",
    "rewrite pagination of search results",
    "upgrade ORM minor version",
]
SUMMARIES_CONFIG = [
    "config: raise log level to INFO",
    "config: pool size 20 -> 32",
    "config: client timeout 2s -> 1500ms",
    "config: enable gzip on responses",
    "config: rotate TLS certificate",
    "config: feature flag rollout 10% -> 50%",
    "config: GC tuning (G1 region size)",
    "config: rate limit 200 -> 250 rps",
    "config: replica count 3 -> 4",
    "config: circuit breaker threshold 50% -> 40%",
]
TITLES = {
    "latency": [
        "Slow responses reported by merchants",
        "Latency alert: p99 above SLO",
        "Driver app sluggish during scans",
        "Support tickets: pages timing out",
        "Tracking page loads slowly",
        "Partner API calls slow",
    ],
    "errors": [
        "Error rate alert firing",
        "Merchants report failed requests",
        "5xx spike on public API",
        "Intermittent failures reported by partners",
        "Label creation failing for some merchants",
        "Checkout of shipments failing",
    ],
}


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns // NS_S, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class DeployRec:
    id: str
    service: str
    deployed_at: int
    summary: str
    kind: str
    author: str
    commit: str
    version: str = ""


@dataclass
class Truth:
    id: str
    kind: str
    variant: str
    cause: str | None
    cause_type: str | None
    aliases: list[str]
    onset: int | None
    effect_start: int | None
    effect_end: int | None
    opened_at: int
    symptom: str
    symptom_type: str
    deploy: DeployRec | None = None  # the bad deploy
    effect: dict[str, Any] = field(default_factory=dict)
    related: str | None = None
    severity: str = "SEV3"


class Planner:
    """Incidents, the faults behind them, and the deploy log around them."""

    def __init__(
        self,
        topo: Topology,
        rng: random.Random,
        start: int,
        share: dict[str, float],
        reach: dict[str, float],
    ) -> None:
        self.topo = topo
        self.reach = reach
        self.rng = rng
        self.start = start
        self.share = share
        self.effects: list[Effect] = []
        self.truths: list[Truth] = []
        self.deploys: list[DeployRec] = []
        self.quiet: list[tuple[str, int, int]] = []  # (service, from, to): no harmless deploys
        self.ancestors = self._ancestors()
        self.next_id = rng.randint(3000, 7000)
        self.cycle: dict[str, list[str]] = {}

    def _ancestors(self) -> dict[str, dict[str, int]]:
        callers = {k: set(v) for k, v in self.topo.callers.items()}
        for s in self.topo.services.values():  # a queue worker's upstream: its producers
            for ep in s.endpoints:
                if ep.topic:
                    broker = next(d for d in self.topo.deps.values() if d.type == "queue")
                    callers.setdefault(s.name, set()).update(callers.get(broker.name, set()))
        out: dict[str, dict[str, int]] = {}
        for node in [*self.topo.services, *self.topo.deps]:
            dist: dict[str, int] = {}
            frontier = {node}
            d = 0
            while frontier and d < 6:
                d += 1
                nxt = set()
                for n in sorted(frontier):
                    for c in sorted(callers.get(n, ())):
                        if c not in dist and c != node:
                            dist[c] = d
                            nxt.add(c)
                frontier = nxt
            out[node] = dist
        return out

    def _pick(self, key: str, candidates: list[str]) -> str:
        """Cycle through a shuffled candidate list, so causes vary across incidents."""
        if not self.cycle.get(key):
            pool = list(candidates)
            self.rng.shuffle(pool)
            self.cycle[key] = pool
        return self.cycle[key].pop()

    def _busy(self, names: list[str], floor: float) -> list[str]:
        return [n for n in names if self.share.get(n, 0.0) >= floor]

    def _symptom(self, cause: str, *, prefer_far: bool = False) -> str:
        anc = {
            n: d
            for n, d in self.ancestors[cause].items()
            if self.topo.services[n].instrumented and self.topo.services[n].role != "worker"
        }
        # where the reporter would notice: a busy service whose requests mostly reach the
        # cause (calls of the cause per request of that service, from the calibration)
        busy = {
            n: d
            for n, d in anc.items()
            if self.share.get(n, 0.0) >= 0.15 and self.reach.get(f"{n}>{cause}", 0.0) >= 0.4
        }
        busy = busy or {
            n: d
            for n, d in anc.items()
            if self.share.get(n, 0.0) >= 0.15 and self.reach.get(f"{n}>{cause}", 0.0) >= 0.15
        }
        anc = busy or anc
        if not anc:
            return self.topo.edge.name
        if prefer_far:
            return self.topo.edge.name if self.topo.edge.name in anc else max(anc, key=anc.get)
        near = [n for n, d in anc.items() if d == 1] if self.rng.random() < 0.6 else []
        near = near or [n for n, d in anc.items() if d <= 2]
        return self.rng.choice(near or list(anc))

    def _aliases(self, name: str) -> tuple[str, list[str]]:
        if name in self.topo.deps:
            dep = self.topo.deps[name]
            return dep.type, list(dep.aliases)
        return "service", [name]

    def _add(self, truth: Truth) -> Truth:
        self.truths.append(truth)
        return truth

    def _new_id(self) -> str:
        self.next_id += self.rng.randint(1, 9)
        return f"OPS-{self.next_id}"

    def deploy(self, service: str, at: int, *, config: bool | None = None) -> DeployRec:
        rng = self.rng
        config = rng.random() < 0.2 if config is None else config
        summary = rng.choice(SUMMARIES_CONFIG if config else SUMMARIES_CODE)
        rec = DeployRec(
            "",
            service,
            at,
            summary,
            "config" if config else "code",
            rng.choice(AUTHORS),
            f"{rng.getrandbits(48):012x}",
        )
        self.deploys.append(rec)
        return rec

    # one slot per incident (two for an overlapping pair); returns the slot's end
    def slot(self, kind: str, cursor: int) -> int:
        rng = self.rng
        # a leak's deploy (20-60 min before its onset) stays inside its own slot
        lead = (rng.randint(70, 80) if kind == "bad_deploy_leak" else rng.randint(15, 20)) * NS_MIN
        onset = cursor + lead + rng.randint(0, 59) * NS_S
        length = rng.randint(10, 20) * NS_MIN
        end = onset + length
        getattr(self, "_" + kind)(onset, end)
        return end + rng.randint(6, 10) * NS_MIN

    def _incident(
        self,
        kind: str,
        variant: str,
        cause: str | None,
        onset: int,
        end: int,
        effect: Effect | None,
        symptom: str,
        symptom_type: str,
        delay_min: tuple[int, int] = (3, 9),
    ) -> Truth:
        cause_type, aliases = self._aliases(cause) if cause else (None, [])
        opened = onset + self.rng.randint(delay_min[0] * 60, delay_min[1] * 60) * NS_S
        if effect is not None:  # opened while it is still going on
            opened = min(opened, end - self.rng.randint(60, 180) * NS_S)
        if effect is not None:
            self.effects.append(effect)
            self.quiet.append((cause or "", onset - 120 * NS_MIN, end + 10 * NS_MIN))
        desc = (
            {}
            if effect is None
            else {
                "latency_x": round(effect.lat, 2),
                "error_rate_added": round(effect.err, 3),
                "shape": effect.shape,
            }
        )
        if effect is not None and effect.lag != 1.0:
            desc["queue_lag_x"] = round(effect.lag, 1)
        big = effect is not None and (effect.lat >= 6 or effect.err >= 0.25)
        return self._add(
            Truth(
                self._new_id(),
                kind,
                variant,
                cause,
                cause_type,
                aliases,
                onset,
                effect.start if effect else None,
                end if effect else None,
                opened,
                symptom,
                symptom_type,
                effect=desc,
                severity="SEV2" if big else "SEV3",
            )
        )

    def _maybe_symptom_deploy(self, truth: Truth, onset: int) -> None:
        if truth.symptom != truth.cause and self.rng.random() < 0.5:
            self.deploy(truth.symptom, onset - self.rng.randint(60, 600) * NS_S)

    def _fault(
        self,
        target: str,
        onset: int,
        end: int,
        *,
        lat_range: tuple[float, float],
        err_range: tuple[float, float],
        p_errors: float,
    ) -> tuple[Effect, str]:
        rng = self.rng
        if rng.random() < p_errors:
            eff = Effect(target, onset, end, lat=rng.uniform(1.0, 1.6), err=rng.uniform(*err_range))
            return eff, "errors"
        eff = Effect(target, onset, end, lat=rng.uniform(*lat_range), err=rng.uniform(0, 0.01))
        return eff, "latency"

    def _service_self_slowdown(self, onset: int, end: int) -> None:
        cands = [
            s.name
            for s in self.topo.services.values()
            if s.role in {"frontline", "mid", "leaf"}
            and s.instrumented
            and sum(len(g) for e in s.endpoints for g in e.groups) >= 2
        ]
        cause = self._pick("self", self._busy(cands, 0.15) or cands)
        eff = Effect(cause, onset, end, lat=self.rng.uniform(5, 20))
        truth = self._incident(
            "service_self_slowdown",
            "handler",
            cause,
            onset,
            end,
            eff,
            self._symptom(cause),
            "latency",
        )
        self._maybe_symptom_deploy(truth, onset)

    def _dependency_saturation(self, onset: int, end: int) -> None:
        cands = [d.name for d in self.topo.deps.values() if d.type in {"database", "cache"}]
        cause = self._pick("dep", self._busy(cands, 0.15) or cands)
        eff, stype = self._fault(
            cause, onset, end, lat_range=(4, 15), err_range=(0.1, 0.4), p_errors=0.4
        )
        truth = self._incident(
            "dependency_saturation",
            self.topo.deps[cause].type,
            cause,
            onset,
            end,
            eff,
            self._symptom(cause),
            stype,
        )
        self._maybe_symptom_deploy(truth, onset)

    def _queue_or_external(self, onset: int, end: int) -> None:
        rng = self.rng
        queue = [d.name for d in self.topo.deps.values() if d.type == "queue"]
        ext = self._busy([d.name for d in self.topo.deps.values() if d.type == "external"], 0.1)
        ext = ext or [d.name for d in self.topo.deps.values() if d.type == "external"]
        n_queue = sum(
            1 for t in self.truths if t.kind == "queue_or_external" and t.cause_type == "queue"
        )
        n_ext = sum(1 for t in self.truths if t.kind == "queue_or_external") - n_queue
        cause = (
            rng.choice(queue)
            if n_queue <= n_ext - 1 or (n_queue == n_ext and rng.random() < 0.4)
            else self._pick("ext", ext)
        )
        if cause in queue:
            eff, stype = self._fault(
                cause, onset, end, lat_range=(8, 40), err_range=(0.2, 0.6), p_errors=0.5
            )
            eff.lag = rng.uniform(50, 400)
        else:
            eff, stype = self._fault(
                cause, onset, end, lat_range=(4, 12), err_range=(0.3, 0.9), p_errors=0.55
            )
        truth = self._incident(
            "queue_or_external",
            self.topo.deps[cause].type,
            cause,
            onset,
            end,
            eff,
            self._symptom(cause),
            stype,
        )
        self._maybe_symptom_deploy(truth, onset)

    def _fanout_dilution(self, onset: int, end: int) -> None:
        fan = self.topo.fanout.endpoints[0]
        cands = sorted(
            {
                c.target.service.name
                for g in fan.groups
                for c in g
                if isinstance(c.target, Endpoint) and c.target.service.instrumented
            }
        )
        cause = self._pick("fan", self._busy(cands, 0.15) or cands)
        eff, stype = self._fault(
            cause, onset, end, lat_range=(4, 10), err_range=(0.25, 0.6), p_errors=0.6
        )
        truth = self._incident(
            "fanout_dilution", "below_fanout", cause, onset, end, eff, self.topo.edge.name, stype
        )
        self._maybe_symptom_deploy(truth, onset)

    def _bad_deploy(self, onset: int, end: int) -> None:
        rng = self.rng
        cands = [
            s.name
            for s in self.topo.services.values()
            if s.role in {"frontline", "mid", "leaf", "worker", "fanout"} and s.instrumented
        ]
        cause = self._pick("deploy", self._busy(cands, 0.15) or cands)
        at = onset - rng.randint(30, 90) * NS_S
        eff, stype = self._fault(
            cause, onset, end, lat_range=(3, 8), err_range=(0.1, 0.4), p_errors=0.5
        )
        eff.start = onset
        symptom = cause if rng.random() < 0.3 else self._symptom(cause)
        truth = self._incident("bad_deploy", "immediate", cause, onset, end, eff, symptom, stype)
        truth.deploy = self.deploy(cause, at)
        self._maybe_symptom_deploy(truth, onset)

    def _bad_deploy_leak(self, onset: int, end: int) -> None:
        rng = self.rng
        cands = [
            s.name
            for s in self.topo.services.values()
            if s.role in {"frontline", "mid", "leaf", "fanout"} and s.instrumented
        ]
        cause = self._pick("deploy", self._busy(cands, 0.15) or cands)
        at = onset - rng.randint(20, 60) * NS_MIN
        half = (onset - at) // 4
        errors = rng.random() < 0.4
        eff = Effect(
            cause,
            at,
            end,
            lat=1.2 if errors else rng.uniform(8, 15),
            err=rng.uniform(0.2, 0.4) if errors else 0.0,
            shape="leak",
            onset=onset,
            half=max(half, NS_MIN),
        )
        symptom = cause if rng.random() < 0.3 else self._symptom(cause)
        truth = self._incident(
            "bad_deploy",
            "slow_leak",
            cause,
            onset,
            end,
            eff,
            symptom,
            "errors" if errors else "latency",
            delay_min=(5, 14),
        )
        truth.deploy = self.deploy(cause, at, config=False)
        others = [s for s in self.topo.services.values() if s.name != cause and s.instrumented]
        decoy = truth.symptom if truth.symptom != cause else rng.choice(others).name
        self.deploy(decoy, onset - rng.randint(60, 180) * NS_S)

    def _overlapping(self, onset: int, end: int) -> None:
        rng = self.rng
        big_cands = [d.name for d in self.topo.deps.values() if d.type in {"database", "external"}]
        big = self._pick("ovl-big", self._busy(big_cands, 0.15) or big_cands)
        eff, stype = self._fault(
            big, onset, end, lat_range=(8, 15), err_range=(0.3, 0.6), p_errors=0.5
        )
        t1 = self._incident("overlapping", "major", big, onset, end, eff, self._symptom(big), stype)
        near = set(self.ancestors[big]) | {big}
        small_cands = [
            s.name
            for s in self.topo.services.values()
            if s.instrumented and s.role in {"mid", "leaf", "frontline"} and s.name not in near
        ]
        small_cands = small_cands or [
            s.name
            for s in self.topo.services.values()
            if s.instrumented and s.role in {"mid", "leaf"}
        ]
        small = self._pick("ovl-small", self._busy(small_cands, 0.15) or small_cands)
        s_onset = onset + rng.randint(2, 5) * NS_MIN
        s_end = s_onset + rng.randint(6, 10) * NS_MIN
        s_eff = Effect(small, s_onset, s_end, lat=rng.uniform(1.8, 2.6), err=rng.uniform(0, 0.02))
        t2 = self._incident(
            "overlapping", "minor", small, s_onset, s_end, s_eff, self._symptom(small), "latency"
        )
        t2.severity = "SEV4"
        t1.related, t2.related = t2.id, t1.id

    def _noise_only(self, onset: int, end: int) -> None:
        rng = self.rng
        pool = [
            s.name
            for s in self.topo.services.values()
            if s.instrumented and s.role in {"edge", "frontline", "mid", "fanout"}
        ]
        pool = self._busy(pool, 0.15) or pool
        symptom = rng.choice(pool)
        variant = rng.choice(["quiet", "harmless_deploy", "blip"])
        truth = self._incident(
            "noise_only",
            variant,
            None,
            onset,
            end,
            None,
            symptom,
            rng.choice(["latency", "errors"]),
        )
        truth.onset = None
        if variant == "harmless_deploy":
            self.deploy(
                rng.choice([symptom, rng.choice(pool)]), onset - rng.randint(60, 900) * NS_S
            )
        elif variant == "blip":
            target = rng.choice(pool)
            blip = Effect(
                target,
                onset,
                onset + rng.randint(1, 3) * NS_MIN,
                lat=rng.uniform(1.1, 1.4),
                err=rng.uniform(0.002, 0.008),
            )
            self.effects.append(blip)
            truth.effect = {
                "blip_on": target,
                "latency_x": round(blip.lat, 2),
                "error_rate_added": round(blip.err, 4),
                "minutes": (blip.end - blip.start) // NS_MIN,
            }

    def background_deploys(self, end: int) -> None:
        """Harmless deploys and config changes all along, avoiding each fault's cause
        around its fault (that would make the deploy the cause)."""
        rng = self.rng
        names = list(self.topo.services)
        deps = [d.name for d in self.topo.deps.values() if d.type in {"database", "cache"}]
        t = self.start + rng.randint(5, 30) * NS_MIN
        while t < end:
            target = rng.choice(deps) if rng.random() < 0.05 else rng.choice(names)
            if not any(s == target and a <= t <= b for s, a, b in self.quiet):
                self.deploy(target, t, config=True if target in deps else None)
            t += int(rng.expovariate(1 / 25) * NS_MIN) + 2 * NS_MIN

    def finish(self) -> None:
        """Number the deploys in time order and give them versions."""
        rng = self.rng
        self.deploys.sort(key=lambda d: (d.deployed_at, d.service))
        n = rng.randint(10000, 40000)
        versions: dict[str, list[int]] = {}
        for d in self.deploys:
            n += rng.randint(1, 4)
            d.id = f"chg-{n}"
            v = versions.setdefault(d.service, [rng.randint(1, 4), rng.randint(0, 20), 0])
            if d.kind == "config":
                d.version = f"{v[0]}.{v[1]}.{v[2]}+cfg{rng.randint(10, 99)}"
            else:
                v[2] += 1
                if rng.random() < 0.15:
                    v[1], v[2] = v[1] + 1, 0
                d.version = f"{v[0]}.{v[1]}.{v[2]}"


class TraceWriter:
    """Collector-style export lines: spans batched, grouped by resource, one request a line."""

    def __init__(
        self, out: Path, topo: Topology, rng: random.Random, layout: str, start: int, minutes: int
    ) -> None:
        self.dir = out / "traces"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = rng
        self.layout = layout
        self.start = start
        self.archive_until = start + int(minutes * 0.55) * NS_MIN
        self.buffer: dict[tuple[str, int], list[str]] = {}
        self.services = topo.services
        self.count = 0
        self.batch = rng.randint(300, 1500)
        self.file: io.TextIOWrapper | None = None
        self.file_name = ""
        self.files: list[str] = []
        self.lines = 0
        self.opened = start
        self.versions: dict[str, str] = {}
        self._resources: dict[tuple[str, int, str], str] = {}

    def emit(self, svc: Service, host: int, span: str) -> None:
        self.buffer.setdefault((svc.name, host), []).append(span)
        self.count += 1

    def _name_for(self, now: int) -> str:
        moment = datetime.fromtimestamp(now // NS_S, tz=UTC)
        if self.layout == "hourly":
            return moment.strftime("otel-%Y%m%dT%H.jsonl")
        if now < self.archive_until:
            return "collector-archive.jsonl"
        return moment.strftime("otel-%Y%m%dT%H") + f"{moment.minute // 10}0.jsonl"

    def _resource(self, service: str, host: int) -> str:
        version = self.versions.get(service, "1.0.0")
        key = (service, host, version)
        if key not in self._resources:
            svc = self.services[service]
            host_name = svc.hosts[host][0]
            attrs = [
                ("service.name", service),
                ("service.namespace", svc.namespace),
                ("service.version", version),
                ("service.instance.id", host_name),
                ("host.name", host_name),
                ("telemetry.sdk.name", "opentelemetry"),
                ("telemetry.sdk.language", svc.language),
                ("deployment.environment.name", "production"),
            ]
            res = json.dumps(
                {"attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs]},
                separators=(",", ":"),
            )
            scope = json.dumps({"name": f"io.opentelemetry.{svc.language}", "version": "1.38.0"})
            self._resources[key] = f'{{"resource":{res},"scopeSpans":[{{"scope":{scope},"spans":['
        return self._resources[key]

    def maybe_flush(self, now: int, force: bool = False) -> None:
        """Write a line when the batch is full or 10 s (simulated) have passed, as the
        collector's batch processor does."""
        if not self.buffer:
            self.opened = now
            return
        if not force and self.count < self.batch and now - self.opened < 10 * NS_S:
            return
        name = self._name_for(now)
        if name != self.file_name:
            if self.file:
                self.file.close()
            self.file = (self.dir / name).open("a", encoding="utf-8", newline="\n")
            self.file_name = name
            if name not in self.files:
                self.files.append(name)
        parts = [
            self._resource(svc, host) + ",".join(spans) + "]}]}"
            for (svc, host), spans in self.buffer.items()
        ]
        assert self.file is not None
        self.file.write('{"resourceSpans":[' + ",".join(parts) + "]}\n")
        self.lines += 1
        self.buffer = {}
        self.count = 0
        self.opened = now
        self.batch = self.rng.randint(300, 1500)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None


def diurnal(ns: int) -> float:
    hour = (ns // NS_S % 86400) / 3600
    return 1.0 + 0.55 * math.sin(2 * math.pi * (hour - 10) / 24)


def poisson(rng: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def calibrate(topo: Topology, seed: int) -> tuple[float, dict[str, float], dict[str, Any]]:
    """Tune client timeouts above each call site's baseline p99.5 (as operators do), then
    measure spans per edge request, each node's calls per edge request, and for each
    (upstream service, node) the node's calls per call of the upstream service."""
    t = 1_700_000_000 * NS_S
    for round_ in range(2):
        sim = Simulator(
            topo,
            random.Random(f"{seed}-calibrate-{round_}"),
            Effects([]),
            lambda svc, host, span: None,
        )
        sim.record = {}
        for i in range(1500):
            sim.request(t + i * 50 * NS_MS)
        sim.run_pending(t + 10**6 * NS_S)
        calls = {
            id(c): c
            for s in topo.services.values()
            for e in s.endpoints
            for g in e.groups
            for c in g
        }
        endpoints = {id(e): e for s in topo.services.values() for e in s.endpoints}
        for key, durations in sim.record.items():
            durations.sort()
            if key in endpoints:
                endpoints[key].median_ms = durations[len(durations) // 2] / NS_MS
                continue
            p995 = durations[int(0.995 * (len(durations) - 1))] / NS_MS
            call = calls[key]
            call.timeout_ms = max(call.timeout_ms, round(p995 * 3, -1))
        for ep in endpoints.values():  # never called in the calibration: its own time
            ep.median_ms = ep.median_ms or ep.self_ms
    sim = Simulator(
        topo, random.Random(f"{seed}-calibrate"), Effects([]), lambda svc, host, span: None
    )
    sim.flow = {}
    n = 2000
    for i in range(n):
        sim.request(t + i * 50 * NS_MS)
    sim.run_pending(t + 10**6 * NS_S)
    share = {k: v / n for k, v in sim.hits.items()}
    reach = {f"{a}>{b}": v / sim.hits[a] for (a, b), v in sim.flow.items()}
    return sim.spans / n, share, reach


def plan_kinds(rng: random.Random) -> list[str]:
    slots: list[str] = []
    for kind in (
        "service_self_slowdown",
        "dependency_saturation",
        "queue_or_external",
        "fanout_dilution",
        "noise_only",
    ):
        slots += [kind] * rng.randint(8, 9)
    slots += ["bad_deploy"] * 4 + ["bad_deploy_leak"] * 4
    slots += [rng.choice(["bad_deploy", "bad_deploy_leak"])]
    slots += ["overlapping"] * 4  # pairs: eight incidents
    rng.shuffle(slots)
    return slots


def write_deploys(out: Path, deploys: list[DeployRec], fmt: str) -> str:
    rows = [
        {
            "id": d.id,
            "service": d.service,
            "version": d.version,
            "commit": d.commit,
            "author": d.author,
            "deployed_at": iso(d.deployed_at),
            "summary": d.summary,
            "kind": d.kind,
        }
        for d in deploys
    ]
    if fmt == "json":
        (out / "deploys.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        return "deploys.json"
    buf = io.StringIO()
    crlf = fmt == "csv-bom-crlf"
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\r\n" if crlf else "\n")
    writer.writeheader()
    writer.writerows(rows)
    data = buf.getvalue().encode("utf-8")
    (out / "deploys.csv").write_bytes((b"\xef\xbb\xbf" if crlf else b"") + data)
    return "deploys.csv"


def write_incidents(out: Path, truths: list[Truth], rng: random.Random) -> dict[str, bool]:
    truths = sorted(truths, key=lambda t: (t.opened_at, t.id))
    order = list(range(len(truths)))
    rng.shuffle(order)
    named = {truths[i].id for i in order[: len(order) // 2]}
    records = []
    for t in truths:
        rec: dict[str, Any] = {"id": t.id, "severity": t.severity, "opened_at": iso(t.opened_at)}
        slo = rng.choice([300, 500, 800, 1000, 1500])
        if t.id in named:
            rec["title"] = f"{t.symptom}: " + (
                "elevated latency" if t.symptom_type == "latency" else "elevated error rate"
            )
            rec["symptoms"] = (
                [f"p99 latency of {t.symptom} at {slo * rng.randint(2, 6)} ms (SLO {slo} ms)"]
                if t.symptom_type == "latency"
                else [f"{t.symptom} 5xx rate {rng.randint(3, 25)}% (SLO 1%)"]
            )
            rec["service"] = t.symptom
        else:
            rec["title"] = rng.choice(TITLES[t.symptom_type])
            rec["symptoms"] = (
                ["p99 latency above SLO on the public API", "synthetic checks slow"]
                if t.symptom_type == "latency"
                else [
                    "error budget burn rate 14x over 1h",
                    "synthetic checks failing intermittently",
                ]
            )[: rng.randint(1, 2)]
        records.append(rec)
    (out / "incidents.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return {t.id: t.id in named for t in truths}


def generate(seed: int, out: Path, spans_target: int, log: Any = print) -> dict[str, Any]:
    began = time.perf_counter()
    rng = random.Random(f"{seed}-topology")
    topo = build(rng)
    per_request, share, reach = calibrate(topo, seed)
    plan_rng = random.Random(f"{seed}-plan")
    day = datetime(2026, plan_rng.randint(1, 11), plan_rng.randint(1, 28), tzinfo=UTC)
    start = int(day.timestamp()) * NS_S + plan_rng.randint(0, 23) * 3600 * NS_S
    planner = Planner(topo, plan_rng, start, share, reach)
    cursor = start + 20 * NS_MIN
    for kind in plan_kinds(plan_rng):
        cursor = planner.slot(kind, cursor)
    minutes = (cursor - start) // NS_MIN + 15
    planner.background_deploys(start + minutes * NS_MIN)
    planner.finish()
    quirk_rng = random.Random(f"{seed}-quirks")
    deploy_fmt = quirk_rng.choice(["json", "csv", "csv-bom-crlf", "csv-bom-crlf"])
    layout = quirk_rng.choice(["hourly", "archive+small"])
    duplicate = quirk_rng.random() < 0.6
    out.mkdir(parents=True, exist_ok=True)
    if (out / "traces").exists():
        shutil.rmtree(out / "traces")
    writer = TraceWriter(out, topo, random.Random(f"{seed}-batches"), layout, start, minutes)
    sim = Simulator(topo, random.Random(f"{seed}-traffic"), Effects(planner.effects), writer.emit)
    total_weight = sum(diurnal(start + m * NS_MIN) for m in range(minutes))
    base = spans_target * 1.03 / per_request / total_weight
    deploy_queue = sorted(planner.deploys, key=lambda d: d.deployed_at)
    traffic = sim.rng
    minute = 0
    while minute < minutes or sim.spans < spans_target:
        t0 = start + minute * NS_MIN
        while deploy_queue and deploy_queue[0].deployed_at <= t0:
            d = deploy_queue.pop(0)
            writer.versions[d.service] = d.version
        for s in sorted(traffic.random() for _ in range(poisson(traffic, base * diurnal(t0)))):
            t = t0 + int(s * NS_MIN)
            sim.run_pending(t)
            sim.request(t)
            writer.maybe_flush(t)
        minute += 1
    sim.run_pending(start + (minute + 60) * NS_MIN)
    writer.maybe_flush(start + minute * NS_MIN, force=True)
    writer.close()
    dup_of = None
    if duplicate:
        small = [f for f in writer.files if f != "collector-archive.jsonl"]
        dup_of = quirk_rng.choice(small[len(small) // 4 :])
        dup_name = dup_of.replace(".jsonl", "-replayed.jsonl")
        shutil.copyfile(out / "traces" / dup_of, out / "traces" / dup_name)
    deploy_file = write_deploys(out, planner.deploys, deploy_fmt)
    named = write_incidents(out, planner.truths, random.Random(f"{seed}-incidents"))
    incidents = [
        {
            "id": t.id,
            "kind": t.kind,
            "variant": t.variant,
            "cause": t.cause,
            "cause_type": t.cause_type,
            "aliases": t.aliases,
            "onset": iso(t.onset) if t.onset else None,
            "effect_start": iso(t.effect_start) if t.effect_start else None,
            "effect_end": iso(t.effect_end) if t.effect_end else None,
            "opened_at": iso(t.opened_at),
            "symptom_service": t.symptom,
            "symptom_type": t.symptom_type,
            "service_named": named[t.id],
            "deploy_id": t.deploy.id if t.deploy else None,
            "overlaps_with": t.related,
            "effect": t.effect,
        }
        for t in sorted(planner.truths, key=lambda t: (t.opened_at, t.id))
    ]
    elapsed = time.perf_counter() - began
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    meta = {
        "seed": seed,
        "generator": "bench/rca/generate.py",
        "format": 1,
        "spans": sim.spans,
        "spans_requested": spans_target,
        "time_range": [iso(start), iso(start + minute * NS_MIN)],
        "minutes": minute,
        "trace_files": len(writer.files) + (1 if dup_of else 0),
        "export_lines": writer.lines,
        "quirks": {
            "deploys": deploy_file
            if deploy_fmt != "csv-bom-crlf"
            else "deploys.csv with a UTF-8 BOM and CRLF line endings",
            "trace_layout": layout,
            "duplicated_trace_file": dup_of,
        },
    }
    answers = {**meta, "topology": topo.describe(), "incidents": incidents}
    (out / "answers.json").write_text(json.dumps(answers, indent=1) + "\n", encoding="utf-8")
    meta.update(generation_seconds=round(elapsed, 1), max_rss_mb=round(rss_mb, 1))
    bom = " with BOM+CRLF" if deploy_fmt == "csv-bom-crlf" else ""
    log(
        f"seed {seed}: {sim.spans} spans over {minute} min in {len(writer.files)} trace files "
        f"({layout}{', one duplicated' if dup_of else ''}), {len(incidents)} incidents, "
        f"{len(planner.deploys)} deploys ({deploy_file}{bom}), "
        f"{elapsed:.1f} s, max RSS {rss_mb:.0f} MB -> {out}"
    )
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--spans", type=int, default=1_000_000, help="at least this many spans (default 1,000,000)"
    )
    args = parser.parse_args(argv)
    generate(args.seed, args.out, args.spans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
