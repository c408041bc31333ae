"""Acceptance: the real ``keel`` console script, run as a subprocess against temp stores.

Every command's happy path and its error paths: exit codes (0 ok, 1 operational error as
one ``keel: error: …`` line without a traceback, 2 usage error), and that a refused
command leaves the store exactly as it was. Fixtures are written through the public
Python API; everything is then read back through the CLI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel import TaskStore

# slow: every test runs the real keel console script as subprocesses
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "keel"
COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "keel"]
SCHEMA = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}
TIMEOUT = 60  # seconds; a hung CLI is a failure, not a stuck run


class Keel:
    """Runs the console script in a temp directory with a clean environment."""

    def __init__(self, cwd: Path, store: Path) -> None:
        self.cwd = cwd
        self.store = store
        self.env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
        self.env["COLUMNS"] = "200"

    def __call__(
        self, *args: str, store: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``keel ARGS`` (with ``--store`` pointing at the temp store unless ``store=False``)."""
        argv = [*COMMAND, *(["--store", str(self.store)] if store else []), *args]
        return subprocess.run(
            argv,
            cwd=self.cwd,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def ok(self, *args: str, **kw: Any) -> str:
        """Run, expect exit 0, return stdout."""
        result = self(*args, **kw)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        return result.stdout

    def fails(self, code: int, *args: str, **kw: Any) -> str:
        """Run, expect exit ``code``, no traceback; return stderr."""
        result = self(*args, **kw)
        assert result.returncode == code, (result.stdout, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr
        return result.stderr

    def error_line(self, *args: str, **kw: Any) -> str:
        """Run, expect exit 1 with exactly one ``keel: error:`` line; return its text."""
        stderr = self.fails(1, *args, **kw)
        lines = [line for line in stderr.splitlines() if not line.startswith("keel: warning:")]
        assert len(lines) == 1, stderr
        assert lines[0].startswith("keel: error: ")
        return lines[0].removeprefix("keel: error: ")

    def snapshot(self) -> Any:
        """Every task with its full history, read through the library (not the CLI under
        test): what "the store is unchanged" compares."""
        with TaskStore(self.store) as store:
            return [(t.task, tuple(store.history(t.task_id))) for t in store.list(limit=100_000)]


@pytest.fixture
def keel(tmp_path: Path) -> Keel:
    """The CLI against ``tmp_path/keel.db``, run in ``tmp_path``."""
    return Keel(tmp_path, tmp_path / "keel.db")


@pytest.fixture
def facade(keel: Keel):
    """The blocking Python API on the same store file, to set up fixtures."""
    with TaskStore(keel.store) as store:
        yield store


# --- list and show ---------------------------------------------------------------------


def test_list_empty_store(keel):
    """An empty store lists as 'no tasks' (table) and [] (JSON)."""
    keel.ok("tasks", "purge")  # creates the file
    assert keel.ok("tasks", "list").strip() == "no tasks"
    assert json.loads(keel.ok("tasks", "list", "--json")) == []


def test_list_shows_every_task_with_its_columns(keel, facade):
    """The table has id, status, name, status message, attempt and updated per task,
    newest first."""
    waiting = facade.create(SCHEMA, idempotency_key="incident-1", message="Which service?")
    working = facade.create()
    out = keel.ok("tasks", "list")
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "STATUS", "NAME", "STATUS", "MESSAGE", "ATTEMPT", "UPDATED"]
    assert rows[1].startswith(waiting.task_id)
    assert "input_required" in rows[1]
    assert "Which service?" in rows[1]
    assert "1/1" in rows[1]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$", rows[1])
    assert rows[0].startswith(working.task_id)
    assert " working " in rows[0]


def test_list_json_and_status_filter(keel, facade):
    """--json is an array of full snapshots; --status keeps one status."""
    waiting = facade.create(SCHEMA)
    facade.create()
    data = json.loads(keel.ok("tasks", "list", "--json", "--status", "input_required"))
    assert [t["task_id"] for t in data] == [waiting.task_id]
    assert data[0]["status"] == "input_required"
    assert data[0]["input_requests"]["input"]["schema"] == SCHEMA
    assert data[0]["lease"] is None
    assert data[0]["attempt"] == 1


def test_show_prints_every_field_and_the_history(keel, facade):
    """show: input request with schema, response, result, attempts, ttl, and history."""
    task = facade.create(SCHEMA, idempotency_key="incident-1", ttl=3600)
    facade.provide_input(task.task_id, {"service": "payments"})
    facade.complete(task.task_id, {"summary": "deploy d-1"})
    out = keel.ok("tasks", "show", task.task_id)
    for fragment in (
        f"task            {task.task_id}",
        "status          completed",
        "idempotency key incident-1",
        "attempt         1 of 1",
        "lease           none (fence 0)",
        "ttl             3600s",
        "input [answered]: input required: service",
        '"required": ["service"]',
        'response {"service": "payments"}',
        'result          {"summary": "deploy d-1"}',
        "(new) -> input_required  created; waiting for input 'input'",
        "input_required -> working  input 'input' received",
        "working -> completed  completed",
    ):
        assert fragment in out, fragment


def test_show_json_has_history_and_responses(keel, facade):
    """show --json: the snapshot plus history entries with when, from, to, reason, actor."""
    task = facade.create(SCHEMA)
    facade.provide_input(task.task_id, {"service": "payments"})
    data = json.loads(keel.ok("tasks", "show", task.task_id, "--json"))
    assert data["input_responses"] == {"input": {"service": "payments"}}
    assert data["pending_input"] == []
    assert [(e["from"], e["to"]) for e in data["history"]] == [
        (None, "input_required"),
        ("input_required", "working"),
    ]
    assert all(isinstance(e["at"], float) and e["actor"] for e in data["history"])


@pytest.mark.parametrize(
    "args",
    [
        ("tasks", "show", "no-such-task"),
        ("tasks", "cancel", "no-such-task"),
        ("tasks", "answer", "no-such-task", "--json", "{}"),
    ],
    ids=["show", "cancel", "answer"],
)
def test_unknown_id_is_one_line_exit_1(keel, facade, args):
    """An unknown id: exit 1, 'keel: error: unknown task: …', one line, no traceback."""
    facade.create()
    assert keel.error_line(*args) == "unknown task: no-such-task"


# --- cancel ----------------------------------------------------------------------------


def test_cancel_records_reason_and_actor(keel, facade):
    """cancel moves a waiting task to cancelled; the history has the reason and 'cli'."""
    task = facade.create(SCHEMA)
    out = keel.ok("tasks", "cancel", task.task_id, "--reason", "user gave up")
    assert out.strip() == f"task {task.task_id}: input_required -> cancelled"
    data = json.loads(keel.ok("tasks", "show", task.task_id, "--json"))
    assert data["status"] == "cancelled"
    assert data["history"][-1]["reason"] == "cancelled: user gave up"
    assert data["history"][-1]["actor"] == "cli"
    again = keel.ok("tasks", "cancel", task.task_id)
    assert again.strip() == f"task {task.task_id} was already cancelled"


def test_cancel_after_completion_is_refused_uniformly(keel, facade):
    """8D: cancel on a completed task is exit 1 naming the real status; nothing changes."""
    task = facade.create()
    facade.complete(task.task_id, {"summary": "done"})
    before = keel.snapshot()
    message = keel.error_line("tasks", "cancel", task.task_id)
    assert message == f"task {task.task_id} is already completed; cannot cancel it"
    assert keel.snapshot() == before


# --- answer ----------------------------------------------------------------------------


def test_answer_resumes_the_task(keel, facade):
    """answer with the default key validates and moves input_required -> working."""
    task = facade.create(SCHEMA)
    out = keel.ok("tasks", "answer", task.task_id, "--json", '{"service": "payments"}')
    assert out.strip() == f"task {task.task_id}: input 'input' accepted; input_required -> working"
    snap = facade.get(task.task_id)
    assert snap.status == "working"
    assert snap.input_value == {"service": "payments"}


def test_answer_violating_the_schema_is_exit_1(keel, facade):
    """A schema violation: exit 1 with the InputRejected message; the task still waits."""
    task = facade.create(SCHEMA)
    before = keel.snapshot()
    message = keel.error_line("tasks", "answer", task.task_id, "--json", '{"svc": "payments"}')
    assert message == (
        f"input 'input' for task {task.task_id} rejected at 'service': "
        "'service' is a required property"
    )
    assert keel.snapshot() == before


def test_answer_to_a_wrong_key_is_exit_1(keel, facade):
    """--key naming no open request (the answer's own field, here): one error line naming
    the key expected; the task still waits, its store unchanged."""
    task = facade.create(SCHEMA)
    before = keel.snapshot()
    message = keel.error_line(
        "tasks", "answer", task.task_id, "--key", "service", "--json", '"payments"'
    )
    assert message == (
        f"task {task.task_id} has no input request 'service'; pending: 'input' "
        "(answers are keyed by input request)"
    )
    assert keel.snapshot() == before


def test_answer_in_the_wrong_state_is_exit_1(keel, facade):
    """8B: answering a working task names its status; exit 1."""
    task = facade.create()
    message = keel.error_line("tasks", "answer", task.task_id, "--json", '{"service": "x"}')
    assert message.startswith("task is not waiting for input: working")


def test_answer_malformed_json_is_exit_2(keel, facade):
    """Malformed --json is a usage error (exit 2) naming line, column and problem."""
    task = facade.create(SCHEMA)
    before = keel.snapshot()
    stderr = keel.fails(2, "tasks", "answer", task.task_id, "--json", '{"service": ')
    assert "Invalid value for '--json': not valid JSON: line 1 column 13: Expecting value" in (
        stderr
    )
    assert keel.snapshot() == before


# --- store selection -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://host/x.db", "unknown store scheme 'ftp'"),
        ("sqlite://host/x.db", "a SQLite URL has no host"),
        ("sqlite:///x.db?fast=yes", "unknown SQLite option(s) fast"),
        ("postgresql://127.0.0.1:1/keel", "cannot connect to PostgreSQL at 127.0.0.1:1"),
    ],
)
def test_bad_store_url_is_exit_1(keel, url, fragment):
    """A store URL Keel cannot use: exit 1, one line naming the problem."""
    assert fragment in keel.error_line("--store", url, "tasks", "list", store=False)


