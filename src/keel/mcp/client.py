"""Client side of the tasks extension, on the official ``mcp`` client.

``TasksClientExtension`` declares ``io.modelcontextprotocol/tasks`` on every request and
claims ``CreateTaskResult`` answers: ``client.call_tool(…)`` then polls ``tasks/get``
(respecting ``pollIntervalMs``, and backing off when a server says a poll came too
soon), hands input requests to a callback and sends its
answers with ``tasks/update``, and returns the task's final ``CallToolResult`` (a failed or
cancelled task raises the same ``MCPError`` a client without the extension gets)::

    async def answer(task_id: str, requests: dict[str, Any]) -> dict[str, Any]:
        return {key: accept({"service": "payments"}) for key in requests}

    tasks = TasksClientExtension(on_input=answer, on_created=remember_task_id)
    async with Client(url, extensions=[tasks]) as client:
        result = await client.call_tool("diagnose_root_cause", {"incident_id": "INC-7"})

When the server offers push notifications (``subscriptions/listen`` with
``notifications.taskIds``, :mod:`keel.mcp.push`), the extension listens to each task it
resolves and follows the ``notifications/tasks`` it receives instead of polling (a slow
backstop poll still runs, so a stalled stream is caught). A server that does not offer
them, or a stream that drops, is met by polling at ``pollIntervalMs`` again (and a
dropped stream by a poll at once, then a new listen): the result is always the task's
own terminal state, never a stale or missing one. ``listen=False`` only polls.

Nothing is kept in memory that cannot be recovered: a task id is all it takes to pick a
task up again after the client restarts (``resume``). The functions ``get_task``,
``update_task`` and ``cancel_task`` drive a task by hand; the request models
(``GetTask``, ``UpdateTask``, ``CancelTask``) are exported for ``send_request``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import anyio
import anyio.abc
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Request, RequestParams, Result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict

from keel.mcp.answers import error_of
from keel.mcp.wire import RATE_LIMITED, TASKS_EXTENSION, cancelled_error, unknown_failure

__all__ = [
    "CancelTask",
    "Created",
    "Detailed",
    "GetTask",
    "InputHandler",
    "ListenParams",
    "ListenTasks",
    "TaskIdParams",
    "TaskInputRequired",
    "TasksClientExtension",
    "UpdateParams",
    "UpdateTask",
    "accept",
    "cancel_task",
    "decline",
    "get_task",
    "resume",
    "update_task",
]

TERMINAL = frozenset({"completed", "failed", "cancelled"})
PUSH_BACKSTOP = 30.0  # seconds between polls while a listen stream delivers the task
RELISTEN = 1.0  # seconds before listening again after a stream dropped
LINGER = 1.0  # seconds a resolved task's listen stream is given to end by itself

InputHandler = Callable[[str, dict[str, Any]], Awaitable[Mapping[str, Any]]]
"""``async def on_input(task_id, input_requests) -> input_responses``.

``input_requests`` is the task's ``inputRequests`` as sent (key -> ``{"method":
"elicitation/create", "params": {"message", "requestedSchema", …}}``); the answer maps
some or all of those keys to elicitation results (build them with :func:`accept` and
:func:`decline`). Keys left out stay outstanding and are asked again on a later poll.
"""

OnCreated = Callable[[str], Awaitable[None] | None]


class TaskIdParams(RequestParams):
    task_id: str


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # mirrored into the Mcp-Name header


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class ListenParams(RequestParams):
    notifications: dict[str, Any]


class ListenTasks(Request[ListenParams, Literal["subscriptions/listen"]]):
    """``subscriptions/listen`` naming tasks (``notifications={"taskIds": [...]}``); the
    SDK's own ``listen()`` sends only the core filters."""

    method: Literal["subscriptions/listen"] = "subscriptions/listen"
    params: ListenParams


