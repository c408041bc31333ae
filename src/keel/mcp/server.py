"""The tasks extension for the official SDK's ``MCPServer``: Keel tasks as MCP tasks.

``TasksExtension(app)`` exposes an app's registered tasks as tools and serves
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` (SEP-2663, 2026-07-28); a lifespan
(``keel_lifespan``) runs the app's workers in the server process. Its ``middleware()``
adds the 2025-11-25 tasks protocol on the same tasks (:mod:`keel.mcp.v2025`)::

    app = Keel("sqlite:///keel-data/keel.db")
    tasks = TasksExtension(app)
    server = MCPServer(
        "bridge", extensions=[tasks], middleware=[tasks.middleware()], lifespan=keel_lifespan(app)
    )

A client that declared the extension gets a ``CreateTaskResult`` as soon as the task is
committed (durable creation). One that did not gets the result inline for
``task_mode="optional"`` tasks (the task is still created durably and the call waits for
it), and ``-32021`` for ``task_mode="required"`` ones.

A task registered with ``inline_within=SECONDS`` is awaited that long after it is
committed: if it finished by then, the call is answered inline with its result, even to
a declared client (the spec leaves the choice to the server). ``TasksExtension(app,
rate_limit_polls=True)`` refuses ``tasks/get`` calls that come faster than half the
task's ``pollIntervalMs`` with ``-32000`` and ``data.retryAfterMs`` (off by default; the
limit is kept per server process).
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
from mcp.server import MCPServer, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware
from mcp.server.extension import Extension, MethodBinding, ToolBinding
from mcp.server.mcpserver import authenticated_principal, require_client_extension
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import CallToolRequestParams, InputRequiredResult, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from keel.errors import InvalidTransition, KeelError, UnknownInputKey
from keel.mcp.answers import error_of, mcp_error
from keel.mcp.push import TaskPush
from keel.mcp.v2025 import V2025, LegacyTasks, ListParams
from keel.mcp.v2025 import TaskIdParams as ResultParams
from keel.mcp.wire import (
    TASKS_EXTENSION,
    create_task_result,
    declined_before_start,
    detailed_task,
    foreign_request_state,
    header_mismatch,
    input_from_wire,
    input_request,
    poll_too_soon,
    tool_outcome,
)
from keel.model import Status, Task
from keel.runtime import Keel, TaskDefinition, TaskOptions, Worker
from keel.runtime.arguments import handler_parameters

__all__ = ["TasksExtension", "keel_lifespan", "mcp_error"]

MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
TASK_STATE = "keel:task:"
"""``requestState`` prefix of an input-required answer to a client without the extension:
the retry carries it back (sealed by the SDK) and resumes that same task."""
BOTH = MODERN | {V2025}  # tasks/get and tasks/cancel: one binding, two generations
ONLY_2025 = frozenset({V2025})  # tasks/result and tasks/list
INLINE_POLL = 0.05  # seconds between reads while a call waits for its task inline
POLL_SLACK = 0.5  # a poll within this share of pollIntervalMs of the last one is too early


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    # Not the SDK's typed InputResponses: answers to keys that are not outstanding must be
    # ignored, not refused before the handler runs; each answer is checked here instead.
    input_responses: dict[str, Any]


def _raise_outcome(outcome: dict[str, Any]) -> HandlerResult:
    """A finished task's ``tools/call`` answer: its result, or its error raised."""
    if "result" in outcome:
        result: HandlerResult = outcome["result"]
        return result
    raise error_of(outcome["error"])


def _responses(params: CallToolRequestParams) -> dict[str, Any]:
    """The call's ``inputResponses`` as plain JSON (the SDK parsed them into models)."""
    return {
        key: value.model_dump(by_alias=True, exclude_none=True)
        if hasattr(value, "model_dump")
        else value
        for key, value in (params.input_responses or {}).items()
    }


def _owner(ctx: ServerRequestContext[Any, Any]) -> str:
    """The task owner: the authenticated principal, "" on unauthenticated servers (where
    the unguessable task id is the bearer secret)."""
    principal = authenticated_principal(ctx) or ""
    if len(principal) > 200:
        return "sha256:" + hashlib.sha256(principal.encode()).hexdigest()
    return principal


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return ctx.protocol_version in MODERN and bool(extensions and TASKS_EXTENSION in extensions)


