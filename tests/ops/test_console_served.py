"""The console served by real processes: ``keel serve`` mounts it at /ops beside /mcp
(its workers run what the console answers), ``keel ops`` serves it alone, and neither
serves it off loopback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from click.testing import CliRunner

from keel import Status
from keel.cli.app import cli
from keel.mcp.tokens import TokenFile
from keel.store import SqliteStore

from .page import Page
from .servers import WAIT, base_of, serving, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # real keel processes


async def test_keel_serve_mounts_the_console_and_its_workers_run_the_answer(
    tmp_path: Path,
) -> None:
    """An answer through /ops resumes the task; keel serve's worker completes it."""
    db = tmp_path / "keel.db"
    async with serving("serve", db, tmp_path) as server:
        store = SqliteStore(db)
        try:
            task = await store.create(name="approve", arguments={"change": "deploy 42"})
            await until(store, task.task_id, lambda t: t.status is Status.INPUT_REQUIRED)
            async with httpx.AsyncClient(base_url=base_of(server)) as http:
                page = Page((await http.get(f"/ops/tasks/{task.task_id}")).text)
                form = page.form_with("Answer")
                values = {**form.fields, "decision": "approve", "replicas": "3"}
                done = await http.post(form.action, data=values)
                assert done.status_code == 303, done.text
                mcp = await http.get("/mcp")
                assert mcp.status_code != 404  # the MCP endpoint is still there, apart
            finished = await until(store, task.task_id, lambda t: t.status.terminal)
            assert finished.status is Status.COMPLETED
            assert finished.result is not None
            assert finished.result["structuredContent"] == {
                "change": "deploy 42",
                "decision": "approve",
                "replicas": 3,
            }
        finally:
            await store.close()


async def test_keel_ops_serves_the_console_alone(tmp_path: Path) -> None:
    """``keel ops --store`` lists the store's tasks at /ops and exits 0 on SIGTERM."""
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    try:
        task = await store.create(name="approve", arguments={"change": "x"})
    finally:
        await store.close()
    async with serving("ops", db, tmp_path) as server, httpx.AsyncClient() as http:
        listed = await http.get(f"{base_of(server)}/", follow_redirects=True)
        assert listed.status_code == 200
        assert (f"/ops/tasks/{task.task_id}", task.task_id) in Page(listed.text).links


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "example.com"])
def test_keel_ops_refuses_to_listen_off_loopback(tmp_path: Path, host: str) -> None:
    """One ``keel: error:`` line naming the host, exit 1, before any store is opened."""
    result = CliRunner().invoke(cli, ["ops", "--store", str(tmp_path / "k.db"), "--host", host])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert result.output.startswith("keel: error: the operator console listens on loopback only")
    assert f"not {host}, without --auth" in result.output
    assert not (tmp_path / "k.db").exists()


def test_keel_ops_check_and_a_port_in_use(tmp_path: Path) -> None:
    """--check opens the store, says where it would listen, exits 0; a taken port is one
    ``keel: error:`` line (uvicorn's own failure would be exit 3 and a log)."""
    import socket

    db = str(tmp_path / "k.db")
    checked = CliRunner().invoke(cli, ["ops", "--store", db, "--port", "8123", "--check"])
    assert checked.exit_code == 0, checked.output
    assert "keel ops: operator console at http://127.0.0.1:8123/ops/" in checked.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(cli, ["ops", "--store", db, "--port", port])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].startswith(
        f"keel: error: cannot listen on 127.0.0.1:{port}"
    )


async def test_the_event_stream_names_each_change_of_the_watched_task(tmp_path: Path) -> None:
    """/ops/events?task=ID: ``*`` at once, then the id after each committed write of it
    (writes of other tasks are not sent)."""
    db = tmp_path / "keel.db"
    store = SqliteStore(db)
    try:
        task = await store.create(name="approve", arguments={"change": "x"})
        other = await store.create(name="approve", arguments={"change": "y"})
        async with serving("ops", db, tmp_path) as server, httpx.AsyncClient() as http:
            url = f"{base_of(server)}/ops/events?task={task.task_id}"
            async with http.stream("GET", url) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.aiter_lines()
                with anyio.fail_after(WAIT):
                    assert await _data(lines) == "*"
                    await store.set_status_message(other.task_id, "not watched")
                    await store.set_status_message(task.task_id, "watched")
                    assert await _data(lines) == task.task_id
    finally:
        await store.close()


async def _data(lines: AsyncIterator[str]) -> str:
    """The data of the next ``change`` event."""
    event = None
    async for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event == "change":
            return line.removeprefix("data: ")
    raise AssertionError("the stream ended")


@pytest.mark.parametrize(
    ("host", "line"),
    [
        ("127.0.0.1", "  console: http://127.0.0.1:8765/ops/"),
        ("0.0.0.0", "  console: off (0.0.0.0 is not loopback, and no --auth is set)"),
    ],
)
def test_keel_serve_names_the_console_or_says_it_is_off(
    tmp_path: Path, host: str, line: str
) -> None:
    """keel serve's startup message: where the console is on loopback; off elsewhere."""
    insecure = [] if host == "127.0.0.1" else ["--insecure-no-auth"]  # off loopback, no --auth
    result = CliRunner().invoke(
        cli,
        ["serve", "--app", "ops.apps.console_app:app", "--store", str(tmp_path / "k.db"),
         "--host", host, "--port", "8765", "--check", *insecure],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert line in result.output.splitlines()


def test_with_auth_keel_ops_and_keel_serve_serve_the_console_off_loopback(tmp_path: Path) -> None:
    """``--auth tokens:FILE``: keel ops starts on 0.0.0.0 and names its auth; keel serve
    mounts the console there, behind the token."""
    tokens = tmp_path / "tokens.json"
    TokenFile(tokens).add("alice")
    auth = ["--auth", f"tokens:{tokens}", "--host", "0.0.0.0", "--port", "8765", "--check"]
    db = str(tmp_path / "k.db")
    ops = CliRunner().invoke(cli, ["ops", "--store", db, *auth])
    assert ops.exit_code == 0, ops.output
    assert f"  auth:  bearer tokens of {tokens}" in ops.output.splitlines()
    served = CliRunner().invoke(
        cli, ["serve", "--app", "ops.apps.console_app:app", "--store", db, *auth]
    )
    assert served.exit_code == 0, served.output
    assert (
        "  console: http://0.0.0.0:8765/ops/ (sign in with a token; "
        "every valid token is an operator's)"
    ) in served.output


async def test_keel_serve_with_auth_refuses_the_console_without_the_token(
    tmp_path: Path,
) -> None:
    """keel serve --auth tokens:FILE: /ops is 401 without a token; with it, a cancel is
    recorded under the token's name."""
    db, tokens = tmp_path / "keel.db", tmp_path / "tokens.json"
    alice = TokenFile(tokens).add("alice")
    async with serving("serve", db, tmp_path, "--auth", f"tokens:{tokens}") as server:
        store = SqliteStore(db)
        try:
            task = await store.create(name="approve", arguments={"change": "x"})
            async with httpx.AsyncClient(base_url=base_of(server)) as http:
                assert (await http.get("/ops/")).status_code == 401
                http.headers["Authorization"] = f"Bearer {alice}"
                page = Page((await http.get(f"/ops/tasks/{task.task_id}")).text)
                form = page.form_with("Cancel")
                assert (await http.post(form.action, data=form.fields)).status_code == 303
            last = (await store.history(task.task_id))[-1]
            assert (last.actor, last.to_status) == ("alice", Status.CANCELLED)
        finally:
            await store.close()
