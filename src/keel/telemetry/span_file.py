"""Spans written to a file as OTLP/JSON lines (``$KEEL_OTEL_FILE``), for tests and for
hosts without a collector.

Each ended span is appended at once (a simple span processor, no batch), as one line: an
OTLP/JSON ``ExportTraceServiceRequest`` (``resourceSpans`` → ``scopeSpans`` → ``spans``),
encoded by OpenTelemetry's own OTLP encoder, with trace and span ids in hex as the OTLP
file format has them. A process SIGKILLed loses only the spans still open. Needs the
``[otel]`` extra (the SDK and the OTLP encoder).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["FileSpanExporter"]

_IDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(value: Any) -> Any:
    """``value`` with every trace/span id turned from protobuf JSON's base64 to hex."""
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    if not isinstance(value, dict):
        return value
    return {
        k: base64.b64decode(v).hex() if k in _IDS and isinstance(v, str) else _hex_ids(v)
        for k, v in value.items()
    }


class FileSpanExporter(SpanExporter):
    """Appends each export to ``path`` as one OTLP/JSON line (flushed before returning)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        message = MessageToDict(encode_spans(spans))
        line = json.dumps(_hex_ids(message), separators=(",", ":")) + "\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
