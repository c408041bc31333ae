"""SQLite's result codes as Keel errors: the one place that reads ``sqlite3`` errors.

An error is recognised by the result code SQLite reports with it
(``sqlite_errorcode`` / ``sqlite_errorname``), never by its message text, which SQLite
words differently from version to version. The extended code is looked up first (a
unique index refusing a row), then its primary code (any other constraint). Every code
the adapter is known to meet is in :data:`FAULTS`; anything else reads as a plain SQLite
error, with SQLite's own words. A lock held past the busy timeout, a full disk and a
read-only file are :class:`~keel.errors.StoreUnavailable` (the store cannot serve for
now, and says why); a damaged page or header is :class:`~keel.errors.StoreCorrupt` (it
must be restored); the others are :class:`~keel.errors.StoreError`.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from keel.errors import StoreCorrupt, StoreError, StoreUnavailable

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
    unavailable: bool = False
    """The store cannot serve for now: a :class:`StoreUnavailable` whose cause is
    :attr:`message` (then without ``{path}``)."""
    damaged: bool = False
    """The file is damaged: a :class:`StoreCorrupt` (restore it from a backup)."""


_BUSY = (
    "busy: another process held its write lock longer than the busy timeout; nothing was "
    "written ({detail})"
)
_UNREADABLE = (
    "store {path} is not a readable Keel SQLite store: its header is damaged or it was "
    "replaced; restore it from a backup (one made by keel backup) ({detail})"
)
_READ_ONLY = "read-only: the file or its folder cannot be written; nothing was written ({detail})"
_READ_ONLY_FOLDER = (
    "cannot open store {path}: its folder is read-only, and SQLite must write {name}-wal "
    "and {name}-shm beside it; make the folder writable or move the store ({detail})"
)

FAULTS: Final[dict[str, Fault]] = {
    f.name: f
    for f in (
        Fault("SQLITE_BUSY", _BUSY, busy=True, unavailable=True),
        Fault("SQLITE_LOCKED", _BUSY, busy=True, unavailable=True),
        Fault("SQLITE_NOTADB", _UNREADABLE, damaged=True),
        Fault(
            "SQLITE_CORRUPT",
            "store {path} is corrupt: some of its pages are damaged; restore it from a "
            "backup (one made by keel backup); keel check gives the full report ({detail})",
            damaged=True,
        ),
        Fault("SQLITE_READONLY", _READ_ONLY, unavailable=True),
        Fault("SQLITE_PERM", _READ_ONLY, unavailable=True),
        Fault("SQLITE_CANTOPEN", "cannot open store {path} ({detail})"),
        Fault(
            "SQLITE_FULL",
            "the disk is full; nothing was written ({detail})",
            unavailable=True,
        ),
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
    detail = str(exc) or type(exc).__name__
    error: StoreError
    if fault is not None and fault.unavailable:
        error = StoreUnavailable(str(path), fault.message.format(detail=detail))
    elif fault is not None and fault.damaged:
        error = StoreCorrupt(str(path), fault.message.format(path=path, detail=detail), detail)
    else:
        template = GENERIC if fault is None else fault.message
        if fault is FAULTS["SQLITE_CANTOPEN"] and _read_only_folder(Path(path)):
            template = _READ_ONLY_FOLDER
        error = StoreError(template.format(path=path, name=Path(path).name, detail=detail))
    error.__cause__ = exc
    return error


def _read_only_folder(path: Path) -> bool:
    """Whether the existing file ``path`` sits in a folder that cannot be written: a
    read-only file system (which stops root too) or no write permission."""
    folder = path.parent
    try:
        if not path.is_file():
            return False
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY) or not os.access(folder, os.W_OK)
    except OSError:
        return False
