"""The simulated platform: a parcel-logistics company, drawn procedurally from a seed.

An edge proxy in front of 4-6 front-line APIs, one fan-out service that assembles a
"shipment overview" from many services in parallel, two tiers of internal services
(HTTP and gRPC), queue workers, a few services with no instrumentation at all, and the
dependencies that exist only as their callers' CLIENT/PRODUCER spans: 3-4 databases,
1-2 caches, one message broker with 2-3 topics, 2-3 external APIs.

Every call site carries its static OTLP attributes as a pre-encoded JSON fragment, so the
simulator only appends the dynamic ones (status codes, resend count).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

SERVICE_POOL = [
    "parcel-tracking",
    "booking-api",
    "merchant-portal-bff",
    "driver-app-bff",
    "returns-api",
    "quote-api",
    "label-service",
    "rate-engine",
    "carrier-gateway",
    "route-planner",
    "eta-predictor",
    "hub-scanner",
    "customs-docs",
    "address-validator",
    "geo-resolver",
    "pickup-scheduler",
    "invoice-service",
    "wallet-ledger",
    "notification-hub",
    "proof-of-delivery",
    "depot-capacity",
    "fleet-telemetry",
    "slot-allocator",
    "pricing-rules",
    "merchant-registry",
    "consignee-profile",
    "claims-service",
    "manifest-builder",
    "linehaul-planner",
    "dock-assignment",
    "weight-audit",
    "tariff-catalog",
    "shipment-history",
    "exception-handler",
    "locker-network",
    "sorting-control",
    "feature-flags",
    "identity-service",
    "tax-calculator",
    "document-store",
    "barcode-service",
    "zone-mapper",
    "capacity-forecast",
    "partner-webhooks",
    "sla-monitor",
]
EDGE_NAMES = ["edge-proxy", "ingress-envoy", "front-door"]
FANOUT_NAMES = ["shipment-overview", "consignment-aggregator", "track-composer"]
LEGACY_NAMES = ["as400-bridge", "legacy-billing", "mainframe-customs", "cobol-rater"]
WORKER_NAMES = [
    "label-printer-worker",
    "event-projector",
    "notification-worker",
    "billing-worker",
    "webhook-dispatcher",
]

DATABASES = [
    ("postgresql", "shipments", "pg-shipments", "pg-shipments-primary.data.internal", 5432),
    ("postgresql", "billing", "pg-billing", "pg-billing.data.internal", 5432),
    ("mysql", "inventory", "mysql-depots", "mysql-depots.data.internal", 3306),
    ("mongodb", "tracking_events", "mongo-events", "mongo-events-rs0.data.internal", 27017),
    ("postgresql", "routing", "pg-routing", "pg-routing.data.internal", 5432),
    ("mysql", "customers", "mysql-customers", "mysql-cust-01.data.internal", 3306),
]
CACHES = [
    ("redis-sessions", "redis-sessions.cache.internal"),
    ("redis-rates", "redis-rates-master.cache.internal"),
    ("memcached-geo", "memcached-geo.cache.internal"),
]
BROKERS = [
    ("kafka", "kafka-logistics", "kafka-0.msg.internal", 9092),
    ("rabbitmq", "rabbitmq-main", "rabbitmq.msg.internal", 5672),
]
TOPICS = ["shipment-events", "label-requests", "notifications", "billing-events"]
EXTERNALS = [
    ("stripe", "api.stripe.com", ["POST /v1/payment_intents", "GET /v1/charges/{id}"]),
    (
        "google-maps",
        "maps.googleapis.com",
        ["GET /maps/api/geocode/json", "GET /maps/api/distancematrix/json"],
    ),
    ("twilio", "api.twilio.com", ["POST /2010-04-01/Accounts/{sid}/Messages.json"]),
    ("dhl-express", "express.api.dhl.com", ["POST /mydhlapi/shipments", "GET /mydhlapi/rates"]),
    ("sendgrid", "api.sendgrid.com", ["POST /v3/mail/send"]),
]
NOUNS = [
    "parcels",
    "shipments",
    "labels",
    "quotes",
    "rates",
    "routes",
    "scans",
    "slots",
    "invoices",
    "claims",
    "manifests",
    "docks",
    "zones",
    "pickups",
    "events",
]
TABLES = [
    "parcel",
    "shipment",
    "scan_event",
    "invoice",
    "depot",
    "slot",
    "route_leg",
    "customer",
    "tariff",
    "claim",
    "manifest_line",
    "address",
]
INTERNAL_OPS = [
    "compute eta",
    "render label",
    "validate payload",
    "apply pricing rules",
    "serialize response",
    "score candidates",
    "build manifest",
]


def attr(key: str, value: Any) -> dict[str, Any]:
    """One OTLP/JSON attribute (ints as strings, as the JSON mapping writes int64)."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def frag(attrs: list[dict[str, Any]]) -> str:
    """Attributes as a JSON fragment without the closing bracket (more may follow)."""
    text = json.dumps(attrs, separators=(",", ":"))
    return text[:-1]


