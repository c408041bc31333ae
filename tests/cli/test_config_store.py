"""Every command that opens a store reads the one ``keel serve`` writes, from the same
``keel.toml`` (``[serve] store``, else ``data_dir``/keel.db): ``--store``, then
``$KEEL_STORE``, then the file, then ``keel-data/keel.db``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli
from keel.store import SqliteStore


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("KEEL_STORE", "KEEL_CONFIG", "KEEL_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def keel(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def store_with(path: Path, name: str) -> str:
    """A store at ``path`` holding one task of tool ``name``; its id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(path)
    try:
        return anyio.run(lambda: store.create(name=name)).task_id
    finally:
        store.close_sync()


def listed(result: Result) -> str:
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_tasks_list_reads_the_store_keel_toml_names(tmp_path: Path) -> None:
    task = store_with(tmp_path / "elsewhere" / "k.db", "from-toml")
    store_with(tmp_path / "keel-data" / "keel.db", "from-default")
    (tmp_path / "keel.toml").write_text('[serve]\nstore = "elsewhere/k.db"\n')
    out = listed(keel("tasks", "list"))
    assert task in out
    assert "from-default" not in out


def test_data_dir_in_keel_toml_is_where_the_store_is(tmp_path: Path) -> None:
    task = store_with(tmp_path / "dd" / "keel.db", "from-data-dir")
    (tmp_path / "keel.toml").write_text('[serve]\ndata_dir = "dd"\n')
    assert task in listed(keel("tasks", "list"))
    assert "dd/keel.db" in listed(keel("check"))


def test_keel_config_names_another_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = store_with(tmp_path / "x.db", "from-env-config")
    (tmp_path / "prod.toml").write_text('[serve]\nstore = "x.db"\n')
    monkeypatch.setenv("KEEL_CONFIG", str(tmp_path / "prod.toml"))
    assert task in listed(keel("tasks", "list"))


def test_store_flag_and_environment_win_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_with(tmp_path / "toml.db", "from-toml")
    flag = store_with(tmp_path / "flag.db", "from-flag")
    env = store_with(tmp_path / "env.db", "from-env")
    (tmp_path / "keel.toml").write_text('[serve]\nstore = "toml.db"\n')
    assert flag in listed(keel("tasks", "list", "--store", "flag.db"))
    monkeypatch.setenv("KEEL_STORE", "env.db")
    out = listed(keel("tasks", "list"))
    assert env in out
    assert "from-toml" not in out


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("[serve]\nstore = 5\n", "[serve] store must be a string, not 5"),
        ("[serve\n", "cannot read keel.toml"),
        ("[other]\nstore = 'x'\n", "expected only a [serve] table, found other"),
    ],
)
def test_a_bad_keel_toml_is_one_error_line(tmp_path: Path, content: str, said: str) -> None:
    (tmp_path / "keel.toml").write_text(content)
    result = keel("tasks", "list")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("keel: error: ")
    assert said in line
