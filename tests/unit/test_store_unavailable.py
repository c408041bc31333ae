"""Unit: a store that cannot serve for now, as callers and clients see it.

``StoreUnavailable`` crosses the wire as ``-32050`` with the store, the cause and
``data.retryAfterMs``; the group-commit helpers answer a call within its timeout and
keep an op whose caller was answered from running.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from keel.errors import StoreCorrupt, StoreDamaged, StoreError, StoreUnavailable
from keel.mcp.wire import STORE_DAMAGED, STORE_UNAVAILABLE, rpc_error
from keel.store.base import Op
from keel.store.group_commit import Lane, Outcome, Ran, Wait, bounded

pytestmark = pytest.mark.anyio


def test_unavailable_is_a_store_error_naming_store_and_cause():
    """The message names the store and the cause; it is a StoreError like any other."""
    error = StoreUnavailable("postgresql://keel@db:5432/keel", "connection refused")
    assert isinstance(error, StoreError)
    assert str(error) == "store postgresql://keel@db:5432/keel is unavailable: connection refused"
    assert error.retry_after == 1.0


def test_unavailable_crosses_the_wire_with_its_code_and_retry_hint():
    """-32050, the message as is, data.retryAfterMs in milliseconds."""
    error = StoreUnavailable("/var/lib/keel.db", "the disk is full", retry_after=2.5)
    assert rpc_error(error) == {
        "code": STORE_UNAVAILABLE,
        "message": "store /var/lib/keel.db is unavailable: the disk is full",
        "data": {"retryAfterMs": 2500},
    }
    assert rpc_error(StoreError("disk I/O"))["code"] == -32603  # the others stay generic


def test_a_corrupt_store_crosses_the_wire_named_and_typed():
    """A damaged page met while serving: -32051 naming the store and the remedy, never
    the generic -32603; no retry hint (trying again does not mend the file)."""
    error = StoreCorrupt("/var/lib/keel.db", "store /var/lib/keel.db is corrupt: …", "malformed")
    assert isinstance(error, StoreDamaged)
    assert rpc_error(error) == {"code": STORE_DAMAGED, "message": str(error)}


def _late() -> Exception:
    return StoreUnavailable("s", "no answer")


class Stuck:
    """A runner whose groups wait in a thread until ``go`` is set (a lock held elsewhere,
    a server gone), then run their ops."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.done = threading.Event()
        self.ran: list[str] = []

    def start(self, ops: Sequence[Op[Any]]) -> Wait:
        return Wait()

    def finish(self, ops: Sequence[Op[Any]], handoff: Any) -> Ran:
        self.go.wait(10)
        outcomes = []
        for op in ops:
            try:
                outcomes.append(Outcome(op.run("tx")))
            except Exception as exc:
                outcomes.append(Outcome.failed(exc))
        self.done.set()
        return Ran(outcomes)

    def closed(self) -> Exception:
        return RuntimeError("closed")


async def test_a_lane_answers_every_caller_within_its_timeout():
    """A group stuck in its thread: its caller and the one queued behind it both get
    late() at their own deadline; once the group gets going, the op whose caller was
    answered does not run, and the queued one is left out."""
    runner = Stuck()
    lane = Lane(asyncio.get_running_loop(), runner, timeout=0.2, late=_late)
    first = lane.submit(Op(lambda tx: runner.ran.append("first")))
    await asyncio.sleep(0)  # the first group leaves for its thread
    second = lane.submit(Op(lambda tx: runner.ran.append("second")))
    for future in (first, second):
        with pytest.raises(StoreUnavailable, match="no answer"):
            await future
    runner.go.set()
    assert await asyncio.to_thread(runner.done.wait, 10)  # the stuck group ran its ops
    assert runner.ran == []


async def test_a_lane_passes_on_an_answer_in_time():
    """Within the timeout, the value is the caller's, and no late error follows."""
    runner = Stuck()
    runner.go.set()
    lane = Lane(asyncio.get_running_loop(), runner, timeout=5.0, late=_late)
    assert await lane.submit(Op(lambda tx: 7)) == 7


def test_an_op_that_would_start_too_late_does_not_run():
    """bounded(op): runs while its caller still waits; refused once the caller's time
    (less the start margin) is up, before it touches anything."""
    touched: list[str] = []
    op = Op(lambda tx: touched.append(tx) or 1, touches=("t1",))
    assert bounded(op, 60.0, _late).run("tx") == 1
    late = bounded(op, 0.0, _late)
    assert late.touches == ("t1",)
    with pytest.raises(StoreUnavailable):
        late.run("tx")
    assert touched == ["tx"]
