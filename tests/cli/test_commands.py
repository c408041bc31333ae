"""The ``keel`` command line in-process (click's CliRunner): options, output, edge cases.

The end-to-end runs of the real console script are in ``tests/acceptance``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import click
import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli
from keel.cli.common import KeelCliError
from keel.cli.render import task_to_json
from keel.model import InputRequest, Status, Task
from keel.store import SqliteStore, Store

T = TypeVar("T")

SCHEMA = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}


@pytest.fixture(autouse=True)
def no_env_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the caller's $KEEL_STORE, and each runs in its own directory."""
    monkeypatch.delenv("KEEL_STORE", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store file path (not created yet)."""
    return tmp_path / "keel.db"


def on_store(path: Path, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``fn`` on the SQLite store at ``path`` and close it."""

    async def run() -> T:
        store = SqliteStore(path)
        try:
            return await fn(store)
        finally:
            await store.close()

    return anyio.run(run)


def keel(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    """Invoke the CLI in-process; stdout and stderr stay separate."""
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


def waiting(path: Path, **requests: InputRequest) -> Task:
    """A named task waiting for the given input requests (default: one, 'input')."""
    chosen = requests or {"input": InputRequest("Which service?", SCHEMA)}
    return on_store(path, lambda s: s.create(name="diagnose", input_requests=chosen))


# --- store selection -----------------------------------------------------------------


def test_subcommand_store_beats_root_store_beats_env(tmp_path, db):
    """--store on the subcommand wins over --store on the root, which wins over $KEEL_STORE."""
    task = waiting(db)
    other = str(tmp_path / "other.db")
    env = {"KEEL_STORE": other}
    assert task.task_id in keel("tasks", "list", env={"KEEL_STORE": str(db)}).stdout
    assert task.task_id not in keel("tasks", "list", env=env).stdout
    assert task.task_id in keel("--store", str(db), "tasks", "list", env=env).stdout
    result = keel("--store", other, "tasks", "list", "--store", str(db))
    assert task.task_id in result.stdout


def test_default_store_is_keel_data_under_cwd(tmp_path):
    """Without --store or $KEEL_STORE, commands use keel-data/keel.db in the cwd."""
    task = waiting(tmp_path / "keel-data" / "keel.db")
    assert task.task_id in keel("tasks", "list").stdout


def test_reading_a_missing_store_creates_nothing(tmp_path):
    """Read-only commands on a store that does not exist answer 'empty' and create no file."""
    result = keel("tasks", "list")
    assert result.exit_code == 0
    assert result.stdout.strip() == "no tasks"
    assert "no store at keel-data/keel.db" in result.stderr
    result = keel("tasks", "show", "nope")
    assert result.exit_code == 1
    assert "keel: error: unknown task: nope" in result.stderr
    assert not (tmp_path / "keel-data").exists()


def test_memory_store_warns_that_nothing_persists():
    """memory:// is accepted, with a warning on stderr and clean stdout."""
    result = keel("tasks", "list", "--json", "--store", "memory://")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []
    assert "nothing will persist" in result.stderr


def test_bad_store_url_is_exit_1_one_line():
    """An unknown scheme is an operational error: one line, exit 1."""
    result = keel("tasks", "list", "--store", "ftp://example.org/x")
    assert result.exit_code == 1
    assert result.stderr.startswith("keel: error: unknown store scheme 'ftp'")
    assert result.stderr.count("\n") == 1


def test_error_messages_are_one_line():
    """A message with line breaks is still printed as one line."""
    buffer = io.StringIO()
    KeelCliError("first\nsecond\n  third").show(buffer)
    assert buffer.getvalue() == "keel: error: first second third\n"


# --- list and show -------------------------------------------------------------------

SNAPSHOT_FIELDS = {
    "task_id", "status", "name", "owner", "arguments", "status_message", "input_requests",
    "input_responses", "pending_input", "result", "error", "idempotency_key", "attempt",
    "max_attempts", "lease", "fence", "closed_fence", "ready_at", "ttl", "expires_at",
    "created_at", "updated_at", "claimed_at", "trace_context",
}  # fmt: skip


def test_list_json_has_the_stable_field_names(db):
    """--json prints an array of full snapshots with exactly the documented fields."""
    waiting(db)
    rows = json.loads(keel("tasks", "list", "--json", "--store", str(db)).stdout)
    assert len(rows) == 1
    assert set(rows[0]) == SNAPSHOT_FIELDS
    assert rows[0]["input_requests"]["input"] == {"message": "Which service?", "schema": SCHEMA}
    assert rows[0]["pending_input"] == ["input"]


def test_list_filters_by_status_and_limits(db):
    """--status filters; --limit cuts the listing and says so on stderr."""
    first = waiting(db)
    on_store(db, lambda s: s.create(name="job"))
    on_store(db, lambda s: s.create(name="job"))
    result = keel("tasks", "list", "--status", "input_required", "--store", str(db))
    assert first.task_id in result.stdout
    assert "working" not in result.stdout
    result = keel("tasks", "list", "--limit", "2", "--json", "--store", str(db))
    assert len(json.loads(result.stdout)) == 2
    assert "showing the newest 2 tasks; the next ones: --cursor " in result.stderr
    assert keel("tasks", "list", "--status", "failed", "--store", str(db)).stdout == (
        "no failed tasks\n"
    )


def test_list_rejects_an_unknown_status(db):
    """--status outside the five is a usage error."""
    result = keel("tasks", "list", "--status", "done", "--store", str(db))
    assert result.exit_code == 2
    assert "'done' is not one of" in result.stderr


def test_plain_table_has_one_line_per_task(db):
    """Piped output is plain columns: a header and one line per task, no box drawing."""
    task = waiting(db)
    lines = keel("tasks", "list", "--store", str(db)).stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "NAME", "STATUS", "MESSAGE", "ATTEMPT", "UPDATED"]
    assert lines[1].split()[:4] == [task.task_id, "input_required", "diagnose", "Which"]


def test_terminal_table_is_coloured(db):
    """On a terminal the same columns come with a coloured status and a bold header."""
    task = waiting(db)
    result = CliRunner().invoke(cli, ["tasks", "list", "--store", str(db)], color=True)
    assert "\x1b[1mID" in result.stdout
    assert "\x1b[33minput_required" in result.stdout
    assert click.unstyle(result.stdout) == keel("tasks", "list", "--store", str(db)).stdout
    assert task.task_id in result.stdout


def test_show_prints_lease_error_ttl_and_history(db):
    """show covers a leased task (lease, fence) and a failed one (error, history reason)."""

    async def setup(store: Store) -> tuple[Task, Task]:
        await store.create(name="job", ttl=60)
        [claimed] = await store.claim(["job"], worker="w1", lease_seconds=30)
        failed = await store.create(name="other")
        await store.fail(failed.task_id, {"code": -32000, "message": "upstream refused"})
        return claimed, failed

    claimed, failed = on_store(db, setup)
    out = keel("tasks", "show", claimed.task_id, "--store", str(db)).stdout
    assert "lease           w1 until" in out
    assert f"(fence {claimed.fence})" in out
    assert "ttl             60s" in out
    out = keel("tasks", "show", failed.task_id, "--store", str(db)).stdout
    assert '"message": "upstream refused"' in out
    assert "working -> failed  failed: upstream refused  [client]" in out


def test_show_json_includes_history(db):
    """show --json is the snapshot plus its history entries (at, from, to, reason, actor)."""
    task = waiting(db)
    data = json.loads(keel("tasks", "show", task.task_id, "--json", "--store", str(db)).stdout)
    assert set(data) == SNAPSHOT_FIELDS | {"history", "steps"}
    [event] = data["history"]
    assert set(event) == {"at", "from", "to", "reason", "actor"}
    assert (event["from"], event["to"]) == (None, "input_required")


def test_task_to_json_is_plain_json(db):
    """The JSON form encodes without custom encoders (no enums, no tuples leaking)."""
    data = task_to_json(waiting(db))
    assert json.loads(json.dumps(data)) == data


# --- answer --------------------------------------------------------------------------


def test_answer_needs_key_when_several_are_pending(db):
    """Several pending requests and no --key: a usage error naming the keys."""
    task = waiting(
        db, a=InputRequest("A?", {"type": "string"}), b=InputRequest("B?", {"type": "string"})
    )
    result = keel("tasks", "answer", task.task_id, "--json", '"x"', "--store", str(db))
    assert result.exit_code == 2
    assert "waits for several inputs ('a', 'b'); choose one with --key" in result.stderr


def test_answer_one_of_several_keys_keeps_waiting(db):
    """Answering one key of two leaves the task input_required and says what is left."""
    task = waiting(
        db, a=InputRequest("A?", {"type": "string"}), b=InputRequest("B?", {"type": "string"})
    )
    args = ("tasks", "answer", task.task_id, "--key", "a", "--json", '"x"', "--store", str(db))
    result = keel(*args)
    assert result.exit_code == 0
    assert "-> input_required (still waiting for 'b')" in result.stdout
    again = keel(*args)
    assert again.exit_code == 1
    assert "input 'a' of task" in again.stderr
    assert "already answered" in again.stderr


def test_answer_unknown_key_is_refused(db):
    """--key naming no request is refused (exit 1) instead of being silently ignored."""
    task = waiting(db)
    result = keel(
        "tasks", "answer", task.task_id, "--key", "nope", "--json", "{}", "--store", str(db)
    )
    assert result.exit_code == 1
    assert "has no input request 'nope'; pending: 'input'" in result.stderr
    assert on_store(db, lambda s: s.get(task.task_id)).status is Status.INPUT_REQUIRED


def test_answer_reads_json_from_stdin(db):
    """--json - reads the answer from stdin."""
    task = waiting(db)
    result = keel(
        "tasks", "answer", task.task_id, "--json", "-", "--store", str(db),
        input='{"service": "payments"}',
    )  # fmt: skip
    assert result.exit_code == 0
    stored = on_store(db, lambda s: s.get(task.task_id))
    assert stored.input_responses == {"input": {"service": "payments"}}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{bad", "line 1 column 2: Expecting property name"),
        ("", "line 1 column 1: Expecting value"),
        ("NaN", "NaN is not a JSON number"),
    ],
)
def test_answer_malformed_json_is_usage_error(db, text, fragment):
    """Malformed --json is exit 2 naming the problem; nothing is stored."""
    task = waiting(db)
    result = keel("tasks", "answer", task.task_id, "--json", text, "--store", str(db))
    assert result.exit_code == 2
    assert "Invalid value for '--json'" in result.stderr
    assert fragment in result.stderr
    assert on_store(db, lambda s: s.get(task.task_id)) == task