def _check_name_header(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    # The SDK checks Mcp-Name only for tools/call, prompts/get and resources/read.
    request = ctx.request  # HTTP only; stdio and in-process calls carry no headers
    if request is None:
        return
    # Strict where the spec is, liberal where it is not: a present header that disagrees
    # is refused (-32020), an absent one is accepted (FastMCP's tasks client and the MCP
    # Inspector send none, and FastMCP's own server accepts that too).
    header = request.headers.get(MCP_NAME_HEADER)
    if header is not None and decode_header_value(header) != task_id:
        raise error_of(header_mismatch())


def _tool_for(definition: TaskDefinition) -> ToolBinding:
    """A tool whose signature is the handler's without its context: tools/list shows the
    handler's arguments, and the ``outputSchema`` of its result if it is typed; the call
    itself is always answered by the extension."""
    handler = definition.handler
    # The parameters Keel checks the arguments against (keel.runtime.arguments), so
    # that the SDK derives from them the inputSchema Keel checks.
    signature = inspect.signature(handler, eval_str=True)
    parameters = handler_parameters(handler)
    output = definition.output

    async def tool(**arguments: Any) -> Any:  # pragma: no cover - intercepted
        raise RuntimeError("answered by the Keel tasks extension")

    tool.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters,
        return_annotation=inspect.Signature.empty if output is None else output.model,
    )
    tool.__annotations__ = {
        p.name: p.annotation for p in parameters if p.annotation is not inspect.Parameter.empty
    }
    tool.__name__ = definition.name
    tool.__doc__ = definition.options.description
    return ToolBinding(
        tool,
        kwargs={
            "name": definition.name,
            "description": definition.options.description,
            # Results are built by Keel (keel.runtime.outcomes), not by the SDK from what
            # this stand-in returns; the SDK only publishes the outputSchema, of a typed
            # handler (structured_output=True) or of none (False).
            "structured_output": output is not None,
        },
    )


def _ask_first(
    definition: TaskDefinition, params: CallToolRequestParams
) -> InputRequiredResult | dict[str, Any]:
    """The task's ask-first input: the answers if the call carries them all, else the
    synchronous input-required result that asks for the missing ones (MRTR)."""
    asked = definition.options.ask_first or {}
    given = params.input_responses or {}
    answers: dict[str, Any] = {}
    missing: dict[str, Any] = {}
    for key, (message, schema) in asked.items():
        response = given.get(key)
        action = getattr(response, "action", None)
        if response is None:
            missing[key] = input_request(message, schema)
        elif action != "accept":
            raise error_of(declined_before_start(key, str(action)))
        else:
            answers[key] = getattr(response, "content", None) or {}
    if missing:
        return InputRequiredResult(input_requests=missing, request_state="keel:ask-first")
    return answers


class PollLimiter:
    """Remembers when each (owner, task) was last answered, for at most ``capacity``
    tasks (the least recently polled are forgotten first)."""

    def __init__(self, capacity: int = 100_000, slack: float = POLL_SLACK) -> None:
        self.capacity = capacity
        self.slack = slack
        self._last: OrderedDict[tuple[str, str], float] = OrderedDict()

    def wait_needed(self, key: tuple[str, str], interval: float, now: float) -> float:
        """Seconds still to wait before ``key`` may poll again; 0 records this poll."""
        last = self._last.get(key)
        if last is not None:
            wait = last + interval * self.slack - now
            if wait > 0:
                return wait
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)
        return 0.0


