"""PostgreSQL store URLs: what Keel reads from them, and what it hands to libpq.

``postgresql://user:password@host:port/dbname?option=value&…`` (``postgres://`` too).
Keel's own options are taken out of the query string; every other one (``sslmode``,
``connect_timeout``, ``application_name``, ``options`` …) goes to libpq unchanged.

Keel's options:

==================  =========  ==============================================================
option              default    meaning
==================  =========  ==============================================================
``schema``          (none)     keep Keel's tables in this schema (created if missing); without
                               it they go where the role's ``search_path`` puts them
``notify``          ``on``     ``off``: no LISTEN/NOTIFY; workers find work by polling alone
``pool_min``        ``1``      connections the pool keeps open
``pool_max``        ``4``      connections the pool opens at most (plus one for LISTEN)
``pool_timeout``    ``30``     seconds a transaction waits for a free pooled connection
``write_groups``    ``2``      write transactions one event loop runs at once (at most
                               ``pool_max``; see :class:`~keel.store.group_commit.Lane`)
``retries``         ``10``     tries of a transaction that hits a transient error
``retry_base``      ``0.05``   seconds before the second try (then doubling, jittered)
``retry_cap``       ``2``      seconds at most between tries
==================  =========  ==============================================================

Whatever these say, a call is answered within the store's ``timeout`` (``keel serve
--store-timeout``, default 10 s): past it, :class:`~keel.errors.StoreUnavailable`. Unless
the URL sets them, libpq is told to give up on a connection attempt after half of it
(``connect_timeout``, 2 to 10 s) and on a peer that stopped answering after about it
(``tcp_user_timeout`` and TCP keepalives), so that no thread waits minutes on a dead server.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from keel.errors import ConfigurationError
from keel.store.group_commit import DEFAULT_STORE_TIMEOUT
from keel.store.postgres.faults import refusing_bad_url
from keel.store.urls import POSTGRES_SCHEMES, redact

__all__ = ["PostgresOptions", "parse_postgres_url"]

_SCHEMA = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
DEFAULT_CONNECT_TIMEOUT = 10  # seconds at most, unless the URL sets connect_timeout


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """A parsed PostgreSQL store URL."""

    url: str
    """The URL as given (with any password in it: never print it; see :attr:`display`)."""
    conninfo: str
    """What psycopg connects with: the URL without Keel's options, plus the schema."""
    host: str
    port: str
    dbname: str
    schema: str | None = None
    notify: bool = True
    pool_min: int = 1
    pool_max: int = 4
    pool_timeout: float = 30.0  # seconds
    write_groups: int = 2  # write transactions of one event loop running at once
    retries: int = 10
    retry_base: float = 0.05  # seconds
    retry_cap: float = 2.0  # seconds
    timeout: float = DEFAULT_STORE_TIMEOUT  # seconds a call waits for its answer at most

    @property
    def address(self) -> str:
        """Where the server is, for connection errors: ``host:port (database name)``."""
        return f"{self.host}:{self.port} (database {self.dbname})"

    @property
    def display(self) -> str:
        """Where the store is, for messages: host, port, database and schema, no password."""
        where = f"{self.host}:{self.port}/{self.dbname}"
        return where if self.schema is None else f"{where} (schema {self.schema})"

    @property
    def channel_tag(self) -> str:
        """Distinguishes this store's NOTIFY channels from another Keel schema's in the
        same database (channel names are per database)."""
        return hashlib.sha256((self.schema or "").encode()).hexdigest()[:12]