class Created(Result):
    """A flat ``CreateTaskResult``."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class Detailed(Result):
    """A ``tasks/get`` answer (extra fields kept: result, error, inputRequests …)."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class TaskInputRequired(Exception):
    """The task waits for input and no ``on_input`` callback was given.

    The task is untouched and keeps waiting: answer with :func:`update_task`, then
    :func:`resume`.
    """

    def __init__(self, task_id: str, input_requests: dict[str, Any]) -> None:
        keys = ", ".join(sorted(input_requests)) or "(none listed)"
        super().__init__(f"task {task_id} needs input ({keys}) and no on_input handler was given")
        self.task_id = task_id
        self.input_requests = input_requests


def accept(content: Mapping[str, Any]) -> dict[str, Any]:
    """An elicitation result that accepts with ``content``."""
    return {"action": "accept", "content": dict(content)}


def decline(action: Literal["decline", "cancel"] = "decline") -> dict[str, Any]:
    """An elicitation result that declines (or cancels) the request."""
    return {"action": action}


def _session(client: Any) -> Any:
    """The ``ClientSession`` of an ``mcp.Client`` (or the session itself)."""
    return getattr(client, "session", client)


async def get_task(client: Any, task_id: str) -> Detailed:
    """``tasks/get``: the task as the server sees it now."""
    return await _session(client).send_request(  # type: ignore[no-any-return]
        GetTask(params=TaskIdParams(task_id=task_id)), Detailed
    )


async def update_task(client: Any, task_id: str, input_responses: Mapping[str, Any]) -> None:
    """``tasks/update``: answer some or all of a task's input requests.

    A response that violates its requested schema raises ``MCPError`` (-32602, naming
    the field) and the request stays outstanding.
    """
    await _session(client).send_request(
        UpdateTask(params=UpdateParams(task_id=task_id, input_responses=dict(input_responses))),
        Result,
    )


async def cancel_task(client: Any, task_id: str) -> None:
    """``tasks/cancel``: ask the server to cancel; an empty ack, also for finished tasks."""
    await _session(client).send_request(CancelTask(params=TaskIdParams(task_id=task_id)), Result)


def _retry_after(exc: MCPError) -> float | None:
    """Seconds a rate-limited poll is told to wait (``data.retryAfterMs``), else None."""
    data = exc.error.data
    if exc.error.code != RATE_LIMITED or not isinstance(data, Mapping):
        return None
    wait = data.get("retryAfterMs")
    return wait / 1000 if isinstance(wait, int | float) and wait >= 0 else None


def _final(task: Detailed) -> CallToolResult:
    """A finished task as its call answers a client without the extension: the
    ``CallToolResult`` (``isError`` kept), or the same JSON-RPC error raised."""
    data = task.model_dump(by_alias=True)
    if task.status == "completed":
        return CallToolResult.model_validate(data["result"])
    error = data.get("error") if task.status == "failed" else None
    if not isinstance(error, Mapping) or not isinstance(error.get("code"), int):
        error = (
            cancelled_error(task.task_id)
            if task.status == "cancelled"
            else unknown_failure(task.task_id)
        )
    raise error_of(error)


def _stamp(task: Detailed) -> str:
    """When the task last changed, as the wire says (ISO 8601 UTC: ordered as text)."""
    stamp = (task.model_extra or {}).get("lastUpdatedAt")
    return stamp if isinstance(stamp, str) else ""


class _Inbox:
    """What one resolution's listen stream pushed: the newest state not yet followed,
    whether the stream delivers (``live``), and whether it dropped (poll at once)."""

    def __init__(self) -> None:
        self.newest: Detailed | None = None  # the newest state seen, pushed or polled
        self.fresh: Detailed | None = None  # pushed and not yet followed
        self.live = False
        self.poll_now = False
        self.done = anyio.Event()  # the resolution has its answer
        self.ended = anyio.Event()  # the listen loop has ended
        self._changed = anyio.Event()

    def seen(self, task: Detailed) -> bool:
        """Note ``task`` (pushed or polled); False if it is older than one already seen:
        notifications may be delivered out of order, and terminal is absorbing."""
        newest = self.newest
        if newest is not None and (newest.status in TERMINAL or _stamp(task) < _stamp(newest)):
            return False
        self.newest = task
        return True

    def push(self, task: Detailed) -> None:
        self.live = True
        if self.seen(task):
            self.fresh = task
        self._changed.set()

    def dropped(self) -> None:
        self.live = False
        self.poll_now = True
        self._changed.set()

    async def next(self, wait: float) -> Detailed | None:
        """A pushed state, or None when it is time to poll (``wait`` seconds passed
        without one, or the stream dropped)."""
        with anyio.move_on_after(wait):
            while self.fresh is None and not self.poll_now:
                await self._changed.wait()
                self._changed = anyio.Event()
        fresh, self.fresh = self.fresh, None
        if fresh is None:
            self.poll_now = False
        return fresh


