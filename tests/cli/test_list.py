"""``keel tasks list``: newest first, filtered by ``--status``, ``--name``,
``--principal`` and ``--since``, continued with ``--cursor`` (a new task is never hidden
behind ``--limit``); bad values are refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli
from keel.model import Task
from keel.store import SqliteStore


def keel(*args: str) -> Result:
    """Invoke the CLI in-process; stdout and stderr stay separate."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _made(db: Path, specs: list[dict[str, object]]) -> list[str]:
    return [t.task_id for t in _tasks(db, specs)]


def _tasks(db: Path, specs: list[dict[str, object]]) -> list[Task]:
    async def run() -> list[Task]:
        store = SqliteStore(db)
        try:
            return [await store.create(**spec) for spec in specs]  # type: ignore[arg-type]
        finally:
            await store.close()

    return anyio.run(run)


def _ids(result: Result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return [row["task_id"] for row in json.loads(result.stdout)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store file path."""
    return tmp_path / "keel.db"


def test_newest_first_and_continued_with_the_cursor(db: Path) -> None:
    """--limit cuts the newest; the note's --cursor lists the rest, each task once."""
    ids = _made(db, [{"name": "job"} for _ in range(5)])
    first = keel("tasks", "list", "--json", "--limit", "2", "--store", str(db))
    assert _ids(first) == ids[::-1][:2]
    cursor = re.search(r"--cursor (\S+)", first.stderr)
    assert cursor is not None
    rest = keel("tasks", "list", "--json", "--cursor", cursor[1], "--store", str(db))
    assert _ids(rest) == ids[::-1][2:]
    assert rest.stderr == ""
    newer = _made(db, [{"name": "job"}])
    assert _ids(keel("tasks", "list", "--json", "--limit", "1", "--store", str(db))) == newer


def test_filters_by_name_principal_and_since(db: Path) -> None:
    """Each filter alone and together."""
    old = _made(db, [{"name": "diagnose", "owner": "alice"}])
    made = _tasks(db, [{"name": "diagnose", "owner": "bob"}, {"name": "job", "owner": "alice"}])
    new, cutoff = [t.task_id for t in made], made[0].created_at  # --since is inclusive

    def listed(*args: str) -> list[str]:
        return _ids(keel("tasks", "list", "--json", "--store", str(db), *args))

    assert listed("--name", "diagnose") == [new[0], old[0]]
    assert listed("--principal", "alice") == [new[1], old[0]]
    assert listed("--since", str(cutoff)) == [new[1], new[0]]
    assert listed("--since", "1h", "--principal", "bob") == [new[0]]
    assert listed("--name", "job", "--status", "input_required") == []


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--since", "yesterday"], 2, "'yesterday' is not a duration"),
        (["--since", "nan"], 2, "'nan' is not a finite time"),
        (["--cursor", "nope"], 1, "keel: error: cursor 'nope' is not one a page of tasks gave"),
    ],
)
def test_bad_values_are_refused_in_one_line(
    db: Path, args: list[str], code: int, message: str
) -> None:
    """A usage error (2) for --since, one keel: error line (1) for a cursor."""
    _made(db, [{"name": "job"}])
    result = keel("tasks", "list", "--store", str(db), *args)
    assert result.exit_code == code
    assert message in result.stderr
    if code == 1:
        assert result.stderr.count("\n") == 1
