"""Unit: :class:`keel.telemetry.span_file.FileSpanExporter` writes OTLP/JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from keel.telemetry.span_file import FileSpanExporter


def test_each_ended_span_is_one_otlp_json_line_with_hex_ids(tmp_path: Path) -> None:
    """A parent and its child, each written as it ends (child first): one line per span,
    ids in hex as the span contexts have them, the child's parentSpanId the parent's."""
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "unit"}))
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("parent") as parent:
        with tracer.start_as_current_span("child", attributes={"n": 3}) as child:
            pass
        assert len(path.read_text().splitlines()) == 1, "the child is on disk when it ends"
    provider.shutdown()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    spans = [
        (resource, span)
        for line in lines
        for resource in line["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    assert [span["name"] for _, span in spans] == ["child", "parent"]
    (resource, got_child), (_, got_parent) = spans
    assert {"key": "service.name", "value": {"stringValue": "unit"}} in resource["resource"][
        "attributes"
    ]
    parent_context, child_context = parent.get_span_context(), child.get_span_context()
    assert got_parent["traceId"] == got_child["traceId"] == f"{parent_context.trace_id:032x}"
    assert got_parent["spanId"] == f"{parent_context.span_id:016x}"
    assert got_child["spanId"] == f"{child_context.span_id:016x}"
    assert got_child["parentSpanId"] == got_parent["spanId"]
    assert "parentSpanId" not in got_parent
    assert got_child["attributes"] == [{"key": "n", "value": {"intValue": "3"}}]


def test_an_export_after_shutdown_fails_without_writing(tmp_path: Path) -> None:
    """Once shut down, the exporter reports failure and leaves the file as it was."""
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    exporter = FileSpanExporter(path)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("kept"):
        pass
    exporter.shutdown()
    before = path.read_text()
    span = provider.get_tracer("test").start_span("late")
    span.end()
    assert isinstance(span, ReadableSpan)
    assert exporter.export([span]) is SpanExportResult.FAILURE
    assert path.read_text() == before
    provider.shutdown()
