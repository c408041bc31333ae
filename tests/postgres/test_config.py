"""PostgreSQL store URLs: Keel's options, libpq's, and the errors for bad ones."""

from __future__ import annotations

import socket

import pytest

from keel import ConfigurationError
from keel.store import PostgresStore, open_store
from keel.store.postgres import parse_postgres_url

from .pg import store_url


def test_defaults_and_libpq_passthrough():
    """Keel's options are taken out; libpq's stay; postgres:// is accepted."""
    opts = parse_postgres_url(
        "postgres://keel:s3cret@db.example:6543/tasks?sslmode=disable&application_name=x"
    )
    assert (opts.host, opts.port, opts.dbname, opts.schema) == ("db.example", "6543", "tasks", None)
    assert (opts.notify, opts.pool_min, opts.pool_max, opts.retries) == (True, 1, 4, 10)
    assert "sslmode=disable" in opts.conninfo
    assert "application_name=x" in opts.conninfo
    assert "s3cret" not in opts.display


def test_keel_options_are_read():
    """schema, notify, pool and retry options are parsed and the schema set for libpq."""
    opts = parse_postgres_url(
        "postgresql://h/db?schema=keel_a&notify=off&pool_min=0&pool_max=9&retries=3"
        "&retry_base=0.01&retry_cap=0.5&pool_timeout=2"
    )
    assert opts.schema == "keel_a"
    assert opts.notify is False
    assert (opts.pool_min, opts.pool_max, opts.retries) == (0, 9, 3)
    assert (opts.retry_base, opts.retry_cap, opts.pool_timeout) == (0.01, 0.5, 2.0)
    assert "search_path=keel_a" in opts.conninfo
    assert "schema" not in opts.conninfo.replace("search_path", "")


@pytest.mark.parametrize(
    ("query", "groups"),
    [("", 2), ("write_groups=1", 1), ("write_groups=3&pool_max=3", 3), ("pool_max=1", 1)],
)
def test_write_groups(query, groups):
    """Two write transactions at once by default, never more than the pool holds."""
    opts = parse_postgres_url(f"postgresql://h/db?{query}")
    assert opts.write_groups == groups
    assert "write_groups" not in opts.conninfo


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("schema=a;drop", "schema must be a plain identifier"),
        ("notify=maybe", "notify must be on or off"),
        ("pool_max=0", "pool_max must be a number >= 1"),
        ("pool_min=5&pool_max=2", "pool_min (5) is larger than pool_max (2)"),
        ("write_groups=0", "write_groups must be a number >= 1"),
        ("write_groups=3&pool_max=2", "write_groups (3) is larger than pool_max (2)"),
        ("retries=lots", "retries must be a number"),
        ("frobnicate=1", 'invalid URI query parameter: "frobnicate"'),
    ],
)
def test_bad_options_are_configuration_errors(query, fragment):
    """Each bad option raises ConfigurationError naming it."""
    with pytest.raises(ConfigurationError) as info:
        parse_postgres_url(f"postgresql://u:pw@h/db?{query}")
    assert fragment in str(info.value)
    assert "pw@" not in str(info.value), "the password is never printed"


def test_unreachable_server_names_host_and_port():
    """Opening a store with no server at the address: ConfigurationError with host:port."""
    # A port bound but never listened on: held for the whole test, so no other process
    # can start listening there, and connecting is refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ConfigurationError) as info:
            open_store(f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2")
    assert f"127.0.0.1:{port}" in str(info.value)


@pytest.mark.postgres
@pytest.mark.anyio
async def test_open_store_selects_postgres(schema):
    """open_store picks PostgresStore for postgresql:// and postgres:// URLs."""
    for url in (store_url(schema), store_url(schema).replace("postgresql://", "postgres://", 1)):
        store = open_store(url)
        try:
            assert isinstance(store, PostgresStore)
            task = await store.create()
            assert (await store.get(task.task_id)).task_id == task.task_id
        finally:
            await store.close()


def test_libpq_options_with_spaces_reach_libpq_intact():
    """``options=-c%20x%3Dy`` (libpq's server settings): the space stays a space (it
    was re-encoded as ``+``, which the server then refused as part of the name)."""
    opts = parse_postgres_url("postgresql://h/db?options=-c%20statement_timeout%3D5s&schema=k")
    assert "options='-c statement_timeout=5s -c search_path=k'" in opts.conninfo


def test_timeouts_for_libpq_follow_the_store_timeout_unless_the_url_sets_them():
    """connect_timeout is half the store timeout (2-10 s), tcp_user_timeout the timeout;
    a value in the URL wins."""
    opts = parse_postgres_url("postgresql://h/db", timeout=3.0)
    assert opts.timeout == 3.0
    assert "connect_timeout=2" in opts.conninfo
    assert "tcp_user_timeout=3000" in opts.conninfo
    given = parse_postgres_url("postgresql://h/db?connect_timeout=7&tcp_user_timeout=100")
    assert "connect_timeout=7" in given.conninfo
    assert "tcp_user_timeout=100" in given.conninfo
    assert "connect_timeout=5" not in given.conninfo