@dataclass(eq=False)
class Dep:
    """A dependency seen only through its callers' spans."""

    name: str  # canonical name (the peer.service its callers use)
    type: str  # database | cache | queue | external
    system: str
    address: str
    port: int
    aliases: list[str]
    db_name: str | None = None
    topics: list[str] = field(default_factory=list)
    ops: list[DepOp] = field(default_factory=list)


@dataclass(eq=False)
class DepOp:
    dep: Dep
    span_name: str
    kind: int  # 3 CLIENT, 4 PRODUCER
    base_ms: float
    sigma: float
    err: float
    attrs: str  # pre-encoded fragment
    protocol: str  # sql | redis | http | messaging
    topic: str | None = None


@dataclass(eq=False)
class Service:
    name: str
    role: str  # edge | frontline | fanout | mid | leaf | worker | legacy
    protocol: str  # http | grpc | messaging
    instrumented: bool
    hosts: list[tuple[str, int]]  # (host.name, clock skew ns)
    drop: float  # share of its spans lost (local sampler / exporter drops)
    language: str
    endpoints: list[Endpoint] = field(default_factory=list)
    namespace: str = "logistics"


@dataclass(eq=False)
class Call:
    """One call site: an endpoint of another service, or a dependency operation."""

    target: Endpoint | DepOp
    prob: float
    critical: float  # probability that its failure fails the caller
    retries: int
    timeout_ms: float
    attrs: str  # caller-side CLIENT span attributes (pre-encoded)
    span_name: str


@dataclass(eq=False)
class Endpoint:
    service: Service
    name: str  # SERVER/CONSUMER span name
    kind: int  # 2 SERVER, 5 CONSUMER
    self_ms: float
    sigma: float
    err: float
    attrs: str
    weight: float = 1.0  # edge routes: share of traffic
    groups: list[list[Call]] = field(default_factory=list)  # sequential groups, parallel inside
    internal: str | None = None  # name of an INTERNAL span covering part of the handler
    route: str = ""
    method: str = "GET"
    topic: str | None = None
    median_ms: float = 0.0  # usual total duration (set by the calibration)


@dataclass
class Topology:
    edge: Service
    fanout: Service
    services: dict[str, Service]
    deps: dict[str, Dep]
    topic_consumers: dict[str, Endpoint]
    callers: dict[str, set[str]]  # node name -> names of services that call it

    def describe(self) -> dict[str, Any]:
        return {
            "services": [
                {
                    "name": s.name,
                    "role": s.role,
                    "instrumented": s.instrumented,
                    "protocol": s.protocol,
                    "hosts": [h for h, _ in s.hosts],
                }
                for s in self.services.values()
            ],
            "dependencies": [
                {"name": d.name, "type": d.type, "system": d.system, "aliases": d.aliases}
                for d in self.deps.values()
            ],
        }


def _lognormal_ms(rng: random.Random, lo: float, hi: float) -> float:
    return round(rng.uniform(lo, hi), 2)


