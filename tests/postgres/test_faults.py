"""psycopg errors as Keel reads them (keel.store.postgres.faults), row by row of FAULTS,
plus the failures that carry no SQLSTATE. No server needed: the errors are built here."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest
from psycopg import errors as pg

from keel import ConfigurationError, StoreError, StoreUnavailable
from keel.store.postgres.config import parse_postgres_url
from keel.store.postgres.faults import (
    FAULTS,
    cannot_connect,
    connection_lost,
    describe,
    fault_of,
    is_transient,
    refusing_bad_url,
    store_error,
)

WHERE = "db:5432/keel (schema k)"
URL = "postgresql://keel:secret@db:5432/keel?schema=k"

# What each row of FAULTS must say: (transient, connection lost). Written out again here
# on purpose: a change to the table must be a change to this test too.
EXPECTED = {
    "40001": (True, False),
    "40P01": (True, False),
    "55P03": (True, False),
    "23505": (True, False),
    "53300": (True, False),
    "57P01": (True, True),
    "57P02": (True, True),
    "57P03": (True, True),
    "57P04": (False, True),
    "57P05": (False, True),
    "08000": (True, True),
    "08001": (True, True),
    "08003": (True, True),
    "08004": (True, True),
    "08006": (True, True),
    "08": (False, True),
    "25006": (False, False),
    "42501": (False, False),
    "53100": (False, False),
}


# For each class row, a code of that class that no exact row lists.
CLASS_EXAMPLES = {"08": "08P01"}


def error_for(key: str) -> psycopg.Error:
    """A psycopg error with SQLSTATE ``key`` (for a class, a code of it listed nowhere)."""
    code = key if len(key) == 5 else CLASS_EXAMPLES[key]
    assert code not in FAULTS or code == key
    return pg.lookup(code)("the server's message\n  on two lines")  # type: ignore[no-any-return]


def test_the_table_is_the_one_tested():
    """Every row of FAULTS is checked here, and nothing else is."""
    assert set(FAULTS) == set(EXPECTED)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_each_row_maps_to_a_store_error_with_its_meaning(key):
    """Each SQLSTATE in FAULTS: its retry and pool decisions, and the StoreError callers
    see (message with the store, the server's text on one line, the SQLSTATE, any hint)."""
    exc = error_for(key)
    fault = FAULTS[key]
    if len(key) == 5:  # the condition name is PostgreSQL's for that code
        assert pg.lookup(fault.name.upper()).sqlstate == key
    assert fault_of(exc) is fault
    assert (is_transient(exc), connection_lost(exc)) == EXPECTED[key]
    error = store_error(exc, WHERE, URL)
    assert error.__cause__ is exc
    text = f"the server's message on two lines [SQLSTATE {exc.sqlstate}]"
    if fault.unavailable:  # named as what it is, the store by its URL without password
        assert type(error) is StoreUnavailable
        assert str(error) == (
            "store postgresql://keel:***@db:5432/keel?schema=k is unavailable: "
            f"{fault.hint} ({text})"
        )
        return
    assert type(error) is StoreError
    expected = f"PostgreSQL error on store {WHERE}: {text}"
    if fault.hint:
        expected += f"; {fault.hint}"
    assert str(error) == expected == describe(exc, WHERE)


def test_a_full_disk_and_a_read_only_server_are_unavailable():
    """53100 and 25006 say what they are: a full disk, a read-only server."""
    assert {k for k, f in FAULTS.items() if f.unavailable} == {"53100", "25006"}
    assert "disk is full" in FAULTS["53100"].hint
    assert "read-only" in FAULTS["25006"].hint


@pytest.mark.parametrize("code", ["08007", "08P01"])
def test_an_exact_code_wins_and_a_class_catches_the_rest(code):
    """A connection exception not listed by code falls back to its class: the connection
    is gone, but another try would not help."""
    exc = pg.lookup(code)("x")
    assert fault_of(exc) is FAULTS["08"]
    assert (is_transient(exc), connection_lost(exc)) == (False, True)


@pytest.mark.parametrize("code", ["23514", "22P02", "42P01", "XX000", "57014"])
def test_an_unlisted_sqlstate_is_a_plain_store_error_tried_once(code):
    """Not in FAULTS: not transient, the connection not lost, a StoreError as is."""
    exc = pg.lookup(code)("refused")
    assert fault_of(exc) is None
    assert (is_transient(exc), connection_lost(exc)) == (False, False)
    assert str(store_error(exc, WHERE)) == (
        f"PostgreSQL error on store {WHERE}: refused [SQLSTATE {code}]"
    )


def test_a_broken_connection_has_no_sqlstate():
    """An OperationalError without SQLSTATE: transient, the connection gone; at open time
    it is a ConfigurationError naming the address."""
    exc = psycopg.OperationalError("server closed the connection\nunexpectedly")
    assert (is_transient(exc), connection_lost(exc)) == (True, True)
    assert str(store_error(exc, WHERE)) == (
        f"PostgreSQL error on store {WHERE}: server closed the connection unexpectedly"
    )
    options = parse_postgres_url("postgresql://u:pw@db:5433/keel")
    error = cannot_connect(exc, options.address)
    assert type(error) is ConfigurationError
    assert str(error) == (
        "cannot connect to PostgreSQL at db:5433 (database keel): "
        "server closed the connection unexpectedly"
    )


def test_other_errors_without_sqlstate_are_not_transient():
    """An InterfaceError (a misuse of the driver) is not retried."""
    exc = psycopg.InterfaceError("bad use")
    assert (is_transient(exc), connection_lost(exc)) == (False, False)
    assert not is_transient(ValueError("not a driver error"))


def test_an_exhausted_pool_is_transient():
    """PoolTimeout: retried, the idle connections tested, the message says so."""
    exc = psycopg_pool.PoolTimeout("couldn't get a connection after 0.01 sec")
    assert (is_transient(exc), connection_lost(exc)) == (True, True)
    assert str(store_error(exc, WHERE)) == (
        f"PostgreSQL store {WHERE}: no free connection in the pool "
        "(couldn't get a connection after 0.01 sec)"
    )


def test_a_url_libpq_refuses_is_a_configuration_error_without_the_password():
    """refusing_bad_url turns libpq's ProgrammingError into a ConfigurationError."""
    with pytest.raises(ConfigurationError) as info, refusing_bad_url("postgresql://u:pw@h/d"):
        raise psycopg.ProgrammingError('invalid URI query parameter: "x"')
    assert str(info.value) == (
        "bad PostgreSQL URL 'postgresql://u:***@h/d': invalid URI query parameter: \"x\""
    )
