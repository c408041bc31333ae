"""Real-process helpers for the integration tier: start a helper script with this
interpreter, read its stdout line by line with a deadline, and always reap it.

Helper scripts live next to the tests (``_*.py``) and import nothing but ``keel`` and the
standard library, so they run as ``sys.executable script.py`` from the project's venv.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

HERE = Path(__file__).parent
STARTUP_TIMEOUT = 60.0  # seconds a helper may take to import keel and open its store
EXIT_TIMEOUT = 60.0  # seconds a helper may take to finish once told to


class Child:
    """One helper script running in its own OS process.

    stdout is a pipe read by a thread into a queue (so waits can have a deadline);
    stderr goes to a file that failures quote.
    """

    def __init__(
        self, script: str, args: Sequence[str], workdir: Path, tag: str, pycache: Path
    ) -> None:
        self.stderr_path = workdir / f"{tag}.stderr"
        self._stderr = self.stderr_path.open("wb")
        self._lines: queue.Queue[str | None] = queue.Queue()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        # Children compile keel and its dependencies once per session, into a folder of
        # our own: the crash test starts sixty of them and imports dominate their startup.
        env.update(PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=str(pycache))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=workdir,
            env=env,
            text=True,
        )
        self.pid = self.proc.pid
        self._reader = threading.Thread(target=self._pump, name=f"{tag}-stdout", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # EOF

    def expect(self, word: str, timeout: float = STARTUP_TIMEOUT) -> str:
        """Wait (at most ``timeout`` seconds) for the next stdout line; it must start
        with ``word``. Returns the rest of the line."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"pid {self.pid}: no {word!r} line within {timeout}s\n{self.stderr()}"
            ) from None
        if line is None or not line.startswith(word):
            raise AssertionError(
                f"pid {self.pid}: expected {word!r}, got {line!r}\n{self.stderr()}"
            )
        return line[len(word) :].strip()

    def send(self, text: str) -> None:
        """Write one line to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> int:
        """SIGKILL the child and reap it; returns its exit status."""
        os.kill(self.pid, signal.SIGKILL)
        return self.wait()

    def wait(self, timeout: float = EXIT_TIMEOUT) -> int:
        """Reap the child (bounded) and release its pipes and reader thread."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:  # still running after the timeout: do not leak it
                self.proc.kill()
                self.proc.wait()
            self._release()
        return code

    def _release(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # the child is gone: nothing to flush
                self.proc.stdin.close()
        self._reader.join(timeout=EXIT_TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def stderr(self) -> str:
        """What the child wrote to stderr so far (for failure messages)."""
        text = self.stderr_path.read_text(errors="replace")
        return f"--- stderr of pid {self.pid} ---\n{text[-4000:]}" if text else ""


@pytest.fixture(scope="session")
def child_pycache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where helper processes cache bytecode (never inside the repository or the venv)."""
    return tmp_path_factory.mktemp("pycache")


@pytest.fixture
def spawn(tmp_path: Path, child_pycache: Path) -> Iterator[Spawner]:
    """Start helper scripts; any child still alive at teardown is killed and reaped."""
    spawner = Spawner(tmp_path, child_pycache)
    yield spawner
    spawner.reap_all()


class Spawner:
    """Starts :class:`Child` processes in the test's temporary folder and remembers them."""

    def __init__(self, workdir: Path, pycache: Path) -> None:
        self.workdir = workdir
        self.pycache = pycache
        self.children: list[Child] = []

    def __call__(self, script: str, *args: str, tag: str) -> Child:
        child = Child(script, args, self.workdir, tag, self.pycache)
        self.children.append(child)
        return child

    def reap_all(self) -> None:
        for child in self.children:
            if child.proc.returncode is None:
                if child.proc.poll() is None:
                    child.proc.kill()
                child.wait()
