"""The Bridge's three data sources, each a small protocol with a built-in adapter.

| source | protocol | built-in adapter | format |
|---|---|---|---|
| incidents | :class:`IncidentSource` | :class:`JsonIncidents` | a JSON array of incidents |
| deploys | :class:`DeploySource` | :class:`FileDeploys` | JSON array, or CSV with a header |
| traces | :class:`TraceSource` | :class:`OtlpJsonTraces` | OTLP/JSON files (see ``otlp``) |

Incidents and deploys are small: they are read from their files when asked (and read
again when a file changes). Traces are large: they are streamed into the trace index
(``keel.bridge.index``), which the diagnosis and ``search_traces`` query.

Every adapter refuses a bad file with :class:`~keel.bridge.errors.MalformedSource`,
naming the file, the record and what is wrong.
"""

from __future__ import annotations

import csv
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from keel.bridge.errors import MalformedSource, UnknownIncident
from keel.bridge.otlp import Row, read_spans
from keel.bridge.records import ENCODING, Deploy, Incident, parse_time
from keel.errors import ConfigurationError

__all__ = [
    "DEPLOY_FIELDS",
    "TRACE_SUFFIXES",
    "DeploySource",
    "FileDeploys",
    "IncidentSource",
    "JsonIncidents",
    "OtlpJsonTraces",
    "TraceSource",
    "trace_files",
]

DEPLOY_FIELDS = ("id", "service", "version", "commit", "author", "deployed_at", "summary")
"""Columns of a deploys CSV (``kind``, ``code`` or ``config``, is optional)."""
TRACE_SUFFIXES = (".json", ".jsonl", ".ndjson")

T = TypeVar("T")


class IncidentSource(Protocol):
    """Where incidents come from."""

    def all(self) -> Sequence[Incident]:
        """Every incident, oldest first. Raises MalformedSource."""
        ...

    def get(self, incident_id: str) -> Incident:
        """Raises UnknownIncident, MalformedSource."""
        ...


class DeploySource(Protocol):
    """Where deploy and configuration-change records come from."""

    def all(self) -> Sequence[Deploy]:
        """Every record, oldest first. Raises MalformedSource."""
        ...


class TraceSource(Protocol):
    """Where spans come from (streamed into the index)."""

    def files(self) -> list[Path]:
        """The files to index, in order. Raises ConfigurationError for a missing path."""
        ...

    def read(
        self, path: Path, consumed: Callable[[int], object] | None = None
    ) -> Iterator[list[Row]]:
        """The spans of one file, in batches; ``consumed`` hears the bytes read so far
        before each batch (for a progress bar). Raises MalformedSource."""
        ...


class _CachedFile(Generic[T]):
    """A file parsed once, and again whenever its size or mtime changes."""

    def __init__(self, path: Path, parse: Callable[[Path], T]) -> None:
        self.path = path
        self._parse = parse
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._value: T | None = None

    def get(self) -> T:
        try:
            st = self.path.stat()
        except OSError as exc:
            raise MalformedSource(self.path, f"cannot read: {exc.strerror or exc}") from exc
        stamp = (st.st_size, st.st_mtime_ns)
        with self._lock:
            if self._value is None or stamp != self._stamp:
                self._value = self._parse(self.path)
                self._stamp = stamp
            return self._value


