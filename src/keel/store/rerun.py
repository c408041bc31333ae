"""An operator's retry of a failed task: a new task with the same request, linked.

The failed task stays failed (finished tasks never change); the new one gets a new id,
the same name, arguments, owner, attempts and TTL, and a copy of the old task's recorded
steps, so a handler resumes past the work that had succeeded. The histories point at each
other: the old task's gains ``retried as NEW`` (failed -> failed: its row is untouched),
the new task's starts with ``retry of OLD``. The idempotency key stays bound to the old
task; the new one has none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keel.errors import InvalidTransition
from keel.model import Event, Limits, Status, Task
from keel.model import transitions as tr
from keel.model.validation import normalize

__all__ = ["rerun_failed"]


def rerun_failed(
    tx: Any, old: Task, *, new_id: str, now: float, actor: str, limits: Limits
) -> Task:
    """In ``tx`` (a :class:`keel.store.base.Tx`): the new task for failed ``old``.

    Raises:
        InvalidTransition: ``old`` did not fail (only a failed task is retried).
    """
    if old.status is not Status.FAILED:
        raise InvalidTransition(
            f"only a failed task can be retried; task {old.task_id} is {old.status.value}", old
        )
    change = tr.new_task(
        new_id,
        now,
        name=old.name,
        arguments=old.arguments,
        owner=old.owner,
        idempotency_key=None,
        input_requests=None,
        ttl=old.ttl,
        max_attempts=old.max_attempts,
        actor=actor,
        limits=limits,
    )
    assert change.event is not None
    tx.insert(change.task)
    tx.append(dataclasses.replace(change.event, reason=f"retry of {old.task_id}"))
    for step, value in tx.get_steps(old.task_id).items():
        text, _ = normalize(value, f"step {step!r}", limits.max_step_bytes)
        tx.put_step(new_id, step, text, now)
    tx.append(Event(old.task_id, now, old.status, old.status, f"retried as {new_id}", actor))
    return change.task
