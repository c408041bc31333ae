"""keel.mcp.client with push notifications: it listens to the task it resolves when the
server offers ``notifications/tasks``, and polls when the server does not or when the
stream ends; the result is always the task's own terminal state.

Over real HTTP, every request the client sends recorded, so the assertions are on what
went over the wire: how many polls, which listens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.server import MCPServer

from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.client import accept
from keel.mcp.push import TaskPush
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.runtime import Keel, TaskContext
from keel.store import SqliteStore
from tasks_extension.support import WAIT, build_app, serve_http
from tasks_extension.test_b4_client_polling import Sent, recording_client

pytestmark = pytest.mark.anyio
POLL = 0.05  # seconds: the gated task's pollIntervalMs


def gated_app(tmp_path: Path, gate: anyio.Event) -> Keel:
    """The test tasks plus ``gated`` (asks for a service, then waits for ``gate``)."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))

    @app.task("gated", poll_interval=POLL, max_attempts=1)
    async def gated(ctx: TaskContext) -> dict[str, str]:
        answer = await ctx.elicit("Which service?", {"type": "object", "properties": {}})
        await ctx.status("waiting for the gate")
        await gate.wait()
        return {"gate": "opened", "service": str(answer.get("service", "-"))}

    return app


def server_for(app: Keel, *, push: TaskPush | None, listen: bool = True) -> MCPServer[Any]:
    """A server over ``app`` with ``push`` (None: the SDK's own listen handler, which
    drops taskIds; ``listen=False``: no subscriptions/listen at all)."""
    tasks = TasksExtension(app)
    lifespan = keel_lifespan(app, concurrency=2)
    if push is not None:
        return MCPServer(
            "push",
            extensions=[tasks],
            middleware=[tasks.middleware(), push],
            subscriptions=push.bus,
            lifespan=push.lifespan(lifespan),
        )
    return MCPServer(
        "no-push",
        extensions=[tasks],
        middleware=[tasks.middleware()],
        subscriptions=None if listen else False,
        lifespan=lifespan,
    )


async def answer(task_id: str, requests: dict[str, Any]) -> dict[str, Any]:
    return {key: accept({"service": "db"}) for key in requests}


async def resolve(url: str, sent: Sent, gate: anyio.Event, *, after: Any = None) -> Any:
    """call_tool("gated") with a listening client; once ``sent`` saw what ``after``
    waits for (default: the listen), open the gate; the call's result."""
    result: Any = None
    async with recording_client(url, sent, Tasks(on_input=answer)) as client:

        async def call() -> None:
            nonlocal result
            result = await client.call_tool("gated", {})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(WAIT):
                await (after() if after is not None else sent.listened.wait())
            gate.set()
    return result


class Watch(Sent):
    """:class:`Sent`, also noting the first subscriptions/listen."""

    def __init__(self, enough: int = 5) -> None:
        super().__init__(enough)
        self.listened = anyio.Event()

    async def hook(self, request: Any) -> None:
        await super().hook(request)
        if self.of("subscriptions/listen"):
            self.listened.set()


@pytest.mark.requirement("B4.28")
async def test_a_client_follows_pushed_notifications_instead_of_polling(tmp_path: Path) -> None:
    """Against a server that pushes, the client listens to its task (taskIds = its id),
    answers the input request it is pushed, and returns the result once the terminal
    state is pushed: a handful of polls where polling at 50 ms would need many."""
    gate = anyio.Event()
    app = gated_app(tmp_path, gate)
    tasks = TasksExtension(app)
    sent = Watch()
    async with serve_http(server_for(app, push=tasks.push())) as url:

        async def settled() -> None:  # answered, and working at the gate, pushed
            while not sent.of("tasks/update"):  # noqa: ASYNC110 - the hook offers no event
                await anyio.sleep(0.01)
            await anyio.sleep(10 * POLL)  # polling would have polled ~10 times by now

        result = await resolve(url, sent, gate, after=settled)
    assert result.structured_content == {"gate": "opened", "service": "db"}
    [listened] = sent.of("subscriptions/listen")
    task_ids = listened[2]["params"]["notifications"]["taskIds"]
    assert len(task_ids) == 1
    assert len(sent.of("tasks/update")) == 1
    assert len(sent.of("tasks/get")) <= 2, sent.of("tasks/get")


@pytest.mark.requirement("B4.28", "B4.1")
@pytest.mark.parametrize("listen", [True, False], ids=["sdk-listen", "no-listen"])
async def test_without_task_push_the_client_polls(tmp_path: Path, listen: bool) -> None:
    """A server whose subscriptions/listen is the SDK's (it acknowledges no taskIds and
    sends no task notification) or that serves none: the client polls at pollIntervalMs
    and returns the task's result all the same."""
    gate = anyio.Event()
    app = gated_app(tmp_path, gate)
    sent = Watch()
    async with serve_http(server_for(app, push=None, listen=listen)) as url:
        result = await resolve(url, sent, gate, after=sent.polled.wait)
    assert result.structured_content == {"gate": "opened", "service": "db"}
    assert len(sent.of("tasks/get")) >= sent.enough


@pytest.mark.requirement("B4.28")
async def test_a_stream_that_ends_is_met_by_a_poll_and_a_new_listen(tmp_path: Path) -> None:
    """The server ends the client's listen stream while the task runs (push.close(), as
    a stopping front end does): the client polls at once, listens again, and still
    returns the task's terminal state."""
    gate = anyio.Event()
    app = gated_app(tmp_path, gate)
    push = TasksExtension(app).push()
    sent = Watch()
    async with serve_http(server_for(app, push=push)) as url:

        async def ended_and_listened_again() -> None:
            while not (push.streams and sent.of("tasks/update")):  # noqa: ASYNC110
                await anyio.sleep(0.01)
            polls = len(sent.of("tasks/get"))
            push.close()
            while len(sent.of("tasks/get")) == polls or push.streams == 0:  # noqa: ASYNC110
                await anyio.sleep(0.01)

        result = await resolve(url, sent, gate, after=ended_and_listened_again)
    assert result.structured_content == {"gate": "opened", "service": "db"}
    assert len(sent.of("subscriptions/listen")) >= 2
