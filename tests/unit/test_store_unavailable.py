"""Unit: a store that cannot serve for now, as callers and clients see it.

``StoreUnavailable`` crosses the wire as ``-32050`` with the store, the cause and
``data.retryAfterMs``; the group-commit helpers answer a call within its timeout and
keep an op whose caller was answered from running.
"""

from __future__ import annotations

import asyncio

import pytest

from keel.errors import StoreError, StoreUnavailable
from keel.mcp.wire import STORE_UNAVAILABLE, rpc_error
from keel.store.base import Op
from keel.store.group_commit import answer_within, bounded

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
    assert rpc_error(StoreError("corrupt"))["code"] == -32603  # the others stay generic


def _late() -> Exception:
    return StoreUnavailable("s", "no answer")


async def test_a_call_is_answered_within_its_timeout():
    """An answer that never comes: the "late" error after the timeout, the waiting
    future cancelled (a queued op is then dropped)."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(StoreUnavailable, match="no answer"):
        await answer_within(future, 0.01, _late)
    assert future.cancelled()


async def test_an_answer_in_time_is_passed_on():
    """Within the timeout, the value (or the error) is the caller's."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    future.set_result(7)
    assert await answer_within(future, 1.0, _late) == 7


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
