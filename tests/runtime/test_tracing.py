"""Runtime: one trace per task (keel.telemetry.tracing), with the OpenTelemetry SDK's
in-memory exporter.

A task created inside a span (what the SDK's ``tools/call`` span is) runs three
attempts: the first crashes after a step, the second replays that step and parks for
input, the third replays it again, takes the answer and completes. Every span is in the
creating span's trace, and every attempt and step span is that span's child.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import SqliteStore
from keel.telemetry import tracing

from .support import SERVICE, parks, running, settles, worker

pytestmark = pytest.mark.anyio


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    """An SDK tracer provider for Keel's spans (and the test's own), for this test only."""
    made = TracerProvider()
    tracing.use_tracer_provider(made)
    try:
        yield made
    finally:
        tracing.use_tracer_provider(None)
        made.shutdown()


@pytest.fixture
def spans(provider: TracerProvider) -> InMemorySpanExporter:
    """Every span ``provider`` ends, in memory."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def test_one_trace_per_task_across_a_restart_and_input(
    tmp_path: Path, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    """Three attempts (a crash, a park for input, a completion) and their steps: one
    trace, every span a child of the span the task was created in; replayed steps are
    marked; the input wait is an event pair; the last attempt says the task completed."""
    store = SqliteStore(tmp_path / "keel.db")
    app = Keel(store)
    crashed: list[int] = []

    @app.task("diagnose", max_attempts=3, retry_base=0.001, retry_cap=0.001)
    async def diagnose(ctx: TaskContext) -> str:
        first = await ctx.step("fetch", lambda: "logs")
        if not crashed:
            crashed.append(ctx.attempt)
            raise RuntimeError("the worker's process died")
        answer = await ctx.elicit("Which service?", SERVICE, key="service")
        return f"{first} of {answer['service']}"

    # A span of its own stands for the SDK's tools/call span.
    with provider.get_tracer("mcp").start_as_current_span("tools/call diagnose") as root:
        task = await app.submit("diagnose")
    async with running(worker(app, worker_id="w1")):
        await parks(store, task.task_id)
        await store.provide_input(task.task_id, {"service": {"service": "db"}})
        done = await settles(store, task.task_id)
    await store.close()
    assert done.status is Status.COMPLETED

    finished = spans.get_finished_spans()
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in finished} == {trace_id}
    below = [s for s in finished if s.name != "tools/call diagnose"]
    assert {s.parent.span_id for s in below if s.parent} == {root.get_span_context().span_id}
    assert all(s.parent is not None for s in below)

    attempts = sorted((s for s in below if s.name == "keel.attempt diagnose"),
                      key=lambda s: s.start_time or 0)  # fmt: skip
    assert [attributes(s)["mcp.task.attempt"] for s in attempts] == [1, 2, 2]
    assert [attributes(s)["mcp.task.outcome"] for s in attempts] == [
        "error", "input_required", "completed",
    ]  # fmt: skip
    assert [attributes(s)["mcp.task.status"] for s in attempts] == [
        "working", "input_required", "completed",
    ]  # fmt: skip
    assert {attributes(s)["mcp.task.id"] for s in attempts} == {task.task_id}
    assert {attributes(s)["mcp.task.worker"] for s in attempts} == {"w1"}
    messaging = {k: v for k, v in attributes(attempts[0]).items() if k.startswith("messaging.")}
    assert messaging == {
        "messaging.system": "keel",
        "messaging.operation.type": "process",
        "messaging.operation.name": "attempt",
        "messaging.destination.name": "diagnose",
        "messaging.message.id": task.task_id,
        "messaging.client.id": "w1",
    }
    assert [attributes(s)["mcp.task.fence"] for s in attempts] == [1, 2, 3]
    assert [e.name for e in attempts[1].events] == ["mcp.task.input_requested"]
    assert [e.name for e in attempts[2].events] == ["mcp.task.input_received"]

    steps = sorted((s for s in below if s.name == "keel.step fetch"),
                   key=lambda s: s.start_time or 0)  # fmt: skip
    assert [attributes(s)["mcp.task.step.replayed"] for s in steps] == [False, True, True]
    assert [attributes(s)["mcp.task.attempt"] for s in steps] == [1, 2, 2]


async def test_no_span_no_stored_context(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """A task created outside any span stores no trace context; its attempts are traced
    all the same, each a trace of its own."""
    store = SqliteStore(tmp_path / "keel.db")
    app = Keel(store)

    @app.task("plain")
    async def plain(ctx: TaskContext) -> str:
        return "done"

    task = await app.submit("plain")
    assert task.trace_context is None
    async with running(worker(app)):
        await settles(store, task.task_id)
    await store.close()
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["keel.attempt plain"]