class _Poller:
    """What one resolution needs: when to poll, who answers input, whether to cancel."""

    def __init__(
        self,
        on_input: InputHandler | None,
        *,
        min_interval: float,
        max_interval: float,
        cancel_on_exit: bool,
    ) -> None:
        self.on_input = on_input
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.cancel_on_exit = cancel_on_exit

    def interval(self, poll_interval_ms: int | None, default: float) -> float:
        seconds = default if poll_interval_ms is None else poll_interval_ms / 1000
        return min(max(seconds, self.min_interval), self.max_interval)

    async def run(
        self,
        session: Any,
        task_id: str,
        poll_interval_ms: int | None,
        inbox: _Inbox | None = None,
    ) -> CallToolResult:
        """Follow the task to its end: by what ``inbox`` is pushed, if given, else (and
        whenever nothing is pushed) by polling ``tasks/get``."""
        interval = self.interval(poll_interval_ms, 1.0)
        try:
            answered: set[str] = set()
            task: Detailed | None = None  # None: poll now
            while True:
                if task is None:
                    try:
                        task = await get_task(session, task_id)
                    except MCPError as exc:
                        wait = _retry_after(exc)
                        if wait is None:
                            raise
                        await anyio.sleep(max(wait, interval))  # polled too fast: back off
                        continue
                    if inbox is not None:
                        inbox.seen(task)
                if task.status in TERMINAL:
                    return _final(task)
                interval = self.interval(task.poll_interval_ms, interval)
                if task.status == "input_required":
                    await self._answer(session, task, answered)
                task = await self._next(inbox, interval)
        except anyio.get_cancelled_exc_class():
            if self.cancel_on_exit:
                # Best effort: the caller's cancellation, not a failed tasks/cancel, is
                # what must come out of here.
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(5),
                    contextlib.suppress(Exception),
                ):
                    await cancel_task(session, task_id)
            raise

    async def _next(self, inbox: _Inbox | None, interval: float) -> Detailed | None:
        """The next state to follow: pushed, or None (poll) after the interval (the
        backstop while the stream delivers)."""
        if inbox is None:
            await anyio.sleep(interval)
            return None
        return await inbox.next(max(PUSH_BACKSTOP, interval) if inbox.live else interval)

    async def _answer(self, session: Any, task: Detailed, answered: set[str]) -> None:
        """Hand the task's input requests not asked yet to ``on_input``; send its answers."""
        requests = dict((task.model_extra or {}).get("inputRequests") or {})
        fresh = {k: v for k, v in requests.items() if k not in answered}
        if not fresh:
            return
        if self.on_input is None:
            raise TaskInputRequired(task.task_id, requests)
        responses = dict(await self.on_input(task.task_id, fresh))
        if responses:
            await update_task(session, task.task_id, responses)
            answered.update(responses)


async def resume(
    client: Any,
    task_id: str,
    *,
    on_input: InputHandler | None = None,
    min_poll_interval: float = 0.0,
    max_poll_interval: float = 30.0,
    cancel_on_exit: bool = False,
) -> CallToolResult:
    """Follow an existing task (say, one created before this client restarted) to its
    end and return its final ``CallToolResult``; arguments as for
    :class:`TasksClientExtension`.

    Raises:
        TaskInputRequired: the task needs input and ``on_input`` is None.
        MCPError: -32602 if the server does not know the task (or it is not yours).
    """
    poller = _Poller(
        on_input,
        min_interval=min_poll_interval,
        max_interval=max_poll_interval,
        cancel_on_exit=cancel_on_exit,
    )
    return await poller.run(_session(client), task_id, None)


