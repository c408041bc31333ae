"""Fixtures of the runtime tests: a SQLite store on the fake clock, an app over it.

The root ``conftest.py`` gives ``clock`` (a FakeClock) and ``store`` (every adapter in
turn); tests that only make sense on a real file (several connections, processes, ten
thousand rows) use ``sqlite_store``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contract.support import FakeClock
from keel.store import SqliteStore


@pytest.fixture
async def sqlite_store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    """A SQLite store in ``tmp_path/keel.db`` on the fake clock, closed afterwards."""
    store = SqliteStore(tmp_path / "keel.db", clock=clock)
    yield store
    await store.close()