def _loguniform(rng: random.Random, lo: float, hi: float) -> float:
    """Most values near ``lo``, a few near ``hi`` (baseline error rates)."""
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _service(
    rng: random.Random, name: str, role: str, protocol: str, instrumented: bool
) -> Service:
    n_hosts = rng.randint(2, 4) if role not in {"edge"} else 3
    hosts = []
    for _ in range(n_hosts):
        suffix = "".join(rng.choice("bcdfghjklmnpqrstvwxz0123456789") for _ in range(5))
        skew_ms = rng.uniform(5, 60) * rng.choice([-1, 1])
        hosts.append((f"{name}-{rng.randint(100000, 999999):x}-{suffix}", int(skew_ms * 1e6)))
    language = rng.choice(["java", "go", "python", "nodejs", "dotnet"])
    return Service(name, role, protocol, instrumented, hosts, 0.0, language)


def _server_endpoint(rng: random.Random, svc: Service, used: set[str]) -> Endpoint:
    if svc.protocol == "grpc":
        pkg = svc.name.replace("-", "")
        rpc_service = f"logistics.{pkg}.v1.{svc.name.title().replace('-', '')}Service"
        method = rng.choice(["Get", "List", "Compute", "Resolve", "Reserve", "Check"])
        method += rng.choice(["Quote", "Slot", "Route", "Status", "Batch", "Profile"])
        name = f"{rpc_service}/{method}"
        attrs = frag(
            [
                attr("rpc.system", "grpc"),
                attr("rpc.service", rpc_service),
                attr("rpc.method", method),
            ]
        )
        ep = Endpoint(svc, name, 2, 0, 0, 0, attrs, route=name, method=method)
    else:
        while True:
            method = rng.choice(["GET", "GET", "GET", "POST", "PUT"])
            noun = rng.choice(NOUNS)
            route = f"/v{rng.randint(1, 3)}/{noun}" + rng.choice(
                ["", "/{id}", "/{id}/status", "/search", "/{id}/events"]
            )
            if f"{method} {route}" not in used:
                break
        used.add(f"{method} {route}")
        name = f"{method} {route}"
        attrs = frag(
            [
                attr("http.request.method", method),
                attr("http.route", route),
                attr("url.scheme", "http"),
                attr("network.protocol.version", "1.1"),
            ]
        )
        ep = Endpoint(svc, name, 2, 0, 0, 0, attrs, route=route, method=method)
    ep.self_ms = _lognormal_ms(rng, 2, 25)
    ep.sigma = rng.uniform(0.25, 0.6)
    ep.err = _loguniform(rng, 0.001, 0.02)
    if rng.random() < 0.3:
        ep.internal = rng.choice(INTERNAL_OPS)
    return ep


def _client_call(rng: random.Random, caller: Service, ep: Endpoint, critical: float) -> Call:
    callee = ep.service
    port = 8080 if callee.protocol == "http" else 9090
    address = f"{callee.name}.{callee.namespace}.svc.cluster.local"
    attrs = [attr("server.address", address), attr("server.port", port)]
    if rng.random() < 0.6 or not callee.instrumented:
        attrs.append(attr("peer.service", callee.name))
    if callee.protocol == "grpc":
        rpc_service, method = ep.name.split("/", 1)
        attrs += [
            attr("rpc.system", "grpc"),
            attr("rpc.service", rpc_service),
            attr("rpc.method", method),
        ]
        span_name = ep.name
        timeout = rng.choice([500, 800, 1000, 2000])
    else:
        attrs += [
            attr("http.request.method", ep.method),
            attr("url.full", f"http://{address}:{port}{ep.route.replace('{id}', '…')}"),
        ]
        span_name = ep.method if rng.random() < 0.5 else ep.name
        timeout = rng.choice([1000, 2000, 3000, 5000])
    return Call(ep, 1.0, critical, rng.choice([0, 0, 1, 2]), timeout, frag(attrs), span_name)


def _dep_call(rng: random.Random, caller: Service, op: DepOp) -> Call:
    dep = op.dep
    attrs = json.loads(op.attrs + "]")
    if rng.random() < 0.55:
        attrs.append(attr("peer.service", dep.name))
    timeout = {"database": 1500, "cache": 200, "queue": 1000, "external": 4000}[dep.type]
    timeout = rng.choice([timeout, timeout * 2])
    critical = {"database": 0.6, "cache": 0.1, "queue": 0.4, "external": 0.5}[dep.type]
    retries = rng.choice([0, 1, 1, 2]) if dep.type in {"external", "queue"} else rng.choice([0, 1])
    return Call(op, 1.0, critical, retries, timeout, frag(attrs), op.span_name)


