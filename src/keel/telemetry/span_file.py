"""Spans written to a file as OTLP/JSON lines (``$KEEL_OTEL_FILE``), for tests and for
hosts without a collector.

Each ended span is appended at once (a simple span processor, no batch), as one line: an
OTLP/JSON ``ExportTraceServiceRequest`` (``resourceSpans`` → ``scopeSpans`` → ``spans``),
encoded by OpenTelemetry's own OTLP encoder, with trace and span ids in hex as the OTLP
file format has them. A process SIGKILLed loses only the spans still open. Needs the
``[otel]`` extra (the SDK and the OTLP encoder).

The file rotates by size: a line that would take it past ``max_bytes`` first moves it
aside, ``spans.jsonl`` to ``spans.1.jsonl`` (``spans.1.jsonl`` to ``spans.2.jsonl`` …, the
oldest past ``backups`` deleted), and starts a new one. Lines are whole and flushed when
written, and a file is only ever renamed: a rotated file reads as it was written, and a
process killed halfway through a rotation loses nothing (at worst a backup number is
skipped, or the current file is missing). :func:`span_files` lists them all, oldest
first. One process per file: rotation is not coordinated between processes.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["DEFAULT_BACKUPS", "DEFAULT_MAX_BYTES", "FileSpanExporter", "backup_path", "span_files"]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""A span file is rotated before it grows past this (bytes; 0: never)."""
DEFAULT_BACKUPS = 4
"""Rotated files kept beside the current one (the oldest beyond are deleted)."""

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


def backup_path(path: Path, n: int) -> Path:
    """The ``n``-th rotated file of ``path``: ``spans.jsonl`` -> ``spans.N.jsonl`` (the
    suffix kept, so a folder of ``*.jsonl`` files holds the backups too)."""
    return path.with_name(f"{path.stem}.{n}{path.suffix}")


def span_files(path: Path | str) -> list[Path]:
    """``path`` and its rotated files that exist, oldest first (the highest number first,
    ``path`` itself last)."""
    path = Path(path)
    pattern = re.compile(re.escape(path.stem) + r"\.([1-9][0-9]*)" + re.escape(path.suffix))
    found = []
    for candidate in path.parent.glob(f"{glob.escape(path.stem)}.*{glob.escape(path.suffix)}"):
        matched = pattern.fullmatch(candidate.name)
        if matched is not None:
            found.append((int(matched.group(1)), candidate))
    files = [p for _, p in sorted(found, reverse=True)]
    return [*files, path] if path.exists() else files


class FileSpanExporter(SpanExporter):
    """Appends each export to ``path`` as one OTLP/JSON line (flushed before returning),
    rotating the file past ``max_bytes`` (0: never) and keeping ``backups`` (see the
    module doc)."""

    def __init__(
        self,
        path: Path | str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._file = self.path.open("ab")
        self._size = self._file.tell()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        message = MessageToDict(encode_spans(spans))
        line = (json.dumps(_hex_ids(message), separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            if self.max_bytes and self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
        return SpanExportResult.SUCCESS

    def _rotate(self) -> None:
        """Close the file, shift the backups up by one (the oldest past ``backups``
        dropped), move the file to backup 1, and start a new one (whatever failed)."""
        self._file.close()
        try:
            for n in range(self.backups, 0, -1):
                older = backup_path(self.path, n)
                if older.exists():
                    older.replace(backup_path(self.path, n + 1))
            with contextlib.suppress(FileNotFoundError):  # deleted by someone: start anew
                self.path.replace(backup_path(self.path, 1))
            backup_path(self.path, self.backups + 1).unlink(missing_ok=True)
        finally:
            self._file = self.path.open("ab")
            self._size = self._file.tell()

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
