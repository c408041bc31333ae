"""A loopback TCP proxy in front of PostgreSQL that can lose the answer to a COMMIT.

Clients connect to ``127.0.0.1:proxy.port``; every byte goes on to the real server and
back, unchanged, until the proxy is *armed*. Then the next COMMIT of a transaction that
wrote something (an ``INSERT``, ``UPDATE`` or ``DELETE`` since its ``BEGIN``) is
forwarded to the server, which commits it, but the server's answer is swallowed: the
proxy reads it up to ``ReadyForQuery``, notes the command tag (``COMMIT``: the write is
durable) and closes both sides. The client sees its connection break while waiting for
the answer to COMMIT — the one case where it cannot know whether its write happened.

It speaks just enough of the PostgreSQL protocol (v3) for that: it answers ``N`` to
SSL/GSS encryption requests (so the traffic stays readable), then reads typed messages
in both directions. COMMITs are recognised in simple queries (``Q``) and in the
extended protocol (``P``/``B``/``E``), where a prepared statement executed by name is
looked up in the statements the connection parsed earlier.

It runs in a thread of its own with its own event loop, so it works whatever the client
(threads, asyncio, other processes) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import threading
from dataclasses import dataclass, field

__all__ = ["CommitDropProxy"]

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
_WRITE = re.compile(
    r"\b(INSERT\s+INTO|DELETE\s+FROM|UPDATE\s+[\w.\"]+(\s+(AS\s+)?\w+)?\s+SET)\b", re.I
)
_COMMIT = re.compile(r"^\s*(COMMIT|END)\s*(TRANSACTION|WORK)?\s*;?\s*$", re.I)
_ROLLBACK = re.compile(r"^\s*(ROLLBACK|ABORT)\b", re.I)
ANSWER_TIMEOUT = 10.0  # seconds to wait for the server's answer to a swallowed COMMIT


def _cstr(body: bytes, start: int) -> tuple[str, int]:
    end = body.index(b"\0", start)
    return body[start:end].decode("utf-8", "replace"), end + 1


@dataclass
class _Conn:
    """What the proxy knows of one client connection."""

    statements: dict[str, str] = field(default_factory=dict)
    portals: dict[str, str] = field(default_factory=dict)
    wrote: bool = False  # the open transaction sent a write
    dropping: bool = False  # a COMMIT was swallowed: nothing more reaches the client


class CommitDropProxy:
    """``CommitDropProxy(host, port)``: start with :meth:`start`, stop with :meth:`close`."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._armed = 0
        self._lock = threading.Lock()
        self.swallowed: list[str] = []
        """Command tags of the COMMITs whose answers were swallowed (``COMMIT`` = done)."""
        self.swallowed_sql: list[list[str]] = []
        """The statements of each swallowed transaction, for failure messages."""
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    # --- control, from the test's thread ------------------------------------------------

    def start(self) -> CommitDropProxy:
        self._thread = threading.Thread(target=self._run, name="commit-drop-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def arm(self, times: int = 1) -> None:
        """Swallow the answers to the next ``times`` COMMITs of writing transactions."""
        with self._lock:
            self._armed += times

    @property
    def armed(self) -> int:
        with self._lock:
            return self._armed

    def close(self) -> None:
        loop = self._loop
        if loop is not None and self._thread is not None:
            loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(10)

    # --- the event loop's side ------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        async with self._server:
            await self._stop_event.wait()
            self._server.close()
            # End the open connections ourselves, so that none is cancelled half way.
            for writer in list(self._writers):
                writer.close()
            while self._handlers:
                await asyncio.gather(*self._handlers, return_exceptions=True)

    def _take_arm(self) -> bool:
        with self._lock:
            if self._armed > 0:
                self._armed -= 1
                return True
            return False

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        self._writers.add(cw)
        try:
            sr, sw = await asyncio.open_connection(*self.upstream)
        except OSError:  # the server is down: so is this connection
            cw.close()
            self._writers.discard(cw)
            self._handlers.discard(me)
            return
        self._writers.add(sw)
        try:
            if not await self._startup(cr, cw, sw):
                return
            conn = _Conn()
            sent: list[str] = []
            up = asyncio.ensure_future(self._client_to_server(cr, sw, conn, sent))
            down = asyncio.ensure_future(self._server_to_client(sr, cw, conn))
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
        finally:
            for writer in (cw, sw):
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
                self._writers.discard(writer)
            self._handlers.discard(me)

    async def _startup(
        self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter, sw: asyncio.StreamWriter
    ) -> bool:
        """Pass the untyped startup packet on; refuse encryption requests ourselves."""
        while True:
            try:
                head = await cr.readexactly(8)
            except asyncio.IncompleteReadError:
                return False
            length, code = struct.unpack("!ii", head)
            rest = await cr.readexactly(length - 8)
            if code in {SSL_REQUEST, GSSENC_REQUEST}:
                cw.write(b"N")  # "no encryption here": the client goes on in the clear
                await cw.drain()
                continue
            sw.write(head + rest)
            await sw.drain()
            return True

    async def _client_to_server(
        self, cr: asyncio.StreamReader, sw: asyncio.StreamWriter, conn: _Conn, sent: list[str]
    ) -> None:
        while True:
            try:
                head = await cr.readexactly(5)
            except asyncio.IncompleteReadError:
                return
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await cr.readexactly(length - 4)
            for sql in self._statements(kind, body, conn):
                sent.append(sql)
                if _WRITE.search(sql):
                    conn.wrote = True
                elif _ROLLBACK.match(sql):
                    conn.wrote = False
                    sent.clear()
                elif _COMMIT.match(sql):
                    if conn.wrote and not conn.dropping and self._take_arm():
                        # Before it is sent: its answer must not get through.
                        conn.dropping = True
                        with self._lock:
                            self.swallowed_sql.append(list(sent))
                    conn.wrote = False
                    sent.clear()
            sw.write(head + body)
            await sw.drain()

    @staticmethod
    def _statements(kind: bytes, body: bytes, conn: _Conn) -> list[str]:
        """The SQL that this client message runs (or prepares to run)."""
        if kind == b"Q":
            text, _ = _cstr(body, 0)
            return [s for s in text.split(";") if s.strip()]
        if kind == b"P":
            name, at = _cstr(body, 0)
            text, _ = _cstr(body, at)
            conn.statements[name] = text
            return []
        if kind == b"B":
            portal, at = _cstr(body, 0)
            name, _ = _cstr(body, at)
            conn.portals[portal] = conn.statements.get(name, "")
            return []
        if kind == b"E":
            portal, _ = _cstr(body, 0)
            text = conn.portals.get(portal, "")
            return [text] if text else []
        return []

    async def _server_to_client(
        self,
        sr: asyncio.StreamReader,
        cw: asyncio.StreamWriter,
        conn: _Conn,
    ) -> None:
        tag: str | None = None
        while True:
            try:
                if conn.dropping:
                    head = await asyncio.wait_for(sr.readexactly(5), ANSWER_TIMEOUT)
                else:
                    head = await sr.readexactly(5)
            except (asyncio.IncompleteReadError, TimeoutError):
                if conn.dropping:
                    self._record(tag or "no answer")
                return
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await sr.readexactly(length - 4)
            if not conn.dropping:
                cw.write(head + body)
                await cw.drain()
                continue
            if kind == b"C":
                command, _ = _cstr(body, 0)
                if tag is None and command.split()[0] in {"COMMIT", "ROLLBACK"}:
                    tag = command
            elif kind == b"E" and tag is None:
                tag = "error: " + body.decode("utf-8", "replace").replace("\0", " ")
            elif kind == b"Z" and tag is not None:
                # The server answered the COMMIT and is idle: drop the connection now.
                self._record(tag)
                return

    def _record(self, tag: str) -> None:
        with self._lock:
            self.swallowed.append(tag)
