"""The Incident Bridge's own errors, all :class:`~keel.errors.KeelError` subclasses (so the
CLI prints them as one line and exit code 1)::

    KeelError
    └── BridgeError            anything the Bridge refuses
        ├── MalformedSource    a data file that cannot be read: names the file and line
        ├── IngestWorkerFailed a worker process of a parallel ingest died or failed
        ├── UnknownIncident    no incident has this id
        ├── UnknownService     no span in the index names this service
        └── BadQuery           a tool argument that cannot be used (a bad time range …)

A refused ingest leaves the index exactly as it was (it is built aside and swapped in).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from keel.errors import KeelError

__all__ = [
    "BadQuery",
    "BridgeError",
    "IngestWorkerFailed",
    "MalformedSource",
    "UnknownIncident",
    "UnknownService",
]


class BridgeError(KeelError):
    """Base class of the Bridge's errors."""


class MalformedSource(BridgeError, ValueError):
    """A data file that cannot be read as what it should be.

    Attributes:
        path: the file.
        line: the 1-based line where the problem is (None when it is the file as a whole).
        reason: what is wrong.
    """

    def __init__(self, path: Path | str, reason: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"malformed data file {where}: {reason}")
        self.path = Path(path)
        self.line = line
        self.reason = reason


class IngestWorkerFailed(BridgeError, RuntimeError):
    """A worker process of a parallel ingest died (killed, out of memory …) or failed
    (what it raised is in the message). The ingest stopped at once, its other workers
    with it, and the index is left as it was. (A malformed trace file is not this: it is
    :class:`MalformedSource`, however many processes read the files.)

    Attributes:
        detail: what a failed worker printed of its error (its traceback), if any.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class UnknownIncident(BridgeError, LookupError):
    """No incident has this id."""

    def __init__(self, incident_id: str, known: Sequence[str]) -> None:
        shown = ", ".join(list(known)[:5])
        more = f" (and {len(known) - 5} more)" if len(known) > 5 else ""
        hint = f"; known incidents: {shown}{more}" if known else "; there are no incidents"
        super().__init__(f"unknown incident: {incident_id!r}{hint}")
        self.incident_id = incident_id


class UnknownService(BridgeError, LookupError):
    """No span in the index names this service."""

    def __init__(self, service: str, known: Sequence[str]) -> None:
        super().__init__(f"unknown service: {service!r}; known services: {', '.join(known)}")
        self.service = service


class BadQuery(BridgeError, ValueError):
    """A tool argument that cannot be used, e.g. a time range that ends before it starts."""
