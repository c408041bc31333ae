"""Unit: :class:`keel.telemetry.span_file.FileSpanExporter` writes OTLP/JSON lines and
rotates its file by size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from keel.errors import ConfigurationError
from keel.telemetry.span_file import FileSpanExporter, backup_path, span_files
from keel.telemetry.tracing import file_rotation


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


def _spans(names: list[str]) -> list[ReadableSpan]:
    """Ended spans named ``names`` (names of one length make lines of one length)."""
    tracer = TracerProvider(resource=Resource.create({"service.name": "unit"})).get_tracer("t")
    spans = []
    for name in names:
        span = tracer.start_span(name)
        span.end()
        assert isinstance(span, ReadableSpan)
        spans.append(span)
    return spans


def _names(path: Path) -> list[str]:
    return [
        span["name"]
        for line in path.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]


def _line_bytes(tmp_path: Path) -> int:
    """The size of one exported line of a span named like the tests' (``sN``)."""
    probe = tmp_path / "probe.jsonl"
    exporter = FileSpanExporter(probe, max_bytes=0)
    exporter.export(_spans(["s9"]))
    exporter.shutdown()
    return probe.stat().st_size


def test_a_file_rotates_by_size_keeping_its_backups(tmp_path: Path) -> None:
    """Room for two lines a file, two backups: seven spans end as spans.2 (s2, s3),
    spans.1 (s4, s5) and the file (s6); s0 and s1 went with the oldest backup. Every
    rotated file reads whole, and span_files lists them oldest first."""
    line = _line_bytes(tmp_path)
    path = tmp_path / "spans.jsonl"
    exporter = FileSpanExporter(path, max_bytes=2 * line, backups=2)
    for span in _spans([f"s{n}" for n in range(7)]):
        assert exporter.export([span]) is SpanExportResult.SUCCESS
    exporter.shutdown()
    first, second = tmp_path / "spans.2.jsonl", tmp_path / "spans.1.jsonl"
    assert span_files(path) == [first, second, path]
    assert [_names(p) for p in span_files(path)] == [["s2", "s3"], ["s4", "s5"], ["s6"]]
    assert not (tmp_path / "spans.3.jsonl").exists()
    assert all(p.stat().st_size <= 2 * line for p in span_files(path))


def test_a_reopened_file_counts_what_it_holds(tmp_path: Path) -> None:
    """A process that restarts appends to its file, and rotates it counting the lines
    already there: one line there, room for two, two exports: one rotation."""
    line = _line_bytes(tmp_path)
    path = tmp_path / "spans.jsonl"
    earlier = FileSpanExporter(path, max_bytes=2 * line)
    earlier.export(_spans(["s0"]))
    earlier.shutdown()
    later = FileSpanExporter(path, max_bytes=2 * line)
    for span in _spans(["s1", "s2"]):
        later.export([span])
    later.shutdown()
    assert [_names(p) for p in span_files(path)] == [["s0", "s1"], ["s2"]]


def test_no_rotation_at_zero_and_none_kept_at_zero_backups(tmp_path: Path) -> None:
    """max_bytes 0 never rotates; backups 0 starts the file anew, keeping nothing."""
    line = _line_bytes(tmp_path)
    kept, fresh = tmp_path / "kept.jsonl", tmp_path / "fresh.jsonl"
    forever = FileSpanExporter(kept, max_bytes=0)
    anew = FileSpanExporter(fresh, max_bytes=line, backups=0)
    for span in _spans(["s0", "s1", "s2"]):
        forever.export([span])
        anew.export([span])
    forever.shutdown()
    anew.shutdown()
    assert (span_files(kept), _names(kept)) == ([kept], ["s0", "s1", "s2"])
    assert (span_files(fresh), _names(fresh)) == ([fresh], ["s2"])


def test_span_files_finds_backups_only(tmp_path: Path) -> None:
    """Backups are ``stem.N.suffix``, N from 1, in number order (not name order); gaps
    (a process killed mid-rotation) and a missing current file are fine; look-alikes
    and other processes' files are not backups."""
    path = tmp_path / "spans-w1.jsonl"
    for name in ("spans-w1.10.jsonl", "spans-w1.2.jsonl", "spans-w1.0.jsonl",
                 "spans-w1.02.jsonl", "spans-w1.x.jsonl", "spans-w1.3.json",
                 "spans-w12.jsonl", "spans-w1.1.jsonl.tmp"):  # fmt: skip
        (tmp_path / name).write_text("")
    assert span_files(path) == [tmp_path / "spans-w1.10.jsonl", tmp_path / "spans-w1.2.jsonl"]
    assert backup_path(path, 3) == tmp_path / "spans-w1.3.jsonl"
    assert backup_path(tmp_path / "spans", 1) == tmp_path / "spans.1"


@pytest.mark.parametrize("text", ["-1", "1e6", "1_000", "²", "ten"])
def test_a_bad_rotation_setting_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """KEEL_OTEL_FILE_MAX_BYTES / _BACKUPS must be whole numbers >= 0: anything else is
    a ConfigurationError naming the variable; unset, the defaults hold."""
    monkeypatch.delenv("KEEL_OTEL_FILE_MAX_BYTES", raising=False)
    monkeypatch.delenv("KEEL_OTEL_FILE_BACKUPS", raising=False)
    assert file_rotation() == {}
    monkeypatch.setenv("KEEL_OTEL_FILE_MAX_BYTES", " 1048576 ")
    monkeypatch.setenv("KEEL_OTEL_FILE_BACKUPS", "0")
    assert file_rotation() == {"max_bytes": 1048576, "backups": 0}
    monkeypatch.setenv("KEEL_OTEL_FILE_BACKUPS", text)
    with pytest.raises(ConfigurationError, match="KEEL_OTEL_FILE_BACKUPS"):
        file_rotation()