# --- reclaim, purge, import ------------------------------------------------------------


def test_reclaim_and_purge_json(db):
    """reclaim --json and purge --json print machine-readable lists."""

    async def setup(store: Store) -> tuple[Task, Task]:
        stale = await store.create(name="job")
        done = await store.create(name="job", ttl=0)
        await store.complete(done.task_id, {"ok": True})
        return stale, done

    stale, done = on_store(db, setup)
    out = json.loads(
        keel("tasks", "reclaim", "--older-than", "0", "--json", "--store", str(db)).stdout
    )
    assert [(r["task_id"], r["previous_status"]) for r in out] == [(stale.task_id, "working")]
    assert set(out[0]) == {"task_id", "previous_status", "idle_seconds", "reason"}
    purged = json.loads(keel("tasks", "purge", "--json", "--store", str(db)).stdout)
    assert purged == [done.task_id]


def test_reclaim_rejects_negative_seconds(db):
    """--older-than must be >= 0 (a usage error otherwise)."""
    result = keel("tasks", "reclaim", "--older-than", "-1", "--store", str(db))
    assert result.exit_code == 2


def test_import_dry_run_stores_nothing(tmp_path, db):
    """import --dry-run checks the file and reports, without creating the store."""
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"a": {"task_id": "a", "status": "working"}}))
    result = keel("tasks", "import", str(path), "--dry-run", "--store", str(db))
    assert result.exit_code == 0
    assert result.stdout.startswith(f"would import 1 task from {path}: 1 working")
    assert not db.exists()


