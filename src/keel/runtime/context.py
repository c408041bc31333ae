"""What a handler sees: ``TaskContext`` with checkpointed steps, input, status, identity.

A handler may run more than once for one task: after a crash (its lease expired and
another worker took it over) or after input it waited for arrived. Everything it did
through the context is replayed, not redone: ``step`` returns the recorded result,
``elicit`` returns the recorded answer. Keep side effects inside steps.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio.to_thread
from opentelemetry.context import Context

from keel.errors import InvalidPayload
from keel.model import DECLINED, InputRequest, JsonObject, JsonValue, Task
from keel.model.validation import check_schema
from keel.runtime.outcomes import InputDeclined
from keel.store import Store
from keel.telemetry import tracing

__all__ = ["Parking", "TaskContext", "check_elicitation_schema"]

T = TypeVar("T")

_PRIMITIVE = {"string", "number", "integer", "boolean"}


class Parking(BaseException):
    """Ends an attempt that waits for input. A BaseException, so that a handler's
    ``except Exception`` does not swallow it; the worker catches it."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"waiting for input {', '.join(keys)}")
        self.keys = keys


def check_elicitation_schema(schema: Mapping[str, Any], what: str) -> JsonObject:
    """MCP elicitation asks for a flat object of primitive properties: check that.

    Raises:
        InvalidPayload: another kind of schema, naming what is wrong.
    """
    checked = check_schema(schema, what)
    if checked.get("type") != "object":
        raise InvalidPayload(f"{what} must be an object schema (type: object) for elicitation")
    properties = checked.get("properties", {})
    if not isinstance(properties, Mapping):
        raise InvalidPayload(f"{what}: properties must be an object")
    for name, prop in properties.items():
        kind = prop.get("type") if isinstance(prop, Mapping) else None
        if kind not in _PRIMITIVE:
            raise InvalidPayload(
                f"{what}: property {name!r} must be a string, number, integer or boolean "
                f"for elicitation, not {kind!r}"
            )
    return checked


class TaskContext:
    """The running task, as its handler sees it (one per attempt)."""

    def __init__(
        self,
        store: Store,
        task: Task,
        *,
        steps: Mapping[str, JsonValue] | None = None,
        worker: str,
        trace_parent: Context | None = None,
        traced: bool | None = None,
    ) -> None:
        self._store = store
        self._task = task
        # Whether spans are recorded: the worker looks it up once per claimed batch.
        self._traced = tracing.enabled() if traced is None else traced
        self._trace_parent = trace_parent  # the task's stored trace context (its steps' parent)
        # The recorded steps, read on the first ``step`` call (None until then): a
        # handler that takes no steps costs no read.
        self._steps: dict[str, JsonValue] | None = None if steps is None else dict(steps)
        self._asked = 0
        self.worker = worker
        self.step_calls: list[str] = []
        """Steps whose function actually ran in this attempt (not replayed)."""

    @property
    def task_id(self) -> str:
        return self._task.task_id

    @property
    def attempt(self) -> int:
        return self._task.attempt

    @property
    def fence(self) -> int:
        return self._task.fence

    @property
    def owner(self) -> str:
        return self._task.owner

    def step_key(self, name: str) -> str:
        """A key that is the same on every run of step ``name`` of this task.

        ``fn`` runs at least once: a crash after its side effect and before its result is
        committed runs it again. Pass this key to an external API that deduplicates by
        idempotency key, and the effect happens once.
        """
        return f"{self.task_id}/{name}"

    async def step(self, name: str, fn: Callable[..., T | Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` once per task and checkpoint its JSON result.

        ``fn`` may be ``async``; a plain function runs in a worker thread (so a long
        computation does not hold up the worker's heartbeats and other tasks).

        On a later run of the handler (after a crash, or after input), the recorded result
        is returned and ``fn`` is not called. The result must be JSON.

        Raises:
            LeaseLost, TaskAlreadyTerminal: this attempt no longer owns the task (the
                result is discarded; the worker stops the attempt).
            InvalidPayload, PayloadTooLarge: the result cannot be stored.
        """
        if self._steps is None:
            loaded = dict(await self._store.steps(self.task_id))
            if self._steps is None:  # a concurrent step() may have loaded (and added) first
                self._steps = loaded
        if not self._traced:
            return await self._step(name, fn, *args)
        replayed = name in self._steps
        with tracing.step_span(
            name, self._task, self.worker, self._trace_parent, replayed=replayed
        ):
            return await self._step(name, fn, *args)

    async def _step(self, name: str, fn: Callable[..., T | Awaitable[T]], *args: Any) -> T:
        assert self._steps is not None
        if name in self._steps:
            recorded: T = self._steps[name]  # the JSON this step returned the first time
            return recorded
        value: Any
        if inspect.iscoroutinefunction(fn):
            value = await fn(*args)
        else:
            # A plain function runs in a worker thread, so that a long computation does
            # not stall this worker's event loop: its heartbeats, cancellation checks and
            # other attempts keep running meanwhile.
            value = await anyio.to_thread.run_sync(functools.partial(fn, *args))
            if inspect.isawaitable(value):
                value = await value
        await self._store.save_step(self.task_id, name, value, fence=self.fence)
        self._steps[name] = value
        self.step_calls.append(name)
        result: T = value
        return result

    async def elicit(
        self, message: str, schema: Mapping[str, Any], *, key: str | None = None
    ) -> JsonObject:
        """Ask the user for input matching ``schema``; return the (validated) answer.

        If the answer is not there yet, the request is stored, the task becomes
        ``input_required``, and this attempt ends here, releasing its worker and lease.
        When the answer arrives the handler runs again and this call returns it.

        Keys default to the call order (``input-1``, ``input-2`` …), so keep the calls in
        a deterministic order, or pass ``key``.

        Raises:
            InputDeclined: the user declined or cancelled the request.
            InvalidPayload: a schema that elicitation cannot present.
        """
        self._asked += 1
        key = key or f"input-{self._asked}"
        answers = await self.elicit_many({key: (message, schema)})
        return answers[key]

    async def elicit_many(
        self, requests: Mapping[str, tuple[str, Mapping[str, Any]]]
    ) -> dict[str, JsonObject]:
        """Ask for several answers at once; the task waits until all are given.

        Raises:
            InputDeclined: the user declined or cancelled one of them.
        """
        task = self._task
        answers: dict[str, JsonObject] = {}
        missing: dict[str, InputRequest] = {}
        for key, (message, schema) in requests.items():
            if key in task.input_responses:
                answer = task.input_responses[key]
                if isinstance(answer, Mapping) and DECLINED in answer:
                    raise InputDeclined(key, str(answer[DECLINED]))
                answers[key] = answer
            else:
                checked = check_elicitation_schema(schema, f"schema of input {key!r}")
                missing[key] = InputRequest(message, checked)
        if missing:
            await self._store.request_input(task.task_id, missing, fence=self.fence)
            raise Parking(list(missing))
        return answers

    async def status(self, message: str | None) -> None:
        """Show a progress line in the task's snapshot (``statusMessage`` over MCP)."""
        self._task = await self._store.set_status_message(self.task_id, message, fence=self.fence)

    async def progress(self, done: int, total: int | None = None, message: str = "") -> None:
        """Report progress as the status line: ``"[3/7] correlating deploys"``."""
        count = f"[{done}/{total}]" if total is not None else f"[{done}]"
        await self.status(f"{count} {message}".rstrip())