def _make_deps(rng: random.Random) -> dict[str, Dep]:
    deps: dict[str, Dep] = {}
    systems: list[str] = []
    for system, db_name, peer, address, port in rng.sample(DATABASES, rng.randint(3, 4)):
        dep = Dep(peer, "database", system, address, port, [peer, address, db_name], db_name)
        systems.append(system)
        for _ in range(rng.randint(2, 4)):
            op_name = rng.choice(["SELECT", "SELECT", "SELECT", "INSERT", "UPDATE"])
            table = rng.choice(TABLES)
            if system == "mongodb":
                op_name = {"SELECT": "find", "INSERT": "insert", "UPDATE": "update"}[op_name]
            attrs = frag(
                [
                    attr("db.system", system),
                    attr("db.name", db_name),
                    attr("db.operation", op_name),
                    attr("db.sql.table", table),
                    attr("server.address", address),
                    attr("server.port", port),
                ]
            )
            dep.ops.append(
                DepOp(
                    dep,
                    f"{op_name} {db_name}.{table}",
                    3,
                    rng.uniform(0.8, 8),
                    rng.uniform(0.35, 0.7),
                    rng.uniform(0.0005, 0.004),
                    attrs,
                    "sql",
                )
            )
        deps[dep.name] = dep
    for peer, address in rng.sample(CACHES, 2):
        system = "memcached" if peer.startswith("memcached") else "redis"
        systems.append(system)
        dep = Dep(
            peer, "cache", system, address, 6379 if system == "redis" else 11211, [peer, address]
        )
        for op_name in ("GET", "SET") if system == "redis" else ("get", "set"):
            attrs = frag(
                [
                    attr("db.system", system),
                    attr("db.operation", op_name),
                    attr("server.address", address),
                    attr("server.port", dep.port),
                ]
            )
            dep.ops.append(
                DepOp(
                    dep,
                    op_name,
                    3,
                    rng.uniform(0.2, 1.2),
                    0.4,
                    rng.uniform(0.0002, 0.002),
                    attrs,
                    "redis",
                )
            )
        deps[dep.name] = dep
    for dep in deps.values():
        if systems.count(dep.system) == 1:
            dep.aliases.append(dep.system)
    system, peer, address, port = rng.choice(BROKERS)
    topics = rng.sample(TOPICS, rng.randint(2, 3))
    broker = Dep(
        peer, "queue", system, address, port, [peer, address, system, *topics], topics=topics
    )
    for topic in topics:
        attrs = frag(
            [
                attr("messaging.system", system),
                attr("messaging.destination.name", topic),
                attr("messaging.operation", "publish"),
                attr("server.address", address),
                attr("server.port", port),
            ]
        )
        broker.ops.append(
            DepOp(
                broker,
                f"publish {topic}",
                4,
                rng.uniform(1, 5),
                0.5,
                rng.uniform(0.0005, 0.003),
                attrs,
                "messaging",
                topic,
            )
        )
    deps[broker.name] = broker
    for peer, address, routes in rng.sample(EXTERNALS, rng.randint(2, 3)):
        dep = Dep(peer, "external", "http", address, 443, [peer, address])
        for route in routes:
            method, path = route.split(" ", 1)
            attrs = frag(
                [
                    attr("http.request.method", method),
                    attr("server.address", address),
                    attr("server.port", 443),
                    attr("url.full", f"https://{address}{path}"),
                    attr("url.template", path),
                ]
            )
            dep.ops.append(
                DepOp(
                    dep,
                    method if rng.random() < 0.6 else route,
                    3,
                    rng.uniform(60, 300),
                    rng.uniform(0.3, 0.6),
                    rng.uniform(0.002, 0.015),
                    attrs,
                    "http",
                )
            )
        deps[dep.name] = dep
    return deps


