"""A task created over 2025-11-25 survives a SIGKILL of ``keel serve`` like any other: a
real ``keel serve --app conformance`` process (JSON answers, SQLite), killed while the
task waits for input and restarted on the same store; a new session finishes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acceptance.test_serve_http import WAIT, Server, restart, running_server
from keel.mcp.client_v2025 import LegacyClient
from keel.mcp.v2025 import RELATED_TASK
from keel.store import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A running keel serve, stopped at the end of the test."""
    yield from running_server(tmp_path)


@pytest.mark.requirement("K21")
async def test_a_2025_task_survives_a_sigkill_and_is_finished_through_tasks_result(
    server: Server, tmp_path: Path
) -> None:
    """create (params.task) -> input_required -> SIGKILL, restart -> a new session's
    tasks/result asks the question (elicitation/create on the GET stream, since keel
    serve answers in JSON), gets the answer, and returns the task's result."""
    await server.ready()
    async with LegacyClient(server.url, timeout=WAIT) as client:
        created = await client.call_task("confirm_delete", {"filename": "incident.log"})
        waiting = await client.until(created["taskId"], "input_required", limit=WAIT)
    assert waiting["status"] == "input_required"

    await restart(server)

    async def confirm(message: str, schema: dict[str, Any], task_id: str | None) -> Any:
        assert (message, task_id) == ("Delete incident.log?", created["taskId"])
        return {"confirm": True}

    async with LegacyClient(server.url, on_input=confirm, timeout=WAIT) as client:
        assert (await client.get(created["taskId"]))["status"] == "input_required"
        result = await client.result(created["taskId"])
        assert result["content"][0]["text"] == "deleted incident.log"
        assert result["_meta"][RELATED_TASK] == {"taskId": created["taskId"]}
        assert [via for via, _ in client.questions] == ["GET"]
        assert (await client.get(created["taskId"]))["status"] == "completed"
    store = SqliteStore(tmp_path / "keel.db")
    try:
        history = await store.history(created["taskId"])
    finally:
        await store.close()
    statuses = [event.to_status.value for event in history]
    assert statuses.count("input_required") == 1
    assert statuses[-1] == "completed"
    assert "cancelled" not in statuses
    assert "failed" not in statuses
