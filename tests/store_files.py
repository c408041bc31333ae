"""SQLite store files in the states the tests need: full of tasks, or damaged.

Importable from every tier (``tests/`` is on the path, as for ``keel_serve``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio

from keel.model import Task
from keel.store import SqliteStore

__all__ = ["copied_alone", "damage", "filled", "read_only_folder", "wal_size"]

PAGE = 4096  # bytes: SQLite's default page size, which Keel keeps


def filled(path: Path, count: int, *, pad: int = 500) -> list[Task]:
    """Create a store at ``path`` with ``count`` tasks (arguments ``pad`` bytes long, so
    that they fill many pages), closed again; the tasks."""

    async def run() -> list[Task]:
        store = SqliteStore(path)
        try:
            return [
                await store.create(name="job", arguments={"pad": "x" * pad}) for _ in range(count)
            ]
        finally:
            await store.close()

    return anyio.run(run)


def damage(path: Path, *, whole_page: bool = False) -> None:
    """Overwrite part of the tasks table's first page with 0xFF: SQLite's header and
    schema stay readable (the file opens), its checks fail. ``whole_page``: all of it,
    its page header too, so that every read and write of the table meets the damage."""
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'tasks'").fetchone()[0]
    conn.close()
    with path.open("r+b") as file:
        if whole_page:
            file.seek((root - 1) * PAGE)
            file.write(b"\xff" * PAGE)
        else:
            file.seek((root - 1) * PAGE + 40)
            file.write(b"\xff" * 100)


def copied_alone(db: Path, folder: Path) -> Path:
    """``db`` copied into the new ``folder`` without its -wal and -shm, as ``cp keel.db``
    would; the copy."""
    folder.mkdir()
    return Path(shutil.copyfile(db, folder / db.name))


def wal_size(db: Path) -> int | None:
    """The size of ``db``'s WAL in bytes (None: there is none)."""
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else None


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[Path | None]:
    """``folder`` seen read-only: as root (whom permissions do not stop) a read-only bind
    mount of it beside it, else ``folder`` itself without write permission; restored
    after. None where neither can be made (root without ``mount``, or not allowed)."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(mode)
        return
    view = folder.with_name(f"{folder.name}-read-only")
    view.mkdir()
    mount = shutil.which("mount")
    bind = [str(mount), "--bind", str(folder), str(view)]
    if mount is None or subprocess.run(bind, check=False, capture_output=True).returncode:
        yield None
        return
    try:
        remount = [mount, "-o", "remount,bind,ro", str(view)]
        ro = subprocess.run(remount, check=False, capture_output=True).returncode == 0
        yield view if ro else None
    finally:
        subprocess.run(["umount", str(view)], check=False, capture_output=True)
