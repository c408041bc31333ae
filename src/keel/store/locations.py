"""Store locations: the URL forms every entry point accepts, and the default.

* a plain path, ``tasks.db`` or ``/var/lib/keel/keel.db``: a SQLite file;
* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (SQLAlchemy's
  convention), with ``?synchronous=normal`` to trade power-loss durability for speed,
  ``?busy_timeout=SECONDS``, and ``?lost_wal=accept`` to open a store whose write-ahead
  log was lost after a crash (refused by default, :class:`~keel.errors.WalLost`);
* ``postgresql://…`` or ``postgres://…``: PostgreSQL;
* ``memory://``: in this process only, gone when it ends; an explicit choice, never a default.

Precedence everywhere: an explicit location, then ``$KEEL_STORE``, then ``keel-data/keel.db``
under the current directory.

:func:`open_store` opens the store a location names; :func:`migrate` brings its schema up
to date and says what it did. PostgreSQL needs psycopg, an optional dependency (the
``postgres`` extra): it is imported only when a PostgreSQL location is opened.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from keel.errors import ConfigurationError
from keel.model import Limits
from keel.model.validation import unstorable
from keel.store.base import TxStore
from keel.store.group_commit import START_MARGIN
from keel.store.protocol import Clock
from keel.store.urls import POSTGRES_SCHEMES, redact

__all__ = [
    "DEFAULT_LOCATION",
    "ENV_VAR",
    "POSTGRES_EXTRA",
    "Location",
    "MigrationReport",
    "file_name_problem",
    "load_postgres_adapter",
    "migrate",
    "open_store",
    "parse_location",
    "resolve_location",
]

DEFAULT_LOCATION = "keel-data/keel.db"
ENV_VAR = "KEEL_STORE"

_SQLITE_OPTIONS = {"synchronous", "busy_timeout", "plan", "lost_wal"}

POSTGRES_EXTRA = "pip install 'keel-tasks[postgres]'"
"""How to install what PostgreSQL stores need (psycopg is an optional dependency)."""
_PSYCOPG = frozenset({"psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c"})


@dataclass(frozen=True, slots=True)
class Location:
    """A parsed store location."""

    kind: str
    """``sqlite``, ``memory`` or ``postgres``."""
    path: Path | None = None
    url: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """A one-line description for people: what and where."""
        if self.kind == "memory":
            return "memory:// (in this process only; lost when it exits)"
        if self.kind == "sqlite":
            sync = self.options.get("synchronous", "full")
            return f"SQLite {self.path} (synchronous={sync})"
        return f"PostgreSQL {redact(self.url)}"


def resolve_location(explicit: str | None = None) -> str:
    """The location to use: ``explicit``, else ``$KEEL_STORE``, else the default file."""
    if explicit:
        return explicit
    return os.environ.get(ENV_VAR) or DEFAULT_LOCATION


def parse_location(location: str | os.PathLike[str]) -> Location:
    """Parse a store location.

    Raises:
        ConfigurationError: an empty location, one with NUL or a lone surrogate (a byte
            that is not UTF-8), a malformed URL, an unknown scheme, or an unknown option.
    """
    text = os.fspath(location).strip()
    if not text:
        raise ConfigurationError("store location is empty")
    problem = unstorable(text)  # SQLite file names and PostgreSQL URLs are UTF-8 text
    if problem:
        raise ConfigurationError(f"store location: {problem}")
    if "://" not in text:
        return Location("sqlite", _file_name(text), text)
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [ in the host
        # Not echoed: the rest may hold a password, and redact() cannot split it either.
        raise ConfigurationError(
            f"malformed store URL {text.partition('://')[0]}://…: {exc}"
        ) from None
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path.strip("/"):
            raise ConfigurationError(f"memory:// takes no path: {text!r}")
        return Location("memory", url=text)
    if scheme in POSTGRES_SCHEMES:
        return Location("postgres", url=text)
    if scheme == "sqlite":
        if parts.netloc:
            raise ConfigurationError(
                f"{text!r}: a SQLite URL has no host; use sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        # sqlite:///a.db -> path "/a.db" -> relative "a.db"; sqlite:////abs -> "//abs" -> "/abs"
        raw = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not raw:
            raise ConfigurationError(f"{text!r} names no database file")
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(options) - _SQLITE_OPTIONS
        if unknown:
            raise ConfigurationError(
                f"unknown SQLite option(s) {', '.join(sorted(unknown))} in {text!r}; "
                f"known: {', '.join(sorted(_SQLITE_OPTIONS))}"
            )
        return Location("sqlite", _file_name(raw), text, options)
    raise ConfigurationError(
        f"unknown store scheme {parts.scheme!r} in {text!r}; use a file path, sqlite:///…, "
        "postgresql://… or memory://"
    )


_MAX_BUSY_TIMEOUT = 86_400.0  # seconds: a day; a write waiting longer is no longer waiting
_NAME_MAX = 255  # bytes in one part of a file name: the limit of every common file system
_PATH_MAX = 4096  # bytes in a whole path, its end included: Linux's (a longer one fails)


def file_name_problem(name: str) -> str | None:
    """What makes ``name`` a file name no system call takes, or None: a NUL, a surrogate
    that stands for no byte (only a program can pass one: a byte of ``sys.argv`` that is
    not UTF-8 arrives as one that does), a part over 255 bytes, a whole over 4,095."""
    if "\x00" in name:
        return f"contains a NUL character at position {name.index(chr(0))}"
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError as exc:
        return f"holds {name[exc.start]!a} at position {exc.start}, which stands for no byte"
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > _NAME_MAX or len(raw) >= _PATH_MAX:
        return (
            f"is too long: {len(raw)} bytes with a part of {longest} (the limits are "
            f"{_PATH_MAX - 1} and {_NAME_MAX})"
        )
    return None


def _file_name(text: str) -> Path:
    """A SQLite file's path, refused when no system call would take it."""
    problem = file_name_problem(text)
    if problem:
        raise ConfigurationError(f"store path {text[:60]!r} {problem}")
    return Path(text)


