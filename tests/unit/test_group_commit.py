"""``keel.store.group_commit``: queueing, delivery and regrouping, with a fake runner.

The SQL adapters' runners are covered by the contract suite and the integration tests;
here the lane itself is checked against a runner that records what it was asked to do.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from keel.store.base import Op
from keel.store.group_commit import Lane, Outcome, Ran, Regroup, Wait, run_alone

pytestmark = pytest.mark.anyio


class Boom(Exception):
    """What the op named "fails after writing" raises."""


class FakeRunner:
    """Runs ops as ``op.run(None)``; an op that raises Boom "wrote" first: a group that
    holds it is rolled back (Regroup) unless it is alone. ``inline`` decides whether
    groups run on the loop or in a thread."""

    def __init__(self, *, inline: bool, afters: int = 0) -> None:
        self.inline = inline
        self.groups: list[tuple[str, int]] = []  # (where, size) of every group run
        self.afters = 0
        self.expected = afters
        self.all_after = threading.Event()
        """Set once ``afters`` Ran.after calls ran (they run in the thread, after delivery)."""

    def _run(self, ops: Sequence[Op[Any]]) -> list[Outcome]:
        outcomes = []
        for op in ops:
            try:
                outcomes.append(Outcome(op.run(None)))
            except Boom as exc:
                if len(ops) > 1:
                    raise Regroup from exc
                outcomes.append(Outcome.failed(exc))
            except Exception as exc:
                outcomes.append(Outcome.failed(exc))
        return outcomes

    def start(self, ops: Sequence[Op[Any]]) -> list[Outcome] | Wait:
        if not self.inline:
            return Wait("handoff")
        self.groups.append(("loop", len(ops)))
        return self._run(ops)

    def finish(self, ops: Sequence[Op[Any]], handoff: Any) -> Ran:
        self.groups.append(("thread", len(ops)))
        outcomes = self._run(ops)

        def after() -> None:
            self.afters += 1
            if self.afters == self.expected:
                self.all_after.set()

        return Ran(outcomes, after)

    def closed(self) -> Exception:
        return RuntimeError("closed")


def _value(v: Any) -> Op[Any]:
    return Op(lambda tx: v)


def _refused(message: str) -> Op[Any]:
    def run(tx: Any) -> Any:
        raise ValueError(message)

    return Op(run)


def _boom() -> Op[Any]:
    def run(tx: Any) -> Any:
        raise Boom("failed after writing")

    return Op(run)


@pytest.mark.parametrize("inline", [True, False], ids=["on-loop", "in-thread"])
async def test_ops_queued_together_run_as_one_group(inline):
    """Ops submitted in one loop iteration share one group; each caller gets its own
    value, and a refused op its own error without failing the others."""
    runner = FakeRunner(inline=inline, afters=0 if inline else 1)
    lane = Lane(asyncio.get_running_loop(), runner)
    results = await asyncio.gather(
        lane.submit(_value(1)), lane.submit(_refused("no")), lane.submit(_value(3)),
        return_exceptions=True,
    )  # fmt: skip
    assert (results[0], results[2]) == (1, 3)
    assert isinstance(results[1], ValueError)
    assert runner.groups == [("loop" if inline else "thread", 3)]
    if not inline:
        assert await asyncio.to_thread(runner.all_after.wait, 10)
    assert runner.afters == (0 if inline else 1)
    assert lane.idle


@pytest.mark.parametrize("inline", [True, False], ids=["on-loop", "in-thread"])
async def test_a_group_that_failed_after_writing_runs_each_op_alone(inline):
    """Regroup: every op runs again in a group of its own (in a thread), so only the one
    that failed fails."""
    runner = FakeRunner(inline=inline, afters=3)
    lane = Lane(asyncio.get_running_loop(), runner)
    results = await asyncio.gather(
        lane.submit(_value("a")), lane.submit(_boom()), lane.submit(_value("c")),
        return_exceptions=True,
    )  # fmt: skip
    assert (results[0], results[2]) == ("a", "c")
    assert isinstance(results[1], Boom)
    first = [("loop", 3)] if inline else [("thread", 3)]
    assert runner.groups == [*first, ("thread", 1), ("thread", 1), ("thread", 1)]
    assert await asyncio.to_thread(runner.all_after.wait, 10)
    assert runner.afters == 3  # each alone, each after its own transaction


async def test_ops_queued_while_a_group_runs_form_the_next_group():
    """While a group runs in a thread, new ops wait and then run together."""
    runner = FakeRunner(inline=False)
    lane = Lane(asyncio.get_running_loop(), runner)
    first = lane.submit(_value(1))
    await asyncio.sleep(0)  # the first flush starts
    rest = [lane.submit(_value(n)) for n in (2, 3, 4)]
    assert await asyncio.gather(first, *rest) == [1, 2, 3, 4]
    assert runner.groups == [("thread", 1), ("thread", 3)]


async def test_groups_are_bounded_by_max_group():
    runner = FakeRunner(inline=True)
    lane = Lane(asyncio.get_running_loop(), runner, max_group=2)
    assert await asyncio.gather(*(lane.submit(_value(n)) for n in range(5))) == list(range(5))
    assert [size for _, size in runner.groups] == [2, 2, 1]


async def test_a_cancelled_op_is_left_out_of_its_group():
    """A caller that gave up before the flush: its op does not run."""
    runner = FakeRunner(inline=True)
    lane = Lane(asyncio.get_running_loop(), runner)
    ran: list[str] = []
    gone = lane.submit(Op(lambda tx: ran.append("gone")))
    kept = lane.submit(Op(lambda tx: ran.append("kept")))
    gone.cancel()
    await kept
    assert ran == ["kept"]
    assert runner.groups == [("loop", 1)]


class _Result:
    """A result a weak reference can follow."""


@pytest.mark.parametrize("inline", [True, False], ids=["on-loop", "in-thread"])
async def test_a_lane_with_a_timeout_keeps_no_answered_result(inline):
    """Once its caller is answered, a result is the caller's alone: a lane with a timeout
    does not keep it until the caller's deadline (a worker held ~30,000 tasks so)."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as thread:
        lane = Lane(loop, FakeRunner(inline=inline), timeout=600.0, executor=thread)
        gone = []
        for _ in range(3):
            result = await lane.submit(_value(_Result()))
            gone.append(weakref.ref(result))
        del result
        # The thread has returned from the last group (its frame held the outcomes), and
        # the loop's own hand-offs of the last answer are done.
        await loop.run_in_executor(thread, lambda: None)
        await asyncio.sleep(0)
        gc.collect()
        assert [ref() for ref in gone] == [None, None, None]


