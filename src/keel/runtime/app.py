"""The registry: ``Keel`` holds a store and the task handlers an application registers."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, TypeVar

from keel.errors import ConfigurationError, InvalidPayload
from keel.model import InputRequest, JsonObject, JsonValue, Status, Task
from keel.model.validation import check_answer_keys, check_key, check_schema
from keel.runtime.arguments import ArgumentsShape
from keel.runtime.events import EventHub
from keel.runtime.outcomes import ResultShape
from keel.store import Clock, Store, open_store
from keel.store.locations import parse_location, resolve_location
from keel.telemetry import tracing

__all__ = ["Handler", "Keel", "TaskDefinition", "TaskOptions", "import_user_module", "load_app"]

Handler = Callable[..., Awaitable[Any]]
"""``async def handler(ctx: TaskContext, **arguments) -> result``."""
H = TypeVar("H", bound=Handler)

DEFAULT_LEASE = 30.0  # seconds
DEFAULT_TTL = 7 * 86_400.0  # seconds a finished task is kept
DEFAULT_POLL_INTERVAL = 1.0  # seconds, what clients are told to wait between polls
MAX_INLINE_WITHIN = 1.0  # seconds: longer waits belong in a task handle, not a held request


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How one kind of task runs: the one home of every default.

    Give them to :meth:`Keel.task` whole (``options=``), or override single fields by
    keyword (``@app.task(max_attempts=1)``), or both.
    """

    input_schema: JsonObject | None = None
    """JSON Schema of the arguments; checked before a task is created (without one, the
    schema of the handler's signature is; see :mod:`keel.runtime.arguments`)."""
    task_mode: Literal["optional", "required"] = "optional"
    """``optional``: a client without the MCP tasks extension gets the result inline;
    ``required``: such a client is refused."""
    max_attempts: int = 3
    lease_seconds: float = DEFAULT_LEASE
    deadline_seconds: float | None = None
    """Hard limit on one attempt's running time; past it the attempt is stopped and retried."""
    ttl_seconds: float | None = DEFAULT_TTL
    poll_interval: float = DEFAULT_POLL_INTERVAL
    retry_base: float = 1.0  # seconds before the second attempt (then doubling, jittered)
    retry_cap: float = 60.0  # seconds at most between attempts
    description: str | None = None
    ask_first: Mapping[str, tuple[str, JsonObject]] | None = None
    """Input the caller must give before the task is created, by key: (message, schema).
    Over MCP it is asked synchronously (an input-required result); the handler reads the
    answers with ``ctx.elicit(…, key=KEY)``, which returns at once."""
    inline_within: float = 0.0
    """Seconds a ``tools/call`` may wait for the task to finish before answering with a
    task handle: a task done by then is answered inline with its result (over MCP, even
    to a client that declared the tasks extension). 0, the default, never waits."""


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    name: str
    handler: Handler
    options: TaskOptions
    output: ResultShape | None = None
    """What the handler's return annotation promises (its tool's ``outputSchema``), if
    it is a typed object; see :class:`~keel.runtime.outcomes.ResultShape`."""
    arguments: ArgumentsShape | None = None
    """What the handler takes and the schema its arguments are checked against (set by
    :meth:`Keel.task`)."""

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Raises ArgumentsRejected naming the field if the arguments are wrong: against
        the schema, a name the handler does not take, or one it needs left out."""
        if self.arguments is not None:
            self.arguments.check(arguments)


_OPTION_FIELDS = frozenset(f.name for f in dataclasses.fields(TaskOptions))


def _checked_options(options: TaskOptions, handler: Handler) -> TaskOptions:
    """``options`` checked, with their schemas in the form the store keeps and the
    description defaulting to the handler's docstring.

    Raises:
        ConfigurationError: an option out of its range, or a schema that is not one.
    """
    if options.task_mode not in {"optional", "required"}:
        raise ConfigurationError("task_mode must be 'optional' or 'required'")
    if options.max_attempts < 1 or options.lease_seconds <= 0:
        raise ConfigurationError("max_attempts must be >= 1 and lease_seconds > 0")
    if not 0 <= options.inline_within <= MAX_INLINE_WITHIN:
        raise ConfigurationError(
            f"inline_within must be between 0 and {MAX_INLINE_WITHIN:g} seconds"
        )
    schema = options.input_schema
    asked = options.ask_first
    return dataclasses.replace(
        options,
        input_schema=None if schema is None else check_schema(schema, "input_schema"),
        description=inspect.cleandoc(options.description or handler.__doc__ or "") or None,
        ask_first=None
        if not asked
        else {
            key: (message, check_schema(wanted, f"ask_first[{key!r}]"))
            for key, (message, wanted) in asked.items()
        },
    )


class Keel:
    """An application: a store and the handlers of its tasks.

    Args:
        store: a :class:`~keel.store.Store`, or a location (see ``keel.store.open_store``;
            a path is a SQLite file); default ``$KEEL_STORE``, then ``keel-data/keel.db``.
            Opened on first use.
        clock: seconds since the epoch, for the store it opens (tests inject one).
    """

    def __init__(
        self, store: Store | str | os.PathLike[str] | None = None, *, clock: Clock | None = None
    ) -> None:
        self._store: Store | None = None
        self._location: str | None = None
        if isinstance(store, os.PathLike):
            store = os.fspath(store)
        if isinstance(store, str) or store is None:
            self._location = resolve_location(store)
        else:
            self._store = store
        self._clock = clock
        self._store_timeout: float | None = None
        self._tasks: dict[str, TaskDefinition] = {}
        self.events = EventHub()
        """This process's workers of this app: told at once of tasks submitted, answered
        or cancelled through it (no wait for their next poll)."""

    @property
    def location(self) -> str | None:
        """The store location this app opens (None if it was given a store object)."""
        return self._location

    def use_store(
        self, store: Store | str | os.PathLike[str], *, timeout: float | None = None
    ) -> None:
        """Point the app at another store (``keel worker --store``) before it is opened;
        ``timeout``: seconds a call waits for a store it opens (see ``open_store``)."""
        self._store_timeout = timeout
        if isinstance(store, os.PathLike):
            store = os.fspath(store)
        if isinstance(store, str):
            parse_location(store)
            self._store, self._location = None, store
        else:
            self._store, self._location = store, None

    @property
    def store(self) -> Store:
        if self._store is None:
            assert self._location is not None
            self._store = open_store(self._location, clock=self._clock, timeout=self._store_timeout)
        return self._store

    @property
    def tasks(self) -> Mapping[str, TaskDefinition]:
        return dict(self._tasks)

    def task(
        self, name: str | None = None, options: TaskOptions | None = None, **overrides: Any
    ) -> Callable[[H], H]:
        """Register ``async def handler(ctx, **arguments)`` as the task ``name`` (default:
        the handler's name), run as ``options`` say (default: ``TaskOptions()``) with any
        of their fields overridden by keyword: ``@app.task(max_attempts=1)``. The tool's
        description defaults to the handler's docstring.

        Raises:
            TypeError: an override that is not a :class:`TaskOptions` field.
            ConfigurationError: a duplicate name, a handler that is not async, bad options,
                a return annotation that cannot be evaluated or has no JSON Schema.
        """
        unknown = sorted(set(overrides) - _OPTION_FIELDS)
        if unknown:
            raise TypeError(
                f"Keel.task() got an unexpected keyword argument {unknown[0]!r} "
                f"(the options are TaskOptions' fields: {', '.join(sorted(_OPTION_FIELDS))})"
            )
        chosen = dataclasses.replace(options or TaskOptions(), **overrides)

        def register(handler: H) -> H:
            registered = handler  # iscoroutinefunction below narrows `handler`'s type
            task_name = check_key(name or handler.__name__, "task name")
            if task_name in self._tasks:
                raise ConfigurationError(f"task {task_name!r} is registered twice")
            if not inspect.iscoroutinefunction(handler):
                raise ConfigurationError(f"handler of task {task_name!r} must be `async def`")
            checked = _checked_options(chosen, handler)
            output = ResultShape.of(task_name, handler)
            arguments = ArgumentsShape.of(task_name, handler, checked.input_schema)
            self._tasks[task_name] = TaskDefinition(task_name, handler, checked, output, arguments)
            return registered

        return register

    def definition(self, name: str) -> TaskDefinition:
        """Raises ConfigurationError for a name this app does not register."""
        try:
            return self._tasks[name]
        except KeyError:
            raise ConfigurationError(f"no task named {name!r} is registered") from None

    async def submit(
        self,
        name: str,
        arguments: Mapping[str, JsonValue] | None = None,
        *,
        owner: str = "",
        idempotency_key: str | None = None,
        answers: Mapping[str, JsonValue] | None = None,
    ) -> Task:
        """Create a task for a worker to run; its arguments are checked first.

        ``answers`` are the task's ``ask_first`` input, given with it (validated).

        Raises:
            ConfigurationError: no such task is registered.
            ArgumentsRejected: the arguments violate the task's input schema, or name one
                its handler does not take, or leave out one it needs (no task made).
            UnstorableText: a NUL or lone surrogate in the arguments, the answers or the
                key (no task made).
            IdempotencyConflict: the key is bound to another request.
        """
        definition = self.definition(name)
        args = dict(arguments or {})
        definition.check_arguments(args)
        options = definition.options
        requests = {
            key: InputRequest(message, schema)
            for key, (message, schema) in (options.ask_first or {}).items()
        }
        missing = [key for key in requests if key not in (answers or {})]
        if missing:
            raise InvalidPayload(f"task {name!r} needs input {missing[0]!r} before it starts")
        # Wake this process's idle workers now, not only once the task is committed: the
        # claim they make at once is queued behind the create, and the store commits both
        # as one group (one fsync, no second wait for the disk before the task runs). A
        # claim that misses it (another loop, a plan) finds the task after the second call.
        self.events.ready()
        task = await self.store.create(
            name=name,
            arguments=args,
            owner=owner,
            idempotency_key=idempotency_key,
            ttl=options.ttl_seconds,
            max_attempts=options.max_attempts,
            input_requests=requests or None,
            input_responses={k: (answers or {})[k] for k in requests} or None,
            trace_context=tracing.current_carrier(),  # the tools/call span: the task's trace
        )
        self.events.ready()
        return task

    async def answer(
        self,
        task_id: str,
        answers: Mapping[str, JsonValue],
        *,
        owner: str | None = None,
        declined: Mapping[str, str] | None = None,
    ) -> Task:
        """Give a waiting task some or all of its input (``Store.provide_input``); a task
        that has all it asked for is ready again, and this process's workers hear of it
        at once. ``answers`` are keyed by input request: ``{"input-1": {"service": "x"}}``.

        Raises:
            UnknownInputKey: no key of ``answers`` (or ``declined``) is an open request of
                the waiting task (nothing changes; the error names the keys expected).
            TaskNotFound, InvalidTransition, InputRejected: as ``Store.provide_input``.
        """
        waiting = await self.store.get(task_id, owner=owner)
        if waiting.status is Status.INPUT_REQUIRED:
            check_answer_keys(waiting, [*answers, *(declined or {})])
        self.events.ready()  # as in submit: a claim made now shares the answer's commit
        task = await self.store.provide_input(task_id, answers, owner=owner, declined=declined)
        if task.status is Status.WORKING:
            self.events.ready()
        return task

    async def cancel(
        self, task_id: str, *, reason: str | None = None, owner: str | None = None
    ) -> Task:
        """Cancel a task: durable at once; a running handler stops at its next await."""
        task = await self.store.cancel(task_id, reason=reason, owner=owner)
        self.events.cancelled(task_id)
        return task

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()


def import_user_module(module_name: str, what: str) -> ModuleType:
    """Import a module named on the command line, the current directory first on the
    path (``--app myproject.tasks:app`` from the project folder).

    Raises:
        ConfigurationError: it cannot be imported (``what`` says what it was for).
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for {what}: {exc}") from exc


def load_app(spec: str) -> Keel:
    """Load an app from ``module:attribute`` (the attribute is a :class:`Keel`).

    Raises:
        ConfigurationError: the module or attribute is missing, or not a Keel.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app must be MODULE:ATTRIBUTE, not {spec!r}")
    module = import_user_module(module_name, f"app {spec!r}")
    app = getattr(module, attribute, None)
    if not isinstance(app, Keel):
        raise ConfigurationError(f"{spec!r} is not a keel.runtime.Keel (got {type(app).__name__})")
    return app
