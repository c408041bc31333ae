"""``keel check``, ``keel backup``, and every command that opens a store refusing a file
that is not one, in-process (click's CliRunner).

Backups while a real ``keel serve`` writes are in ``tests/acceptance/test_store_file.py``.
Each test runs in its own directory without ``$KEEL_STORE`` (``conftest.py``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli
from keel.store import SqliteStore, open_store
from keel.store.postgres import SCHEMA_VERSION
from postgres.pg import drop_schema, new_schema, require_postgres, store_url
from store_files import damage, filled


def keel(*args: str) -> Result:
    """Invoke the CLI in-process; stdout and stderr stay separate."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_error(result: Result) -> str:
    """The text of the single ``keel: error:`` line of a failed command (exit 1)."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("keel: warn")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keel: error: "), result.stderr
    return lines[0].removeprefix("keel: error: ")


COMMANDS = {
    "tasks list": ["tasks", "list"],
    "tasks show": ["tasks", "show", "some-task"],
    "check": ["check"],
    "backup": ["backup", "copy.db"],
    "db migrate": ["db", "migrate"],
    "serve": ["serve", "--check", "--app", "keel.conformance:app"],
    "worker": ["worker", "--app", "keel.conformance:app"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "is an empty file (0 bytes)"),
        (b'{"tasks": []}\n', "is not a SQLite database (it lacks SQLite's file header)"),
    ],
    ids=["zero-bytes", "not-sqlite"],
)
def test_every_command_refuses_a_file_that_is_not_a_store(
    tmp_path: Path, command: str, content: bytes, reason: str
) -> None:
    """Each command that opens a store refuses an existing empty or non-SQLite file in one
    line naming the file and what to do; the file is left as it was, with no -wal or -shm
    beside it."""
    db = tmp_path / "keel.db"
    db.write_bytes(content)
    error = one_error(keel("--store", str(db), *COMMANDS[command]))
    assert error.startswith(f"store {db} {reason}, not a Keel store"), error
    assert "restore the file from a backup" in error
    assert db.read_bytes() == content
    assert sorted(p.name for p in tmp_path.glob("keel.db*")) == ["keel.db"]


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_serve_and_worker_refuse_a_store_that_fails_its_quick_check(
    tmp_path: Path, command: str
) -> None:
    """A damaged store (its header fine, its pages not) is refused before anything is
    served from it."""
    db = tmp_path / "keel.db"
    filled(db, 200)
    damage(db)
    error = one_error(keel("--store", str(db), *COMMANDS[command]))
    assert error.startswith(f"store {db} failed its quick check: "), error
    assert "keel check gives the full report" in error


def test_a_missing_store_is_still_created(tmp_path: Path) -> None:
    """A file that does not exist is a new store, as before (``db migrate``)."""
    db = tmp_path / "new" / "keel.db"
    result = keel("--store", str(db), "db", "migrate")
    assert result.exit_code == 0, result.stderr
    assert db.is_file()


def test_check_prints_the_schema_version_and_the_tasks_per_status(tmp_path: Path) -> None:
    """keel check: the integrity check passed, the schema version, the count per status
    (every status named)."""
    db = tmp_path / "keel.db"
    filled(db, 3)
    result = keel("--store", str(db), "check")
    assert result.exit_code == 0, result.stderr
    version = SqliteStore(db)
    try:
        expected = version.schema_version
    finally:
        version.close_sync()
    assert result.stdout.splitlines() == [
        f"{db}: integrity check ok, schema version {expected}",
        "tasks: 3 (working 3, input_required 0, completed 0, failed 0, cancelled 0)",
    ]


def test_check_fails_on_a_damaged_store(tmp_path: Path) -> None:
    """A store that fails its integrity check: one error line with SQLite's findings."""
    db = tmp_path / "keel.db"
    filled(db, 200)
    damage(db)
    error = one_error(keel("--store", str(db), "check"))
    assert error.startswith(f"store {db} failed its integrity check: "), error


@pytest.mark.parametrize("location", ["missing.db", "memory://"])
def test_check_refuses_what_is_no_store(location: str) -> None:
    """No file at the path (none is created) or memory://: one error line."""
    error = one_error(keel("--store", location, "check"))
    assert ("no store at missing.db" in error) or ("memory://" in error)
    assert not Path("missing.db").exists()


def test_backup_writes_a_checked_copy_and_never_overwrites_unasked(tmp_path: Path) -> None:
    """keel backup: DEST holds every task and passes integrity_check on its own (no -wal
    beside it); a second backup to the same DEST is refused and leaves it as it was;
    --force replaces it with a fresh copy."""
    db, dest = tmp_path / "keel.db", tmp_path / "backups" / "keel-1.db"
    made = filled(db, 5)
    dest.parent.mkdir()
    result = keel("--store", str(db), "backup", str(dest))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"{db} -> {dest}: 5 task(s), ")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["keel-1.db"]
    with sqlite3.connect(dest) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = {row[0] for row in conn.execute("SELECT task_id FROM tasks")}
    conn.close()
    assert ids == {t.task_id for t in made}

    before = dest.read_bytes()
    filled(db, 1)
    error = one_error(keel("--store", str(db), "backup", str(dest)))
    assert error.startswith(f"backup destination {dest} already exists"), error
    assert "--force" in error
    assert dest.read_bytes() == before

    result = keel("--store", str(db), "backup", "--force", str(dest))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"{db} -> {dest}: 6 task(s), ")


@pytest.mark.parametrize(
    ("dest", "message"),
    [("keel.db", "is the store itself"), ("nowhere/copy.db", "folder nowhere does not exist")],
)
def test_backup_refuses_a_destination_it_cannot_use(
    tmp_path: Path, dest: str, message: str
) -> None:
    """DEST as the store itself (even with --force), or in a missing folder: one line."""
    db = tmp_path / "keel.db"
    filled(db, 1)
    before = db.read_bytes()
    assert message in one_error(keel("--store", str(db), "backup", "--force", dest))
    assert db.read_bytes() == before


def test_backup_of_postgresql_says_how_to_use_pg_dump() -> None:
    """PostgreSQL is backed up with pg_dump: the error says so, with the command (and no
    password)."""
    error = one_error(keel("--store", "postgresql://keel:secret@db.example/keel", "backup", "x"))
    assert "pg_dump --format=custom --file x" in error
    assert "secret" not in error


@pytest.mark.postgres
def test_check_on_postgresql_prints_the_schema_version_and_the_tasks_per_status() -> None:
    """keel check on PostgreSQL: connected, the schema version, the count per status."""
    require_postgres()
    schema = new_schema()
    try:
        url = store_url(schema)

        async def two_tasks() -> None:
            store = open_store(url)
            try:
                task = await store.create(name="job")
                await store.cancel(task.task_id)
                await store.create(name="job")
            finally:
                await store.close()

        anyio.run(two_tasks)
        result = keel("--store", url, "check")
        assert result.exit_code == 0, result.stderr
        first, second = result.stdout.splitlines()
        assert first.endswith(
            f"(schema {schema}): connected, schema readable, schema version {SCHEMA_VERSION}"
        )
        assert (
            second == "tasks: 2 (working 1, input_required 0, completed 0, failed 0, cancelled 1)"
        )
    finally:
        drop_schema(schema)
