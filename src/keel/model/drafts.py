"""Frozen values built without their ``__init__``, where a hot path builds many.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: about
1,400 instructions a field on CPython 3.11, ~35,000 for a :class:`~keel.model.Task` of
24 fields. A worker builds several frozen values per task it runs (the task read from its
row, the task a transition makes, its history entry, an observer's commit record), and
they were a sixth of its instructions per task (``bench/instr_bench.py``).

:func:`draft_class` gives a class of the same slots without the frozen ``__setattr__``.
A builder (:func:`keel.model.task.task_of`, for one) stores each field into a draft with
plain attribute stores, tens of instructions each, then assigns the frozen class to the
draft's ``__class__``: CPython allows that between classes of the same slots, and checks
it (a class of another layout is refused with ``TypeError``). What comes out is an
instance of the frozen class like any other: equal, hashed, printed and frozen alike.

A builder is given every field: no defaults, no ``__post_init__``, no checks. It is for
values read back from a store or derived from another value, not for a caller's input.
"""

from __future__ import annotations

__all__ = ["draft_class"]


def draft_class(cls: type) -> type:
    """A class of ``cls``'s slots, in its layout, without its ``__setattr__``.

    ``cls`` must be a slotted class whose only base is ``object`` (a frozen
    ``@dataclass(slots=True)``); the layout check of ``__class__`` assignment refuses
    any other.
    """
    return type(f"{cls.__name__}Draft", (), {"__slots__": vars(cls)["__slots__"]})
