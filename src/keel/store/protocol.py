"""The store port: one async protocol that every adapter implements.

Every method is one transaction: it happens whole or not at all, and an error leaves the
store exactly as it was. The rules themselves live in :mod:`keel.model.transitions`; the
contract suite in ``tests/contract`` runs every behaviour below against every adapter.

Writes come in two kinds:

* **unleased** writes (``fence=None``) from clients, the facade and operators. They are
  refused on a task that a worker holds, except ``cancel``, which always reaches it;
* **fenced** writes from a worker's attempt, carrying the fencing token its claim
  returned. A stale token raises :class:`~keel.errors.LeaseLost` and changes nothing.

Any write to a finished task raises :class:`~keel.errors.TaskAlreadyTerminal` with the
stored snapshot, except an exact repeat of the write that finished it, which returns that
snapshot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Protocol, runtime_checkable

from keel.errors import KeelError
from keel.model import Event, InputRequest, JsonObject, JsonValue, Reclaimed, Status, Task
from keel.store.browse import TaskFilter, TaskPage
from keel.store.changes import Change
from keel.store.leases import StuckTasks, WorkerLeases

__all__ = ["Clock", "Store", "WakeUps"]

Clock = Callable[[], float]
"""Seconds since the epoch. Injected so that leases, TTLs and reclaim run in virtual time."""


@runtime_checkable
class WakeUps(Protocol):
    """An optional store capability: hints from other processes (PostgreSQL's
    LISTEN/NOTIFY). Workers use it when their store has it; polling stays the guarantee,
    so a lost hint only delays."""

    def subscribe(
        self,
        names: Collection[str],
        *,
        on_ready: Callable[[], None],
        on_cancel: Callable[[str], None],
    ) -> Callable[[], None]:
        """Call ``on_ready()`` when tasks named ``names`` may have become ready and
        ``on_cancel(task_id)`` when a task was cancelled; returns the unsubscribe."""
        ...


class Store(Protocol):
    """Durable task storage. Adapters: ``memory``, ``sqlite`` (and ``postgres``)."""

    async def create(
        self,
        *,
        name: str | None = None,
        arguments: Mapping[str, JsonValue] | None = None,
        owner: str = "",
        idempotency_key: str | None = None,
        input_requests: Mapping[str, InputRequest] | None = None,
        ttl: float | None = None,
        max_attempts: int = 1,
        actor: str = "client",
        input_responses: Mapping[str, JsonValue] | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> Task:
        """Create a task, or return the one already bound to ``(owner, idempotency_key)``.

        It starts ``input_required`` if ``input_requests`` are given, else ``working``;
        ``input_responses`` answers some of them at once (validated; all answered ->
        ``working``).

        ``ttl`` and ``max_attempts`` are options of the first create: a repeat with other
        values returns the task as it was created. ``trace_context`` (W3C ``traceparent``
        and ``tracestate`` of the span that creates it) is kept with the task
        (:attr:`Task.trace_context`), for the spans of its attempts
        (:mod:`keel.telemetry.tracing`).

        Raises:
            IdempotencyConflict: the key is bound to a task with another name, other
                arguments or other initial input requests.
            InvalidPayload: arguments not a JSON object; a bad schema, key, ttl, max_attempts
                or trace context.
            PayloadTooLarge: arguments over the limit.
        """
        ...

    async def get(self, task_id: str, *, owner: str | None = None) -> Task:
        """The task's current snapshot.

        Args:
            owner: if given, a task of another owner is reported as unknown.

        Raises:
            TaskNotFound: no such task (or not this owner's).
        """
        ...

    async def list(
        self,
        *,
        status: Status | None = None,
        owner: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> Sequence[Task]:
        """Tasks in the order they were stored, oldest first; ``after`` is the last task id
        of the previous page (an unknown ``after`` gives an empty page)."""
        ...

    async def browse(
        self, where: TaskFilter | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> TaskPage:
        """One page of the tasks ``where`` matches (every task without it), newest first
        (by ``created_at``, then id), for operators: every principal's tasks. Pass the
        page's ``next_cursor`` back for the next page (see :mod:`keel.store.browse`).

        Raises:
            InvalidPayload: a bad filter field, a cursor no page gave, a limit outside
                1..:data:`~keel.store.browse.MAX_PAGE`.
        """
        ...

    async def statuses(self, task_ids: Collection[str]) -> Mapping[str, tuple[Status, int]]:
        """The status and fence of each known task among ``task_ids`` (unknown ids are left
        out): one cheap read with which a worker learns that its tasks were cancelled or
        taken over."""
        ...

    async def counts(self) -> Mapping[Status, int]:
        """How many tasks the store holds in each status (every status, zeros included),
        from one read: what ``keel check`` prints."""
        ...

    async def workers(self, *, now: float | None = None) -> Sequence[WorkerLeases]:
        """The live leases of each worker that holds one, by worker name, from one read
        of the leases index (see :mod:`keel.store.leases`); a lease has expired when it
        is before ``now`` (default: the store's clock).

        Raises:
            InvalidPayload: ``now`` is not a finite time.
        """
        ...

    async def leased(self, worker: str, *, limit: int = 50, cursor: str | None = None) -> TaskPage:
        """One page of the tasks ``worker`` holds a lease on, soonest expiry first (then
        id); pass ``next_cursor`` back for the next page.

        Raises:
            InvalidPayload: a worker that is not a non-empty string, a cursor no page of
                leases gave, a limit outside 1..:data:`~keel.store.browse.MAX_PAGE`.
        """
        ...

    async def stuck(
        self,
        *,
        waiting_over: float,
        deadlines: Mapping[str, float] | None = None,
        now: float | None = None,
        limit: int = 100,
    ) -> StuckTasks:
        """Live tasks an operator should look at, at ``now`` (default: the store's
        clock), up to ``limit`` of each kind, longest overdue first: leases expired and
        not recovered, tasks waiting for input not updated for over ``waiting_over``
        seconds, and leased attempts of the tools in ``deadlines`` (seconds, by tool
        name) running longer than that since their claim.

        Raises:
            InvalidPayload: a time or duration that is not one, a deadline not above 0,
                a limit outside 1..:data:`~keel.store.leases.MAX_STUCK`.
        """
        ...

    async def history(self, task_id: str, *, owner: str | None = None) -> Sequence[Event]:
        """The task's append-only history, oldest first.

        Raises:
            TaskNotFound: no such task (or not this owner's).
        """
        ...

    async def provide_input(
        self,
        task_id: str,
        responses: Mapping[str, JsonValue],
        *,
        owner: str | None = None,
        actor: str = "client",
        declined: Mapping[str, str] | None = None,
    ) -> Task:
        """Answer outstanding input requests, by key; ``working`` again once all are answered.

        Unknown and already-answered keys are ignored. ``declined`` maps keys the user
        refused to ``"decline"`` or ``"cancel"``; they count as answered.

        Raises:
            TaskNotFound: no such task (or not this owner's).
            TaskAlreadyTerminal: the task ended.
            InvalidTransition: the task is not waiting for input.
            InputRejected: an answer violates its schema; no answer is accepted.
            PayloadTooLarge: an answer over the limit.
        """
        ...

    async def request_input(
        self,
        task_id: str,
        requests: Mapping[str, InputRequest],
        *,
        fence: int | None,
    ) -> Task:
        """``working -> input_required``: persist the requests and release the lease.

        Raises:
            TaskNotFound, TaskAlreadyTerminal, LeaseLost, InvalidTransition.
            InvalidPayload: no requests, a bad schema, or a key the task already used.
        """
        ...

    async def complete(
        self, task_id: str, result: JsonValue, *, fence: int | None = None, actor: str = "client"
    ) -> Task:
        """``working -> completed`` with ``result``.

        Raises:
            TaskNotFound, LeaseLost.
            TaskAlreadyTerminal: it ended already (unless this exact write ended it).
            InvalidTransition: it waits for input, or it is leased and this write is not.
            InvalidPayload, PayloadTooLarge: the result.
        """
        ...

    async def complete_many(
        self, results: Sequence[tuple[str, JsonValue, int | None]], *, actor: str = "client"
    ) -> Sequence[Task | KeelError]:
        """:meth:`complete` for several tasks in one call and one transaction: each
        ``(task_id, result, fence)`` in turn, what each gives back in the same order: the
        completed task, or the error :meth:`complete` would have raised for it (that task
        is left as it was; the others complete). At most
        :data:`~keel.store.base.MAX_COMPLETE_BATCH` tasks (a worker writes the outcomes
        of the handlers that ended together this way).

        Raises:
            InvalidPayload: more than ``MAX_COMPLETE_BATCH`` tasks.
            StoreError: the store could not write (then none of them completed).
        """
        ...

    async def fail(
        self, task_id: str, error: JsonObject, *, fence: int | None = None, actor: str = "client"
    ) -> Task:
        """Non-terminal -> ``failed`` with a JSON-RPC-shaped ``{code, message, data?}``.

        Raises:
            TaskNotFound, LeaseLost.
            TaskAlreadyTerminal: it ended already (unless this exact write ended it).
            InvalidTransition: it is leased and this write is not.
            InvalidPayload: not a JSON-RPC error object.
        """
        ...

    async def cancel(
        self,
        task_id: str,
        *,
        reason: str | None = None,
        owner: str | None = None,
        actor: str = "client",
    ) -> Task:
        """Non-terminal -> ``cancelled``, whether it waits or runs (the lease is dropped).

        Raises:
            TaskNotFound: no such task (or not this owner's).
            TaskAlreadyTerminal: it completed or failed first. Cancelling a cancelled
                task returns it.
        """
        ...

    async def rerun(self, task_id: str, *, actor: str = "operator") -> Task:
        """Retry a failed (or dead-lettered) task as a new task: a new id, the same name,
        arguments, owner, attempts and TTL, the old task's recorded steps copied; each
        history names the other (``retry of OLD`` / ``retried as NEW``). The old task
        stays failed. See :mod:`keel.store.rerun`.

        Raises:
            TaskNotFound: no such task.
            InvalidTransition: the task did not fail.
        """
        ...

    async def claim(
        self, names: Collection[str], *, worker: str, lease_seconds: float, limit: int = 1
    ) -> Sequence[Task]:
        """Lease up to ``limit`` ready ``working`` tasks with one of ``names`` (a collection,
        not a string: that raises InvalidPayload): earliest
        ``ready_at`` first, then in the order they were stored.

        Each claim bumps the task's fencing token; the returned tasks carry it.
        """
        ...

    async def renew(self, task_id: str, *, fence: int, lease_seconds: float) -> Task:
        """Extend the lease of the attempt holding ``fence``.

        Raises:
            TaskNotFound, LeaseLost.
            TaskAlreadyTerminal: the task ended (cancelled): the attempt must stop.
        """
        ...

    async def release(self, task_id: str, *, fence: int, reason: str) -> Task:
        """Give a leased task back unfinished (a worker shutting down): ready again at once;
        not a failed attempt.

        Raises:
            TaskNotFound, TaskAlreadyTerminal, LeaseLost.
        """
        ...

    async def retry(
        self, task_id: str, error: JsonObject, *, fence: int, delay_seconds: float
    ) -> Task:
        """End the attempt with ``error``: ready again after the delay, or dead-lettered
        (``failed``) when it was the last attempt.

        Raises:
            TaskNotFound, TaskAlreadyTerminal, LeaseLost, InvalidPayload.
        """
        ...

    async def set_status_message(
        self, task_id: str, message: str | None, *, fence: int | None = None
    ) -> Task:
        """Set the progress line shown in snapshots.

        Raises:
            TaskNotFound, TaskAlreadyTerminal, LeaseLost, InvalidTransition, InvalidPayload.
        """
        ...

    async def save_step(self, task_id: str, step: str, value: JsonValue, *, fence: int) -> None:
        """Checkpoint a step's JSON result for the attempt holding ``fence``.

        A step that is already recorded keeps its first value.

        Raises:
            TaskNotFound, TaskAlreadyTerminal, LeaseLost, InvalidPayload, PayloadTooLarge.
        """
        ...

    async def steps(self, task_id: str, *, owner: str | None = None) -> Mapping[str, JsonValue]:
        """Every checkpointed step of the task, by name.

        Raises:
            TaskNotFound: no such task (or not this owner's).
        """
        ...

    async def recover_expired(self, *, limit: int = 100) -> Sequence[Task]:
        """Tasks whose lease expired become ready again (``attempt + 1``), or ``failed``
        with a dead-letter error after their last attempt. Safe to run from anywhere."""
        ...

    async def reclaim(
        self, timeout_seconds: float, *, actor: str = "reclaim"
    ) -> Sequence[Reclaimed]:
        """Fail every non-terminal task not updated for more than ``timeout_seconds``
        (``actor``: who the history says did it).

        Raises:
            InvalidPayload: a negative or non-finite timeout.
        """
        ...

    async def purge(self, *, limit: int = 1000) -> Sequence[str]:
        """Delete finished tasks whose TTL has run out (with history and steps); return
        their ids. Tasks that still live are never deleted, whatever their TTL."""
        ...

    async def import_tasks(
        self,
        tasks: Sequence[Task],
        *,
        actor: str = "import",
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        """Insert whole tasks as they are (migration from another store), all or none.

        Each gets one history entry, "imported" or the reason given for its id in
        ``reasons``.

        Raises:
            ImportFailed: a task id or idempotency key is already taken.
            InvalidPayload: a task that the store could not hold.
        """
        ...

    def changes(self, *, after: int | None = None) -> AsyncIterator[Change]:
        """Committed task changes, from any process, as they happen.

        ``async for change in store.changes(): ...``: the first item comes at once with
        ``task_ids=None`` (read the current state of what you watch now), unless
        ``after`` is a position the feed can still replay; each later item names the
        tasks changed by committed writes since the previous one (coalesced), with a
        growing ``position``; ``task_ids=None`` again means "you may have missed
        something: re-read". Leaving the loop ends the subscription. See
        :mod:`keel.store.changes` for how each adapter delivers it.
        """
        ...

    async def close(self) -> None:
        """Release connections. Safe to call twice."""
        ...
