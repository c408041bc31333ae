"""The seed-compatible blocking facade: ``TaskStore(location)``.

The teaching code of the seed had a synchronous ``TaskStore`` whose tasks carried one
input schema and one input value. This facade keeps that shape for scripts and the seed's
own example, on top of the durable async store (one private event loop thread per
instance), with the production answers the seed asked for:

* ``TaskStore()`` with no location opens the default *file* (``keel-data/keel.db``, or
  ``$KEEL_STORE``), never a memory dict: that was the incident. ``memory://`` is explicit.
* Every write to a finished task raises :class:`~keel.errors.TaskAlreadyTerminal`, which
  carries the real snapshot, except an exact repeat of the write that finished it.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from keel.errors import InvalidPayload
from keel.model import (
    DEFAULT_INPUT_KEY,
    INTERNAL_ERROR,
    Event,
    InputRequest,
    JsonObject,
    JsonValue,
    Limits,
    Reclaimed,
    Status,
    Task,
)
from keel.model.validation import describe_schema
from keel.store import Clock, TxStore, open_store, parse_location, resolve_location

__all__ = ["TaskSnapshot", "TaskStore"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """A task as the seed described it, plus what production needs beside it."""

    task_id: str
    status: Status
    input_schema: JsonObject | None
    input_value: JsonValue | None
    result: JsonValue | None
    error: JsonObject | None
    idempotency_key: str | None
    status_message: str | None
    created_at: float
    updated_at: float
    task: Task
    """The full task behind this snapshot."""

    @classmethod
    def of(cls, task: Task) -> TaskSnapshot:
        request = task.input_requests.get(DEFAULT_INPUT_KEY)
        return cls(
            task_id=task.task_id,
            status=task.status,
            input_schema=None if request is None else request.schema,
            input_value=task.input_responses.get(DEFAULT_INPUT_KEY),
            result=task.result,
            error=task.error,
            idempotency_key=task.idempotency_key,
            status_message=task.status_message,
            created_at=task.created_at,
            updated_at=task.updated_at,
            task=task,
        )


class _LoopThread:
    """A private event loop in a daemon thread; blocking calls hop onto it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="keel-taskstore", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class TaskStore:
    """A durable task store with a blocking API.

    Args:
        location: a file path, ``sqlite:///…``, ``memory://`` …; default ``$KEEL_STORE``,
            then ``keel-data/keel.db`` under the current directory.
        clock: seconds since the epoch (tests inject one).

    Raises:
        ConfigurationError: a bad location.
        StoreError: the store cannot be opened.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        clock: Clock | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.location = parse_location(
            resolve_location(None if location is None else os.fspath(location))
        )
        self._store: TxStore = open_store(
            self.location.url or str(self.location.path), clock=clock, limits=limits
        )
        self._loop = _LoopThread()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.call(coro)

    def create(
        self,
        input_schema: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        *,
        message: str | None = None,
        arguments: Mapping[str, JsonValue] | None = None,
        ttl: float | None = None,
    ) -> TaskSnapshot:
        """Create a task: ``input_required`` with a schema, else ``working``.

        The same ``idempotency_key`` again returns the same task (8A).

        Raises:
            IdempotencyConflict: the key is bound to a task with another schema/arguments.
            InvalidPayload: the schema is not a valid JSON Schema.
        """
        requests = None
        if input_schema is not None:
            text = message or describe_schema(input_schema)
            requests = {DEFAULT_INPUT_KEY: InputRequest(text, dict(input_schema))}
        task = self._call(
            self._store.create(
                arguments=arguments,
                idempotency_key=idempotency_key,
                input_requests=requests,
                ttl=ttl,
            )
        )
        return TaskSnapshot.of(task)

    def get(self, task_id: str) -> TaskSnapshot:
        """The task's snapshot.

        Raises:
            TaskNotFound: ``unknown task: <id>`` (8E); never None.
        """
        return TaskSnapshot.of(self._call(self._store.get(task_id)))

    def provide_input(self, task_id: str, value: JsonValue) -> TaskSnapshot:
        """Give the task its input; ``input_required -> working``.

        Raises:
            TaskNotFound, TaskAlreadyTerminal.
            InvalidTransition: ``task is not waiting for input: working`` (8B).
            InputRejected: the value violates the task's schema (nothing changes).
        """
        task = self._call(self._store.provide_input(task_id, {DEFAULT_INPUT_KEY: value}))
        return TaskSnapshot.of(task)

    def complete(self, task_id: str, result: JsonValue) -> TaskSnapshot:
        """``working -> completed``. Completing twice: the first result stands (8C).

        Raises:
            TaskNotFound, InvalidTransition.
            TaskAlreadyTerminal: it already ended (its snapshot is on the error), unless this
                is an exact repeat of the completion, which returns the snapshot.
        """
        return TaskSnapshot.of(self._call(self._store.complete(task_id, result, actor="facade")))

    def fail(self, task_id: str, error: str | Mapping[str, Any]) -> TaskSnapshot:
        """Non-terminal -> ``failed``. ``error`` is a message or ``{message, code?, data?}``.

        Raises:
            TaskNotFound, TaskAlreadyTerminal, InvalidTransition, InvalidPayload.
        """
        if isinstance(error, str):
            error = {"message": error}
        if not isinstance(error, Mapping):
            raise InvalidPayload(f"error must be a message or an object, not {error!r}")
        shaped = {"code": INTERNAL_ERROR, **error}
        return TaskSnapshot.of(self._call(self._store.fail(task_id, shaped, actor="facade")))

    def cancel(self, task_id: str, reason: str | None = None) -> TaskSnapshot:
        """Non-terminal -> ``cancelled``. After ``completed`` it raises, uniformly (8D).

        Raises:
            TaskNotFound.
            TaskAlreadyTerminal: it completed or failed first; the snapshot is on the error.
        """
        return TaskSnapshot.of(
            self._call(self._store.cancel(task_id, reason=reason, actor="facade"))
        )

    def reclaim(self, timeout_seconds: float) -> builtins.list[Reclaimed]:
        """Fail every non-terminal task not updated for more than ``timeout_seconds``.

        Returns one :class:`~keel.model.Reclaimed` per task, saying why.
        """
        return list(self._call(self._store.reclaim(timeout_seconds)))

    def list(
        self, status: Status | str | None = None, *, limit: int = 100
    ) -> builtins.list[TaskSnapshot]:
        """Tasks in creation order."""
        chosen = None if status is None else Status(status)
        return [
            TaskSnapshot.of(t) for t in self._call(self._store.list(status=chosen, limit=limit))
        ]

    def history(self, task_id: str) -> Sequence[Event]:
        """The task's transitions, oldest first."""
        return self._call(self._store.history(task_id))

    def purge(self) -> builtins.list[str]:
        """Delete finished tasks whose TTL ran out; their ids."""
        return list(self._call(self._store.purge()))

    @property
    def store(self) -> TxStore:
        """The async store underneath (for code that wants the full API)."""
        return self._store

    def close(self) -> None:
        """Close the store and its loop thread. Safe to call twice."""
        if self._loop.loop.is_closed():
            return
        self._call(self._store.close())
        self._loop.stop()

    def __enter__(self) -> TaskStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
