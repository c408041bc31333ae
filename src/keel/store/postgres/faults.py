"""Which psycopg errors are worth another try, and how the rest read as Keel errors.

This is the one place that knows psycopg's exception types (with the adapter's edge):
everything else sees :mod:`keel.errors`.
"""

from __future__ import annotations

import random
from typing import Final

import psycopg
import psycopg_pool
from psycopg import errors as pg

__all__ = ["backoff", "connection_lost", "describe", "is_transient"]

_JITTER = random.Random()  # noqa: S311 - spreads retries; nothing secret about it

_TRANSIENT_STATES: Final = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
        "57P01",  # admin_shutdown: the server (or an operator) ended our backend
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: the server is starting up or shutting down
        "53300",  # too_many_connections
        "08000", "08003", "08006", "08001", "08004",  # connection exceptions
        "23505",  # unique_violation: a concurrent create of the same key; the retry finds it
    }
)  # fmt: skip


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` may well not happen again: lost connections, a server restarting,
    serialization failures and deadlocks, a pool with no free connection for now."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate in _TRANSIENT_STATES:
        return True
    # A connection that broke has no SQLSTATE; psycopg says so with OperationalError.
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        return True
    return isinstance(exc, pg.AdminShutdown | pg.SerializationFailure | pg.DeadlockDetected)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection itself is gone (not just this transaction)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P"))


def describe(exc: BaseException, where: str) -> str:
    """One line for a StoreError: what failed, on which store."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return f"PostgreSQL store {where}: no free connection in the pool ({exc})"
    text = " ".join(str(exc).split()) or type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    suffix = f" [SQLSTATE {state}]" if state else ""
    return f"PostgreSQL error on store {where}: {text}{suffix}"


def backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait before try ``attempt + 1``: exponential, capped, full jitter on the
    upper half (so that processes that failed together do not retry together)."""
    ceiling = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return float(ceiling * (0.5 + 0.5 * _JITTER.random()))