def test_run_alone_returns_or_raises_and_runs_the_after():
    """An op run off the lane: its value or its error, and its after() once it ran."""
    runner = FakeRunner(inline=False)
    assert run_alone(runner, _value(7)) == 7
    with pytest.raises(Boom):
        run_alone(runner, _boom())
    assert runner.afters == 2


def _stuck(value: Any, entered: threading.Event, release: threading.Event) -> Op[Any]:
    """An op that says it started, then blocks its group's thread until ``release``."""

    def run(tx: Any) -> Any:
        entered.set()
        assert release.wait(10)
        return value

    return Op(run)


async def test_with_two_in_flight_a_group_does_not_wait_for_a_stuck_one():
    """in_flight=2: ops queued while a group runs form the next group at once, in another
    thread, and are answered while the first is still running."""
    runner = FakeRunner(inline=False)
    pool = ThreadPoolExecutor(max_workers=2)
    lane = Lane(asyncio.get_running_loop(), runner, in_flight=2, executor=pool)
    release, entered = threading.Event(), threading.Event()
    first = lane.submit(_stuck("first", entered, release))
    assert await asyncio.to_thread(entered.wait, 10)
    assert lane.running == 1
    assert await asyncio.wait_for(lane.submit(_value("second")), 10) == "second"
    assert not first.done()
    release.set()
    assert await asyncio.wait_for(first, 10) == "first"
    assert runner.groups == [("thread", 1), ("thread", 1)]
    assert lane.running == 0
    pool.shutdown()


async def test_with_two_in_flight_a_third_group_waits_for_one_to_end():
    """At most ``in_flight`` groups run; what is queued beyond them waits, then runs as
    one group."""
    runner = FakeRunner(inline=False)
    pool = ThreadPoolExecutor(max_workers=3)
    lane = Lane(asyncio.get_running_loop(), runner, in_flight=2, executor=pool)
    release = threading.Event()
    entered = [threading.Event(), threading.Event()]
    running = [lane.submit(_stuck(0, entered[0], release))]
    assert await asyncio.to_thread(entered[0].wait, 10)
    running.append(lane.submit(_stuck(1, entered[1], release)))
    assert await asyncio.to_thread(entered[1].wait, 10)
    queued = [lane.submit(_value(n)) for n in (2, 3)]
    await asyncio.sleep(0)  # a flush would have been scheduled by now: none is
    assert lane.running == 2
    assert lane.queued
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*running, *queued), 10) == [0, 1, 2, 3]
    assert runner.groups == [("thread", 1), ("thread", 1), ("thread", 2)]
    pool.shutdown()
