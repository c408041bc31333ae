"""The PostgreSQL adapter: one database shared by many front ends and workers on many hosts.

* Every protocol call is a transaction over the shared :class:`~keel.store.base.TxStore`
  logic, so the rules are the memory and SQLite adapters' rules, word for word. Claims are
  the exception that proves it: one ``UPDATE … WHERE task_id IN (SELECT … FOR UPDATE SKIP
  LOCKED LIMIT n) RETURNING …`` statement (``claim`` in queries.sql), checked against
  :func:`keel.model.transitions.claim` by a test.
* **Group commit** (:mod:`keel.store.group_commit`). Calls made on one event loop while
  a transaction is in flight queue up; the next transaction runs all of them (reads and
  writes in separate lanes), so a worker completing thirty tasks at once pays for one
  transaction, not thirty. The tasks a group names are locked in one statement first.
* **Threads, not async connections.** Each group runs in a worker thread on a pooled
  synchronous psycopg connection: the Tx primitives are synchronous, and measured on this
  adapter's target machine a statement costs ~25 µs on a sync connection against ~70 µs
  through psycopg's async one; the ~100 µs thread hop is paid once per group.
* **Retries that cannot apply twice.** Transient failures (a lost connection, a server
  restart, admin shutdown, a serialization failure or deadlock, an exhausted pool) are
  retried with jittered exponential backoff, up to ``retries`` tries. A write group
  records its operation id in ``keel_write_log`` in the same transaction; if the COMMIT
  was sent but its answer lost, the retry first inserts that id again: a duplicate means
  the first try committed, and its outcome is returned instead of running it again.
* **Answers within the timeout.** A call waits ``timeout`` seconds at most
  (its :class:`~keel.store.group_commit.Lane`'s; ``keel serve --store-timeout``): past
  it, or when the retries of its group run out of that time, it gets
  :class:`~keel.errors.StoreUnavailable` naming the store and the last cause seen (the
  pool's own connection attempts included: ``connection refused`` …). The pool gives up
  reconnecting after :data:`RECONNECT_WINDOW` and starts again at once while calls wait,
  so a server that comes back is used within about that long.
* **Wake-ups** by LISTEN/NOTIFY after COMMIT (see :mod:`keel.store.postgres.notify`);
  workers keep polling, so a lost notification only delays.

``psycopg`` errors become :mod:`keel.errors` here and nowhere else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar, TypeVar

import anyio.to_thread
import psycopg
import psycopg_pool

from keel.errors import StoreError, StoreUnavailable
from keel.model import Limits, Task
from keel.store.base import MAX_CLAIM_BATCH, Op, Picks, TxStore
from keel.store.group_commit import (
    DEFAULT_STORE_TIMEOUT,
    START_MARGIN,
    Lane,
    Outcome,
    Ran,
    Regroup,
    Wait,
    run_alone,
)
from keel.store.postgres.config import PostgresOptions, parse_postgres_url
from keel.store.postgres.faults import (
    backoff,
    cause_of,
    connection_lost,
    is_transient,
    store_error,
    unavailable,
)
from keel.store.postgres.notify import Listener, change_channel, channels, payloads
from keel.store.postgres.schema import SCHEMA_VERSION, migrate_store
from keel.store.postgres.tx import GroupState, PgTx, Q, cursor
from keel.store.protocol import Clock

__all__ = ["SCHEMA_VERSION", "PostgresOptions", "PostgresStore", "parse_postgres_url"]

log = logging.getLogger("keel.store.postgres")

T = TypeVar("T")

MAX_GROUP = 200  # calls in one transaction at most: a long transaction holds its row locks
TRIM_EVERY = 600.0  # seconds between deletions of old keel_write_log rows (per process)
RECONNECT_WINDOW = 0.5  # seconds the pool retries a connection before it starts over


class _AlreadyCommitted(Exception):
    """A retried group found its operation id: the earlier try committed."""


class _CommitUnknown(Exception):
    """The connection failed while COMMIT was on its way: it may or may not have applied."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        super().__init__("commit outcome unknown")
        self.outcomes = outcomes


class _Refused(Exception):
    """The one call of a group failed after it sent a write: roll back, report ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _touched(ops: Sequence[Op[Any]]) -> list[str]:
    """The tasks a group's ops name, each once: read (and locked) together up front."""
    return list(dict.fromkeys(task_id for op in ops for task_id in op.touches))