def test_import_of_a_directory_is_a_usage_error(tmp_path, db):
    """FILE must be a file."""
    assert keel("tasks", "import", str(tmp_path), "--store", str(db)).exit_code == 2


def test_help_lists_every_command():
    """keel --help and keel tasks --help list the commands."""
    top = keel("--help").stdout
    assert "demo" in top
    assert "tasks" in top
    sub = keel("tasks", "-h").stdout
    for name in ("list", "show", "cancel", "answer", "reclaim", "purge", "import"):
        assert f"  {name} " in sub


def test_version():
    """keel --version prints the package version."""
    from keel import __version__

    assert keel("--version").stdout.strip() == f"keel, version {__version__}"


def test_show_lists_checkpointed_steps(db):
    """show prints a task's checkpointed steps, and --json has them under "steps"."""

    async def prepare(store: Store) -> str:
        task = await store.create(name="job")
        [lease] = await store.claim(["job"], worker="w1", lease_seconds=30)
        await store.save_step(task.task_id, "load-incident", {"id": "INC-7"}, fence=lease.fence)
        return task.task_id

    task_id = on_store(db, prepare)
    text = keel("--store", str(db), "tasks", "show", task_id).stdout
    assert "load-incident" in text
    assert "INC-7" in text
    data = json.loads(keel("--store", str(db), "tasks", "show", task_id, "--json").stdout)
    assert data["steps"] == {"load-incident": {"id": "INC-7"}}
