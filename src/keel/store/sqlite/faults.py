"""SQLite's result codes as Keel errors: the one place that reads ``sqlite3`` errors.

An error is recognised by the result code SQLite reports with it
(``sqlite_errorcode`` / ``sqlite_errorname``), never by its message text, which SQLite
words differently from version to version. The extended code is looked up first (a
unique index refusing a row), then its primary code (any other constraint). Every code
the adapter is known to meet is in :data:`FAULTS`; anything else reads as a plain SQLite
error, with SQLite's own words.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from keel.errors import StoreError

__all__ = ["FAULTS", "GENERIC", "Fault", "fault_of", "is_busy", "translate"]


@dataclass(frozen=True, slots=True)
class Fault:
    """What a SQLite result code means to a Keel user."""

    name: str
    """SQLite's name of the code (``SQLITE_BUSY``)."""
    message: str
    """The StoreError's text: ``{path}`` is the store, ``{detail}`` SQLite's message."""
    busy: bool = False
    """Another connection holds a lock: waiting (up to the busy timeout) may help."""


_BUSY = (
    "store {path} is busy: another process held its write lock longer than the busy "
    "timeout ({detail})"
)
_UNREADABLE = "store {path} is not a readable Keel SQLite store ({detail})"
_READ_ONLY = "cannot write to store {path} ({detail})"

FAULTS: Final[dict[str, Fault]] = {
    f.name: f
    for f in (
        Fault("SQLITE_BUSY", _BUSY, busy=True),
        Fault("SQLITE_LOCKED", _BUSY, busy=True),
        Fault("SQLITE_NOTADB", _UNREADABLE),
        Fault(
            "SQLITE_CORRUPT", "store {path} is damaged: not a readable Keel SQLite store ({detail})"
        ),
        Fault("SQLITE_READONLY", _READ_ONLY),
        Fault("SQLITE_PERM", _READ_ONLY),
        Fault("SQLITE_CANTOPEN", "cannot open store {path} ({detail})"),
        Fault("SQLITE_FULL", "store {path}: the disk is full; nothing was written ({detail})"),
        Fault("SQLITE_IOERR", "store {path}: the disk failed a read or a write ({detail})"),
        Fault("SQLITE_CONSTRAINT_UNIQUE", "store {path} already has that row ({detail})"),
        Fault("SQLITE_CONSTRAINT", "store {path} refused a write its schema forbids ({detail})"),
    )
}
"""Every SQLite result code the adapter expects to meet, by name."""

GENERIC: Final = "SQLite error on store {path}: {detail}"
"""The text of any other SQLite error (or of one that carries no code)."""

_PRIMARY: Final[dict[int, str]] = {
    getattr(sqlite3, name): name for name in FAULTS if name.count("_") == 1
}
"""Primary result code -> its name, for the codes of :data:`FAULTS`."""


def fault_of(exc: BaseException) -> Fault | None:
    """The entry of :data:`FAULTS` for ``exc``, by its extended code, then its primary one."""
    name = getattr(exc, "sqlite_errorname", None)
    if name in FAULTS:
        return FAULTS[name]
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return None
    primary = _PRIMARY.get(code & 0xFF)
    return None if primary is None else FAULTS[primary]


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says another connection holds a lock (SQLITE_BUSY, SQLITE_LOCKED)."""
    fault = fault_of(exc)
    return fault is not None and fault.busy


def translate(exc: sqlite3.Error, path: Path | str) -> StoreError:
    """``exc`` as the StoreError a caller sees (``__cause__`` is ``exc``)."""
    fault = fault_of(exc)
    template = GENERIC if fault is None else fault.message
    error = StoreError(template.format(path=path, detail=str(exc) or type(exc).__name__))
    error.__cause__ = exc
    return error