def _load_json_records(path: Path, key: str) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding=ENCODING))
    except json.JSONDecodeError as exc:
        raise MalformedSource(path, f"not valid JSON: {exc.msg}", exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MalformedSource(path, f"cannot read: {exc}") from exc
    except RecursionError:  # the parser's answer to arrays nested ~1,000 deep
        raise MalformedSource(path, "not valid JSON: nested too deep to read") from None
    except ValueError as exc:  # an integer of over 4,300 digits
        raise MalformedSource(path, f"not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get(key), list):
        data = data[key]
    if not isinstance(data, list):
        raise MalformedSource(path, f"expected a JSON array of {key} (or {{{key!r}: [...]}})")
    return data


def _text(record: dict[str, Any], field: str, *, required: bool = True) -> str | None:
    value = record.get(field)
    if value is None or value == "":
        if required:
            raise ValueError(f"{field} is missing")
        return None
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string")
    return value


def _incident(record: Any) -> Incident:
    if not isinstance(record, dict):
        raise TypeError("an incident must be a JSON object")
    symptoms = record.get("symptoms", [])
    if isinstance(symptoms, str):
        symptoms = [symptoms]
    if not isinstance(symptoms, list) or not all(isinstance(s, str) for s in symptoms):
        raise TypeError("symptoms must be a list of strings")
    service = _text(record, "service", required=False) or _text(
        record, "affected_service", required=False
    )
    return Incident(
        id=str(_text(record, "id")),
        title=str(_text(record, "title")),
        severity=_text(record, "severity", required=False) or "unknown",
        opened_at=parse_time(record.get("opened_at"), "opened_at"),
        symptoms=tuple(symptoms),
        service=service,
    )


def _parse_incidents(path: Path) -> dict[str, Incident]:
    incidents: dict[str, Incident] = {}
    for n, record in enumerate(_load_json_records(path, "incidents")):
        try:
            incident = _incident(record)
        except (ValueError, TypeError) as exc:
            name = record.get("id") if isinstance(record, dict) else None
            raise MalformedSource(path, f"incident #{n + 1} ({name or 'no id'}): {exc}") from None
        if incident.id in incidents:
            raise MalformedSource(path, f"incident id {incident.id!r} appears twice")
        incidents[incident.id] = incident
    return dict(sorted(incidents.items(), key=lambda kv: (kv[1].opened_at, kv[0])))


class JsonIncidents:
    """Incidents from a JSON file: ``[{"id", "title", "severity", "opened_at",
    "symptoms": [...], "service"?}, …]`` (``service`` may be absent or null)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = _CachedFile(path, _parse_incidents)

    def all(self) -> Sequence[Incident]:
        return list(self._file.get().values())

    def get(self, incident_id: str) -> Incident:
        incidents = self._file.get()
        try:
            return incidents[incident_id]
        except KeyError:
            raise UnknownIncident(incident_id, list(incidents)) from None


def _deploy(record: dict[str, Any]) -> Deploy:
    summary = _text(record, "summary", required=False) or _text(record, "change_summary")
    kind = _text(record, "kind", required=False) or "code"
    if kind not in {"code", "config"}:
        raise ValueError(f"kind must be 'code' or 'config', not {kind!r}")
    return Deploy(
        id=str(_text(record, "id")),
        service=str(_text(record, "service")),
        version=_text(record, "version", required=False) or "",
        commit=_text(record, "commit", required=False) or "",
        author=_text(record, "author", required=False) or "",
        deployed_at=parse_time(record.get("deployed_at"), "deployed_at"),
        summary=str(summary),
        kind=kind,
    )


def _parse_deploys(path: Path) -> list[Deploy]:
    deploys: list[Deploy] = []
    if path.suffix.lower() == ".csv":
        try:
            with path.open(encoding=ENCODING, newline="") as file:
                reader = csv.DictReader(file)
                missing = [
                    f
                    for f in ("id", "service", "deployed_at")
                    if f not in (reader.fieldnames or [])
                ]
                if missing:
                    raise MalformedSource(path, f"the CSV header lacks {', '.join(missing)}", 1)
                for record in reader:
                    try:
                        deploys.append(_deploy(dict(record)))
                    except (ValueError, TypeError) as exc:
                        raise MalformedSource(path, str(exc), reader.line_num) from None
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise MalformedSource(path, f"cannot read as CSV: {exc}") from exc
    else:
        for n, record in enumerate(_load_json_records(path, "deploys")):
            if not isinstance(record, dict):
                raise MalformedSource(path, f"deploy #{n + 1}: a deploy record must be an object")
            try:
                deploys.append(_deploy(record))
            except (ValueError, TypeError) as exc:
                raise MalformedSource(path, f"deploy #{n + 1}: {exc}") from None
    ids = [d.id for d in deploys]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise MalformedSource(path, f"deploy id {twice!r} appears twice")
    return sorted(deploys, key=lambda d: (d.deployed_at, d.id))


class FileDeploys:
    """Deploy records from JSON (``[{"id", "service", "version", "commit", "author",
    "deployed_at", "summary", "kind"?}, …]``) or CSV with those columns as its header."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = _CachedFile(path, _parse_deploys)

    def all(self) -> Sequence[Deploy]:
        return self._file.get()


def trace_files(paths: Iterable[Path]) -> list[Path]:
    """The OTLP/JSON files named by ``paths``: files as given, folders by their
    ``*.json`` / ``*.jsonl`` / ``*.ndjson`` files (sorted by name, not recursive).

    Raises:
        ConfigurationError: a path that does not exist.
    """
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(
                sorted(p for p in path.iterdir() if p.is_file() and p.suffix in TRACE_SUFFIXES)
            )
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigurationError(f"trace source {path} does not exist")
    return found


class OtlpJsonTraces:
    """Spans from OTLP/JSON files, or folders of ``*.json`` / ``*.jsonl`` / ``*.ndjson``."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)

    def files(self) -> list[Path]:
        return trace_files(self.paths)

    def read(
        self, path: Path, consumed: Callable[[int], object] | None = None
    ) -> Iterator[list[Row]]:
        return read_spans(path, consumed=consumed)