def test_a_file_that_is_not_a_store_is_exit_1(keel, tmp_path):
    """A --store file that is not a SQLite database: exit 1, one line."""
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, not even close" * 100)
    message = keel.error_line("--store", str(junk), "tasks", "list", store=False)
    assert str(junk) in message


def test_keel_store_env_and_default_location(keel, tmp_path):
    """$KEEL_STORE is used without --store; without both, keel-data/keel.db under cwd."""
    with TaskStore(tmp_path / "env.db") as store:
        from_env = store.create()
    with TaskStore(tmp_path / "keel-data" / "keel.db") as store:
        default = store.create()
    env = {"KEEL_STORE": str(tmp_path / "env.db")}
    assert from_env.task_id in keel.ok("tasks", "list", store=False, env=env)
    listed = keel.ok("tasks", "list", store=False)
    assert default.task_id in listed
    assert from_env.task_id not in listed
    # --store wins over $KEEL_STORE
    assert default.task_id in keel.ok(
        "--store", "keel-data/keel.db", "tasks", "list", store=False, env=env
    )


def test_read_commands_do_not_create_a_store(keel, tmp_path):
    """list/show on a missing default store create no keel-data/ folder."""
    assert keel.ok("tasks", "list", store=False).strip() == "no tasks"
    assert keel.error_line("tasks", "show", "x", store=False) == "unknown task: x"
    assert not (tmp_path / "keel-data").exists()


