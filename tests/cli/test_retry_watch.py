"""``keel tasks retry`` and ``keel tasks watch`` over a real SQLite store file.

retry prints the new task's id (the old one stays failed, both histories linked); an
unknown id or a task that did not fail is one ``keel: error:`` line. watch, read through
a pipe as a real process, prints the current tasks, then a plain line per change, and
stops after --count changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from click.testing import CliRunner

from keel import Status
from keel.cli.app import cli
from keel.store import SqliteStore

WAIT = 30.0  # seconds any one line may take


async def _failed(db: Path) -> str:
    store = SqliteStore(db)
    try:
        task = await store.create(name="flaky", arguments={"n": 1})
        await store.fail(task.task_id, {"code": -32603, "message": "upstream down"})
        return task.task_id
    finally:
        await store.close()


def test_retry_prints_the_new_id_and_the_old_task_stays_failed(tmp_path: Path) -> None:
    """stdout is the new id alone; the new task has the same name and arguments."""
    db = tmp_path / "keel.db"
    old = anyio.run(_failed, db)
    result = CliRunner().invoke(cli, ["tasks", "retry", old, "--store", str(db)])
    assert result.exit_code == 0, result.output
    new = result.stdout.strip()
    assert new != old
    assert f"retried as {new}" in result.stderr

    async def check() -> None:
        store = SqliteStore(db)
        try:
            retried = await store.get(new)
            assert (retried.name, retried.arguments) == ("flaky", {"n": 1})
            assert retried.status is Status.WORKING
            assert (await store.get(old)).status is Status.FAILED
            assert (await store.history(new))[0].actor == "cli"
        finally:
            await store.close()

    anyio.run(check)


def test_retry_of_an_unknown_or_unfailed_task_is_one_error_line(tmp_path: Path) -> None:
    """Exit 1 and one ``keel: error:`` line; nothing is created."""
    db = tmp_path / "keel.db"

    async def running() -> str:
        store = SqliteStore(db)
        try:
            return (await store.create(name="job")).task_id
        finally:
            await store.close()

    async def total() -> int:
        store = SqliteStore(db)
        try:
            return sum((await store.counts()).values())
        finally:
            await store.close()

    for task_id in ["no-such-task", anyio.run(running)]:
        result = CliRunner().invoke(cli, ["tasks", "retry", task_id, "--store", str(db)])
        assert result.exit_code == 1, result.output
        assert result.output.count("\n") == 1
        assert result.output.startswith("keel: error:")
    assert anyio.run(total) == 1


@pytest.mark.anyio
async def test_watch_through_a_pipe_prints_the_tasks_then_each_change(tmp_path: Path) -> None:
    """The existing task first, then a line for a new task and for its completion;
    --count 2 ends it (exit 0)."""
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    try:
        before = await store.create(name="job")
        await store.set_status_message(before.task_id, "already here")
        command = [sys.executable, "-m", "keel", "tasks", "watch", "--store", str(db)]
        env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
        async with await anyio.open_process(
            [*command, "--count", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        ) as process:
            assert process.stdout is not None
            assert process.stderr is not None
            out = TextReceiveStream(process.stdout)
            err = TextReceiveStream(process.stderr)
            with anyio.fail_after(WAIT), _killed_at_the_end(process):
                lines = await _lines(out, 1)
                first = lines[0].split("\t")[1:]
                assert first == [before.task_id, "working", "job", "already here"]
                assert "watching" in await err.receive()
                new = await store.create(name="deploy")
                lines = await _lines(out, 2, lines)
                await store.complete(new.task_id, {"ok": True})
                lines = await _lines(out, 3, lines)
                assert await process.wait() == 0
        assert [line.split("\t")[1:3] for line in lines[1:]] == [
            [new.task_id, "working"],
            [new.task_id, "completed"],
        ]
    finally:
        await store.close()


@contextmanager
def _killed_at_the_end(process: Process) -> Iterator[None]:
    """Kill the watch if it still runs (a failed assertion must not wait for it)."""
    try:
        yield
    finally:
        if process.returncode is None:
            process.kill()


_buffer: dict[int, str] = {}


async def _lines(stream: TextReceiveStream, total: int, got: list[str] | None = None) -> list[str]:
    """Read ``stream`` until ``total`` whole lines have come (``got`` so far)."""
    lines = list(got or [])
    pending = _buffer.pop(id(stream), "")
    while len(lines) < total:
        pending += await stream.receive()
        *whole, pending = pending.split("\n")
        lines += whole
    _buffer[id(stream)] = pending
    return lines
