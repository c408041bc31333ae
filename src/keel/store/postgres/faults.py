"""psycopg's errors as Keel reads them: worth another try or not, the connection gone or
not, and the :mod:`keel.errors` error each one becomes.

This is the one place that decides what a psycopg error means. The adapter's modules
catch ``psycopg.Error`` where they talk to the driver and hand it here; everything above
the adapter sees :mod:`keel.errors` only.

:data:`FAULTS` is the table, keyed by SQLSTATE: an exact code (``40001``) wins over its
class (the first two characters, ``08``). A SQLSTATE it does not list is a plain
:class:`~keel.errors.StoreError`, tried once. Two failures carry no SQLSTATE:

* an ``OperationalError`` without one is a connection that broke (libpq reports a lost
  socket, not a server error): transient, and the connection is gone. While *opening* a
  store it means no server there will talk to us: :func:`cannot_connect` makes it a
  :class:`~keel.errors.ConfigurationError` naming the address.
* psycopg_pool's ``PoolTimeout``: every pooled connection busy for ``pool_timeout``
  seconds; transient, and read as the first case (the idle connections are tested).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import psycopg
import psycopg_pool

from keel.errors import ConfigurationError, StoreError, StoreUnavailable
from keel.store.urls import redact

__all__ = [
    "FAULTS",
    "Fault",
    "backoff",
    "cannot_connect",
    "cause_of",
    "connection_lost",
    "describe",
    "fault_of",
    "is_transient",
    "refusing_bad_url",
    "store_error",
    "unavailable",
]

_JITTER = random.Random()  # noqa: S311 - spreads retries; nothing secret about it


@dataclass(frozen=True, slots=True)
class Fault:
    """What Keel makes of one SQLSTATE (or one class of them)."""

    name: str
    """PostgreSQL's condition name (appendix A of its manual), for people reading the table."""
    transient: bool = False
    """Another try may well succeed: the adapter retries the transaction, with backoff."""
    connection_lost: bool = False
    """The connection itself is gone, not just the transaction: the pool's idle ones are
    probably gone too (a restart ends them all), so they are tested before the retry."""
    hint: str = ""
    """What to do about it, appended to the message of the :class:`StoreError`."""
    unavailable: bool = False
    """The server cannot take writes for now, for a reason of its own (no retry here; an
    operator or a failover may fix it): a :class:`StoreUnavailable` naming ``hint``."""


FAULTS: Final[Mapping[str, Fault]] = MappingProxyType(
    {
        # Another transaction got in the way: the next try sees its outcome and goes on.
        "40001": Fault("serialization_failure", transient=True),
        "40P01": Fault("deadlock_detected", transient=True),
        "55P03": Fault("lock_not_available", transient=True),
        # A concurrent create of the same idempotency key: the retry finds the task.
        "23505": Fault("unique_violation", transient=True),
        # The server is short of connections, restarting, or an operator ended our backend.
        "53300": Fault("too_many_connections", transient=True),
        "57P01": Fault("admin_shutdown", transient=True, connection_lost=True),
        "57P02": Fault("crash_shutdown", transient=True, connection_lost=True),
        "57P03": Fault("cannot_connect_now", transient=True, connection_lost=True),
        "57P04": Fault("database_dropped", connection_lost=True),
        "57P05": Fault("idle_session_timeout", connection_lost=True),
        # Connection exceptions: these five are a network or server failure, worth
        # another try on a fresh connection; the rest of class 08 (a protocol violation,
        # a transaction whose outcome is unknown) end the connection but say nothing
        # about the next one.
        "08000": Fault("connection_exception", transient=True, connection_lost=True),
        "08001": Fault(
            "sqlclient_unable_to_establish_sqlconnection", transient=True, connection_lost=True
        ),
        "08003": Fault("connection_does_not_exist", transient=True, connection_lost=True),
        "08004": Fault(
            "sqlserver_rejected_establishment_of_sqlconnection",
            transient=True,
            connection_lost=True,
        ),
        "08006": Fault("connection_failure", transient=True, connection_lost=True),
        "08": Fault("connection_exception", connection_lost=True),
        # Deployment problems a retry cannot fix: say what to change.
        "25006": Fault(
            "read_only_sql_transaction",
            hint="the server is read-only (a standby?); point the store at the primary",
            unavailable=True,
        ),
        "42501": Fault(
            "insufficient_privilege",
            hint="the role needs CREATE on the database or schema the first time, then "
            "SELECT, INSERT, UPDATE and DELETE on Keel's tables",
        ),
        "53100": Fault("disk_full", hint="the database server's disk is full", unavailable=True),
    }
)