# --- reclaim and purge -------------------------------------------------------------------


def test_reclaim_fails_idle_tasks_and_explains(keel, facade):
    """reclaim --older-than 0 fails every non-terminal task, listing why; terminal untouched."""
    waiting = facade.create(SCHEMA)
    working = facade.create()
    done = facade.create()
    facade.complete(done.task_id, {"ok": True})
    out = keel.ok("tasks", "reclaim", "--older-than", "0")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "PREVIOUS", "STATUS"]
    assert lines[1].split()[:2] == [waiting.task_id, "input_required"]
    assert lines[2].split()[:2] == [working.task_id, "working"]
    assert "reclaimed: no update for" in lines[1]
    assert lines[-1] == "reclaimed 2 tasks idle for more than 0s"
    assert facade.get(waiting.task_id).status == "failed"
    assert facade.get(working.task_id).status == "failed"
    assert facade.get(done.task_id).status == "completed"


def test_reclaim_with_a_long_timeout_changes_nothing(keel, facade):
    """Nothing idle long enough: 0 reclaimed, store unchanged."""
    facade.create(SCHEMA)
    before = keel.snapshot()
    assert keel.ok("tasks", "reclaim", "--older-than", "3600").strip() == (
        "reclaimed 0 tasks idle for more than 3600s"
    )
    assert keel.snapshot() == before


