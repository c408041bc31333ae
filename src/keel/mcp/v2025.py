"""The 2025-11-25 tasks protocol (the spec's experimental core utility) on the same server.

The 2026-07-28 extension (:mod:`keel.mcp.server`) and this generation share one store, one
runtime and one durability: a task created by a 2025-11-25 client is the same Keel task,
survives a crash the same way, and a 2026 client could read it. Where the generations
differ, the store keeps one truth and the wire translates here:

* ``initialize`` advertises ``capabilities.tasks`` (``cancel``, ``requests.tools.call``;
  ``list`` only when the server authenticates its callers: a server that cannot tell
  requestors apart does not list tasks, as the spec advises);
* ``tools/list`` marks each Keel tool ``execution.taskSupport`` (``optional`` or
  ``required``);
* ``tools/call`` with ``params.task`` answers ``{"task": Task}`` once the task is committed;
  without it the call waits for the outcome (a ``required`` tool answers ``-32601``);
* ``tasks/get``, ``tasks/cancel`` answer the 2025 ``Task`` (``ttl`` / ``pollInterval`` in
  ms); ``tasks/result`` blocks until the task ends and answers what the call would have
  (with the ``io.modelcontextprotocol/related-task`` ``_meta``); ``tasks/list`` pages the
  caller's own tasks;
* a completed task whose result has ``isError`` is stored ``completed`` and shown
  ``failed`` here (the 2025 spec counts it a failure);
* a task that needs input asks through ``elicitation/create`` (with the related-task
  ``_meta``) while a ``tasks/result`` (or a plain ``tools/call``) waits: on that
  request's SSE stream, or on the GET stream when the server answers in JSON. A client
  that cannot be asked (no form ``elicitation`` capability, or no channel) gets
  :data:`CANNOT_ASK` (``-32021``) and the task is cancelled, the reason in its history:
  a plain client never strands a task;
* while ``tasks/result`` waits, each change of status is sent as
  ``notifications/tasks/status`` (on its stream, or the GET stream; best effort); with
  push running (:mod:`keel.mcp.push`), a session that asked ``tasks/get`` for a task
  gets them on its own channel too (the GET stream on HTTP), on each committed change
  until the task ends (not while its own ``tasks/result`` streams them).

The hooks, for the SDK (``mcp`` 2.3.0, pinned): ``tasks/*`` are not spec methods, so the
extension's method bindings serve both generations (``TasksExtension`` calls the handlers
here when ``ctx.protocol_version`` is 2025-11-25). The ``tasks`` capability, ``execution``
in ``tools/list`` and a 2025 ``CreateTaskResult`` cannot pass the SDK's capability
builder and result sieve, so they go through ``Server.middleware`` (public, provisional:
the lowest public seam; covered by ``tests/tasks_extension/test_v2025_*``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NoReturn, cast

import anyio
from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.mcpserver import authenticated_principal
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    CallToolRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    Notification,
    RequestParams,
    ServerNotification,
    TaskStatusNotification,
    TaskStatusNotificationParams,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from keel.errors import (
    InvalidTransition,
    KeelError,
    TaskAlreadyTerminal,
    TaskNotFound,
    UnknownInputKey,
)
from keel.mcp.answers import error_of, mcp_error
from keel.mcp.wire import (
    CANNOT_ASK,
    RELATED_TASK,
    cannot_start,
    declined_before_start,
    invalid_cursor,
    legacy_outcome,
    legacy_task,
    list_not_served,
    not_a_task_tool,
    stranded,
    task_required,
)
from keel.model import JsonObject, Status, Task
from keel.runtime import Keel, TaskDefinition

__all__ = [
    "CANNOT_ASK",
    "LIST_PAGE",
    "RELATED_TASK",
    "V2025",
    "LegacyTasks",
    "ListParams",
    "TaskIdParams",
    "legacy_task",
]

V2025 = "2025-11-25"
"""The one handshake version with tasks."""
LEGACY = frozenset(HANDSHAKE_PROTOCOL_VERSIONS)
LIST_PAGE = 50
"""Tasks per ``tasks/list`` page."""
WAIT_POLL = 0.05  # seconds between store reads while a request waits for a task …
WAIT_POLL_MAX = 0.5  # … doubling up to this while the task shows no change

Owner = Callable[[ServerRequestContext[Any, Any]], str]
Asked = Callable[
    [object, str, Task, Callable[[Task], JsonObject], Callable[[JsonObject], Awaitable[None]]],
    None,
]
"""``TaskPush.watch_session``: (session, owner, task, wire, send)."""


class TaskIdParams(RequestParams):
    task_id: str


class StatusNotification(Notification[dict[str, Any], Literal["notifications/tasks/status"]]):
    """``notifications/tasks/status`` with the 2025 ``Task`` as plain JSON params."""

    method: Literal["notifications/tasks/status"] = "notifications/tasks/status"
    params: dict[str, Any]


class ListParams(RequestParams):
    cursor: str | None = None


def _can_elicit(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client declared form elicitation (``{}`` means form, 2025-11-25)."""
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _cannot_start(definition: TaskDefinition, why: str) -> MCPError:
    """:data:`CANNOT_ASK` for a task that asks before it starts (none is created)."""
    return error_of(cannot_start(definition.name, sorted(definition.options.ask_first or {}), why))


