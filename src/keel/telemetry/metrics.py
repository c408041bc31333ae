"""Prometheus metrics of a Keel process: ``keel_*``, counted where the store commits.

:class:`Metrics` is a :class:`~keel.store.observed.CommitObserver`: set as a store's
observer, it hears of each write after its COMMIT, with the history entries it wrote, so
every counter counts exactly the transitions this process committed (an idempotent
repeat, a refused or rolled-back write counts nothing). Each process has its own
counters; Prometheus adds them up across processes (``sum by (tool)``).

The gauges are read when scraped: ``keel_tasks{status}`` from the store (one
``counts()`` read, by :meth:`Metrics.refresh`), the rest from this process.
docs/observability.md lists every metric.

``prometheus_client`` is imported when the metrics are first read (the registry is made
then), not when a process starts: a ``keel worker`` without ``--metrics-port`` never
needs it (issue 19: start-up CPU).
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from keel.model import Status, Task
from keel.store.observed import Committed, Transition

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.core import Metric

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format."""

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)
"""Seconds: queue and input waits, attempts (milliseconds to an hour)."""
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
BATCH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 100)

_ENDS_ATTEMPT = {
    "complete": "completed",
    "fail": "failed",
    "retry": "error",
    "release": "released",
    "request_input": "input_required",
    "cancel": "cancelled",
}


_INPUT = Status.INPUT_REQUIRED
_RETRIES = frozenset({"retry", "recover_expired"})


def _tool(task: Task | None) -> str:
    return "" if task is None or task.name is None else task.name