def test_reclaim_requires_older_than(keel):
    """reclaim without --older-than is a usage error."""
    assert "--older-than" in keel.fails(2, "tasks", "reclaim")


def test_purge_deletes_only_expired_finished_tasks(keel, facade):
    """purge removes finished tasks whose TTL ran out and names them; others stay."""
    expired = facade.create(ttl=0)
    facade.complete(expired.task_id, {"ok": True})
    kept = facade.create()
    facade.complete(kept.task_id, {"ok": True})
    live = facade.create(ttl=0)
    out = keel.ok("tasks", "purge")
    assert out.splitlines() == [expired.task_id, "purged 1 task (finished, TTL run out)"]
    remaining = {t["task_id"] for t in json.loads(keel.ok("tasks", "list", "--json"))}
    assert remaining == {kept.task_id, live.task_id}
    assert keel.ok("tasks", "purge").strip() == "purged 0 tasks (finished, TTL run out)"


# --- import ----------------------------------------------------------------------------

TEACHING = {
    "t1": {
        "task_id": "t1",
        "status": "input_required",
        "input_schema": SCHEMA,
        "input_value": None,
        "result": None,
        "idempotency_key": "incident-1",
    },
    "t2": {
        "task_id": "t2",
        "status": "completed",
        "input_schema": SCHEMA,
        "input_value": {"service": "payments"},
        "result": {"summary": "deploy d-1"},
        "idempotency_key": "incident-2",
        "updated_at": 1_700_000_000.0,
    },
    "t3": {
        "task_id": "t3",
        "status": "failed",
        "input_schema": None,
        "input_value": None,
        "result": None,
        "idempotency_key": None,
    },
}


def teaching_file(tmp_path: Path, data: Any = TEACHING) -> Path:
    """A teaching-store file, written as its _save() did."""
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def test_import_then_answer_an_imported_task(keel, tmp_path):
    """import stores every task; the waiting one can be answered through the CLI."""
    path = teaching_file(tmp_path)
    out = keel.ok("tasks", "import", str(path))
    assert out.splitlines()[0] == (
        f"imported 3 tasks from {path} into SQLite {keel.store} (synchronous=full): "
        "1 input_required, 1 completed, 1 failed"
    )
    assert "task 't3': failed before import" in out
    data = {t["task_id"]: t for t in json.loads(keel.ok("tasks", "list", "--json"))}
    assert data["t2"]["result"] == {"summary": "deploy d-1"}
    assert data["t2"]["input_responses"] == {"input": {"service": "payments"}}
    assert data["t3"]["error"]["code"] == -32603
    history = json.loads(keel.ok("tasks", "show", "t1", "--json"))["history"]
    assert history[0]["actor"] == "import:tasks.json"
    keel.ok("tasks", "answer", "t1", "--json", '{"service": "payments"}')
    assert json.loads(keel.ok("tasks", "show", "t1", "--json"))["status"] == "working"


def test_import_twice_imports_nothing_the_second_time(keel, tmp_path):
    """The same file again: exit 1 naming the taken ids; nothing added."""
    path = teaching_file(tmp_path)
    keel.ok("tasks", "import", str(path))
    before = keel.snapshot()
    message = keel.error_line("tasks", "import", str(path))
    assert message.startswith(f"cannot import {path}: task t1 already exists in the store")
    assert keel.snapshot() == before


def test_import_truncated_file_leaves_store_unchanged(keel, facade, tmp_path):
    """A file cut in half (a crash mid-rewrite): exit 1 with line/column; store unchanged."""
    facade.create(SCHEMA, idempotency_key="existing")
    path = teaching_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    before = keel.snapshot()
    message = keel.error_line("tasks", "import", str(path))
    assert re.match(rf"cannot import {re.escape(str(path))}: line \d+ column \d+: ", message)
    assert keel.snapshot() == before


