"""Acceptance: the spans of one task, exported to files by real processes, form one
whole trace across a SIGKILL.

A ``keel serve --no-worker`` front end and ``keel worker`` processes on one store
(a SQLite file, or a PostgreSQL schema) each export their spans to a file of their own
(``$KEEL_OTEL_FILE``, OTLP/JSON lines), rotated at every span
(``$KEEL_OTEL_FILE_MAX_BYTES``).
A client calls the Bridge's diagnosis as a task; it asks which service (input_required);
the worker that ran it is SIGKILLed, a new worker starts, the client answers, and the
diagnosis completes. Read back from every file: the task's spans share one trace, whose
root is the front end's ``tools/call`` span; every exported span's parent was exported
too; each attempt (each claim) has its span, in the process that ran it; the step done
before the question is replayed by the new worker; the polls of the task are in its
trace. Every process's file rotated, and its rotated files are read back too.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from acceptance.test_serve_http import until
from acceptance.test_worker_cli import keel_worker
from keel.cli.demo import DEMO_INCIDENT, DEMO_SERVICE
from keel.mcp.client import Created, accept, update_task
from keel.mcp.client import TasksClientExtension as Tasks
from keel.telemetry.span_file import span_files
from keel_serve import KeelServe
from postgres.pg import drop_schema, new_schema, require_postgres, store_url

from .apps.harness import APPS, WorkerProcess, fleet, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TOOL = "diagnose_root_cause"
WAIT = 30.0  # seconds for a span to reach its file
ROTATE_BYTES = 1  # every span after the first rotates the file: one span a file


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One store for every process: a SQLite file, or a PostgreSQL schema of its own
    (dropped after)."""
    if request.param == "sqlite":
        yield str(tmp_path / "keel.db")
        return
    require_postgres()
    schema = new_schema()
    try:
        yield store_url(schema)
    finally:
        drop_schema(schema)


