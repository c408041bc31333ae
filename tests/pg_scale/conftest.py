"""Fixtures of the PostgreSQL scale-out tests: a private schema on the shared server per
test, and a private throwaway cluster for the tests that stop the server.

The shared server (``$KEEL_TEST_POSTGRES``, see ``tests/postgres/pg.py``) is never
stopped: tests that restart PostgreSQL get a cluster of their own
(:class:`~pg_scale.cluster.PrivateCluster`). Without PostgreSQL (or without what a
private cluster needs) the tests skip, except under ``KEEL_REQUIRE_POSTGRES=1`` (CI),
where they fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from postgres.pg import REQUIRED, drop_schema, new_schema, require_postgres, store_url

from .cluster import ClusterUnavailable, PrivateCluster

UrlFactory = Callable[..., str]


@pytest.fixture
def pg_url() -> Iterator[UrlFactory]:
    """``pg_url(**options)``: the shared server's URL with a schema of this test's own
    (the same schema on every call) and Keel's URL options; the schema is dropped after."""
    require_postgres()
    schema = new_schema()

    def url(**options: str) -> str:
        return store_url(schema, **options)

    yield url
    drop_schema(schema)


@pytest.fixture
def private_cluster() -> Iterator[PrivateCluster]:
    """A throwaway PostgreSQL cluster (initdb in a temporary folder, a free port), which
    the test may stop, crash and restart; always stopped and deleted afterwards."""
    try:
        cluster = PrivateCluster.create()
    except ClusterUnavailable as exc:
        if REQUIRED:
            pytest.fail(
                f"cannot make a private PostgreSQL cluster: {exc} (KEEL_REQUIRE_POSTGRES=1)"
            )
        pytest.skip(f"cannot make a private PostgreSQL cluster: {exc}")
    with cluster:
        yield cluster
