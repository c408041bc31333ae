"""psycopg is optional (the ``postgres`` extra): without it SQLite use works and imports
nothing of it, and a PostgreSQL store is one ConfigurationError naming the extra, printed
by the CLI as one line.

Each test runs Python in a subprocess whose import system refuses every psycopg module,
as on an installation without the extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import keel

# Each test starts a real Python process with psycopg hidden: out of the fast loop.
pytestmark = pytest.mark.slow

EXTRA = "pip install 'keel-tasks[postgres]'"

HIDE_PSYCOPG = """
import importlib.abc, sys

class NoPsycopg(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoPsycopg())
"""


def run(body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter that cannot import psycopg."""
    return subprocess.run(
        [sys.executable, "-c", HIDE_PSYCOPG + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_sqlite_use_imports_no_psycopg(tmp_path):
    """Every module outside the PostgreSQL adapter imports, and a SQLite store works."""
    package = Path(keel.__file__).parent
    modules = sorted(
        ".".join(("keel", *path.relative_to(package).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for path in package.rglob("*.py")
        if "postgres" not in path.relative_to(package).parts and path.name != "__main__.py"
    )
    result = run(
        f"""
        import importlib, anyio
        for name in {modules!r}:
            importlib.import_module(name)
        from keel.store import open_store

        async def main():
            store = open_store("keel.db")
            task = await store.create()
            assert (await store.get(task.task_id)).task_id == task.task_id
            await store.close()

        anyio.run(main)
        assert not any(m.partition(".")[0].startswith("psycopg") for m in sys.modules)
        print("ok", len({modules!r}))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"ok {len(modules)}\n"
    assert "keel.cli.app" in modules
    assert "keel.store.sqlite" in modules


def test_a_postgres_store_without_psycopg_is_a_configuration_error(tmp_path):
    """open_store, migrate and keel.store.PostgresStore each raise one ConfigurationError
    that names the extra."""
    result = run(
        """
        import keel.store
        from keel.errors import ConfigurationError

        attempts = [
            lambda: keel.store.open_store("postgresql://u:pw@127.0.0.1:1/kdb"),
            lambda: keel.store.migrate("postgres://127.0.0.1:1/kdb"),
            lambda: keel.store.PostgresStore,
        ]
        for attempt in attempts:
            try:
                attempt()
            except ConfigurationError as exc:
                print(exc)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    for line in lines:
        assert line == f"PostgreSQL stores need psycopg, which is not installed (psycopg): {EXTRA}"


def test_the_cli_prints_one_line_without_a_traceback(tmp_path):
    """keel with a PostgreSQL store and no psycopg: exit 1, one ``keel: error:`` line."""
    for args in (["tasks", "list"], ["db", "migrate"]):
        result = run(
            f"""
            sys.argv = ["keel", "--store", "postgresql://127.0.0.1:1/kdb", *{args!r}]
            from keel.cli import main
            main()
            """,
            tmp_path,
        )
        assert result.returncode == 1, (args, result.stderr)
        assert result.stdout == ""
        assert result.stderr == (
            "keel: error: PostgreSQL stores need psycopg, which is not installed (psycopg): "
            f"{EXTRA}\n"
        ), args
