"""Real ``keel worker`` processes for the acceptance tests: start one, wait until it is
ready, SIGKILL or SIGTERM it, and always reap it.

A worker runs the console script next to this interpreter, from this folder (so that
``--app steps_app:app`` imports), on the test's SQLite file, with a ``--worker-id`` chosen
by the test: history names that id, so a test can tell which process ran which attempt.
Its stderr (the ready line and ``-v`` logs) is copied to a file that failures quote.

:class:`LoggedProcess` starts a process from this folder, copies its output to a log
file and quotes it. (A ``keel serve`` process is a :class:`keel_serve.KeelServe`.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import anyio

APPS = Path(__file__).resolve().parent
KEEL = Path(sys.executable).parent / "keel"
READY_TIMEOUT = 60.0  # seconds a worker may take to import its app and open the store
EXIT_TIMEOUT = 40.0  # seconds a worker may take to exit (it waits up to 30 s for handlers)

T = TypeVar("T")


def worker_env(effects: Path, *, lease: float = 1.5, **extra: str) -> dict[str, str]:
    """The environment of a worker process: the test's, without ``$KEEL_STORE`` (the
    store is given with ``--store``), plus the app's settings."""
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    env.update(
        KEEL_TEST_EFFECTS=str(effects),
        KEEL_TEST_LEASE=str(lease),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


class LoggedProcess:
    """A process started from this folder whose output (stdout and stderr) a thread copies
    to ``<logs>/<name>.log``, which failures quote."""

    def __init__(self, argv: list[str], *, name: str, logs: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = logs / f"{name}.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=APPS,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.pid = self.proc.pid
        self._reader = threading.Thread(target=self._pump, name=name, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self._saw(line)

    def _saw(self, line: str) -> None:
        """Called with each line of output once it is in the log."""

    def _close(self, timeout: float) -> None:
        """After the process exited: let the copying thread finish, close the pipe and log."""
        self._reader.join(timeout=timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """What the process wrote so far (for failure messages)."""
        text = self.log_path.read_text(errors="replace")
        return f"--- output of {self.name} (pid {self.pid}) ---\n{text[-4000:]}"


class WorkerProcess(LoggedProcess):
    """One ``keel worker`` process."""

    def __init__(
        self,
        *,
        store: Path | str,
        worker_id: str,
        logs: Path,
        env: Mapping[str, str],
        concurrency: int = 2,
        app: str = "steps_app:app",
    ) -> None:
        self.worker_id = worker_id
        self._ready = threading.Event()
        argv = [
            str(KEEL),
            "worker",
            "--app",
            app,
            "--store",
            str(store),
            "--concurrency",
            str(concurrency),
            "--worker-id",
            worker_id,
            "-v",
        ]
        super().__init__(argv, name=worker_id, logs=logs, env=env)

    def _saw(self, line: str) -> None:
        if line.startswith(f"keel worker {self.worker_id}:"):
            self._ready.set()

    @property
    def ready(self) -> bool:
        """Whether the worker printed its ready line (its loops run)."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Block (at most ``timeout`` seconds) until the worker's loops run."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.worker_id} exited early\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.worker_id} not ready in {timeout}s\n{self.output()}")

    def kill(self) -> int:
        """SIGKILL the worker and reap it; returns its exit status."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return self.wait()

    def terminate(self, timeout: float = EXIT_TIMEOUT) -> int:
        """SIGTERM the worker (a graceful stop) and reap it; returns its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = EXIT_TIMEOUT) -> int:
        """Reap the worker (bounded: still running after ``timeout``, it is killed)."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._close(EXIT_TIMEOUT)
        return code


@contextlib.contextmanager
def fleet() -> Iterator[list[WorkerProcess]]:
    """A list to put started workers in; any still running at the end is killed and reaped."""
    workers: list[WorkerProcess] = []
    try:
        yield workers
    finally:
        for w in workers:
            if w.proc.returncode is None:
                w.kill()


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, within: float, what: str, every: float = 0.05
) -> T:
    """Poll ``probe`` until it returns something other than None (at most ``within`` s)."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await anyio.sleep(every)