def _number(options: dict[str, str], name: str, default: float, low: float, url: str) -> float:
    raw = options.pop(name, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= low:  # also refuses nan
        raise ConfigurationError(f"{name} must be a number >= {low:g} in {redact(url)!r}")
    return value


def _write_groups(options: dict[str, str], pool_max: int, url: str) -> int:
    """``write_groups``: 2 unless the URL says, never more than ``pool_max`` (each
    transaction holds a connection; by default a pool of one runs one at a time)."""
    given = "write_groups" in options
    groups = int(_number(options, "write_groups", 2, 1, url))
    if given and groups > pool_max:
        raise ConfigurationError(
            f"write_groups ({groups}) is larger than pool_max ({pool_max}) in {redact(url)!r}"
        )
    return min(groups, pool_max)


def _libpq_defaults(params: Mapping[str, object], timeout: float) -> dict[str, object]:
    """What libpq is told about timeouts when the URL does not say: derived from the
    store ``timeout`` (see the module docstring)."""
    half = math.ceil(timeout / 2)
    defaults: dict[str, object] = {
        "connect_timeout": min(DEFAULT_CONNECT_TIMEOUT, max(2, half)),
        "tcp_user_timeout": max(1000, round(timeout * 1000)),  # milliseconds
        "keepalives": 1,
        "keepalives_idle": max(1, half),
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }
    return {k: v for k, v in defaults.items() if k not in params}


def parse_postgres_url(url: str, *, timeout: float = DEFAULT_STORE_TIMEOUT) -> PostgresOptions:
    """Split a ``postgresql://`` URL into Keel's options and libpq's connection string.

    Raises:
        ConfigurationError: not a PostgreSQL URL, a malformed one, a bad Keel option, or
            an option libpq does not know.
    """
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in POSTGRES_SCHEMES:
        raise ConfigurationError(f"{redact(url)!r} is not a postgresql:// URL")
    query = parse_qsl(parts.query, keep_blank_values=True)
    keel = {k: v for k, v in query if k in _KEEL_OPTIONS}
    libpq = [(k, v) for k, v in query if k not in _KEEL_OPTIONS]
    schema = keel.pop("schema", None)
    if schema is not None and not _SCHEMA.match(schema):
        raise ConfigurationError(
            f"schema must be a plain identifier (letters, digits, _), not {schema!r}"
        )
    notify_raw = keel.pop("notify", "on").lower()
    if notify_raw not in _SWITCH:
        raise ConfigurationError(f"notify must be on or off, not {notify_raw!r}")
    pool_min = int(_number(keel, "pool_min", 1, 0, url))
    pool_max = int(_number(keel, "pool_max", 4, 1, url))
    if pool_min > pool_max:
        raise ConfigurationError(f"pool_min ({pool_min}) is larger than pool_max ({pool_max})")
    pool_timeout = _number(keel, "pool_timeout", 30.0, 0.001, url)
    write_groups = _write_groups(keel, pool_max, url)
    retries = int(_number(keel, "retries", 10, 1, url))
    retry_base = _number(keel, "retry_base", 0.05, 0, url)
    retry_cap = _number(keel, "retry_cap", 2.0, 0, url)
    # libpq reads both schemes; give it the canonical one and the remaining options.
    stripped = urlunsplit(
        parts._replace(scheme="postgresql", query=urlencode(libpq, quote_via=quote))
    )
    with refusing_bad_url(url):
        params = conninfo_to_dict(stripped)
    if not timeout > 0:
        raise ConfigurationError(f"the store timeout must be a number of seconds > 0: {timeout}")
    extra = _libpq_defaults(params, timeout)
    if schema is not None:
        # Every connection resolves Keel's unqualified table names in this schema.
        given = str(params.get("options") or "")
        extra["options"] = f"{given} -c search_path={schema}".strip()
    with refusing_bad_url(url):
        conninfo = make_conninfo(stripped, **extra)  # type: ignore[arg-type]
    return PostgresOptions(
        url=url,
        conninfo=conninfo,
        host=str(params.get("host") or "localhost"),
        port=str(params.get("port") or "5432"),
        dbname=str(params.get("dbname") or params.get("user") or "(default)"),
        schema=schema,
        notify=_SWITCH[notify_raw],
        pool_min=pool_min,
        pool_max=pool_max,
        pool_timeout=pool_timeout,
        write_groups=write_groups,
        retries=retries,
        retry_base=retry_base,
        retry_cap=retry_cap,
        timeout=timeout,
    )


_KEEL_OPTIONS = frozenset(
    {"schema", "notify", "pool_min", "pool_max", "pool_timeout", "write_groups", "retries",
     "retry_base", "retry_cap"}
)  # fmt: skip
