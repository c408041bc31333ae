"""Pure helpers for store URLs, shared by the location parser and the adapters.

The bottom of the store package: it imports nothing of Keel's, so that
:mod:`keel.store.locations` (which picks an adapter) and the adapters' own URL parsers
(:mod:`keel.store.postgres.config`) can both use it without importing each other.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = ["POSTGRES_SCHEMES", "SECRET_PARAMETERS", "redact"]

POSTGRES_SCHEMES: Final = frozenset({"postgresql", "postgres"})
"""URL schemes (lower case) that name a PostgreSQL store; libpq reads both."""

SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})
"""Query parameters that carry secrets (libpq accepts ``?password=…``)."""


def redact(url: str) -> str:
    """The URL with any password, in ``user:password@`` or in the query, replaced by
    ``***`` (for logs and messages)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret_query = any(key.lower() in SECRET_PARAMETERS for key, _ in query)
    if parts.password is None and not secret_query:
        return url  # as given: re-joining would turn sqlite:///x.db into sqlite:/x.db
    if parts.password is not None:
        parts = parts._replace(
            netloc=f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[1]}"
        )
    if secret_query:
        masked = [(k, "***" if k.lower() in SECRET_PARAMETERS else v) for k, v in query]
        parts = parts._replace(query=urlencode(masked, safe="*"))
    return parts.geturl()