class _Watched(psycopg.Connection[Any]):
    """A pooled connection whose opening tells its store how it went: the pool retries
    connections in its own threads and hands waiting callers only a timeout, so this is
    how a call learns *why* there was no connection (``connection refused`` …). The pool's
    ``connection_class`` is the seam psycopg_pool offers for it."""

    store: ClassVar[PostgresStore]

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
        try:
            conn = super().connect(conninfo, **kwargs)
        except psycopg.Error as exc:
            cls.store._trouble = cause_of(exc)
            raise
        cls.store._trouble = None
        return conn


class _Groups:
    """How one kind of PostgreSQL group (reads or writes) runs: the lanes' runner."""

    def __init__(self, store: PostgresStore, write: bool) -> None:
        self._store = store
        self._write = write

    def start(self, ops: Sequence[Op[Any]]) -> list[Outcome] | Wait:
        return Wait()  # every group waits for the network: always in a worker thread

    def finish(self, ops: Sequence[Op[Any]], handoff: Any) -> Ran:
        store = self._store
        outcomes, notes = store._group_noting(ops, self._write)
        if notes is None:
            return Ran(outcomes)
        return Ran(outcomes, lambda: store._notify(notes))

    def closed(self) -> Exception:
        return StoreError(f"store {self._store._where} is closed")


