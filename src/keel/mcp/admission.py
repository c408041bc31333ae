"""Admission of new old-protocol sessions: a rate, a queue and a bound on openings in
progress, in front of the SDK.

A 2025-11-25 client opens a session with a request that carries no ``Mcp-Session-Id``;
the SDK's session manager then builds a transport and a server task for it and parses
the request (about 3 ms of CPU an ``initialize``, 1 ms a refusal at the session limit),
on the same event loop that answers every other client. A flood of such requests
therefore slows everyone, however many the session limit refuses. So before the SDK
sees one, :class:`SessionAdmission` makes it take its turn (:class:`SessionGate`):

* a **rate** of new sessions (:class:`TokenBucket`: ``rate`` a second, ``burst`` at
  once after a quiet spell); every session-opening request takes a token, whether the
  SDK then opens its session or refuses it at the session limit, so a client that
  keeps asking is slowed to the rate whatever it is answered;
* at most ``openings`` such requests **in progress** in the SDK at once;
* requests over the rate **wait**, in order, at most ``queue`` of them: a client that
  sends its next request when the last is answered (every flooder that waits for its
  answers) is slowed to the rate, which costs neither side CPU while it waits. A
  request beyond the queue is refused at once, unread, by a prepared answer (the
  caller's: ``-32052`` with ``Retry-After``, :mod:`keel.mcp.access`);
* once the SDK has refused a session at the session limit (:meth:`SessionGate.found_full`),
  the requests whose turn comes in the next :data:`FULL_RECHECK` seconds are refused
  the same way without the SDK (its refusal costs a millisecond of CPU); the first
  after that asks the SDK again. They still wait for their turn: a refusal at once
  would let a flooder ask again at once, as fast as it can.

Requests of existing sessions and 2026-07-28 requests (which hold no session) never
wait: :func:`opens_session` tells them apart by their headers alone, as the SDK does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import anyio
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "FULL_RECHECK",
    "MONOTONIC",
    "Clock",
    "SessionAdmission",
    "SessionGate",
    "SessionRate",
    "TokenBucket",
    "opens_session",
]

SESSION_RATE = 50.0  # session-opening requests let through a second, by default
SESSION_BURST = 50  # of them at once after a quiet spell
SESSION_QUEUE = 200  # session-opening requests that may wait for their turn
SESSION_OPENINGS = 8  # session-opening requests the SDK serves at once
FULL_RECHECK = 1.0  # seconds a session limit found full is taken to stay full

_SESSION_ID = b"mcp-session-id"
_PROTOCOL_VERSION = b"mcp-protocol-version"
_HANDSHAKE = frozenset(v.encode("latin-1") for v in HANDSHAKE_PROTOCOL_VERSIONS)


def opens_session(scope: Scope) -> bool:
    """Whether the SDK's session manager (stateful mode) would open a session for this
    HTTP request: one without ``Mcp-Session-Id`` whose ``MCP-Protocol-Version`` is
    absent or a handshake version (2025-11-25 and before). Any other version
    (2026-07-28, or one the SDK does not know) goes to its sessionless entry.

    The SDK decides on the first ``mcp-protocol-version`` header and on whether any
    ``mcp-session-id`` is present (``StreamableHTTPSessionManager._handle_request``);
    this reads the same headers the same way.
    """
    version: bytes | None = None
    for name, value in scope.get("headers", ()):
        if name == _SESSION_ID:
            return False
        if name == _PROTOCOL_VERSION and version is None:
            version = value
    return version is None or version in _HANDSHAKE


@dataclass(frozen=True, slots=True)
class SessionRate:
    """How fast new 2025-11-25 sessions may be opened (``keel serve --session-*``)."""

    rate: float = SESSION_RATE
    """New sessions a second (tokens added to the bucket)."""
    burst: int = SESSION_BURST
    """Sessions that may open at once after a quiet spell (the bucket's size)."""
    queue: int = SESSION_QUEUE
    """Session-opening requests that may wait for their turn; more are refused."""
    openings: int = SESSION_OPENINGS
    """Session-opening requests the SDK serves at once."""

    @property
    def drain_seconds(self) -> float:
        """How long a full queue takes to drain at the rate (what a refused client is
        told to wait), at least a second."""
        return max(1.0, math.ceil(self.queue / self.rate))

    def describe(self) -> str:
        """One line for ``keel serve``'s startup message."""
        return (
            f"  new 2025-11-25 sessions: {self.rate:g} a second (bursts of {self.burst}), "
            f"{self.openings} opening at once, {self.queue} more may wait"
        )


class Clock(Protocol):
    """The time the gate reads and waits on (tests give a manual one)."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once :meth:`now` has reached ``deadline``."""
        ...


class _Monotonic:
    """:func:`time.monotonic`, waited on with :func:`anyio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.monotonic()))


MONOTONIC: Clock = _Monotonic()


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` kept; it starts full."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.last = now

    def take(self, now: float) -> float:
        """Take a token at time ``now``: 0.0 if one was there, else (nothing taken) the
        seconds until one will be."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = max(self.last, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class SessionGate:
    """Whose turn it is to open a session: a token of the rate and a place among the
    openings in progress, given in order of arrival, to at most ``queue`` waiting."""

    def __init__(self, limits: SessionRate, clock: Clock = MONOTONIC) -> None:
        self.limits, self.clock = limits, clock
        self.bucket = TokenBucket(limits.rate, limits.burst, clock.now())
        self.waiting = 0  # requests inside enter(), their turn not yet come
        self.in_progress = 0  # requests let through and not yet answered
        self._turn = anyio.Lock()  # FIFO: the first in line takes the next token
        self._slots = anyio.Semaphore(limits.openings)
        self._full_until = -math.inf  # clock time until which the session limit is full

    def found_full(self) -> None:
        """The SDK refused a session at the session limit: take the limit as full for
        :data:`FULL_RECHECK` seconds."""
        self._full_until = self.clock.now() + FULL_RECHECK

    @property
    def full(self) -> bool:
        """Whether the session limit was found full less than :data:`FULL_RECHECK` ago."""
        return self.clock.now() < self._full_until

    async def enter(self) -> bool:
        """Wait for this request's turn (none when nobody is waiting and a token and a
        place are free); False, at once, when ``queue`` requests are waiting already.
        After True, :meth:`leave` once the request is answered."""
        if not self.waiting and self._now():
            self.in_progress += 1
            return True
        if self.waiting >= self.limits.queue:
            return False
        self.waiting += 1
        try:
            async with self._turn:
                await self._slots.acquire()
                try:
                    while (delay := self.bucket.take(self.clock.now())) > 0.0:
                        await self.clock.sleep_until(self.clock.now() + delay)
                except BaseException:
                    self._slots.release()
                    raise
        finally:
            self.waiting -= 1
        self.in_progress += 1
        return True

    def _now(self) -> bool:
        """Take a place and a token if both are free now (neither, else)."""
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            return False
        if self.bucket.take(self.clock.now()) > 0.0:
            self._slots.release()
            return False
        return True

    def leave(self) -> None:
        """A request let through by :meth:`enter` has been answered."""
        self.in_progress -= 1
        self._slots.release()


class SessionAdmission:
    """ASGI middleware: requests to the MCP endpoint at ``path`` that would open a
    2025-11-25 session (:func:`opens_session`) pass through ``gate`` first; those beyond
    its queue get ``queue_full``, and those whose turn comes while the session limit is
    known to be full get ``sessions_full`` (ASGI apps, prepared once), their body unread.
    Every other request passes at once."""

    def __init__(
        self,
        app: ASGIApp,
        gate: SessionGate,
        path: str,
        *,
        queue_full: ASGIApp,
        sessions_full: ASGIApp,
    ) -> None:
        self.app, self.gate, self.path = app, gate, path
        self.queue_full, self.sessions_full = queue_full, sessions_full

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or not opens_session(scope):
            await self.app(scope, receive, send)
            return
        if not await self.gate.enter():
            await self.queue_full(scope, receive, send)
            return
        try:
            await (self.sessions_full if self.gate.full else self.app)(scope, receive, send)
        finally:
            self.gate.leave()
