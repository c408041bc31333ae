"""``keel serve`` over HTTP as a real process, on a loopback port of its own.

``keel serve`` takes a port number, not a listening socket, so the port is picked free
and released before the process binds it, and another process (a parallel test run)
may take it in between. :class:`KeelServe` therefore retries: when the process exits
saying the address is in use, :meth:`KeelServe.ready` starts it again on another port,
up to :data:`TRIES` times. It is ready once its own output says it listens on its port
(uvicorn's "running on" line): a connection that succeeds proves only that *someone*
listens there, possibly the process that took the port.

Every ``keel serve`` the tests start over HTTP is one of these (the acceptance tier's
``Server``, the PostgreSQL tests' ``FrontEnd``, the wire-schema recordings).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

__all__ = ["KEEL", "READY_TIMEOUT", "TRIES", "KeelServe"]

KEEL = Path(sys.executable).parent / "keel"
HOST = "127.0.0.1"
TRIES = 5  # starts on a fresh port before giving up on finding one
READY_TIMEOUT = 60.0  # seconds one start may take to listen
EXIT_TIMEOUT = 30.0  # seconds a SIGTERMed server may take to exit
IN_USE = "address already in use"  # in keel serve's own error line, and uvicorn's


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class KeelServe:
    """``keel serve ARGS --host 127.0.0.1 --port N`` started from ``cwd``; its stdout and
    stderr appended to ``log`` (which failures quote).

    :meth:`start` starts a process (again after :meth:`kill`, on the same port first);
    :meth:`ready` waits until it listens, moving to another port if its was taken.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        log: Path,
        command: str = "serve",
    ) -> None:
        self.command = command
        """The keel command: ``serve``, or ``ops`` (which serves the same way)."""
        self.args = list(args)
        self.cwd = cwd
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self.log_path = log
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._since = 0  # where the current process's output starts in the log

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/mcp"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start a process on :attr:`port` (any previous one must have exited)."""
        assert not self.alive, "the previous keel serve still runs"
        argv = [str(KEEL), self.command, *self.args, "--host", HOST, "--port", str(self.port)]
        with self.log_path.open("ab") as out:
            self._since = out.tell()
            self.process = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def ready(self, within: float = READY_TIMEOUT) -> None:
        """Wait until the process listens on its port (at most ``within`` seconds per
        start). If it exited because the port was taken, start it on another port.

        Raises:
            AssertionError: it exited for another reason, never listened in time, or
                found no free port in :data:`TRIES` starts.
        """
        assert self.process is not None, "start() first"
        for start in range(1, TRIES + 1):
            if await self._listening(within):
                return
            if start == TRIES:
                break
            self.port = _free_port()
            self.start()
        raise AssertionError(f"no free port in {TRIES} starts\n{self.output()}")

    async def _listening(self, within: float) -> bool:
        """True once the current process says it listens on its port; False if it
        exited because the address was in use."""
        assert self.process is not None
        listening = re.compile(rf"running on http://{re.escape(HOST)}:{self.port}\b", re.I)
        deadline = time.monotonic() + within
        while True:
            own = self._own_output()
            if listening.search(own):
                return True
            code = self.process.poll()
            if code is not None:
                if IN_USE in own.lower():
                    return False
                raise AssertionError(f"keel serve exited ({code})\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"keel serve not listening in {within}s\n{self.output()}")
            await anyio.sleep(0.05)  # the log file offers no event to wait on

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=EXIT_TIMEOUT)

    def stop(self, timeout: float = EXIT_TIMEOUT) -> int | None:
        """SIGTERM, then reap (SIGKILLed if it will not go); the exit code, or None if
        nothing was started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def _own_output(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self._since)
            return log.read().decode(errors="replace")

    def output(self) -> str:
        """The end of the log (for failure messages)."""
        text = self.log_path.read_text(errors="replace")
        pid = self.process.pid if self.process is not None else None
        return f"--- output of keel serve (pid {pid}, {self.log_path}) ---\n{text[-4000:]}"
