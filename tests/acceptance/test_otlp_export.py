"""Acceptance: spans exported by OTLP/HTTP (issue 18), the branch of
``keel.telemetry.tracing.configure_from_environment`` that OpenTelemetry's standard
variables select (``OTEL_EXPORTER_OTLP_ENDPOINT``).

The test runs a real OTLP/HTTP receiver on a socket bound to 127.0.0.1: it takes
``POST /v1/traces``, decodes each body as the protobuf ``ExportTraceServiceRequest``
(the collector's own message type) and answers an ``ExportTraceServiceResponse``. A real
``keel serve`` process (in-process workers, SQLite) is pointed at it and runs a task of
two steps: the receiver gets the front end's ``tools/call`` span and the task's attempt
and step spans, under the service name asked for, in one trace rooted at the call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from keel_serve import KeelServe
from tasks_extension.support import post, serve_asgi

from .apps.harness import APPS, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
WAIT = 60.0  # seconds for the spans to arrive (a batch every 50 ms, a loaded machine)
SERVICE = "keel-otlp-test"
PROTOBUF = "application/x-protobuf"


def attributes(span: Any) -> dict[str, Any]:
    """A protobuf span's attributes as plain values."""
    plain: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        plain[kv.key] = getattr(kv.value, kind) if kind else None
    return plain


class Receiver:
    """What the OTLP/HTTP receiver was sent: every span, with its service name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        self.changed = anyio.Event()

    async def traces(self, request: Request) -> Response:
        self.content_types.add(request.headers.get("content-type", ""))
        export = ExportTraceServiceRequest.FromString(await request.body())
        for resource in export.resource_spans:
            service = next(
                kv.value.string_value
                for kv in resource.resource.attributes
                if kv.key == "service.name"
            )
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "service": service,
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "attrs": attributes(span),
                        }
                    )
        self.changed.set()
        self.changed = anyio.Event()
        body = ExportTraceServiceResponse().SerializeToString()
        return Response(body, media_type=PROTOBUF)

    def of_task(self, task_id: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["attrs"].get("mcp.task.id") == task_id]

    async def until(self, done: Any) -> None:
        """Wait (bounded) until ``done()`` holds for what has been received."""
        with anyio.fail_after(WAIT):
            while not done():
                await self.changed.wait()


def environment(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """The server's environment: the test app's, none of the caller's OpenTelemetry
    settings, and OTLP/HTTP to ``endpoint`` in batches every 50 ms."""
    env = {
        k: v
        for k, v in worker_env(tmp_path / "effects.jsonl").items()
        if not k.startswith(("OTEL_", "KEEL_OTEL"))
    }
    return env | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # milliseconds between two batches
    }


@pytest.mark.skipif(os.name != "posix", reason="keel serve is a POSIX process here")
async def test_spans_reach_an_otlp_http_receiver(tmp_path: Path) -> None:
    """With only ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, ``keel serve`` posts protobuf
    exports to ``ENDPOINT/v1/traces``: the task's attempt span (completed, its attempt
    number and worker) and its two step spans arrive, with the ``tools/call`` span that
    created the task, all of service ``OTEL_SERVICE_NAME`` and in the call's trace."""
    receiver = Receiver()
    collector = Starlette(routes=[Route("/v1/traces", receiver.traces, methods=["POST"])])
    async with serve_asgi(collector) as endpoint:
        args = ["--app", "steps_app:app", "--store", str(tmp_path / "keel.db")]
        server = KeelServe(
            [*args, "--data-dir", str(tmp_path / "data")],
            cwd=APPS,
            env=environment(tmp_path, endpoint),
            log=tmp_path / "keel-serve.log",
        )
        server.start()
        try:
            await server.ready()
            created = await post(
                server.url,
                "tools/call",
                {"name": "multi_step", "arguments": {"steps": 2, "work_ms": 1}},
            )
            task_id = created.result["taskId"]

            def arrived() -> bool:
                names = [s["name"] for s in receiver.of_task(task_id)]
                calls = [s for s in receiver.spans if s["name"].startswith("tools/call")]
                done = any(
                    s["attrs"].get("mcp.task.status") == "completed"
                    for s in receiver.of_task(task_id)
                )
                return done and names.count("keel.step step-1") >= 1 and bool(calls)

            await receiver.until(arrived)
        finally:
            assert server.stop() == 0, server.output()
    spans = receiver.of_task(task_id)
    [attempt] = [s for s in spans if s["name"] == "keel.attempt multi_step"]
    steps = sorted(s["name"] for s in spans if s["name"].startswith("keel.step"))
    [call] = [s for s in receiver.spans if s["span_id"] == attempt["parent"]]
    assert receiver.content_types == {PROTOBUF}
    assert {s["service"] for s in receiver.spans} == {SERVICE}
    assert steps == ["keel.step step-0", "keel.step step-1"], steps
    assert attempt["attrs"]["mcp.task.attempt"] == 1
    assert attempt["attrs"]["mcp.task.status"] == "completed"
    assert attempt["attrs"]["mcp.task.worker"], attempt
    assert call["name"].startswith("tools/call"), call
    assert {s["trace_id"] for s in spans} == {call["trace_id"]}
    assert all(s["parent"] == call["span_id"] for s in spans), spans
