"""Every 2025-11-25 answer of the dual stack validates against the SDK's models of the
2025-11-25 schema (``mcp_types._v2025_11_25``, generated from the published schema; the
SDK keeps them private, but they are its record of that protocol): initialize, tools/list,
the CreateTaskResult, tasks/get, tasks/list, tasks/result, tasks/cancel, the status
notification and the elicitation request a task sends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types._v2025_11_25 as v2025
import pytest

from keel.mcp.client_v2025 import LegacyClient
from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import WAIT, build_app, build_server, serve_http

pytestmark = pytest.mark.anyio


@pytest.mark.requirement("A3.1", "A1.2")
async def test_every_2025_answer_validates_against_the_2025_11_25_schema(
    tmp_path: Path,
) -> None:
    """One flow over SSE on an authenticated server (so tasks/list is served): each
    answer parses as its 2025-11-25 model, required fields present, types right."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))

    async def on_input(message: str, schema: dict[str, Any], task_id: str | None) -> Any:
        return {"service": "payments"}

    async with (
        serve_http(build_server(app, auth=True), json_response=False) as url,
        LegacyClient(url, on_input=on_input, token="tok-alice", timeout=WAIT) as client,
    ):
        capabilities = v2025.ServerCapabilities.model_validate(client.capabilities)
        assert capabilities.tasks is not None
        assert capabilities.tasks.requests is not None
        listed = v2025.ListToolsResult.model_validate(await client.request("tools/list"))
        support = {t.name: t.execution.task_support for t in listed.tools if t.execution}
        assert support["ask"] == "optional"

        created = await client.request(
            "tools/call", {"name": "ask", "arguments": {"incident_id": "INC-1"}, "task": {}}
        )
        task_id = v2025.CreateTaskResult.model_validate(created).task.task_id
        v2025.GetTaskResult.model_validate(await client.get(task_id))
        result = v2025.CallToolResult.model_validate(await client.result(task_id))
        assert result.meta is not None
        v2025.ListTasksResult.model_validate(await client.request("tasks/list"))
        slow = (await client.call_task("slow", {}))["taskId"]
        cancelled = v2025.CancelTaskResult.model_validate(await client.cancel(slow))
        assert cancelled.status == "cancelled"

    [(_, question)] = client.questions
    v2025.ElicitRequestFormParams.model_validate(question)
    notes = [n for n in client.notifications if n["method"] == "notifications/tasks/status"]
    assert notes
    for note in notes:
        v2025.TaskStatusNotification.model_validate(note)