def build(rng: random.Random) -> Topology:
    """Draw a platform of 25-40 services and its dependencies."""
    total = rng.randint(27, 38)
    n_front = rng.randint(4, 6)
    n_legacy = rng.randint(2, 3)
    n_workers = 0  # one per topic, decided below
    deps = _make_deps(rng)
    broker = next(d for d in deps.values() if d.type == "queue")
    n_workers = len(broker.topics)
    n_rest = total - 2 - n_front - n_legacy - n_workers
    names = rng.sample(SERVICE_POOL, n_front + n_rest)
    edge = _service(rng, rng.choice(EDGE_NAMES), "edge", "http", True)
    fanout = _service(rng, rng.choice(FANOUT_NAMES), "fanout", "http", True)
    front = [_service(rng, n, "frontline", "http", True) for n in names[:n_front]]
    rest_names = names[n_front:]
    n_mid = len(rest_names) // 2
    mid = [_service(rng, n, "mid", rng.choice(["http", "grpc"]), True) for n in rest_names[:n_mid]]
    leaf = [
        _service(rng, n, "leaf", rng.choice(["http", "grpc"]), True) for n in rest_names[n_mid:]
    ]
    legacy = [_service(rng, n, "legacy", "http", False) for n in rng.sample(LEGACY_NAMES, n_legacy)]
    workers = [
        _service(rng, n, "worker", "messaging", True) for n in rng.sample(WORKER_NAMES, n_workers)
    ]
    services = {s.name: s for s in [edge, fanout, *front, *mid, *leaf, *legacy, *workers]}
    for s in rng.sample([*mid, *leaf], 3):
        s.drop = rng.uniform(0.15, 0.4)
    used: set[str] = set()
    for s in [fanout, *front, *mid, *leaf, *legacy]:
        for _ in range(1 if s.role in {"fanout", "legacy"} else rng.randint(1, 3)):
            s.endpoints.append(_server_endpoint(rng, s, used))
    for w, topic in zip(workers, broker.topics, strict=True):
        consumer = Endpoint(
            w,
            f"process {topic}",
            5,
            _lognormal_ms(rng, 3, 20),
            0.4,
            rng.uniform(0.001, 0.01),
            frag(
                [
                    attr("messaging.system", broker.system),
                    attr("messaging.destination.name", topic),
                    attr("messaging.operation", "process"),
                    attr("messaging.consumer.group.name", w.name),
                ]
            ),
            topic=topic,
        )
        w.endpoints.append(consumer)
    topic_consumers = {w.endpoints[0].topic or "": w.endpoints[0] for w in workers}
    dbs = [d for d in deps.values() if d.type == "database"]
    caches = [d for d in deps.values() if d.type == "cache"]
    externals = [d for d in deps.values() if d.type == "external"]
    leaf_eps = [e for s in [*leaf, *legacy] for e in s.endpoints]
    mid_eps = [e for s in mid for e in s.endpoints]

    def add(ep: Endpoint, call: Call, parallel_with_last: bool = False) -> None:
        if parallel_with_last and ep.groups:
            ep.groups[-1].append(call)
        else:
            ep.groups.append([call])

    # leaves: a database read or two, sometimes a cache in front
    for s in leaf:
        for ep in s.endpoints:
            if rng.random() < 0.4:
                add(ep, _dep_call(rng, s, rng.choice(rng.choice(caches).ops)))
            for op in rng.sample(rng.choice(dbs).ops, rng.randint(1, 2)):
                add(ep, _dep_call(rng, s, op))
    for s in legacy:
        for ep in s.endpoints:
            ep.self_ms = _lognormal_ms(rng, 20, 80)
    # mid tier: leaves, a database, maybe an external API or a publish
    for i, s in enumerate(mid):
        for ep in s.endpoints:
            add(ep, _dep_call(rng, s, rng.choice(rng.choice(dbs).ops)))
            for target in rng.sample(leaf_eps, rng.randint(1, 2)):
                add(ep, _client_call(rng, s, target, 0.4), rng.random() < 0.4)
            if i < len(mid) // 2 and rng.random() < 0.5:
                later = [e for t in mid[len(mid) // 2 :] for e in t.endpoints]
                add(ep, _client_call(rng, s, rng.choice(later), 0.5))
            if rng.random() < 0.35:
                add(ep, _dep_call(rng, s, rng.choice(rng.choice(externals).ops)))
            if rng.random() < 0.3:
                add(ep, _dep_call(rng, s, rng.choice(broker.ops)))
    # front line: a cache, 2-4 internal calls, sometimes an external API, a publish
    for s in front:
        for ep in s.endpoints:
            add(ep, _dep_call(rng, s, rng.choice(rng.choice(caches).ops)))
            for target in rng.sample(mid_eps + leaf_eps, rng.randint(2, 3)):
                add(ep, _client_call(rng, s, target, 0.5), rng.random() < 0.3)
            if rng.random() < 0.3:
                add(ep, _dep_call(rng, s, rng.choice(rng.choice(externals).ops)))
            if rng.random() < 0.4:
                add(ep, _dep_call(rng, s, rng.choice(broker.ops)))
    # the fan-out: many services in parallel, partial results tolerated
    fan_ep = fanout.endpoints[0]
    fan_ep.groups.append([_dep_call(rng, fanout, rng.choice(rng.choice(caches).ops))])
    fan_targets = rng.sample(mid_eps + leaf_eps, min(len(mid_eps + leaf_eps), rng.randint(6, 9)))
    fan_ep.groups.append([_client_call(rng, fanout, t, 0.12) for t in fan_targets])
    # workers: write what they consume, sometimes call out
    for w in workers:
        ep = w.endpoints[0]
        add(ep, _dep_call(rng, w, rng.choice(rng.choice(dbs).ops)))
        if rng.random() < 0.6:
            add(ep, _dep_call(rng, w, rng.choice(rng.choice(externals).ops)))
        if rng.random() < 0.5:
            add(ep, _client_call(rng, w, rng.choice(leaf_eps), 0.5))
    # make sure every dependency and every legacy service has a caller
    callers = _callers(services)
    for dep in deps.values():
        for op in dep.ops if dep.type == "queue" else dep.ops[:1]:
            if op.dep.name not in callers or (dep.type == "queue" and not _calls_op(services, op)):
                s = rng.choice(mid + front)
                add(rng.choice(s.endpoints), _dep_call(rng, s, op))
    for s in legacy:
        if s.name not in _callers(services):
            m = rng.choice(mid)
            add(rng.choice(m.endpoints), _client_call(rng, m, s.endpoints[0], 0.7))
    # ... and every internal service too (the first mid tier from the front line)
    for s in [*mid, *leaf]:
        if s.name not in _callers(services):
            upper = rng.choice(front if s in mid[: len(mid) // 2] or s in leaf else mid)
            add(rng.choice(upper.endpoints), _client_call(rng, upper, rng.choice(s.endpoints), 0.6))
    # the edge: one route per front-line endpoint plus the overview route
    edge_eps: list[Endpoint] = []
    for s in [*front, fanout]:
        for target in s.endpoints:
            route = "/api" + target.route if s.protocol == "http" else "/api/x"
            ep = Endpoint(
                edge,
                f"{target.method} {route}",
                2,
                _lognormal_ms(rng, 0.3, 1.5),
                0.3,
                rng.uniform(0.0005, 0.003),
                frag(
                    [
                        attr("http.request.method", target.method),
                        attr("http.route", route),
                        attr("url.scheme", "https"),
                        attr("network.protocol.version", "2"),
                    ]
                ),
                weight=rng.uniform(1, 2.5) / len(s.endpoints),
                route=route,
                method=target.method,
            )
            ep.groups.append([_client_call(rng, edge, target, 1.0)])
            edge_eps.append(ep)
    edge_eps[-1].weight = max(e.weight for e in edge_eps)  # the overview is popular
    edge.endpoints = edge_eps
    return Topology(edge, fanout, services, deps, topic_consumers, _callers(services))


def _calls_op(services: dict[str, Service], op: DepOp) -> bool:
    return any(
        c.target is op for s in services.values() for e in s.endpoints for g in e.groups for c in g
    )


def _callers(services: dict[str, Service]) -> dict[str, set[str]]:
    callers: dict[str, set[str]] = {}
    for s in services.values():
        for ep in s.endpoints:
            for group in ep.groups:
                for call in group:
                    t = call.target
                    name = t.service.name if isinstance(t, Endpoint) else t.dep.name
                    callers.setdefault(name, set()).add(s.name)
                    if isinstance(t, DepOp) and t.topic:
                        pass
    return callers
