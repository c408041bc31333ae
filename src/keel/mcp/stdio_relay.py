"""``keel serve --transport stdio``'s stdout, relayed, so a stop knows what was written.

The SDK's stdio transport writes each JSON-RPC message (one line) from a task that calls
``write`` then ``flush`` in worker threads, and offers no event for a message written:
a server cancelled while that task still has a message (or has not yet been handed one)
loses it. A SIGTERM must end each open listen stream with its result as its last frame
(:mod:`keel.mcp.push`), so before it stops serving it must know that those results are
out. :class:`StdoutRelay` knows it without a fixed grace: it points fd 1 at a pipe
before the SDK claims fd 1, and a thread relays the pipe to the real stdout line by
line, noting (once :meth:`~StdoutRelay.watch` was called) the id of each JSON-RPC
answer it has written. :meth:`~StdoutRelay.written` waits until given answers have
been; :meth:`~StdoutRelay.finish` until everything written to the pipe before it has.

If the real stdout is gone (the client closed it), the relay closes the pipe, so the
SDK's next write fails as it would have on stdout itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Collection

__all__ = ["StdoutRelay"]

log = logging.getLogger("keel.mcp.stdio")

CHUNK = 1 << 16  # bytes read from the pipe at a time
END_LINE = b"\x00keel-stdout-relay-end"  # written by finish(); never in JSON text
RequestId = str | int


class StdoutRelay:
    """Relays fd 1 to the real stdout (see the module doc). Create it before the SDK's
    stdio transport claims fd 1; it runs until :meth:`finish` (its thread is a daemon)."""

    def __init__(self) -> None:
        self._stdout = os.dup(1)  # the real stdout
        read, write = os.pipe()
        os.dup2(write, 1)  # fd 1 (what the SDK will claim) is the pipe now
        self._end = write  # kept to write END even after fd 1 was pointed elsewhere
        self._pipe = read
        self._changed = threading.Condition()
        self._watching = False
        self._answered: set[RequestId] = set()
        self._ended = False
        self._thread = threading.Thread(target=self._relay, name="keel-stdout-relay", daemon=True)
        self._thread.start()

    def watch(self) -> None:
        """Note the id of each JSON-RPC answer written from now on."""
        with self._changed:
            self._watching = True

    def written(self, ids: Collection[RequestId], timeout: float) -> bool:
        """Wait (in a thread, at most ``timeout`` s) until the answers to ``ids`` have
        been written to stdout, after :meth:`watch`; whether they all have."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._ended or self._answered.issuperset(ids), timeout
            ) and self._answered.issuperset(ids)

    def finish(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until everything written to the pipe so far has
        been written to stdout, then stop relaying; whether it got there."""
        with contextlib.suppress(OSError):  # the relay has ended: nothing left to wait for
            os.write(self._end, END_LINE + b"\n")
        with self._changed:
            return self._changed.wait_for(lambda: self._ended, timeout)

    def _relay(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self._pipe, CHUNK):
                *lines, pending = (pending + chunk).split(b"\n")
                self._write([line for line in lines if line != END_LINE])
                if END_LINE in lines:
                    break
        except OSError as exc:  # stdout is gone: the server's next write fails as on it
            log.debug("stdout relay ended: %r", exc)
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()
            os.close(self._pipe)

    def _write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        data = memoryview(b"".join(line + b"\n" for line in lines))
        while data:
            data = data[os.write(self._stdout, data) :]
        with self._changed:
            if not self._watching:
                return
            for line in lines:
                answer = _answer_id(line)
                if answer is not None:
                    self._answered.add(answer)
            self._changed.notify_all()


def _answer_id(line: bytes) -> RequestId | None:
    """The id of a JSON-RPC answer (a result or an error), else None."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or not ("result" in message or "error" in message):
        return None
    answer = message.get("id")
    return answer if isinstance(answer, str | int) else None