class _Counter:
    """A counter by label values, kept as plain numbers and told to Prometheus only when
    scraped (:class:`_Tallies`): counting a transition is a dict update, not
    ``prometheus_client``'s locked child lookup and increment (those were most of what
    metrics cost a task; docs/benchmarks.md, "Telemetry on and off")."""

    __slots__ = ("doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + by

    def family(self) -> Metric:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for labels, value in list(self.values.items()):
            family.add_metric(list(labels), value)
        return family


class _Histogram:
    """A histogram by label values (see :class:`_Counter`): a count per bucket and a sum."""

    __slots__ = ("bounds", "doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.bounds = tuple(float(b) for b in bounds)
        self.values: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        if not labels:
            self.values[()] = ([0] * (len(self.bounds) + 1), [0.0])

    def observe(self, value: float, *labels: str) -> None:
        kept = self.values.get(labels)
        if kept is None:
            kept = self.values[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        kept[0][bisect_left(self.bounds, value)] += 1  # the first bucket with value <= bound
        kept[1][0] += value

    def family(self) -> Metric:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        # A bound as Prometheus writes it (``le``): ``0.005``, ``1.0``, ``+Inf``.
        go_float = cast("Callable[[float], str]", floatToGoString)
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        edges = [go_float(b) for b in self.bounds] + ["+Inf"]
        for labels, (counts, total) in list(self.values.items()):
            cumulative, buckets = 0, []
            for edge, count in zip(edges, counts, strict=True):
                cumulative += count
                buckets.append((edge, float(cumulative)))
            family.add_metric(list(labels), buckets, total[0])
        return family


class _Tallies:
    """The collector of the counters and histograms (a registry asks it when scraped)."""

    def __init__(self) -> None:
        self.metrics: list[_Counter | _Histogram] = []

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.family()

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def _gauge(name: str, doc: str, read: Callable[[], float], registry: CollectorRegistry) -> None:
    from prometheus_client import Gauge

    Gauge(name, doc, registry=registry).set_function(read)


class Metrics:
    """The metrics of one process (their own registry: several may live side by side)."""

    def __init__(self) -> None:
        self._tallies = _Tallies()
        self._gauges: list[tuple[str, str, Callable[[], float]]] = []

        def counter(name: str, doc: str, labels: Iterable[str] = ("tool",)) -> _Counter:
            kept = _Counter(name, doc, list(labels))
            self._tallies.metrics.append(kept)
            return kept

        def histogram(name: str, doc: str, labels: Iterable[str], buckets: Any) -> _Histogram:
            kept = _Histogram(name, doc, list(labels), buckets)
            self._tallies.metrics.append(kept)
            return kept

        self.created = counter("keel_tasks_created", "Tasks created (idempotent repeats not).")
        self.completed = counter("keel_tasks_completed", "Tasks that completed.")
        self.failed = counter("keel_tasks_failed", "Tasks that failed (dead letters included).")
        self.cancelled = counter("keel_tasks_cancelled", "Tasks cancelled.")
        self.dead = counter("keel_tasks_dead_lettered", "Tasks failed after their last attempt.")
        self.retries = counter("keel_task_retries", "Attempts that ended to be tried again.")
        self.expiries = counter("keel_lease_expiries", "Leases that expired and were recovered.")
        self.input_requested = counter("keel_task_input_requests", "Times tasks asked for input.")
        self.released = counter("keel_task_releases", "Attempts that gave their task back.")
        self.purged = counter("keel_tasks_purged", "Finished tasks purged.", ())
        self.queue_wait = histogram(
            "keel_queue_wait_seconds", "Ready (created, answered, retried) to claimed.",
            ["tool"], WAIT_BUCKETS,
        )  # fmt: skip
        self.attempt = histogram(
            "keel_attempt_duration_seconds", "Claim to the attempt's outcome, by outcome.",
            ["tool", "outcome"], WAIT_BUCKETS,
        )  # fmt: skip
        self.input_wait = histogram(
            "keel_input_wait_seconds", "Waiting for input to the answer that resumed the task.",
            ["tool"], WAIT_BUCKETS,
        )  # fmt: skip
        self.batch = histogram("keel_claim_batch_size", "Tasks one claim took.", [], BATCH_BUCKETS)
        self.commit = histogram(
            "keel_store_commit_seconds", "A store write, called to committed, by method.",
            ["op"], COMMIT_BUCKETS,
        )  # fmt: skip
        self._ended = {Status.COMPLETED: self.completed, Status.FAILED: self.failed,
                       Status.CANCELLED: self.cancelled}  # fmt: skip

    @functools.cached_property
    def registry(self) -> CollectorRegistry:
        """Every metric, as Prometheus reads them: made on first use (a scrape, a test),
        with ``keel_tasks``, then the counters and histograms, then the gauges."""
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=True)
        registry.register(self.tasks)
        registry.register(self._tallies)
        for name, doc, read in self._gauges:
            _gauge(name, doc, read, registry)
        return registry

    @functools.cached_property
    def tasks(self) -> Gauge:
        """``keel_tasks{status}``, set from the store when scraped."""
        from prometheus_client import Gauge

        return Gauge("keel_tasks", "Tasks in the store, by status.", ["status"], registry=None)

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge of this process read when scraped (workers, attempts, listeners)."""
        self._gauges.append((name, doc, read))
        if "registry" in self.__dict__:  # already made: it joins it now
            _gauge(name, doc, read, self.registry)

    def set_counts(self, counts: Mapping[Status, int]) -> None:
        """``keel_tasks{status}`` from a store's ``counts()``."""
        for status in Status:
            self.tasks.labels(status.value).set(counts.get(status, 0))

    def exposition(self) -> bytes:
        """The Prometheus text of every metric."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    # --- the observer ----------------------------------------------------------------

    def committed(self, commit: Committed) -> None:
        self.commit.observe(commit.seconds, commit.what)
        if commit.what == "claim":
            self._claims(commit.result)
            return
        if commit.what == "purge":
            self.purged.inc(by=len(commit.result))
        for transition in commit.transitions:
            self._transition(commit.what, transition)

    def _claims(self, claimed: list[Task]) -> None:
        self.batch.observe(len(claimed))
        for task in claimed:
            # A claim leaves ready_at alone and sets claimed_at (and updated_at) to its time.
            at = task.updated_at if task.claimed_at is None else task.claimed_at
            self.queue_wait.observe(max(0.0, at - task.ready_at), _tool(task))

    def _transition(self, what: str, transition: Transition) -> None:
        event, old = transition.event, transition.old
        before, to = event.from_status, event.to_status
        tool = _tool(transition.new or old)
        if before is None:
            if what == "create":
                self.created.inc(tool)
                if to is _INPUT:
                    self.input_requested.inc(tool)
            return
        self._attempt_end(what, transition, tool)
        if what in _RETRIES:
            if what == "recover_expired":
                self.expiries.inc(tool)
            (self.dead if to is Status.FAILED else self.retries).inc(tool)
        elif what == "release":
            self.released.inc(tool)
        if before is _INPUT:
            if to is Status.WORKING and old is not None:
                self.input_wait.observe(max(0.0, event.at - old.updated_at), tool)
        elif to is _INPUT:
            self.input_requested.inc(tool)
        ended = self._ended.get(to)
        if ended is not None:
            ended.inc(tool)

    def _attempt_end(self, what: str, transition: Transition, tool: str) -> None:
        """The duration of the attempt this write ended, if it ended one: from the claim
        time the task carries, so it is observed once, by the process that wrote the end,
        whichever process claimed it (a task claimed before the store kept claim times,
        schema 0006/0004, has none and is not observed)."""
        old, new = transition.old, transition.new
        if old is None or old.lease_owner is None or (new is not None and new.lease_owner):
            return
        if old.claimed_at is not None:
            outcome = _ENDS_ATTEMPT.get(what, "recovered" if what == "recover_expired" else what)
            seconds = max(0.0, transition.event.at - old.claimed_at)
            self.attempt.observe(seconds, tool, outcome)
