"""SQLite errors as Keel errors: the one table in ``keel.store.sqlite.faults``.

Every result code the adapter expects is listed here again, with the words its
StoreError must say: the two tables must agree both ways. The codes are set on the
exceptions directly, so the text SQLite would use plays no part (it is never read).
"""

from __future__ import annotations

import sqlite3

import pytest

from keel.errors import StoreCorrupt, StoreError, StoreUnavailable
from keel.store.sqlite.faults import FAULTS, GENERIC, is_busy, translate

PATH = "/data/keel.db"

EXPECTED = {
    "SQLITE_BUSY": "store /data/keel.db is unavailable: busy: another process held its write",
    "SQLITE_LOCKED": "store /data/keel.db is unavailable: busy: another process held its write",
    "SQLITE_NOTADB": "store /data/keel.db is not a readable Keel SQLite store",
    "SQLITE_CORRUPT": "store /data/keel.db is corrupt: some of its pages are damaged",
    "SQLITE_READONLY": "store /data/keel.db is unavailable: read-only: the file or its folder",
    "SQLITE_PERM": "store /data/keel.db is unavailable: read-only: the file or its folder",
    "SQLITE_CANTOPEN": "cannot open store /data/keel.db",
    "SQLITE_FULL": "store /data/keel.db is unavailable: the disk is full; nothing was written",
    "SQLITE_IOERR": "store /data/keel.db: the disk failed a read or a write",
    "SQLITE_CONSTRAINT_UNIQUE": "store /data/keel.db already has that row",
    "SQLITE_CONSTRAINT": "store /data/keel.db refused a write its schema forbids",
}
"""Result code -> the start of the StoreError's message."""

BUSY = {"SQLITE_BUSY", "SQLITE_LOCKED"}
UNAVAILABLE = {*BUSY, "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_FULL"}
"""The codes of a store that cannot serve for now: StoreUnavailable, not a plain StoreError."""
DAMAGED = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
"""The codes of a damaged file: StoreCorrupt (-32051 over MCP), to be restored."""


def _error(name: str, text: str = "what SQLite said") -> sqlite3.Error:
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = getattr(sqlite3, name)
    exc.sqlite_errorname = name
    return exc


def test_the_table_lists_exactly_the_expected_codes():
    """No code is mapped without a test here, and none tested here is missing."""
    assert set(FAULTS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_code_maps_to_its_message(name):
    """Each code becomes a StoreError that names the store, says what happened in Keel's
    words, keeps SQLite's words in parentheses, and chains the driver error."""
    exc = _error(name)
    error = translate(exc, PATH)
    kind = (
        StoreUnavailable if name in UNAVAILABLE else StoreCorrupt if name in DAMAGED else StoreError
    )
    assert type(error) is kind
    assert str(error).startswith(EXPECTED[name])
    assert str(error).endswith("(what SQLite said)")
    assert error.__cause__ is exc
    assert is_busy(exc) is (name in BUSY)


@pytest.mark.parametrize(
    ("extended", "primary"),
    [
        ("SQLITE_BUSY_SNAPSHOT", "SQLITE_BUSY"),
        ("SQLITE_BUSY_RECOVERY", "SQLITE_BUSY"),
        ("SQLITE_LOCKED_SHAREDCACHE", "SQLITE_LOCKED"),
        ("SQLITE_READONLY_DBMOVED", "SQLITE_READONLY"),
        ("SQLITE_CANTOPEN_ISDIR", "SQLITE_CANTOPEN"),
        ("SQLITE_IOERR_FSYNC", "SQLITE_IOERR"),
        ("SQLITE_CORRUPT_INDEX", "SQLITE_CORRUPT"),
        ("SQLITE_CONSTRAINT_FOREIGNKEY", "SQLITE_CONSTRAINT"),
        ("SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT"),
    ],
)
def test_an_extended_code_falls_back_to_its_primary_code(extended, primary):
    """SQLite reports extended codes; one without an entry of its own reads as its
    primary code (the low byte)."""
    assert str(translate(_error(extended), PATH)).startswith(EXPECTED[primary])
    assert is_busy(_error(extended)) is (primary in BUSY)


def test_message_text_is_never_read():
    """An error whose text says "locked" but whose code is a plain SQLITE_ERROR is not
    taken for a busy lock; a busy code is busy whatever its text."""
    wordy = _error("SQLITE_ERROR", "database is locked; database disk image is malformed")
    assert not is_busy(wordy)
    assert str(translate(wordy, PATH)) == GENERIC.format(path=PATH, detail=str(wordy))
    assert is_busy(_error("SQLITE_BUSY", "something else entirely"))


def test_an_error_without_a_code_is_a_plain_sqlite_error():
    """Errors the sqlite3 module raises itself carry no result code."""
    exc = sqlite3.ProgrammingError("Cannot operate on a closed database.")
    error = translate(exc, PATH)
    assert str(error) == f"SQLite error on store {PATH}: Cannot operate on a closed database."
    assert not is_busy(exc)
