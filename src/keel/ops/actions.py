"""What an operator's buttons do, each one store call recorded under the operator's name.

Answering goes through the same checks as ``tasks/update`` (and :meth:`keel.runtime.Keel.
answer`): the answer keys must name an open request (:func:`check_answer_keys`), then
:meth:`~keel.store.Store.provide_input` validates every answer against the schema it was
requested with, and refuses all of them if one is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from keel.model import JsonValue, Reclaimed, Status, Task
from keel.model.validation import check_answer_keys
from keel.store import Store

__all__ = ["CANCEL_REASON", "Actions"]

CANCEL_REASON = "from the operator console"
log = logging.getLogger("keel.ops")


@dataclass(frozen=True, slots=True)
class Actions:
    """The console's writes on ``store``, made as ``operator`` (the history's actor).

    ``on_ready`` and ``on_cancel`` tell workers in this process at once (``keel serve``
    passes its app's event hub); other processes learn it from the store.
    """

    store: Store
    operator: str
    on_ready: Callable[[], None] = field(default=lambda: None)
    on_cancel: Callable[[str], None] = field(default=lambda _task_id: None)

    async def answer(self, task_id: str, key: str, value: JsonValue) -> Task:
        """Answer the open input request ``key`` of the task.

        Raises:
            TaskNotFound, UnknownInputKey, InvalidTransition, TaskAlreadyTerminal.
            InputRejected: the answer does not satisfy the request's schema.
        """
        waiting = await self.store.get(task_id)
        if waiting.status is Status.INPUT_REQUIRED:
            check_answer_keys(waiting, [key])
        task = await self.store.provide_input(task_id, {key: value}, actor=self.operator)
        if task.status is Status.WORKING:
            self.on_ready()
        return task

    async def retry(self, task_id: str) -> Task:
        """Retry a failed task as a new one (:meth:`~keel.store.Store.rerun`); the new task.

        Raises:
            TaskNotFound, InvalidTransition (it did not fail).
        """
        task = await self.store.rerun(task_id, actor=self.operator)
        self.on_ready()
        return task

    async def cancel(self, task_id: str, reason: str | None = None) -> Task:
        """Cancel the task, running or waiting.

        Raises:
            TaskNotFound, TaskAlreadyTerminal (it completed or failed first).
        """
        task = await self.store.cancel(task_id, reason=reason or CANCEL_REASON, actor=self.operator)
        self.on_cancel(task_id)
        return task

    async def reclaim(self, older_than: float) -> Sequence[Reclaimed]:
        """Fail every live task idle for more than ``older_than`` seconds, each recorded
        in its history as the operator's.

        Raises:
            InvalidPayload: a negative or non-finite time.
        """
        done = await self.store.reclaim(older_than, actor=self.operator)
        for item in done:
            self.on_cancel(item.task_id)  # a worker of this process holding it stops
        return done

    async def purge(self, limit: int = 1000) -> Sequence[str]:
        """Delete finished tasks whose TTL has run out (their history goes with them, so
        who purged them is logged, ``keel.ops``, not recorded in it)."""
        ids = await self.store.purge(limit=limit)
        log.info("%s purged %d expired tasks from the operator console", self.operator, len(ids))
        return ids