def environment(tmp_path: Path) -> dict[str, str]:
    """The test's environment for every process: the Bridge's data in ``tmp_path`` at a
    fast pace, no store or OTLP endpoint of the caller's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "KEEL_STORE" and not k.startswith(("OTEL_", "KEEL_OTEL"))
    }
    return env | {
        "KEEL_BRIDGE_DATA": str(tmp_path / "bridge"),
        "KEEL_BRIDGE_PACE": "fast",
        "PYTHONUNBUFFERED": "1",
        # Span files rotate at every span, none dropped: the trace must be read back
        # whole from files rotated away, the one a SIGKILL left included.
        "KEEL_OTEL_FILE_MAX_BYTES": str(ROTATE_BYTES),
        "KEEL_OTEL_FILE_BACKUPS": "10000",
    }


def read_spans(path: Path) -> list[dict[str, Any]]:
    """Every span a process wrote to ``path`` (OTLP/JSON lines), its rotated files
    included, each with its service, plain attributes and ``file`` (``path``'s name). A
    line still being written (no newline yet) is not read."""
    spans = []
    lines = [
        line
        for part in span_files(path)
        for line in part.read_text("utf-8").split("\n")[:-1]  # whole lines only
    ]
    for line in lines:
        for resource in json.loads(line)["resourceSpans"]:
            service = next(
                a["value"]["stringValue"]
                for a in resource["resource"]["attributes"]
                if a["key"] == "service.name"
            )
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    attributes = {
                        a["key"]: next(iter(a["value"].values()), None)
                        for a in span.get("attributes", [])
                    }
                    spans.append(
                        span | {"service": service, "file": path.name, "attrs": attributes}
                    )
    return spans


async def test_a_diagnosis_killed_while_it_asks_is_one_whole_trace(
    tmp_path: Path, store: str
) -> None:
    """Front end and workers export to their own files; the diagnosis asks, its worker
    is SIGKILLed, a new worker runs it to completion after the answer: every span of the
    task is in one trace, rooted at the front end's tools/call span, every parent of
    every exported span is exported, and each attempt has a span in its worker's file."""
    env = environment(tmp_path)
    files = {name: tmp_path / f"spans-{name}.jsonl" for name in ("serve", "old", "new")}
    server = KeelServe(
        ["--app", "bridge", "--no-worker", "--store", store, "--data-dir", str(tmp_path)],
        cwd=APPS,
        env=env | {"KEEL_OTEL_FILE": str(files["serve"])},
        log=tmp_path / "keel-serve.log",
    )
    server.start()
    try:
        await server.ready()  # the Bridge's sample data is prepared before it listens
        with fleet() as workers:
            old = WorkerProcess(
                store=store,
                worker_id="old",
                logs=tmp_path,
                env=env | {"KEEL_OTEL_FILE": str(files["old"])},
                app="keel.bridge:app",
            )
            workers.append(old)
            old.wait_ready()
            async with Client(server.url, extensions=[Tasks()]) as client:
                created = await client.session.call_tool(
                    TOOL, {"incident_id": DEMO_INCIDENT}, allow_claimed=True
                )
            assert isinstance(created, Created), created
            task_id = created.task_id
            waiting = await until(server.url, task_id, "input_required")
            [key] = waiting["inputRequests"]
            # The attempt records its question, then its span ends: SIGKILL only once the
            # span is on disk (a span still open at a kill is lost, and nothing depends on
            # it; this test checks that each attempt's span, once exported, is in place).
            with anyio.fail_after(WAIT):
                while True:
                    if any(s["name"] == f"keel.attempt {TOOL}" for s in read_spans(files["old"])):
                        break
                    await anyio.sleep(0.02)

            assert old.kill() == -signal.SIGKILL, old.output()
            new = WorkerProcess(
                store=store,
                worker_id="new",
                logs=tmp_path,
                env=env | {"KEEL_OTEL_FILE": str(files["new"])},
                app="keel.bridge:app",
            )
            workers.append(new)
            new.wait_ready()
            async with Client(server.url, extensions=[Tasks()]) as client:
                await update_task(client, task_id, {key: accept({"service": DEMO_SERVICE})})
            await until(server.url, task_id, "completed")
            assert new.terminate() == 0, new.output()
    finally:
        assert server.stop() == 0, server.output()

    rotated = {name: len(span_files(path)) - 1 for name, path in files.items()}
    names = {name: [s["name"] for s in read_spans(path)] for name, path in files.items()}
    assert all(n >= 1 for n in rotated.values()), (rotated, names)
    spans = [span for path in files.values() for span in read_spans(path)]
    ids = {span["spanId"] for span in spans}
    orphans = [s for s in spans if s.get("parentSpanId") and s["parentSpanId"] not in ids]
    assert orphans == [], "every exported span's parent is exported"

    of_task = [s for s in spans if s["attrs"].get("mcp.task.id") == task_id]
    [trace_id] = {s["traceId"] for s in of_task}
    trace = [s for s in spans if s["traceId"] == trace_id]
    [root] = [s for s in trace if not s.get("parentSpanId")]
    assert (root["name"], root["file"]) == (f"tools/call {TOOL}", files["serve"].name)

    attempts = sorted(
        (s["attrs"]["mcp.task.fence"], s["file"], s["attrs"].get("mcp.task.outcome"))
        for s in of_task
        if s["name"] == f"keel.attempt {TOOL}"
    )
    assert attempts == [
        ("1", files["old"].name, "input_required"),
        ("2", files["new"].name, "completed"),
    ], "one span for each attempt, exported by the worker that ran it"
    steps = [s for s in of_task if s["name"].startswith("keel.step ")]
    assert {s["file"] for s in steps} == {files["old"].name, files["new"].name}
    replayed = {
        (s["file"], s["attrs"]["mcp.task.step.name"])
        for s in steps
        if s["attrs"]["mcp.task.step.replayed"]
    }
    assert replayed == {(files["new"].name, "load-incident")}, "the step before the question"
    polls = {s["name"] for s in trace if s["file"] == files["serve"].name and s is not root}
    assert polls == {"tasks/get", "tasks/update"}, "the task's polls are in its trace"
    assert {s["service"] for s in trace} == {"keel-serve", "keel-worker"}


def test_an_unwritable_span_file_is_one_error_line(tmp_path: Path) -> None:
    """``KEEL_OTEL_FILE`` in a folder that does not exist: ``keel worker`` exits 1 with
    one ``keel: error:`` line naming the variable, no traceback."""
    env = worker_env(tmp_path / "effects.jsonl", KEEL_OTEL_FILE=str(tmp_path / "no" / "x"))
    error = keel_worker(
        tmp_path, "--app", "steps_app:app", "--store", str(tmp_path / "k.db"), env=env
    )
    assert error.startswith(f"KEEL_OTEL_FILE={tmp_path / 'no' / 'x'}: cannot write spans there"), (
        error
    )