class TasksClientExtension(ClientExtension):
    """Declares the tasks extension and resolves tasks: by push notifications where the
    server offers them, by polling where it does not (see the module docstring).

    Args:
        on_input: answers input requests (see :data:`InputHandler`); without it a task
            that needs input raises :class:`TaskInputRequired` from ``call_tool``.
        on_created: called with each new task id before polling starts: persist it to
            :func:`resume` the task after a restart.
        min_poll_interval / max_poll_interval: bounds (seconds) on the server's
            ``pollIntervalMs``, which is otherwise respected.
        cancel_on_exit: send ``tasks/cancel`` if the call is cancelled while it waits
            (default off: the task goes on and can be resumed).
        listen: listen for ``notifications/tasks`` when the server offers them (default);
            False: poll only.
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        *,
        on_input: InputHandler | None = None,
        on_created: OnCreated | None = None,
        min_poll_interval: float = 0.0,
        max_poll_interval: float = 30.0,
        cancel_on_exit: bool = False,
        listen: bool = True,
    ) -> None:
        if min_poll_interval < 0 or max_poll_interval < min_poll_interval:
            raise ValueError("need 0 <= min_poll_interval <= max_poll_interval")
        self.on_created = on_created
        self.listen = listen
        self._poller = _Poller(
            on_input,
            min_interval=min_poll_interval,
            max_interval=max_poll_interval,
            cancel_on_exit=cancel_on_exit,
        )
        self._inboxes: dict[str, set[_Inbox]] = {}

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [
            NotificationBinding(
                method="notifications/tasks", params_type=Detailed, handler=self._pushed
            )
        ]

    async def _pushed(self, task: Detailed) -> None:
        for inbox in list(self._inboxes.get(task.task_id, ())):
            inbox.push(task)

    async def _resolve(self, created: Created, ctx: ClaimContext) -> CallToolResult:
        if self.on_created is not None:
            outcome = self.on_created(created.task_id)
            if inspect.isawaitable(outcome):
                await outcome
        session = ctx.session
        if not self.listen or session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await self._poller.run(session, created.task_id, created.poll_interval_ms)
        return await self._follow_pushed(session, created)

    async def _follow_pushed(self, session: Any, created: Created) -> CallToolResult:
        """Resolve with a listen stream open on the task, polling as the fallback."""
        task_id = created.task_id
        inbox = _Inbox()
        self._inboxes.setdefault(task_id, set()).add(inbox)
        results: list[CallToolResult] = []
        errors: list[Exception] = []

        async def follow(tg: anyio.abc.TaskGroup) -> None:
            try:
                results.append(
                    await self._poller.run(session, task_id, created.poll_interval_ms, inbox)
                )
            except Exception as exc:  # re-raised below, outside the task group
                errors.append(exc)
            inbox.done.set()
            if inbox.live:  # a server that pushes ends the stream itself, at once
                with anyio.move_on_after(LINGER):
                    await inbox.ended.wait()
            tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_listen, session, task_id, inbox)
                tg.start_soon(follow, tg)
        finally:
            watching = self._inboxes.get(task_id, set())
            watching.discard(inbox)
            if not watching:
                self._inboxes.pop(task_id, None)
        if errors:
            raise errors[0]
        return results[0]

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=Created, resolve=self._resolve)]


async def _listen(session: Any, task_id: str, inbox: _Inbox) -> None:
    """Keep a listen stream open on the task until the resolution is done.

    An error before anything was pushed means the server does not offer task
    notifications (or not now): the resolution polls. A stream that ends or drops after
    it delivered is listened to again, after a poll at once.
    """
    request = ListenTasks(params=ListenParams(notifications={"taskIds": [task_id]}))
    try:
        while not inbox.done.is_set():
            delivered = inbox.live
            try:
                await session.send_request(request, Result)
            except Exception:  # the stream is only a shortcut: polling reports real errors
                if not delivered and not inbox.live:
                    inbox.dropped()
                    return
            inbox.dropped()
            with anyio.move_on_after(RELISTEN):
                await inbox.done.wait()
    finally:
        inbox.ended.set()
