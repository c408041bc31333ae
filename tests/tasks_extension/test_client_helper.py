"""keel.mcp.client on the official client (in-process): input through a callback,
resume by task id, cancel, and the typed error when nobody answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError

from keel.mcp.client import (
    TaskInputRequired,
    TasksClientExtension,
    accept,
    cancel_task,
    decline,
    get_task,
    resume,
    update_task,
)
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.wire import TASK_CANCELLED
from keel.runtime import InputDeclined, Keel, TaskContext
from keel.store import SqliteStore

pytestmark = pytest.mark.anyio
WAIT = 10.0

SERVICE = {
    "type": "object",
    "required": ["service"],
    "properties": {"service": {"type": "string", "enum": ["payments", "checkout"]}},
}
CONFIRM = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


@pytest.fixture
def app(tmp_path: Path) -> Keel:
    app = Keel(SqliteStore(tmp_path / "keel.db"))

    @app.task("diagnose", poll_interval=0.02)
    async def diagnose(ctx: TaskContext, incident_id: str) -> dict[str, Any]:
        answers = await ctx.elicit_many(
            {"service": ("Which service?", SERVICE), "confirm": ("Go on?", CONFIRM)}
        )
        later = await ctx.elicit("And now?", CONFIRM, key="later")
        return {
            "incident": incident_id,
            "service": answers["service"]["service"],
            "ok": answers["confirm"]["ok"],
            "later": later["ok"],
        }

    @app.task("polite", poll_interval=0.02)
    async def polite(ctx: TaskContext) -> str:
        try:
            await ctx.elicit("May I?", CONFIRM, key="may")
        except InputDeclined:
            return "declined, fine"
        return "accepted"

    @app.task("forever", poll_interval=0.02)
    async def forever(ctx: TaskContext) -> str:
        await anyio.sleep_forever()
        return "never"  # pragma: no cover

    return app


@pytest.fixture
def server(app: Keel) -> MCPServer[Any]:
    return MCPServer("t", extensions=[TasksExtension(app)], lifespan=keel_lifespan(app))


@pytest.mark.requirement("B3.5", "B4.9", "B2.7")
async def test_input_requests_go_to_the_callback_and_the_final_result_comes_back(
    server: MCPServer[Any],
) -> None:
    """Two questions at once, then a third: the callback sees each request once, with its
    message and schema, and call_tool returns the completed result."""
    seen: list[tuple[str, dict[str, Any]]] = []
    created: list[str] = []

    async def on_input(task_id: str, requests: dict[str, Any]) -> dict[str, Any]:
        seen.append((task_id, requests))
        out: dict[str, Any] = {}
        for key, request in requests.items():
            schema = request["params"]["requestedSchema"]
            out[key] = accept({"service": "payments"} if schema == SERVICE else {"ok": True})
        return out

    tasks = TasksClientExtension(on_input=on_input, on_created=created.append)
    async with Client(server, extensions=[tasks]) as client:
        with anyio.fail_after(WAIT):
            result = await client.call_tool("diagnose", {"incident_id": "INC-7"})
    assert result.structured_content == {
        "incident": "INC-7",
        "service": "payments",
        "ok": True,
        "later": True,
    }
    assert [sorted(r) for _, r in seen] == [["confirm", "service"], ["later"]]
    assert len(created) == 1
    assert {task_id for task_id, _ in seen} == set(created)
    assert seen[0][1]["service"]["params"]["message"] == "Which service?"


@pytest.mark.requirement("B4.4")
async def test_without_a_callback_a_waiting_task_raises_and_can_be_resumed(
    server: MCPServer[Any],
) -> None:
    """No on_input: TaskInputRequired carries the id and the requests; the task keeps
    waiting; answered by hand, a fresh client resumes it by id to its result."""
    async with Client(server, extensions=[TasksClientExtension()]) as client:
        with anyio.fail_after(WAIT), pytest.raises(TaskInputRequired) as info:
            await client.call_tool("polite", {})
        task_id = info.value.task_id
        assert list(info.value.input_requests) == ["may"]
        assert (await get_task(client, task_id)).status == "input_required"
    async with Client(server, extensions=[TasksClientExtension()]) as other:
        await update_task(other, task_id, {"may": decline()})
        with anyio.fail_after(WAIT):
            result = await resume(other, task_id)
    assert not result.is_error
    assert "declined, fine" in result.content[0].text  # type: ignore[union-attr]


@pytest.mark.requirement("K5")
async def test_a_wrong_answer_is_refused_naming_the_field_and_the_request_stays(
    server: MCPServer[Any],
) -> None:
    """An on_input answer outside the schema raises MCPError -32602 from call_tool; the
    task still waits for that answer."""
    created: list[str] = []

    async def wrong(task_id: str, requests: dict[str, Any]) -> dict[str, Any]:
        return {k: accept({"service": "nope"}) for k in requests if k == "service"}

    tasks = TasksClientExtension(on_input=wrong, on_created=created.append)
    async with Client(server, extensions=[tasks]) as client:
        with anyio.fail_after(WAIT), pytest.raises(MCPError) as info:
            await client.call_tool("diagnose", {"incident_id": "INC-8"})
        assert info.value.error.code == -32602
        assert "service" in info.value.error.message
        task = await get_task(client, created[0])
        assert task.status == "input_required"
        assert "service" in (task.model_extra or {})["inputRequests"]


async def until(client: Client, task_id: str, status: str) -> None:
    """Poll until the task has ``status`` (the caller bounds the wait)."""
    while True:
        if (await get_task(client, task_id)).status == status:
            return
        await anyio.sleep(0.01)


async def test_cancel_task_ends_a_running_task_and_resume_reports_it(
    server: MCPServer[Any],
) -> None:
    """A cancelled task's call raises the same error a client without the extension gets
    (TASK_CANCELLED), in the waiting call and in a later resume."""
    created: list[str] = []
    made = anyio.Event()

    def remember(task_id: str) -> None:
        created.append(task_id)
        made.set()

    tasks = TasksClientExtension(on_created=remember)
    async with Client(server, extensions=[tasks]) as client:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    with pytest.raises(MCPError) as raised:
                        await client.call_tool("forever", {})
                    assert raised.value.error.code == TASK_CANCELLED
                    assert "cancelled" in raised.value.error.message

                tg.start_soon(call)
                await made.wait()
                await cancel_task(client, created[0])
            with pytest.raises(MCPError) as raised:
                await resume(client, created[0])
    assert raised.value.error.code == TASK_CANCELLED


@pytest.mark.slow
async def test_cancel_on_exit_cancels_the_task_when_the_call_is_abandoned(
    server: MCPServer[Any],
) -> None:
    """With cancel_on_exit, a call cancelled by its caller sends tasks/cancel; without it
    the task goes on."""
    for cancel_on_exit, expected in ((True, "cancelled"), (False, "working")):
        created: list[str] = []
        tasks = TasksClientExtension(on_created=created.append, cancel_on_exit=cancel_on_exit)
        async with Client(server, extensions=[tasks]) as client:
            with anyio.move_on_after(0.5):
                await client.call_tool("forever", {})
            with anyio.fail_after(WAIT):
                await until(client, created[0], expected)
            await cancel_task(client, created[0])


def test_poll_interval_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        TasksClientExtension(min_poll_interval=2, max_poll_interval=1)


async def test_a_failed_cancel_on_exit_does_not_replace_the_callers_cancellation(
    app: Keel, server: MCPServer[Any]
) -> None:
    """The store behind the server fails while the caller abandons the call: tasks/cancel
    answers an error, and what comes out of the call is still the cancellation."""
    created = anyio.Event()
    tasks = TasksClientExtension(
        on_created=lambda _: created.set(), min_poll_interval=30, cancel_on_exit=True
    )
    async with Client(server, extensions=[tasks]) as client:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "forever", {})
                await created.wait()
                await app.store.close()  # every store call fails from here on
                tg.cancel_scope.cancel()
        assert tg.cancel_scope.cancelled_caught