class PostgresStore(TxStore):
    """A :class:`keel.store.Store` in a PostgreSQL database (see :mod:`config` for the URL).

    Opening it connects once, applies missing migrations (under an advisory lock) and
    opens the connection pool.

    Args:
        url: ``postgresql://…`` or ``postgres://…`` with optional Keel options.
        clock: seconds since the epoch (injected in tests). Every process sharing a
            database must agree on the time: leases are compared across hosts.
        timeout: seconds a call waits for its answer at most (default: the one in
            ``url``'s :class:`PostgresOptions`, else :data:`DEFAULT_STORE_TIMEOUT`).

    Raises:
        ConfigurationError: a bad URL or option, or no server reachable at its address.
        StoreError: the database refused to set up the schema, or it is newer than this Keel.
    """

    def __init__(
        self,
        url: str | PostgresOptions,
        *,
        clock: Clock | None = None,
        limits: Limits | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(clock=clock, limits=limits)
        if isinstance(url, PostgresOptions):
            self.options = url
        else:
            self.options = parse_postgres_url(url, timeout=timeout or DEFAULT_STORE_TIMEOUT)
        self.timeout = timeout or self.options.timeout
        self._where = self.options.display
        self._trouble: str | None = None
        """The last failure to connect or to run a group (None since a success): the
        cause a :class:`StoreUnavailable` names."""
        self._closed = False
        self._runners = {write: _Groups(self, write) for write in (False, True)}
        self._lanes: dict[tuple[int, bool], Lane] = {}
        self._last_trim = 0.0
        self._trim_lock = threading.Lock()
        self.schema_version = self._setup()
        # Group transactions and blocking single calls run here, never on an event loop.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.options.pool_max, thread_name_prefix="keel-pg"
        )
        watched = type("KeelConnection", (_Watched,), {"store": self})
        self._pool = psycopg_pool.ConnectionPool(
            self.options.conninfo,
            connection_class=watched,
            min_size=self.options.pool_min,
            max_size=self.options.pool_max,
            kwargs={"autocommit": True},
            timeout=min(self.options.pool_timeout, self.timeout),
            name=f"keel {self._where}",
            num_workers=1,
            # psycopg_pool waits longer and longer between attempts (1 s, 2 s, 4 s … for
            # five minutes): after a long outage the first call would wait for the next
            # one. Instead it gives up soon and, while calls wait, starts over at once.
            reconnect_timeout=RECONNECT_WINDOW,
            reconnect_failed=_start_over,
            open=True,
        )
        self._listener = (
            Listener(
                self.options.conninfo, self.options.channel_tag, retry_cap=self.options.retry_cap
            )
            if self.options.notify
            else None
        )

    def _setup(self) -> int:
        """Bring the schema up to date (see :func:`schema.migrate_store`); its version."""
        migrate_store(self.options)
        return SCHEMA_VERSION  # migrate_store refuses a newer schema and upgrades an older

    # --- running calls ---------------------------------------------------------------

    async def _run(self, op: Op[T], *, write: bool) -> T:
        self._check_open()
        runner = self._runners[write]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - not on asyncio (e.g. trio): one at a time
            return await anyio.to_thread.run_sync(lambda: run_alone(runner, op))
        # One lane of writes per event loop: a worker's claims share the group of its
        # outcome writes when they are queued together (one transaction, one COMMIT, one
        # NOTIFY for both); a lane of their own for claims cost ~15% more worker CPU per
        # task. Its groups run ``write_groups`` at a time (2 by default): with one, this
        # process and the server took turns, each idle while the other worked (half of two
        # cores unused); with two, the server runs one group while this process prepares
        # the next or reads the answers of the last (docs/benchmarks.md).
        key = (id(loop), write)
        lane = self._lanes.get(key)
        if lane is None or lane.loop is not loop:
            lane = self._lanes[key] = Lane(
                loop,
                runner,
                max_group=MAX_GROUP,
                executor=self._threads,
                timeout=self.timeout,
                late=self._late,
                in_flight=self.options.write_groups if write else 1,
            )
        return await lane.submit(op)  # type: ignore[no-any-return]

    def _late(self) -> StoreUnavailable:
        """The answer of a call that waited the whole timeout (or would start too late)."""
        cause = self._trouble or "no answer"
        return unavailable(self.options.url, f"{cause}; no answer within {self.timeout:g} s")

    def _give_up_or_wait(
        self, attempt: int, cause: BaseException, started: float, *, unknown: bool = False
    ) -> None:
        """After a transient failure: raise :class:`StoreUnavailable` if the tries or the
        time are used up (the group started at ``started``), else wait before the next."""
        self._trouble = (
            cause_of(cause)
            if not isinstance(cause, psycopg_pool.PoolTimeout)
            else (self._trouble or cause_of(cause))
        )
        pause = backoff(attempt, self.options.retry_base, self.options.retry_cap)
        spent = time.monotonic() - started
        if attempt >= self.options.retries or spent + pause >= self._budget:
            maybe = " (it may or may not have been applied)" if unknown else ""
            raise unavailable(
                self.options.url,
                f"{self._trouble}; gave up after {attempt} tries in {spent:.1f} s{maybe}",
                cause,
            )
        self._sweep_pool(cause)
        log.info("transient failure on %s (%s); retry %d in %.3fs", self._where, cause,
                 attempt, pause)  # fmt: skip
        time.sleep(pause)  # in a worker thread: waiting out a failure, not for a result

    @property
    def _budget(self) -> float:
        """Seconds a group may spend on its tries: a little less than the timeout, so that
        its callers hear the cause it found rather than only that time ran out."""
        return self.timeout - min(START_MARGIN, self.timeout / 2)

    def _remaining(self, started: float) -> float:
        """Seconds a try that begins now may wait for a pooled connection."""
        left = self._budget - (time.monotonic() - started)
        return max(min(self.options.pool_timeout, left), 0.001)

    def _group_noting(
        self, ops: Sequence[Op[Any]], write: bool
    ) -> tuple[list[Outcome], GroupState | None]:
        """Run ``ops`` as one transaction, retrying transient failures: their outcomes,
        and what the notifications after COMMIT must say.

        Raises:
            Regroup: an op of several failed after writing; the group was rolled back.
        """
        started = time.monotonic()
        if not write:
            return self._retrying(lambda: self._read_once(ops, started), started), None
        op_id = uuid.uuid4()
        previous: list[Outcome] | None = None  # a try whose COMMIT may have applied
        attempt = 0
        while True:
            attempt += 1
            try:
                self._check_open()
                done = self._write_once(ops, op_id, started, replay=previous is not None)
            except _AlreadyCommitted:
                assert previous is not None
                log.info("a lost COMMIT reply: the transaction had committed; not applied again")
                return previous, None
            except Regroup:
                raise
            except _CommitUnknown as exc:
                previous, cause = exc.outcomes, exc.__cause__
            except Exception as exc:
                if not is_transient(exc):
                    raise
                cause = exc
            else:
                self._trouble = None
                return done
            assert cause is not None
            self._give_up_or_wait(attempt, cause, started, unknown=previous is not None)

    def _retrying(self, once: Callable[[], T], started: float) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                self._check_open()
                done = once()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._give_up_or_wait(attempt, exc, started)
            else:
                self._trouble = None
                return done

    def _sweep_pool(self, cause: BaseException) -> None:
        """After a lost connection, test the idle ones: a server restart or an operator
        ending backends breaks them all, and each would otherwise cost a try of its own."""
        if connection_lost(cause):
            try:
                self._pool.check()
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:  # pragma: no cover
                log.info("pool check failed: %s", exc)

    def _read_once(self, ops: Sequence[Op[Any]], started: float) -> list[Outcome]:
        state = GroupState(write=False, now=self._now)
        outcomes: list[Outcome] = []
        with self._pool.connection(timeout=self._remaining(started)) as conn:
            cur = cursor(conn)
            if len(ops) > 1:
                state.preload(cur, _touched(ops))
            for op in ops:
                try:
                    outcomes.append(Outcome(op.run(PgTx(cur, state))))
                except psycopg.Error as exc:
                    if is_transient(exc):
                        raise
                    outcomes.append(Outcome.failed(self._store_error(exc)))
                except Exception as exc:
                    outcomes.append(Outcome.failed(exc))
        return outcomes

    def _write_once(
        self, ops: Sequence[Op[Any]], op_id: uuid.UUID, started: float, *, replay: bool
    ) -> tuple[list[Outcome], GroupState]:
        state = GroupState(write=True, now=self._now)
        outcomes: list[Outcome] = []
        committing = False
        with self._pool.connection(timeout=self._remaining(started)) as conn:
            cur = cursor(conn)
            try:
                # Pipelined: a statement whose answer nothing waits for (BEGIN, the held-back
                # updates and history, the write log) travels with the next one that is
                # waited for; the group's last ones are answered by the one sync that ends
                # the pipeline, before COMMIT.
                with conn.pipeline() as pipe:
                    cur.execute(b"BEGIN")
                    # The operation id first (it travels with the first statement answered):
                    # on a retry, a duplicate means that the first try committed.
                    cur.execute(Q["log_write"], {"op_id": op_id})
                    if replay:
                        try:
                            pipe.sync()
                        except psycopg.errors.UniqueViolation:
                            raise _AlreadyCommitted from None
                    state.preload(cur, _touched(ops))
                    outcomes = self._calls(cur, ops, state)
                    state.flush(cur)
                    if state.wrote:
                        self._maybe_trim(cur)
                state.check()
                if not state.wrote:
                    _rollback(conn)  # nothing written (a claim that found nothing): no id kept
                    return outcomes, state
                committing = True
                self._commit(conn)
            except _Refused as refused:
                _rollback(conn)
                return [Outcome.failed(refused.error)], state
            except psycopg.Error as exc:
                _rollback(conn)
                if not is_transient(exc):
                    if len(ops) > 1:
                        raise Regroup from exc
                    return [Outcome.failed(self._store_error(exc))], state
                if committing:
                    raise _CommitUnknown(outcomes) from exc
                raise
            except BaseException:
                _rollback(conn)
                raise
        return outcomes, state

    def _calls(
        self,
        cur: psycopg.Cursor[dict[str, Any]],
        ops: Sequence[Op[Any]],
        state: GroupState,
    ) -> list[Outcome]:
        """Run each call of a write group; a refused one is undone, the others stand."""
        outcomes: list[Outcome] = []
        for op in ops:
            tx = PgTx(cur, state)
            mark = state.mark()
            try:
                outcomes.append(Outcome(op.run(tx)))
            except psycopg.Error as exc:
                if is_transient(exc):
                    raise
                if len(ops) > 1:
                    raise Regroup from exc
                raise _Refused(self._store_error(exc)) from exc
            except Exception as exc:
                if tx.sent or state.flushes != mark[3]:
                    # Part of it reached the database: only a rollback can undo it.
                    if len(ops) > 1:
                        raise Regroup from exc
                    raise _Refused(exc) from exc
                state.undo(mark)
                outcomes.append(Outcome.failed(exc))
        return outcomes

    def _commit(self, conn: psycopg.Connection[Any]) -> None:
        """Send COMMIT and wait for its answer (tests override this to lose the answer)."""
        conn.execute(b"COMMIT")

    def _maybe_trim(self, cur: psycopg.Cursor[Any]) -> None:
        now = time.monotonic()
        if now - self._last_trim < TRIM_EVERY or not self._trim_lock.acquire(blocking=False):
            return
        try:
            self._last_trim = now
            cur.execute(Q["trim_write_log"])
        finally:
            self._trim_lock.release()

    def _store_error(self, exc: BaseException) -> StoreError:
        return store_error(exc, self._where, self.options.url)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self._where} is closed")

    # --- notifications -----------------------------------------------------------------

    def _notify(self, state: GroupState) -> None:
        """After COMMIT, outside the transaction: one coalesced NOTIFY per channel."""
        if self._listener is None:
            self.change_hub.publish(state.changed)  # notify=off: this process's writes only
            return
        if not (state.ready_names or state.cancelled or state.changed):
            return
        ready, cancel = channels(self.options.channel_tag)
        messages = [(ready, p) for p in payloads(state.ready_names)] if state.ready_names else []
        messages += [(cancel, p) for p in payloads(state.cancelled)] if state.cancelled else []
        change = change_channel(self.options.channel_tag)
        messages += [(change, p) for p in payloads(state.changed)] if state.changed else []
        params = {"channels": [c for c, _ in messages], "payloads": [p for _, p in messages]}
        try:
            with self._pool.connection() as conn:
                conn.execute(Q["notify"], params)  # all of them in one statement
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            # Polling covers for it: a lost notification only delays.
            log.info("notification not sent (%s)", exc)

    def subscribe(
        self,
        names: Collection[str],
        *,
        on_ready: Callable[[], None],
        on_cancel: Callable[[str], None],
    ) -> Callable[[], None]:
        """Wake-ups for a worker on the calling event loop (LISTEN/NOTIFY).

        ``on_ready()`` runs when tasks with one of ``names`` may have become ready,
        ``on_cancel(task_id)`` when a task was cancelled. Both are hints: the worker's
        polling stays the guarantee. Returns the function that unsubscribes. With
        ``notify=off`` it subscribes to nothing.
        """
        if self._listener is None:
            return lambda: None
        return self._listener.subscribe(names, on_ready, on_cancel)

    def _start_changes(self) -> int | None:
        """The change feed: task ids NOTIFYed after COMMIT by every process."""
        if self._listener is not None:
            self._listener.feed(self.change_hub)
        return None

    @property
    def listening(self) -> bool:
        """Whether the LISTEN connection is up (tests wait for it before they notify)."""
        return self._listener is not None and self._listener.connected.is_set()

    # --- the one statement claim ----------------------------------------------------------

    async def claim(
        self, names: Collection[str], *, worker: str, lease_seconds: float, limit: int = 1
    ) -> Sequence[Task]:
        wanted, lease = self._claim_request(names, worker, lease_seconds)
        if not wanted or limit < 1:
            return []
        count = min(limit, MAX_CLAIM_BATCH)
        return await self._write(
            Op(lambda tx: tx.claim(wanted, self._now(), worker, lease, count), picks=Picks.READY),
            "claim",
        )

    # --- administration ----------------------------------------------------------------

    async def close(self) -> None:
        # Let queued calls finish first: a caller awaiting one must get its answer.
        loop = _current_loop()
        for lane in list(self._lanes.values()):
            if lane.loop is loop:
                await lane.drain()
        await anyio.to_thread.run_sync(self.close_sync)

    def close_sync(self) -> None:
        """Close the pool and the LISTEN connection. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        self._threads.shutdown(wait=True)
        self._pool.close()


def _start_over(pool: psycopg_pool.ConnectionPool[Any]) -> None:
    """The pool gave up reconnecting (after :data:`RECONNECT_WINDOW`): while calls wait
    for a connection, try again at once (``check`` lets an empty pool grow); with none
    waiting, the next call starts the next attempt."""
    if pool.get_stats().get("requests_waiting"):
        pool.check()


def _current_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover
        return None


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """Roll back whatever is open; a broken connection has nothing to roll back."""
    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute(b"ROLLBACK")
    except psycopg.Error:
        pass
