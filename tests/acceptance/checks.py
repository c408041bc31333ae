"""The checks of a finished multi-step task (``steps_app``'s ``multi_step``,
``pg_scale_app``'s ``pg_steps``) against its history, recorded steps and side-effect file,
shared by ``test_worker_crash.py`` and the PostgreSQL scale-out tests (``tests/pg_scale``).

* :func:`read_effects` reads the side-effect file the apps append to;
* :func:`claims_of` parses a task's attempts from its history, each checked to be explained;
* :func:`check_task` checks one task's outcome, history, recorded steps and side effects
  together, counting what it saw in a :class:`Ledger`.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.model import Event, Status

CLAIMED = re.compile(
    r"claimed by (?P<worker>\S+) \(attempt (?P<attempt>\d+)/\d+, fence (?P<fence>\d+)\)"
)
RECOVERED = re.compile(r"lease of (?P<worker>\S+) expired .* on attempt (?P<attempt>\d+)/")


def read_effects(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The side-effect lines, by task, in the order they were appended."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not path.exists():
        return by_task
    text = path.read_text(encoding="utf-8")
    assert not text or text.endswith("\n"), "a side-effect line was torn"
    for line in text.splitlines():
        record = json.loads(line)
        by_task[record["task"]].append(record)
    return by_task


@dataclass
class Claim:
    """One attempt of a task as its history tells it."""

    worker: str
    attempt: int
    fence: int
    ended_by: Event | None = None  # the event that ended it (None: still open)


@dataclass
class Ledger:
    """What the test did, to check the store against, and what the checks counted."""

    killed: set[str] = field(default_factory=set)
    """Worker ids the test SIGKILLed (or whose attempts the test otherwise cut short)."""
    interrupting: set[str] = field(default_factory=set)
    """… of those, the ones whose kill cut an attempt short (filled by :func:`check_task`)."""
    stats: Counter[str] = field(default_factory=Counter)


def claims_of(task_id: str, history: list[Event]) -> list[Claim]:
    """The task's attempts from its history, each checked to be explained: a claim only
    after creation or the end of the previous attempt; every attempt but the last ended
    by the recovery of its expired lease; the completion written by the last claimer."""
    claims: list[Claim] = []
    assert history[0].from_status is None, history[0]
    assert history[0].reason == "created", history[0]
    for event in history[1:]:
        if m := CLAIMED.fullmatch(event.reason):
            assert not claims or claims[-1].ended_by is not None, (
                f"{task_id}: claimed while an attempt was open: {history}"
            )
            claim = Claim(m["worker"], int(m["attempt"]), int(m["fence"]))
            assert event.actor == f"worker:{claim.worker}", event
            claims.append(claim)
        elif m := RECOVERED.match(event.reason):
            assert claims, f"{task_id}: {history}"
            assert claims[-1].ended_by is None, f"{task_id}: {history}"
            assert m["worker"] == claims[-1].worker, event
            assert int(m["attempt"]) == claims[-1].attempt, event
            assert (event.from_status, event.to_status) == (Status.WORKING, Status.WORKING)
            assert event.actor == "recovery", event
            claims[-1].ended_by = event
        elif event.to_status is Status.COMPLETED:
            assert claims, f"{task_id}: {history}"
            assert claims[-1].ended_by is None, f"{task_id}: {history}"
            # No stale write accepted: the completion is the current fence holder's.
            assert event.actor == f"worker:{claims[-1].worker}", event
            claims[-1].ended_by = event
        else:
            raise AssertionError(f"{task_id}: history has an unexplained event {event}")
    return claims


def check_task(
    task_id: str,
    status: Status,
    result: Any,
    history: list[Event],
    steps: Mapping[str, Any],
    effects: list[dict[str, Any]],
    step_count: int,
    ledger: Ledger,
) -> None:
    """Check one multi-step task's outcome, history, recorded steps and side effects
    together:

    * it completed exactly once (one completion, the last event), written by the worker
      holding the last fence, with a result built from the recorded steps;
    * fences strictly increase and attempt numbers count the recoveries; every attempt
      but the last ended by the recovery of a lease that a killed worker held;
    * each step was recorded once, by an attempt whose fence and worker the history
      shows, in fence order (a superseded fence never recorded a step after a newer one);
    * an attempt ran exactly the steps not recorded when it started (recorded steps are
      replayed, never run again); a step's effect was repeated only as the last act of
      an attempt that was killed before it could record it.
    """
    stats = ledger.stats
    assert status is Status.COMPLETED, f"{task_id} ended {status}: {history}"
    # Finished exactly once: one completion, the last event, by the last attempt.
    completions = [e for e in history if e.to_status is Status.COMPLETED]
    assert len(completions) == 1, history
    assert history[-1] is completions[0], history

    claims = claims_of(task_id, history)
    by_fence = {c.fence: c for c in claims}
    fences = [c.fence for c in claims]
    assert fences == sorted(set(fences)), f"{task_id}: fences not increasing: {history}"
    assert [c.attempt for c in claims] == list(range(1, len(claims) + 1)), (
        f"{task_id}: every attempt number counts one recovery: {history}"
    )
    for claim in claims[:-1]:  # ended by recovery: only a worker the test killed
        assert claim.worker in ledger.killed, f"{task_id}: a live worker lost its lease: {history}"
        ledger.interrupting.add(claim.worker)
        stats["attempts_interrupted"] += 1
    stats["tasks_retried"] += len(claims) > 1

    # Every step recorded once; the result is built from the recorded values (replay).
    names = [f"step-{n}" for n in range(step_count)]
    assert sorted(steps) == names, f"{task_id}: recorded steps {sorted(steps)}"
    recorded = [steps[name] for name in names]
    assert result["structuredContent"]["nonces"] == [r["nonce"] for r in recorded], (
        f"{task_id}: the result does not use the recorded step results"
    )
    assert result["structuredContent"]["fence"] == claims[-1].fence, (result, history)

    # Each recorded result is the return value of a line in the effects file, made by the
    # attempt whose fence it carries, on the worker that held that fence.
    nonces = Counter(e["nonce"] for e in effects)
    for rec in recorded:
        assert nonces[rec["nonce"]] == 1, f"{task_id}: recorded effect {rec} not in the file"
        assert rec["fence"] in by_fence, f"{task_id}: step recorded by unknown fence {rec}"
        assert by_fence[rec["fence"]].worker == rec["worker"], rec
    assert [r["fence"] for r in recorded] == sorted(r["fence"] for r in recorded)

    # Side effects, in the order they were made.
    made = [e["fence"] for e in effects]
    assert made == sorted(made), f"{task_id}: attempts overlapped: {effects}"
    recorded_nonces = {r["nonce"] for r in recorded}
    for fence, claim in by_fence.items():
        mine = [e for e in effects if e["fence"] == fence]
        assert all(e["worker"] == claim.worker for e in mine), f"{task_id}: {mine}"
        assert all(e["attempt"] == claim.attempt for e in mine), f"{task_id}: {mine}"
        # An attempt runs exactly the steps not recorded when it started, in order:
        # recorded steps are replayed, never recomputed.
        done_before = sum(1 for r in recorded if r["fence"] < fence)
        ran = [e["step"] for e in mine]
        assert ran == names[done_before : done_before + len(ran)], (
            f"{task_id}: fence {fence} ran {ran} with {done_before} steps recorded before it"
        )
        unrecorded = [e for e in mine if e["nonce"] not in recorded_nonces]
        if unrecorded:
            # The window: the effect happened, its result was not committed, the attempt
            # died right there. Only a killed attempt, only its last effect, at most one.
            assert len(unrecorded) == 1, f"{task_id}: fence {fence} lost {unrecorded}"
            assert mine[-1] is unrecorded[0], f"{task_id}: fence {fence} went on: {mine}"
            assert claim.ended_by is not None, claim
            assert claim.ended_by.actor == "recovery", claim
            assert claim.worker in ledger.killed, claim
            stats["effects_repeated"] += 1
    stats["effects"] += len(effects)
    for name in names:
        assert any(e["step"] == name for e in effects), f"{task_id}: {name} never ran"
