"""Unit: keel.store.urls, the pure URL helpers under the location parser and the adapters."""

from __future__ import annotations

import pytest

from keel.store.urls import POSTGRES_SCHEMES, redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://keel:s3cret@db:5432/k", "postgresql://keel:***@db:5432/k"),
        ("postgresql://:s3cret@db/k", "postgresql://:***@db/k"),
        ("postgresql://keel@db/k?password=s3cret&schema=x", "postgresql://keel@db/k?password=***&schema=x"),
        ("postgres://db/k?SSLPassword=s3cret", "postgres://db/k?SSLPassword=***"),
        ("postgresql://keel@db/k?schema=x", "postgresql://keel@db/k?schema=x"),
        ("sqlite:///rel.db?synchronous=normal", "sqlite:///rel.db?synchronous=normal"),
    ],
)  # fmt: skip
def test_redact_masks_passwords_and_nothing_else(url, shown):
    """A password in user:password@ or in the query becomes ***; the rest is kept as is."""
    assert redact(url) == shown


def test_postgres_schemes():
    """Both schemes libpq reads name a PostgreSQL store."""
    assert frozenset({"postgresql", "postgres"}) == POSTGRES_SCHEMES
