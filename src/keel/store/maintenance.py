"""Looking after a store: check it before serving from it, check it in full, back it up.

* :func:`verify`: SQLite's ``quick_check`` of an open store (``keel serve`` and ``keel
  worker`` run it before they serve from the file); a no-op for other stores.
* :func:`check`: the full integrity check, the schema version and the number of tasks
  in each status (``keel check``).
* :func:`backup`: a consistent copy of a SQLite store while it is in use (SQLite's
  online backup: one snapshot, however many processes keep writing), written beside
  ``dest``, checked, then moved into place (``keel backup``). A copy of ``keel.db`` made
  with ``cp`` while Keel runs is not a backup: committed rows may still be in
  ``keel.db-wal`` only. PostgreSQL is backed up with ``pg_dump``, which this refuses
  with the command to run.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from keel.errors import ConfigurationError, StoreDamaged, StoreError
from keel.model import Status
from keel.store.locations import open_store, parse_location, resolve_location
from keel.store.protocol import Store
from keel.store.sqlite import SqliteStore
from keel.store.sqlite.connection import remove_files
from keel.store.urls import redact

__all__ = ["BackupReport", "CheckReport", "backup", "check", "verify"]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`check` found."""

    where: str
    """The store, for people (never a password)."""
    integrity: str
    """What was checked and how it went (``"integrity check ok"``)."""
    version: int
    """The schema version recorded in the store."""
    counts: Mapping[Status, int]
    """Tasks in each status, every status named."""


@dataclass(frozen=True, slots=True)
class BackupReport:
    """What :func:`backup` wrote."""

    source: str
    dest: Path
    size: int  # bytes
    seconds: float  # copying and checking, wall clock
    tasks: int  # in the copy


def verify(store: Store) -> None:
    """Refuse to serve from a damaged SQLite file (``PRAGMA quick_check``: it reads every
    page, a few seconds per GB). Other stores check themselves.

    Raises:
        StoreDamaged: the quick check failed.
    """
    if isinstance(store, SqliteStore):
        store.verify()


async def check(location: str | os.PathLike[str] | None = None) -> CheckReport:
    """Open the store at ``location`` (resolved as :func:`resolve_location` says) and
    check it: SQLite's full ``integrity_check``; for PostgreSQL, that it answers and its
    schema is one this Keel reads (its own checks are the server's business).

    Raises:
        ConfigurationError: a bad location, ``memory://``, or no store at the path.
        NotAStore: an empty file or one that is not SQLite.
        StoreDamaged: the integrity check failed.
        StoreError: the store cannot be opened or read.
    """
    text = resolve_location(None if location is None else os.fspath(location))
    loc = parse_location(text)
    if loc.kind == "memory":
        raise ConfigurationError("memory:// has no store to check")
    if loc.kind == "sqlite" and loc.path is not None:
        _require_file(loc.path)
    store = open_store(text)
    try:
        if isinstance(store, SqliteStore):
            await anyio.to_thread.run_sync(lambda: store.verify(thorough=True))
            where, integrity, version = str(store.path), "integrity check ok", store.schema_version
        else:
            from keel.store.postgres import PostgresStore  # loaded: the store is one

            assert isinstance(store, PostgresStore)
            where, integrity = store.options.display, "connected, schema readable"
            version = store.schema_version
        counts = await store.counts()
    finally:
        await store.close()
    return CheckReport(where, integrity, version, counts)


async def backup(
    dest: str | os.PathLike[str],
    location: str | os.PathLike[str] | None = None,
    *,
    force: bool = False,
) -> BackupReport:
    """Copy the SQLite store at ``location`` to ``dest``, consistently, while other
    processes keep using it; check the copy (``integrity_check``) before it takes the
    name ``dest``, so ``dest`` is only ever a whole, checked copy.

    Raises:
        ConfigurationError: ``dest`` exists (without ``force``), is the store itself, or
            its folder is missing; the store is not a SQLite file (PostgreSQL: the message
            says how to run ``pg_dump``); no store at the path.
        StoreDamaged: the copy failed its integrity check (``dest`` is left untouched).
        StoreError: the store or ``dest`` cannot be read or written.
    """
    text = resolve_location(None if location is None else os.fspath(location))
    loc = parse_location(text)
    target = Path(dest)
    if loc.kind == "postgres":
        raise ConfigurationError(
            "keel backup copies SQLite stores; back up PostgreSQL with pg_dump, which takes "
            f"a consistent snapshot while Keel serves: pg_dump --format=custom --file {target} "
            f"'{redact(loc.url)}' (and pg_restore to bring it back)"
        )
    if loc.kind != "sqlite" or loc.path is None:
        raise ConfigurationError(f"{loc.describe()} has no file to back up")
    _check_dest(loc.path, target, force=force)
    started = time.monotonic()
    draft = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    store = open_store(text)
    assert isinstance(store, SqliteStore)
    try:
        await anyio.to_thread.run_sync(lambda: store.backup(draft))
        tasks = await _checked_copy(draft, loc.path)
        size = await anyio.to_thread.run_sync(lambda: _place(draft, target))
    finally:
        await store.close()
        await anyio.to_thread.run_sync(lambda: remove_files(draft))
    return BackupReport(str(loc.path), target, size, time.monotonic() - started, tasks)


async def _checked_copy(draft: Path, source: Path) -> int:
    """Open the copy as Keel would (header, schema version), run the full integrity
    check, and count its tasks; closing it folds its WAL in, so the file alone is the
    backup.

    Raises:
        StoreDamaged: the integrity check of the copy failed (named after ``source``).
    """
    copy = SqliteStore(draft)
    try:
        try:
            await anyio.to_thread.run_sync(lambda: copy.verify(thorough=True))
        except StoreDamaged as exc:
            raise StoreDamaged(str(source), "backup's integrity check", exc.problems) from exc
        return sum((await copy.counts()).values())
    finally:
        await copy.close()


def _place(draft: Path, target: Path) -> int:
    """Move the checked copy to its name (replacing a file there: ``--force``); its size.

    Raises:
        StoreError: it cannot be moved there.
    """
    try:
        os.replace(draft, target)
        return target.stat().st_size
    except OSError as exc:
        raise StoreError(f"cannot write backup {target}: {exc.strerror or exc}") from exc


def _require_file(path: Path) -> None:
    """Refuse a missing store file (checking one must not create it).

    Raises:
        ConfigurationError: there is no file at ``path``.
    """
    if not path.exists():
        raise ConfigurationError(f"no store at {path} (choose one with --store or $KEEL_STORE)")


def _check_dest(source: Path, dest: Path, *, force: bool) -> None:
    """Refuse a ``dest`` that would lose something or cannot be written.

    Raises:
        ConfigurationError: see :func:`backup`.
    """
    _require_file(source)
    if dest.is_dir():
        raise ConfigurationError(f"backup destination {dest} is a folder; name the file to write")
    if not dest.parent.is_dir():
        raise ConfigurationError(f"backup destination folder {dest.parent} does not exist")
    if dest.exists():
        if dest.resolve() == source.resolve():
            raise ConfigurationError(f"backup destination {dest} is the store itself")
        if not force:
            raise ConfigurationError(
                f"backup destination {dest} already exists; choose another name, or pass "
                "--force to replace it (it is replaced only once the new copy is checked)"
            )
