"""What a store committed, told after COMMIT to an observer (metrics, logs, traces).

A :class:`~keel.store.base.TxStore` whose ``observer`` is set runs each write through a
:class:`Recording`: the op sees a thin proxy of the adapter's transaction that notes
every task it inserts or updates and every history entry it appends. The op may run more
than once (SQLite plans it against a read snapshot first; a group that must be regrouped
runs it again alone): each run starts a fresh record, so the record of the run that
committed is the one reported. Only when the store's call returns, that is after its
COMMIT, does the observer hear of it; a write that fails or rolls back is never heard
of. So counters kept by an observer count exactly the transitions that this process
committed.

A claim on PostgreSQL is one SQL statement that writes its history itself: its record
has no transitions, and observers read the claimed tasks from :attr:`Committed.result`
(the claimed tasks of every adapter).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from keel.model import Event, Task
from keel.model.drafts import draft_class

__all__ = ["CommitObserver", "Committed", "Observers", "Recording", "Transition", "committed"]

T = TypeVar("T")

log = logging.getLogger("keel.store")


@dataclass(frozen=True, slots=True)
class Transition:
    """One history entry a write committed, with the task before and after it."""

    event: Event
    old: Task | None
    """The task as the write found it (None: the write created it)."""
    new: Task | None
    """The task as the write left it (None only if the adapter did not say)."""

    @property
    def task(self) -> Task | None:
        return self.new or self.old


@dataclass(frozen=True, slots=True)
class Committed:
    """One committed store call."""

    what: str
    """The store method: ``create``, ``complete``, ``claim``, ``recover_expired`` …"""
    transitions: tuple[Transition, ...]
    result: Any
    """What the call returned (for ``claim``: the claimed tasks)."""
    seconds: float
    """From the call to its commit, queueing for its group included."""


_TransitionDraft = draft_class(Transition)
_CommittedDraft = draft_class(Committed)


def committed(
    what: str, transitions: tuple[Transition, ...], result: Any, seconds: float
) -> Committed:
    """``Committed(what, transitions, result, seconds)`` without its ``__init__`` (see
    :mod:`keel.model.drafts`): one per observed write, as :func:`_transition` builds one
    Transition per history entry (~3,000 instructions each instead of ~6,500)."""
    draft: Any = _CommittedDraft()
    draft.what, draft.transitions, draft.result, draft.seconds = what, transitions, result, seconds
    draft.__class__ = Committed
    done: Committed = draft
    return done


def _transition(event: Event, old: Task | None, new: Task | None) -> Transition:
    draft: Any = _TransitionDraft()
    draft.event, draft.old, draft.new = event, old, new
    draft.__class__ = Transition
    transition: Transition = draft
    return transition


class CommitObserver(Protocol):
    """Hears of every committed write of the stores it observes, on the caller's thread.

    It must be quick and must not raise (what it raises is logged and dropped)."""

    def committed(self, commit: Committed) -> None: ...


class Observers:
    """Several observers as one, each told in turn."""

    def __init__(self, observers: Sequence[CommitObserver]) -> None:
        self.observers = tuple(observers)

    def committed(self, commit: Committed) -> None:
        for observer in self.observers:
            tell(observer, commit)


def tell(observer: CommitObserver, commit: Committed) -> None:
    """``observer.committed(commit)``; an error in it is logged, never raised."""
    try:
        observer.committed(commit)
    except Exception:
        log.exception("a store observer failed on %s", commit.what)


class Recording:
    """The record of one op's last run (see the module doc)."""

    __slots__ = ("_pending", "transitions")

    def __init__(self) -> None:
        self.transitions: list[Transition] = []
        self._pending: dict[str, tuple[Task | None, Task]] = {}

    def wrap(self, run: Callable[[Any], T]) -> Callable[[Any], T]:
        """``run`` with a fresh record at each call, over a recording proxy of its Tx."""

        def recorded(tx: Any) -> T:
            self.transitions = []
            self._pending = {}
            return run(_RecordingTx(tx, self))

        return recorded

    def inserted(self, task: Task) -> None:
        self._pending[task.task_id] = (None, task)

    def updated(self, old: Task, new: Task) -> None:
        self._pending[old.task_id] = (old, new)

    def appended(self, event: Event) -> None:
        before, after = self._pending.pop(event.task_id, (None, None))
        self.transitions.append(_transition(event, before, after))


class _RecordingTx:
    """The adapter's Tx, with inserts, updates and history entries noted on their way."""

    __slots__ = ("_record", "_tx")

    def __init__(self, tx: Any, record: Recording) -> None:
        self._tx = tx
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def load(self, task_id: str) -> Task | None:
        # Nearly every write reads its task: without a failed lookup before __getattr__.
        return self._tx.load(task_id)  # type: ignore[no-any-return]

    def insert(self, task: Task) -> None:
        self._tx.insert(task)
        self._record.inserted(task)

    def update(self, old: Task, new: Task) -> None:
        self._tx.update(old, new)
        self._record.updated(old, new)

    def append(self, event: Event) -> None:
        self._tx.append(event)
        self._record.appended(event)