class TasksExtension(Extension):
    """``io.modelcontextprotocol/tasks`` over a Keel app.

    Args:
        app: the Keel app whose tasks become tools.
        rate_limit_polls: refuse ``tasks/get`` polls faster than the task's poll interval
            allows (see the module docstring).
        expose_crashes: show clients the text of a handler's unexpected exception (by
            default they see only its type; the text stays in the task's history).
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self, app: Keel, *, rate_limit_polls: bool = False, expose_crashes: bool = False
    ) -> None:
        self.app = app
        self.expose_crashes = expose_crashes
        self._limiter = PollLimiter() if rate_limit_polls else None
        self._bindings = {name: _tool_for(d) for name, d in app.tasks.items()}
        self.legacy = LegacyTasks(
            app, owner=_owner, poll_interval=self._poll_interval, expose_crashes=expose_crashes
        )

    def settings(self) -> dict[str, Any]:
        return {}

    def tools(self) -> list[ToolBinding]:
        return list(self._bindings.values())

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get, protocol_versions=BOTH),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=MODERN),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, protocol_versions=BOTH),
            # 2025-11-25 only (keel.mcp.v2025).
            MethodBinding(
                "tasks/result", ResultParams, self.legacy.result, protocol_versions=ONLY_2025
            ),
            MethodBinding("tasks/list", ListParams, self.legacy.list, protocol_versions=ONLY_2025),
        ]

    def middleware(self) -> ServerMiddleware[Any]:
        """What the 2025-11-25 tasks protocol needs beyond method bindings (its capability,
        ``execution.taskSupport``, its ``CreateTaskResult``): pass it to
        ``MCPServer(middleware=[extension.middleware()])``."""
        return self.legacy

    def push(self) -> TaskPush:
        """Push notifications for these tasks (``subscriptions/listen`` with ``taskIds``):
        the middleware, bus and lifespan to give the server (:mod:`keel.mcp.push`)."""
        push = TaskPush(self.app, wire=self._wire, owner=_owner)
        self.legacy.on_asked = push.watch_session  # 2025-11-25: notifications/tasks/status
        return push

    def _poll_interval(self, task: Task) -> float:
        definition = self.app.tasks.get(task.name or "")
        return (definition.options if definition else TaskOptions()).poll_interval

    def _wire(self, task: Task) -> dict[str, Any]:
        return detailed_task(
            task,
            now=time.time(),
            poll_interval=self._poll_interval(task),
            expose_crashes=self.expose_crashes,
        )

    async def _lookup(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
        require_client_extension(ctx, TASKS_EXTENSION)
        _check_name_header(ctx, task_id)
        try:
            # Unknown, purged and another principal's tasks answer the same.
            return await self.app.store.get(task_id, owner=_owner(ctx))
        except KeelError as exc:
            raise mcp_error(exc) from None

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> Any:
        if ctx.protocol_version == V2025:
            return await self.legacy.get(ctx, params.task_id)
        task = await self._lookup(ctx, params.task_id)
        if self._limiter is not None and not task.status.terminal:
            wait = self._limiter.wait_needed(
                (task.owner, task.task_id), self._poll_interval(task), time.monotonic()
            )
            if wait > 0:
                interval_ms = round(self._poll_interval(task) * 1000)
                raise error_of(poll_too_soon(max(1, round(wait * 1000)), interval_ms))
        return self._wire(task)

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> Any:
        task = await self._lookup(ctx, params.task_id)
        pending = task.pending_input
        outstanding = {k: v for k, v in params.input_responses.items() if k in pending}
        if not outstanding or task.status is not Status.INPUT_REQUIRED:
            return {}  # nothing outstanding is answered: an empty ack, as the spec asks
        await self._answer(task, outstanding)
        return {}

    async def _answer(self, task: Task, responses: dict[str, Any]) -> None:
        """Apply elicitation results to the task's outstanding requests.

        Raises:
            MCPError: -32602 for an answer its schema refuses (named; the request stays).
        """
        try:
            answers, declined = input_from_wire(responses)
            await self.app.answer(task.task_id, answers, owner=task.owner, declined=declined)
        except (InvalidTransition, UnknownInputKey):
            # It ended or moved on meanwhile, or a concurrent update answered the same
            # key first: the spec ignores answers to requests that are not outstanding.
            pass
        except KeelError as exc:  # InputRejected names the field; the request stays
            raise mcp_error(exc) from exc

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> Any:
        if ctx.protocol_version == V2025:
            return await self.legacy.cancel(ctx, params.task_id)
        task = await self._lookup(ctx, params.task_id)
        try:
            await self.app.cancel(task.task_id, reason="tasks/cancel", owner=task.owner)
        except InvalidTransition:
            pass  # already finished: the same empty ack
        except KeelError as exc:
            raise mcp_error(exc) from exc
        return {}

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        definition = self.app.tasks.get(params.name)
        if definition is None:
            return await call_next(ctx)
        declared = _declared(ctx)
        if not declared and definition.options.task_mode == "required":
            require_client_extension(ctx, TASKS_EXTENSION)
        if not declared and (params.request_state or "").startswith(TASK_STATE):
            return await self._resume(params, ctx)
        arguments = dict(params.arguments or {})
        answers: dict[str, Any] | None = None
        if definition.options.ask_first:
            asked = _ask_first(definition, params)
            if isinstance(asked, InputRequiredResult):
                return asked
            answers = asked
        try:  # the arguments are checked by submit, before anything is stored
            task = await self.app.submit(
                definition.name, arguments, owner=_owner(ctx), answers=answers
            )
        except KeelError as exc:
            raise mcp_error(exc) from exc
        if declared:
            if definition.options.inline_within > 0:
                task = await self._settle(task, definition.options.inline_within)
                if task.status in {Status.COMPLETED, Status.FAILED}:
                    return _raise_outcome(tool_outcome(task, expose_crashes=self.expose_crashes))
            # Committed before this answer leaves: the handle is durable when it arrives.
            return create_task_result(
                task, now=time.time(), poll_interval=definition.options.poll_interval
            )
        return await self._inline(task, ctx)

    async def _resume(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any]
    ) -> HandlerResult:
        """The retry of a call that got an input-required result: answer that same task
        (its ``requestState``, sealed by the SDK, names it) and go on waiting for it."""
        task_id = (params.request_state or "").removeprefix(TASK_STATE)
        try:
            task = await self.app.store.get(task_id, owner=_owner(ctx))
        except KeelError as exc:
            raise mcp_error(exc) from exc
        if task.name != params.name:
            raise error_of(foreign_request_state(task.name, params.name))
        given = _responses(params)
        outstanding = {k: v for k, v in given.items() if k in task.pending_input}
        if outstanding and task.status is Status.INPUT_REQUIRED:
            await self._answer(task, outstanding)
            task = await self._reread(task)
        return await self._inline(task, ctx, asked=set(given))

    async def _settle(self, task: Task, within: float) -> Task:
        """The task once it has finished, or as it is after ``within`` seconds."""
        deadline = time.monotonic() + within
        pause = 0.001
        while not task.status.terminal and task.status is not Status.INPUT_REQUIRED:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, 0.01)
            task = await self._reread(task)
        return task

    async def _reread(self, task: Task) -> Task:
        """The task as the store has it now; a store that cannot answer (unavailable,
        failed) is the call's answer, by the one table."""
        try:
            return await self.app.store.get(task.task_id)
        except KeelError as exc:
            raise mcp_error(exc) from exc

    async def _inline(
        self, task: Task, ctx: ServerRequestContext[Any, Any], asked: set[str] | None = None
    ) -> HandlerResult:
        """Wait for a task whose client does not poll, and answer its result inline.

        When the task needs input, the answer is an input-required result (MRTR) with
        the task's outstanding requests and a ``requestState`` naming the task: the
        client's retry resumes this same task (:meth:`_resume`), so it is never left
        waiting for an answer nobody can give. Requests the retry already answered
        (``asked``) are not asked again while the task works them in. A client of a protocol
        without MRTR cannot be asked: the task is cancelled, and the call answers
        ``-32021`` saying so.
        """
        while not task.status.terminal:
            if task.status is Status.INPUT_REQUIRED and not set(task.pending_input) <= (
                asked or set()
            ):
                if ctx.protocol_version not in MODERN:
                    # (Reached only on a server without extension.middleware(), which asks.)
                    await self.legacy.strand(task, "this server cannot ask a legacy client")
                requests = detailed_task(task, now=time.time(), poll_interval=1.0)
                return InputRequiredResult(
                    input_requests=requests["inputRequests"],
                    request_state=TASK_STATE + task.task_id,
                )
            await anyio.sleep(INLINE_POLL)
            task = await self._reread(task)
        return _raise_outcome(tool_outcome(task, expose_crashes=self.expose_crashes))


def keel_lifespan(
    app: Keel, *, concurrency: int = 4, run_workers: bool = True
) -> Callable[[MCPServer[Any]], AbstractAsyncContextManager[dict[str, Any]]]:
    """A ``MCPServer(lifespan=…)`` that runs the app's workers in the server process.

    When it ends, the workers stop the way a stopped ``keel worker`` does, giving their
    tasks back, even when the server was cancelled from outside (stdio on SIGTERM).
    """

    async def run_until_stopped(worker: Worker, stop: anyio.Event) -> None:
        # Shielded: a cancelled server still stops its worker the graceful way (set
        # ``stop``), within the worker's own shutdown grace.
        with anyio.CancelScope(shield=True):
            await worker.run(stop=stop)

    @asynccontextmanager
    async def lifespan(_server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        if not run_workers or not app.tasks:
            yield {}
            return
        worker = Worker(app, concurrency=concurrency)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_until_stopped, worker, stop)
            try:
                await worker.started.wait()
                yield {"keel_worker": worker}
            finally:
                stop.set()

    return lifespan
