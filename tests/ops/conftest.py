"""The console's ASGI app on a real SQLite store, and an HTTP client talking to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from keel.ops import standalone_app
from keel.store import SqliteStore

BASE = "http://127.0.0.1:8000"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """A fresh SQLite store file, closed after the test."""
    opened = SqliteStore(tmp_path / "keel.db")
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def client(store: SqliteStore) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on ``keel ops``'s app over ``store`` (the console at /ops)."""
    transport = httpx.ASGITransport(app=standalone_app(store))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        yield http