class LegacyTasks:
    """The 2025-11-25 tasks protocol over a Keel app: the handlers ``TasksExtension``
    binds, and the ``Server.middleware`` for what no binding can reach.

    Args:
        app: the Keel app.
        owner: the task owner of a request (the extension's principal binding).
        poll_interval: a task's poll interval in seconds.
        expose_crashes: show a crash's text (see ``TasksExtension``).
    """

    def __init__(
        self,
        app: Keel,
        *,
        owner: Owner,
        poll_interval: Callable[[Task], float],
        expose_crashes: bool = False,
    ) -> None:
        self.app = app
        self.owner = owner
        self.poll_interval = poll_interval
        self.expose_crashes = expose_crashes
        self.on_asked: Asked | None = None
        """Set by ``TasksExtension.push()``: the tasks a session asks for are pushed."""
        self._streaming: Counter[tuple[object, str]] = Counter()
        """(session, task id) that a ``tasks/result`` streams itself: no push meanwhile."""

    def wire(self, task: Task) -> JsonObject:
        return legacy_task(
            task,
            now=time.time(),
            poll_interval=self.poll_interval(task),
            expose_crashes=self.expose_crashes,
        )

    # --- the middleware ---------------------------------------------------------------

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "initialize":
            return self._initialized(ctx, await call_next(ctx))
        legacy = ctx.protocol_version in LEGACY and ctx.session.client_params is not None
        if not legacy or ctx.request_id is None:
            return await call_next(ctx)
        if ctx.method == "tools/list" and ctx.protocol_version == V2025:
            return self._listed(await call_next(ctx))
        if ctx.method == "tools/call":
            name = (ctx.params or {}).get("name")
            definition = self.app.tasks.get(name) if isinstance(name, str) else None
            if definition is not None:
                return await self._call(ctx, definition)
            if ctx.protocol_version == V2025 and (ctx.params or {}).get("task") is not None:
                # Not a Keel tool: its taskSupport is "forbidden".
                raise error_of(not_a_task_tool(name))
        return await call_next(ctx)

    def _initialized(self, ctx: ServerRequestContext[Any, Any], result: Any) -> HandlerResult:
        if not isinstance(result, dict) or result.get("protocolVersion") != V2025:
            return result  # type: ignore[no-any-return]
        tasks: JsonObject = {"cancel": {}, "requests": {"tools": {"call": {}}}}
        if authenticated_principal(ctx) is not None:
            tasks["list"] = {}
        capabilities = dict(result.get("capabilities") or {})
        capabilities["tasks"] = tasks
        return {**result, "capabilities": capabilities}

    def _listed(self, result: Any) -> HandlerResult:
        if not isinstance(result, dict):
            return result  # type: ignore[no-any-return]
        tools = []
        for tool in result.get("tools", []):
            definition = self.app.tasks.get(tool.get("name"))
            if definition is None:
                tools.append(tool)  # absent: "forbidden"
                continue
            mode = "required" if definition.options.task_mode == "required" else "optional"
            tools.append({**tool, "execution": {"taskSupport": mode}})
        return {**result, "tools": tools}

    async def _call(
        self, ctx: ServerRequestContext[Any, Any], definition: TaskDefinition
    ) -> HandlerResult:
        params = CallToolRequestParams.model_validate(ctx.params or {}, by_name=False)
        augmented = params.task is not None and ctx.protocol_version == V2025
        if not augmented and definition.options.task_mode == "required":
            raise error_of(task_required(definition.name))
        arguments = dict(params.arguments or {})
        try:  # the arguments are checked by submit, before anything is stored
            answers = await self._ask_first(ctx, definition)
            task = await self.app.submit(
                definition.name, arguments, owner=self.owner(ctx), answers=answers
            )
        except KeelError as exc:
            raise mcp_error(exc) from exc
        if augmented:
            # Committed before this answer leaves: the handle is durable when it arrives.
            return {"task": self.wire(task)}
        return await self._outcome(ctx, task, related=False)

    async def _ask_first(
        self, ctx: ServerRequestContext[Any, Any], definition: TaskDefinition
    ) -> dict[str, Any] | None:
        """The answers a task asks for before it starts, asked on the call's own stream
        (there is no task yet); None when it asks nothing."""
        asked = definition.options.ask_first
        if not asked:
            return None
        if not _can_elicit(ctx):
            raise _cannot_start(definition, "it declared no form elicitation capability")
        answers: dict[str, Any] = {}
        for key, (message, schema) in asked.items():
            try:
                answer = await self._elicit(ctx, message, schema, None)
            except NoBackChannelError:
                raise _cannot_start(definition, "this connection has no channel") from None
            if answer.action != "accept":
                raise error_of(declined_before_start(key, answer.action))
            answers[key] = answer.content or {}
        return answers

    # --- the methods ------------------------------------------------------------------

    async def _lookup(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
        try:
            return await self.app.store.get(task_id, owner=self.owner(ctx))
        except KeelError as exc:
            raise mcp_error(exc) from None

    async def get(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> HandlerResult:
        """``tasks/get``: the 2025 ``Task``."""
        task = await self._lookup(ctx, task_id)
        self._asked(ctx, task)
        return self.wire(task)

    def _asked(self, ctx: ServerRequestContext[Any, Any], task: Task) -> None:
        """This session asked for ``task``: push its changes to it, where push runs."""
        if self.on_asked is None:
            return
        session = ctx.session

        async def send(wire: JsonObject) -> None:
            if (session, wire["taskId"]) in self._streaming:
                return  # tasks/result sends them on its own stream
            # Plain JSON params, so that a task kept for good says "ttl": null; the SDK's
            # ServerNotification union lacks this notification (as in _notify).
            notification = cast("ServerNotification", StatusNotification(params=dict(wire)))
            await session.send_notification(notification)

        self.on_asked(session, self.owner(ctx), task, self.wire, send)

    async def cancel(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> HandlerResult:
        """``tasks/cancel``: the task after cancellation; a finished one is ``-32602``."""
        task = await self._lookup(ctx, task_id)
        try:
            if task.status.terminal:  # cancelled included: the spec refuses every terminal
                raise TaskAlreadyTerminal(task, "cancel")
            task = await self.app.cancel(task.task_id, reason="tasks/cancel", owner=task.owner)
        except KeelError as exc:
            raise mcp_error(exc) from exc
        return self.wire(task)

    async def result(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> HandlerResult:
        """``tasks/result``: blocks until the task ends (asking for its input meanwhile),
        then answers what the ``tools/call`` would have."""
        task = await self._lookup(ctx, params.task_id)
        key = (ctx.session, task.task_id)
        self._streaming[key] += 1
        try:
            return await self._outcome(ctx, task, related=True)
        finally:
            self._streaming[key] -= 1
            if self._streaming[key] <= 0:
                del self._streaming[key]

    async def list(self, ctx: ServerRequestContext[Any, Any], params: ListParams) -> HandlerResult:
        """``tasks/list``: the caller's own tasks, oldest first, :data:`LIST_PAGE` a page."""
        if authenticated_principal(ctx) is None:
            raise error_of(list_not_served())
        owner = self.owner(ctx)
        try:
            if params.cursor is not None:
                try:
                    await self.app.store.get(params.cursor, owner=owner)
                except TaskNotFound:
                    raise error_of(invalid_cursor()) from None
            tasks = await self.app.store.list(owner=owner, limit=LIST_PAGE + 1, after=params.cursor)
        except KeelError as exc:  # the store failed (unavailable, damaged): by the one table
            raise mcp_error(exc) from exc
        page = list(tasks[:LIST_PAGE])
        answer: JsonObject = {"tasks": [self.wire(task) for task in page]}
        if len(tasks) > LIST_PAGE:
            answer["nextCursor"] = page[-1].task_id
        return answer

    # --- waiting and asking -----------------------------------------------------------

    async def _outcome(
        self, ctx: ServerRequestContext[Any, Any], task: Task, *, related: bool
    ) -> HandlerResult:
        """Wait for the task to end, asking the client for input when it needs some;
        answer its tool result (or raise its error)."""
        seen: tuple[Status, str | None] | None = None
        pause = WAIT_POLL
        while True:
            if (task.status, task.status_message) != seen:
                seen = (task.status, task.status_message)
                pause = WAIT_POLL  # it moves: look again soon
                if related:
                    await self._notify(ctx, task)
            if task.status.terminal:
                break
            if task.status is Status.INPUT_REQUIRED:
                await self._ask(ctx, task)
            else:
                await anyio.sleep(pause)
                pause = min(pause * 2, WAIT_POLL_MAX)
            task = await self._lookup(ctx, task.task_id)
        outcome = legacy_outcome(task, related=related, expose_crashes=self.expose_crashes)
        if "error" in outcome:
            raise error_of(outcome["error"])
        result: HandlerResult = outcome["result"]
        return result

    async def _notify(self, ctx: ServerRequestContext[Any, Any], task: Task) -> None:
        """``notifications/tasks/status`` (best effort): on the waiting request's stream,
        or the GET stream when the server answers in JSON."""
        params = TaskStatusNotificationParams.model_validate(self.wire(task))
        related = ctx.request_id if ctx.session.can_send_request else None
        # The SDK's ServerNotification union lacks this 2025-11-25 notification, which the
        # session only serializes: the cast is for the type checker alone.
        notification = cast("ServerNotification", TaskStatusNotification(params=params))
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await ctx.session.send_notification(notification, related_request_id=related)

    async def _ask(self, ctx: ServerRequestContext[Any, Any], task: Task) -> None:
        """Ask each outstanding input request through ``elicitation/create`` and give the
        task the answers; cancel it when the client cannot be asked."""
        if not _can_elicit(ctx):
            await self.strand(task, "it declared no form elicitation capability")
        for key, request in task.pending_input.items():
            try:
                answer = await self._elicit(ctx, request.message, request.schema, task.task_id)
            except NoBackChannelError:
                await self.strand(task, "this connection has no channel to ask on")
            accepted = answer.action == "accept"
            try:
                await self.app.answer(
                    task.task_id,
                    {key: answer.content or {}} if accepted else {},
                    owner=task.owner,
                    declined=None if accepted else {key: answer.action},
                )
            except (InvalidTransition, UnknownInputKey):
                return  # answered elsewhere, or ended meanwhile: the wait goes on
            except KeelError as exc:  # an answer its schema refuses: named, still asked
                raise mcp_error(exc) from exc

    async def _elicit(
        self,
        ctx: ServerRequestContext[Any, Any],
        message: str,
        schema: JsonObject,
        task_id: str | None,
    ) -> ElicitResult:
        """One ``elicitation/create`` (with the related-task ``_meta`` when a task asks).

        Raises:
            NoBackChannelError: the connection cannot carry a request to the client.
        """
        params: JsonObject = {"message": message, "requestedSchema": schema}
        if task_id is not None:
            params["_meta"] = {RELATED_TASK: {"taskId": task_id}}
        question = ElicitRequest(params=ElicitRequestFormParams.model_validate(params))
        # On an SSE response the question rides this request's stream; a server that
        # answers in JSON has only the session's GET stream for it.
        metadata = (
            ServerMessageMetadata(related_request_id=ctx.request_id)
            if ctx.session.can_send_request
            else None
        )
        return await ctx.session.send_request(question, ElicitResult, metadata=metadata)

    async def strand(self, task: Task, why: str) -> NoReturn:
        """Cancel a task whose input its client cannot give (the reason goes into its
        history) and raise :data:`CANNOT_ASK` saying so."""
        keys = ", ".join(sorted(task.pending_input))
        reason = f"the task needs input ({keys}) and its client cannot be asked: {why}"
        try:
            await self.app.cancel(task.task_id, reason=reason, owner=task.owner)
        except InvalidTransition:
            pass  # it ended meanwhile: still refused
        except KeelError as exc:  # the store failed: that is the answer (the one table)
            raise mcp_error(exc) from exc
        raise error_of(stranded(task.task_id, sorted(task.pending_input), reason))