def test_import_malformed_file_leaves_store_unchanged(keel, facade, tmp_path):
    """An unknown status anywhere in the file: exit 1 naming task and status; nothing stored."""
    facade.create()
    bad = {**TEACHING, "t4": {"task_id": "t4", "status": "done"}}
    path = teaching_file(tmp_path, bad)
    before = keel.snapshot()
    message = keel.error_line("tasks", "import", str(path))
    assert "task 't4': status 'done' is not one of 'working', 'input_required'" in message
    assert keel.snapshot() == before


def test_import_missing_file_is_exit_1(keel, tmp_path):
    """A file that does not exist is an operational error naming it."""
    message = keel.error_line("tasks", "import", str(tmp_path / "nope.json"))
    assert message.startswith(f"cannot import {tmp_path / 'nope.json'}: cannot read the file")


# --- demo, example, entry points ---------------------------------------------------------

DEMO_MOMENTS = [
    r"^create .* diagnose_root_cause for INC-",
    r"-> task \S+ input_required, asking 'Which service is affected\?'",
    r"^restart .* routine deploy: process restarted, in-memory state gone",
    r"^recover .* found task \S+ again: input_required, still asking",
    r"^8A retry .*\n.*-> same task: True",
    r"refused: input 'input' for task \S+ rejected at 'service'",
    r"accepted: working",
    r"^8B .*\n.*refused: task is not waiting for input: working",
    r"^complete .* -> completed: payments",
    r"cites deploys: ",
    r"^8C .*\n.*TaskAlreadyTerminal: task \S+ is already completed; cannot complete it\n"
    r".*real status: completed; first conclusion kept: True",
    r"^8D .*\n.*TaskAlreadyTerminal: task \S+ is already completed; cannot cancel it\n"
    r".*real status: completed",
    r"^8E .*\n.*TaskNotFound: unknown task: no-such-task",
]


def test_demo_plays_the_incident_and_can_run_twice(keel, tmp_path):
    """keel demo exits 0 with every key moment, in the default store; a second run works."""
    first = keel("demo", "--store-only", store=False)
    assert first.returncode == 0, first.stderr
    for moment in DEMO_MOMENTS:
        assert re.search(moment, first.stdout, re.MULTILINE), moment
    task_id = re.search(r"keel tasks show (\S+)$", first.stdout.strip())
    assert task_id is not None
    assert (tmp_path / "keel-data" / "keel.db").exists()
    second = keel("demo", "--store-only", store=False)
    assert second.returncode == 0, second.stderr
    listed = json.loads(keel.ok("tasks", "list", "--json", store=False))
    assert len(listed) == 2
    assert {t["status"] for t in listed} == {"completed"}
    shown = json.loads(keel.ok("tasks", "show", task_id.group(1), "--json", store=False))
    assert shown["input_responses"] == {"input": {"service": "payments"}}


def test_demo_on_memory_shows_the_incident_and_fails(keel):
    """With memory:// the restart loses the task (the incident): said, then exit 1."""
    result = keel("--store", "memory://", "demo", "--store-only", store=False)
    assert result.returncode == 1
    assert "the incident itself" in result.stdout
    assert result.stderr.strip().startswith("keel: error: keel demo needs a store that survives")
    assert "Traceback" not in result.stderr


def test_task_recovery_example_prints_the_three_lines():
    """examples/task_recovery.py reproduces the seed's example 07 output exactly."""
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "task_recovery.py")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"restored: \S+ input_required", lines[0])
    assert lines[1:] == ["input: working", "completed: completed"]


def test_python_dash_m_keel_and_help(keel):
    """python -m keel works like the script; help lists the commands; no args shows usage."""
    result = subprocess.run(
        [sys.executable, "-m", "keel", "--version"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    assert result.stdout.startswith("keel, version ")
    tasks_help = keel.ok("tasks", "--help", store=False)
    for name in ("list", "show", "cancel", "answer", "reclaim", "purge", "import"):
        assert re.search(rf"^  {name} ", tasks_help, re.MULTILINE), name
    bare = keel.fails(2, store=False)
    assert bare.startswith("Usage: keel [OPTIONS] COMMAND")


def test_unknown_command_is_exit_2(keel):
    """An unknown subcommand is a usage error."""
    assert "No such command 'frobnicate'" in keel.fails(2, "frobnicate", store=False)
