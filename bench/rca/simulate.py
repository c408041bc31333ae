"""The request simulator: one edge request becomes a tree of OTLP spans.

Durations are built bottom-up (a handler's own time, then its calls, sequential groups
one after the other and the calls inside a group in parallel), in true time; every span
is then written in its host's clock (each host has its own skew of tens of ms). Client
timeouts cut a CLIENT span short while the callee's SERVER span goes on; failed calls are
retried with new CLIENT spans; some services lose part of their spans, so their children
point at parents that are not there. Injected faults (:class:`Effect`) scale a node's
latency and add to its error probability while they are active.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from topology import Call, DepOp, Endpoint, Service, Topology

NS_MS = 1_000_000
NS_MIN = 60_000_000_000

Emit = Callable[[Service, int, str], None]


@dataclass
class Effect:
    """A fault on one node (service or dependency name) in true time.

    ``shape`` ``step``: full strength from ``start`` to ``end``; ``leak``: grows
    exponentially (a quarter of full strength at ``onset``, doubling every ``half``
    ns, capped at full) until ``end``. ``lat`` multiplies latency: a dependency's
    response time, or a service's handler (which then adds ``lat - 1`` times its usual
    median total duration of work of its own, its outgoing calls unchanged); ``err`` is
    added to the error probability; ``lag`` multiplies queue delivery delay (brokers).
    """

    target: str
    start: int
    end: int
    lat: float = 1.0
    err: float = 0.0
    shape: str = "step"
    onset: int = 0
    half: int = 1
    lag: float = 1.0

    def strength(self, t: int) -> float:
        if t < self.start or t >= self.end:
            return 0.0
        if self.shape == "step":
            return 1.0
        return min(1.0, 0.25 * 2.0 ** ((t - self.onset) / self.half))


class Effects:
    def __init__(self, effects: list[Effect]) -> None:
        self.by_target: dict[str, list[Effect]] = {}
        for e in effects:
            self.by_target.setdefault(e.target, []).append(e)

    def at(self, target: str, t: int) -> tuple[float, float, float]:
        """(latency multiplier, added error probability, lag multiplier)."""
        found = self.by_target.get(target)
        if not found:
            return 1.0, 0.0, 1.0
        lat, err, lag = 1.0, 0.0, 1.0
        for e in found:
            s = e.strength(t)
            if s:
                lat *= 1 + (e.lat - 1) * s
                err += e.err * s
                lag *= 1 + (e.lag - 1) * s
        return lat, min(err, 0.95), lag


HTTP_OK = (200, 200, 200, 200, 201, 204)
HTTP_ERR = (500, 500, 502, 503, 504)
GRPC_ERR = (14, 4, 13, 2)
ERROR_TYPES = {
    "sql": ("timeout", "connection_reset", "53300"),
    "redis": ("timeout", "READONLY", "connection_refused"),
    "messaging": ("timeout", "NOT_ENOUGH_REPLICAS", "broker_unavailable"),
    "http": ("timeout", "503", "502"),
}


class Simulator:
    def __init__(self, topo: Topology, rng: random.Random, effects: Effects, emit: Emit) -> None:
        self.topo = topo
        self.rng = rng
        self.effects = effects
        self.emit = emit
        self.spans = 0
        self.hits: dict[str, int] = {}  # calls per node, for choosing busy fault targets
        # calibration only: untruncated durations per call site, and the services above
        # each call (flow[(upstream, node)]: calls of node under upstream's handlers)
        self.record: dict[int, list[int]] | None = None
        self.flow: dict[tuple[str, str], int] | None = None
        self.stack: list[str] = []
        self.edge_weights = [e.weight for e in topo.edge.endpoints]
        self.pending: list[tuple[int, Endpoint, str, str]] = []  # queued consumer work

    def _id64(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    def _dur(self, base_ms: float, sigma: float) -> float:
        """A heavy-tailed duration: lognormal body, a Pareto tail for 1.5% of calls."""
        rng = self.rng
        ms = base_ms * math.exp(rng.gauss(0.0, sigma))
        if rng.random() < 0.015:
            ms *= rng.paretovariate(1.6) * 3
        return ms

    def _span(
        self,
        svc: Service,
        host: int,
        tid: str,
        sid: str,
        parent: str | None,
        name: str,
        kind: int,
        start: int,
        end: int,
        attrs: str,
        error: bool,
        message: str = "",
    ) -> None:
        if not svc.instrumented:
            return
        if svc.drop and self.rng.random() < svc.drop:
            return
        skew = svc.hosts[host][1]
        status = f'{{"code":2,"message":"{message}"}}' if error else "{}"
        parent_field = f'"parentSpanId":"{parent}",' if parent else '"parentSpanId":"",'
        self.emit(
            svc,
            host,
            f'{{"traceId":"{tid}","spanId":"{sid}",{parent_field}"name":"{name}",'
            f'"kind":{kind},"startTimeUnixNano":"{start + skew}",'
            f'"endTimeUnixNano":"{end + skew}","attributes":{attrs}],"status":{status}}}',
        )
        self.spans += 1

    def request(self, t: int) -> None:
        """One edge request at true time ``t``."""
        ep = self.rng.choices(self.topo.edge.endpoints, self.edge_weights)[0]
        tid = f"{self.rng.getrandbits(128):032x}"
        self.serve(ep, None, t, tid)

    def serve(self, ep: Endpoint, parent: str | None, t: int, tid: str) -> tuple[int, bool]:
        """Run a handler from true time ``t``; return (end, failed)."""
        rng = self.rng
        svc = ep.service
        host = rng.randrange(len(svc.hosts))
        sid = self._id64()
        self.hits[svc.name] = self.hits.get(svc.name, 0) + 1
        if self.flow is not None:
            self._flow(svc.name)
            self.stack.append(svc.name)
        lat, err_add, _ = self.effects.at(svc.name, t)
        own = self._dur(ep.self_ms, ep.sigma) * NS_MS
        if lat != 1.0:  # the handler itself is slower: lat x its usual total time
            own += (lat - 1.0) * ep.median_ms * math.exp(rng.gauss(0.0, 0.3)) * NS_MS
        pre = int(own * rng.uniform(0.2, 0.6))
        cur = t + pre
        failed = False
        if ep.internal and svc.instrumented:
            istart = t + int(pre * 0.1)
            self._span(svc, host, tid, self._id64(), sid, ep.internal, 1, istart, cur, "[", False)
        for group in ep.groups:
            end = cur
            for call in group:
                if call.prob < 1 and rng.random() >= call.prob:
                    continue
                cend, cfailed = self.call(call, svc, host, sid, cur, tid)
                end = max(end, cend)
                if cfailed and rng.random() < call.critical:
                    failed = True
            cur = end
        end = cur + int(own) - pre
        if rng.random() < ep.err + err_add:
            failed = True
        if self.flow is not None:
            self.stack.pop()
        if self.record is not None:
            self.record.setdefault(id(ep), []).append(end - t)
        if ep.kind == 5:  # CONSUMER
            self._span(
                svc,
                host,
                tid,
                sid,
                parent,
                ep.name,
                5,
                t,
                end,
                ep.attrs,
                failed,
                "processing failed",
            )
        else:
            self._span(
                svc,
                host,
                tid,
                sid,
                parent,
                ep.name,
                ep.kind,
                t,
                end,
                ep.attrs + self._server_status(svc, failed),
                failed,
                "internal error" if svc.protocol == "grpc" else "",
            )
        return end, failed

    def _server_status(self, svc: Service, failed: bool) -> str:
        if svc.protocol == "grpc":
            code = self.rng.choice(GRPC_ERR) if failed else 0
            return f',{{"key":"rpc.grpc.status_code","value":{{"intValue":"{code}"}}}}'
        if failed:
            code = self.rng.choice(HTTP_ERR)
        elif self.rng.random() < 0.01:
            code = self.rng.choice((400, 404, 409, 429))
        else:
            code = self.rng.choice(HTTP_OK)
        return f',{{"key":"http.response.status_code","value":{{"intValue":"{code}"}}}}'

    def call(
        self, call: Call, svc: Service, host: int, parent: str, t: int, tid: str
    ) -> tuple[int, bool]:
        """A call site with its retries: CLIENT/PRODUCER spans on the caller's side."""
        rng = self.rng
        attempt = 0
        while True:
            csid = self._id64()
            net = int(rng.uniform(0.2, 1.5) * NS_MS)
            target = call.target
            if isinstance(target, Endpoint):
                callee = target.service
                srv_end, failed = self.serve(target, csid, t + net // 2, tid)
                end = srv_end + net - net // 2
                protocol = callee.protocol
                kind = 3
            else:
                end, failed = self._dependency(target, t + net, tid, csid)
                end += net
                protocol = target.protocol
                kind = target.kind
            if self.record is not None:
                self.record.setdefault(id(call), []).append(end - t)
            timed_out = end - t > call.timeout_ms * NS_MS
            if timed_out:
                end = t + int(call.timeout_ms * NS_MS)
                failed = True
            self._span(
                svc,
                host,
                tid,
                csid,
                parent,
                call.span_name,
                kind,
                t,
                end,
                call.attrs + self._client_extra(protocol, failed, timed_out, attempt),
                failed,
                "deadline exceeded" if timed_out else "",
            )
            if not failed or attempt >= call.retries:
                return end, failed
            attempt += 1
            t = end + int(rng.uniform(10, 120) * NS_MS)

    def _client_extra(self, protocol: str, failed: bool, timed_out: bool, attempt: int) -> str:
        rng = self.rng
        parts = []
        if protocol == "http":
            if failed and timed_out:
                parts.append('{"key":"error.type","value":{"stringValue":"timeout"}}')
            else:
                code = rng.choice(HTTP_ERR) if failed else rng.choice(HTTP_OK)
                parts.append(
                    f'{{"key":"http.response.status_code","value":{{"intValue":"{code}"}}}}'
                )
                if failed:
                    parts.append(f'{{"key":"error.type","value":{{"stringValue":"{code}"}}}}')
        elif protocol == "grpc":
            code = (4 if timed_out else rng.choice(GRPC_ERR)) if failed else 0
            parts.append(f'{{"key":"rpc.grpc.status_code","value":{{"intValue":"{code}"}}}}')
        elif failed:
            kind = "timeout" if timed_out else rng.choice(ERROR_TYPES.get(protocol, ("error",)))
            parts.append(f'{{"key":"error.type","value":{{"stringValue":"{kind}"}}}}')
        if attempt:
            parts.append(
                f'{{"key":"http.request.resend_count","value":{{"intValue":"{attempt}"}}}}'
            )
        return "," + ",".join(parts) if parts else ""

    def _dependency(self, op: DepOp, t: int, tid: str, parent: str) -> tuple[int, bool]:
        rng = self.rng
        self.hits[op.dep.name] = self.hits.get(op.dep.name, 0) + 1
        if self.flow is not None:
            self._flow(op.dep.name)
        lat, err_add, lag = self.effects.at(op.dep.name, t)
        ms = self._dur(op.base_ms, op.sigma) * lat
        failed = rng.random() < op.err + err_add
        end = t + int(ms * NS_MS)
        if op.topic is not None and not failed:
            consumer = self.topo.topic_consumers.get(op.topic)
            if consumer is not None:
                delay = self._dur(15, 0.8) * lag * NS_MS
                self.pending.append((end + int(delay), consumer, parent, tid))
        return end, failed

    def _flow(self, node: str) -> None:
        assert self.flow is not None
        for upstream in set(self.stack):
            if upstream != node:
                key = (upstream, node)
                self.flow[key] = self.flow.get(key, 0) + 1

    def run_pending(self, until: int) -> None:
        """Deliver the queued messages due before ``until`` (CONSUMER spans)."""
        if not self.pending:
            return
        due = [p for p in self.pending if p[0] < until]
        if not due:
            return
        self.pending = [p for p in self.pending if p[0] >= until]
        for t, ep, parent, tid in sorted(due, key=lambda p: p[0]):
            self.serve(ep, parent, t, tid)
