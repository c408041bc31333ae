"""The SQLite file is the store: a clean close leaves every row in ``keel.db`` itself, an
existing file that is empty or not SQLite is refused (never taken for a new store), a
new store appears whole, and a damaged one fails its checks."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from keel import NotAStore, StoreDamaged, TaskStore
from keel.model import Status
from keel.store import SqliteStore
from store_files import copied_alone, damage, filled, wal_size

pytestmark = pytest.mark.anyio


def _task_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        ids = {row[0] for row in conn.execute("SELECT task_id FROM tasks")}
    conn.close()
    return ids


async def test_close_folds_the_wal_into_the_file(tmp_path):
    """After writes and a close, the WAL is gone and ``keel.db`` copied alone holds every
    task, with its latest state."""
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    made = [await store.create(name="job") for _ in range(50)]
    await store.cancel(made[0].task_id)
    assert wal_size(db), "the rows are in the WAL while the store is open"
    await store.close()
    assert wal_size(db) is None
    copy = copied_alone(db, tmp_path / "copy")
    assert _task_ids(copy) == {t.task_id for t in made}
    reopened = SqliteStore(copy)
    try:
        assert (await reopened.get(made[0].task_id)).status is Status.CANCELLED
    finally:
        await reopened.close()


async def test_close_folds_the_wal_in_while_another_connection_stays_open(tmp_path):
    """Another connection on the same file (another process, say) stays open: the close
    still checkpoints everything into the file and empties the WAL."""
    db = tmp_path / "keel.db"
    other = SqliteStore(db)
    store = SqliteStore(db)
    try:
        made = [await store.create(name="job") for _ in range(20)]
        await store.close()
        assert wal_size(db) == 0
        assert _task_ids(copied_alone(db, tmp_path / "copy")) == {t.task_id for t in made}
        assert len(await other.list()) == 20
    finally:
        await other.close()


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "is an empty file (0 bytes)"), (b"SQLite format 2\x00", "is not a SQLite database")],
    ids=["zero-bytes", "bad-header"],
)
def test_an_existing_empty_or_foreign_file_is_refused(tmp_path, content, reason):
    """A zero-byte file (or one with another header) is refused with NotAStore naming the
    file and what to do, by the adapter and by the seed-compatible TaskStore alike; the
    file is left as it was and nothing appears beside it."""
    db = tmp_path / "keel.db"
    db.write_bytes(content)
    for opener in (SqliteStore, TaskStore):
        with pytest.raises(NotAStore, match=re.escape(f"store {db} {reason}")) as info:
            opener(db)
        assert "restore the file from a backup" in str(info.value)
        assert info.value.path == str(db)
    assert db.read_bytes() == content
    assert [p.name for p in tmp_path.iterdir()] == ["keel.db"]


def test_a_missing_file_is_created_whole(tmp_path):
    """A missing file becomes a new store: complete (schema applied) before it has its
    name, with no draft left beside it."""
    db = tmp_path / "deep" / "keel.db"
    SqliteStore(db).close_sync()
    assert sorted(p.name for p in db.parent.iterdir()) == ["keel.db"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(version) FROM keel_schema").fetchone()[0] >= 1
    conn.close()


def test_stores_opened_at_once_on_a_new_path_share_one_file(tmp_path):
    """Eight openers race to create the same new store: every one opens it (none sees a
    half-made file), all see the same file, and no draft is left behind."""
    db = tmp_path / "keel.db"
    go = threading.Barrier(8)
    stores: list[SqliteStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        go.wait()
        try:
            stores.append(SqliteStore(db))
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        task = anyio.run(lambda: stores[0].create(name="job"))
        assert all(anyio.run(lambda s=s: s.get(task.task_id)) == task for s in stores)
    finally:
        for store in stores:
            store.close_sync()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keel.db"]


def test_a_damaged_file_fails_its_checks(tmp_path):
    """A file whose pages are damaged still opens (its header and schema are readable),
    but its quick check and integrity check raise StoreDamaged with SQLite's findings; a
    sound one passes both."""
    db = tmp_path / "keel.db"
    filled(db, 200)
    store = SqliteStore(db)
    store.verify()
    store.verify(thorough=True)
    store.close_sync()
    damage(db)
    store = SqliteStore(db)
    try:
        for thorough, check in [(False, "quick check"), (True, "integrity check")]:
            with pytest.raises(StoreDamaged, match=f"store {db} failed its {check}: ") as info:
                store.verify(thorough=thorough)
            assert info.value.problems
            assert "restore it from a backup" in str(info.value)
    finally:
        store.close_sync()
