"""Store locations: the URL forms every entry point accepts, and the default.

* a plain path, ``tasks.db`` or ``/var/lib/keel/keel.db``: a SQLite file;
* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (SQLAlchemy's
  convention), with ``?synchronous=normal`` to trade power-loss durability for speed and
  ``?busy_timeout=SECONDS``;
* ``postgresql://…`` or ``postgres://…``: PostgreSQL;
* ``memory://``: in this process only, gone when it ends; an explicit choice, never a default.

Precedence everywhere: an explicit location, then ``$KEEL_STORE``, then ``keel-data/keel.db``
under the current directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from keel.errors import ConfigurationError
from keel.model import Limits
from keel.store.base import TxStore
from keel.store.protocol import Clock

__all__ = [
    "DEFAULT_LOCATION",
    "ENV_VAR",
    "Location",
    "open_store",
    "parse_location",
    "resolve_location",
]

DEFAULT_LOCATION = "keel-data/keel.db"
ENV_VAR = "KEEL_STORE"

_SQLITE_OPTIONS = {"synchronous", "busy_timeout", "plan"}


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


SECRET_PARAMETERS = frozenset({"password", "sslpassword"})
"""Query parameters that carry secrets (libpq accepts ``?password=…``)."""


def redact(url: str) -> str:
    """The URL with any password, in ``user:password@`` or in the query, replaced by
    ``***`` (for logs and messages)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key.lower() in SECRET_PARAMETERS for key, _ in query):
        masked = [(k, "***" if k.lower() in SECRET_PARAMETERS else v) for k, v in query]
        parts = parts._replace(query=urlencode(masked, safe="*"))
    return parts._replace(netloc=netloc).geturl()


def resolve_location(explicit: str | None = None) -> str:
    """The location to use: ``explicit``, else ``$KEEL_STORE``, else the default file."""
    if explicit:
        return explicit
    return os.environ.get(ENV_VAR) or DEFAULT_LOCATION


def parse_location(location: str | os.PathLike[str]) -> Location:
    """Parse a store location.

    Raises:
        ConfigurationError: an empty location, an unknown scheme, or an unknown option.
    """
    text = os.fspath(location).strip()
    if not text:
        raise ConfigurationError("store location is empty")
    if "://" not in text:
        return Location("sqlite", Path(text), text)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        if parts.netloc or parts.path.strip("/"):
            raise ConfigurationError(f"memory:// takes no path: {text!r}")
        return Location("memory", url=text)
    if scheme in {"postgresql", "postgres"}:
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
        return Location("sqlite", Path(raw), text, options)
    raise ConfigurationError(
        f"unknown store scheme {parts.scheme!r} in {text!r}; use a file path, sqlite:///…, "
        "postgresql://… or memory://"
    )


def open_store(
    location: str | os.PathLike[str] | None = None,
    *,
    clock: Clock | None = None,
    limits: Limits | None = None,
) -> TxStore:
    """Open the store at ``location`` (resolved as :func:`resolve_location` says).

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
            raise ConfigurationError(
                f"busy_timeout must be a number of seconds in {loc.url!r}"
            ) from None
        return SqliteStore(
            loc.path,
            synchronous=loc.options.get("synchronous", "full"),
            busy_timeout=busy,
            plan=loc.options.get("plan", "auto"),
            clock=clock,
            limits=limits,
        )
    from keel.store.postgres import PostgresStore

    return PostgresStore(loc.url, clock=clock, limits=limits)
