"""The Bridge's records (incidents, deploys, spans) and the time format they share.

Times on the wire and in files are ISO 8601 UTC strings (``2026-03-14T09:44:00Z``);
inside, spans keep OTLP's nanoseconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from keel.model import JsonObject

__all__ = [
    "ENCODING",
    "NS_PER_MINUTE",
    "NS_PER_S",
    "Deploy",
    "Incident",
    "Span",
    "format_time",
    "parse_time",
]

ENCODING = "utf-8-sig"
"""How every source file is read: UTF-8, with or without the byte-order mark that
spreadsheets put at the start of a "CSV UTF-8" export (CRLF line ends are read too)."""
SPAN_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
NS_PER_S = 1_000_000_000
NS_PER_MINUTE = 60 * NS_PER_S


def parse_time(value: Any, what: str) -> int:
    """An ISO 8601 time (``Z`` or an offset; naive means UTC) as nanoseconds since the epoch.

    Raises:
        ValueError: not a time, naming ``what``.
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be an ISO 8601 time such as 2026-03-14T09:44:00Z")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"{what} is not an ISO 8601 time: {value!r} (e.g. 2026-03-14T09:44:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp()) * NS_PER_S + moment.microsecond * 1000


def format_time(ns: int) -> str:
    """Nanoseconds since the epoch as ``2026-03-14T09:44:00Z`` (milliseconds if any)."""
    moment = datetime.fromtimestamp(ns // NS_PER_S, tz=UTC)
    millis = (ns % NS_PER_S) // 1_000_000
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


@dataclass(frozen=True, slots=True)
class Incident:
    """An incident as the incident database records it."""

    id: str
    title: str
    severity: str
    opened_at: int  # ns since the epoch
    symptoms: tuple[str, ...] = ()
    service: str | None = None  # the affected service, when the reporter knew it

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "opened_at": format_time(self.opened_at),
            "symptoms": list(self.symptoms),
            "service": self.service,
        }


@dataclass(frozen=True, slots=True)
class Deploy:
    """A deploy (or configuration change) record."""

    id: str
    service: str
    version: str
    commit: str
    author: str
    deployed_at: int  # ns since the epoch
    summary: str
    kind: str = "code"  # "code" or "config": what the change was

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "service": self.service,
            "version": self.version,
            "commit": self.commit,
            "author": self.author,
            "deployed_at": format_time(self.deployed_at),
            "summary": self.summary,
            "kind": self.kind,
        }


@dataclass(frozen=True, slots=True)
class Span:
    """One span, as the index keeps it."""

    trace_id: str
    span_id: str
    parent_id: str | None
    service: str
    name: str
    start: int  # ns since the epoch
    end: int  # ns since the epoch
    error: bool
    attributes: dict[str, Any] = field(default_factory=dict)
    kind: int = 0  # OTLP span kind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer
    peer: str | None = None  # what a client or producer span calls

    @property
    def duration_ms(self) -> float:
        return (self.end - self.start) / 1e6

    def to_json(self) -> JsonObject:
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_id,
            "service": self.service,
            "name": self.name,
            "start": format_time(self.start),
            "end": format_time(self.end),
            "duration_ms": round(self.duration_ms, 3),
            "error": self.error,
            "kind": SPAN_KINDS.get(self.kind, "unspecified"),
            **({"peer": self.peer} if self.peer else {}),
        }