def open_store(
    location: str | os.PathLike[str] | None = None,
    *,
    clock: Clock | None = None,
    limits: Limits | None = None,
    timeout: float | None = None,
) -> TxStore:
    """Open the store at ``location`` (resolved as :func:`resolve_location` says).

    ``timeout`` (seconds; ``keel serve --store-timeout``) bounds how long a call waits for
    the store before it gets :class:`~keel.errors.StoreUnavailable`: PostgreSQL's retries
    and pool waits, SQLite's wait for another process's lock (its ``busy_timeout``, unless
    the location sets a shorter one). None: PostgreSQL's default (10 s), SQLite's own
    busy timeout.

    Raises:
        ConfigurationError: a bad location or option.
        StoreError: the store cannot be opened.
    """
    loc = parse_location(resolve_location(None if location is None else os.fspath(location)))
    if loc.kind == "memory":
        from keel.store.memory import MemoryStore

        return MemoryStore(clock=clock, limits=limits)
    if loc.kind == "sqlite":
        from keel.store.sqlite import DEFAULT_BUSY_TIMEOUT, SqliteStore

        assert loc.path is not None
        try:
            busy = float(loc.options.get("busy_timeout", DEFAULT_BUSY_TIMEOUT))
        except ValueError:
            busy = math.nan
        if not 0 <= busy <= _MAX_BUSY_TIMEOUT:  # also refuses nan
            raise ConfigurationError(
                f"busy_timeout must be 0 to {_MAX_BUSY_TIMEOUT:g} seconds in {loc.url!r}"
            )
        if timeout is not None:  # the lock wait ends a little before the caller's
            busy = min(busy, max(timeout - min(START_MARGIN, timeout / 2), 0.0))
        return SqliteStore(
            loc.path,
            synchronous=loc.options.get("synchronous", "full"),
            busy_timeout=busy,
            plan=loc.options.get("plan", "auto"),
            lost_wal=loc.options.get("lost_wal", "refuse"),
            clock=clock,
            limits=limits,
            timeout=timeout,
        )
    load_postgres_adapter()
    from keel.store.postgres import PostgresStore

    return PostgresStore(loc.url, clock=clock, limits=limits, timeout=timeout)


def load_postgres_adapter() -> None:
    """Import the PostgreSQL adapter, and with it psycopg (an optional dependency).

    Raises:
        ConfigurationError: psycopg is not installed; the message says how to install it.
    """
    try:
        import keel.store.postgres  # noqa: F401 - imported for its effect: psycopg present
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in _PSYCOPG:
            raise  # a broken installation of something else: not ours to explain
        raise ConfigurationError(
            f"PostgreSQL stores need psycopg, which is not installed ({missing}): {POSTGRES_EXTRA}"
        ) from exc


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What :func:`migrate` did."""

    where: str
    """The store, for people (never a password)."""
    applied: tuple[int, ...]
    """The migrations applied just now, in order; empty when the schema was up to date."""
    version: int
    """The store's schema version now."""


def migrate(location: str | os.PathLike[str] | None = None) -> MigrationReport:
    """Open or create the store at ``location`` (resolved as :func:`resolve_location`
    says), apply the migrations it is missing, close it, and say what was done.

    Every store migrates on first use anyway; this lets a deployment do it once, up
    front. PostgreSQL: under an advisory lock, so several processes may run it at once.

    Raises:
        ConfigurationError: a bad location or option, ``memory://`` (no schema), no
            PostgreSQL server at the address, or psycopg not installed.
        StoreError: the store refused, or its schema is newer than this Keel.
    """
    text = resolve_location(None if location is None else os.fspath(location))
    loc = parse_location(text)
    if loc.kind == "memory":
        raise ConfigurationError("memory:// has no schema to migrate")
    if loc.kind == "postgres":
        load_postgres_adapter()
        from keel.store.postgres import parse_postgres_url
        from keel.store.postgres.schema import SCHEMA_VERSION, migrate_store

        options = parse_postgres_url(loc.url)
        done = migrate_store(options)
        return MigrationReport(options.display, tuple(done), SCHEMA_VERSION)
    from keel.store.sqlite import SqliteStore

    assert loc.path is not None
    existed = loc.path.exists()
    store = open_store(text)  # with the location's options, as every other open
    assert isinstance(store, SqliteStore)
    try:
        version = store.schema_version
    finally:
        store.close_sync()
    # A new file gets every migration; the SQLite adapter does not report which ones an
    # existing file was missing.
    applied = () if existed else tuple(range(1, version + 1))
    return MigrationReport(str(loc.path), applied, version)
