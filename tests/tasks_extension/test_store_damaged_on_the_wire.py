"""A SQLite store whose pages are damaged while it serves: every request path of both
protocol generations answers ``-32051`` naming the store and the remedy (restore it
from a backup), never the generic ``-32603``; the damage is not made worse.

The file is damaged for real (the tasks table's root page overwritten on disk, as a
failing disk or a stray write would). ``keel serve`` would refuse it at start (its quick
check); a server built on the library does not check, and meets the damage at run time,
as a server meets damage that appears while it runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.mcp.wire import STORE_DAMAGED
from keel.runtime import Keel
from keel.store import SqliteStore
from store_files import damage
from tasks_extension.store_paths import OWNER, PATHS, server_without_workers, store_errors
from tasks_extension.support import build_app, serve_http

pytestmark = pytest.mark.anyio


async def test_every_path_answers_a_damaged_store_typed_and_named(tmp_path: Path) -> None:
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    # Enough tasks (arguments 500 bytes long) that the tasks table spans many pages: its
    # root page, damaged, is read by every lookup and write.
    tasks = [
        await store.create(name="kept", arguments={"pad": "x" * 500}, owner=OWNER)
        for _ in range(40)
    ]
    await store.close()  # the WAL folded in: the damage is to the rows themselves
    damage(db, whole_page=True)
    app = build_app(Keel(SqliteStore(db)))
    async with serve_http(server_without_workers(app)) as url:
        errors = await store_errors(url, tasks[20].task_id)
    await app.store.close()
    assert set(errors) == set(PATHS)
    for path, error in errors.items():
        assert error["code"] == STORE_DAMAGED, (path, error)
        assert error["message"].startswith(f"store {db} is corrupt: "), (path, error)
        assert "restore it from a backup" in error["message"], (path, error)
        assert "data" not in error, (path, error)