def fault_of(exc: BaseException) -> Fault | None:
    """The row of :data:`FAULTS` for ``exc``'s SQLSTATE (exact code first, then class)."""
    state = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
    if not state:
        return None
    return FAULTS.get(state) or FAULTS.get(state[:2])


def _broken(exc: BaseException) -> bool:
    """A connection that broke: psycopg says so with an OperationalError and no SQLSTATE.

    psycopg_pool's PoolTimeout is one too (it derives from OperationalError): after one,
    testing the idle connections costs little and drops those a server restart broke.
    """
    return isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` may well not happen again: lost connections, a server restarting,
    serialization failures and deadlocks, a pool with no free connection for now."""
    if isinstance(exc, psycopg_pool.PoolTimeout) or _broken(exc):
        return True
    fault = fault_of(exc)
    return fault is not None and fault.transient


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection itself is gone (not just this transaction)."""
    if _broken(exc):
        return True
    fault = fault_of(exc)
    return fault is not None and fault.connection_lost


def cause_of(exc: BaseException) -> str:
    """What ``exc`` says went wrong, on one line, with its SQLSTATE (no store named)."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return f"no free connection in the pool ({exc})"
    text = " ".join(str(exc).split()) or type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    return f"{text} [SQLSTATE {state}]" if state else text


def describe(exc: BaseException, where: str) -> str:
    """One line for a StoreError: what failed, on which store (and, for a deployment
    problem, what to change)."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return f"PostgreSQL store {where}: {cause_of(exc)}"
    fault = fault_of(exc)
    hint = f"; {fault.hint}" if fault is not None and fault.hint else ""
    return f"PostgreSQL error on store {where}: {cause_of(exc)}{hint}"


def unavailable(url: str, cause: str, exc: BaseException | None = None) -> StoreUnavailable:
    """The :class:`StoreUnavailable` of the store at ``url`` (its password masked: see
    :func:`keel.store.urls.redact`), with ``exc`` as its cause."""
    error = StoreUnavailable(redact(url), cause)
    error.__cause__ = exc
    return error


def store_error(exc: BaseException, where: str, url: str = "") -> StoreError:
    """``exc`` (a psycopg error or a pool timeout) as the :class:`StoreError` callers see,
    with ``exc`` as its cause; ``url`` names the store in a :class:`StoreUnavailable`."""
    fault = fault_of(exc)
    if fault is not None and fault.unavailable:
        return unavailable(url or where, f"{fault.hint} ({cause_of(exc)})", exc)
    error = StoreError(describe(exc, where))
    error.__cause__ = exc
    return error


def cannot_connect(exc: BaseException, address: str) -> ConfigurationError:
    """The error for a store that cannot be opened because no server at ``address``
    (``host:port (database name)``) would talk to us: a wrong host, port, database,
    role or password is a configuration to fix, not a failure to retry."""
    error = ConfigurationError(
        f"cannot connect to PostgreSQL at {address}: {' '.join(str(exc).split())}"
    )
    error.__cause__ = exc
    return error


@contextmanager
def refusing_bad_url(url: str) -> Iterator[None]:
    """Turn libpq's refusal of a connection string (psycopg's ``ProgrammingError``, with
    no SQLSTATE: nothing was sent) into a :class:`ConfigurationError` naming the URL,
    its password masked."""
    try:
        yield
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"bad PostgreSQL URL {redact(url)!r}: {exc}") from None


def backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait before try ``attempt + 1``: exponential, capped, full jitter on the
    upper half (so that processes that failed together do not retry together)."""
    ceiling = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return float(ceiling * (0.5 + 0.5 * _JITTER.random()))
