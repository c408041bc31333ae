"""Ingest on several cores: worker processes read the trace files, the index stores them.

:func:`read_in_workers` starts worker processes and hands them tasks in file order: a
whole file, or a byte range of a large file cut just after a newline, read as JSON lines
(:func:`~keel.bridge.otlp.read_lines`; a file whose ranges are not only whole requests,
one per line, is read whole instead, and what was stored of it is taken back). A worker
writes the rows of a task into a small SQLite file of its own (``keel.bridge.loading``),
with their per-minute aggregates, and the parent's :class:`Sink` copies these parts into
the index in file order, in C (``INSERT … SELECT``), while the workers read on. At most a
few tasks run ahead of the copy, so memory and disk stay bounded whatever the export's
size, one multi-GB file included.

A worker is a fresh interpreter (``python -c``) running :func:`worker_main`: the caller's
``__main__`` is never imported again, guarded or not. It reads its tasks from a pipe and
writes its messages (pickles, framed by their length) to another. Failures are bounded:

- a worker that dies (killed, out of memory) or raises stops the ingest at once with
  :class:`~keel.bridge.errors.IngestWorkerFailed`; a malformed file is the
  :class:`~keel.bridge.errors.MalformedSource` a single process would raise (the first
  such file in order);
- leaving :func:`read_in_workers` in any way (an error, Ctrl-C, ``SystemExit`` from a
  SIGTERM handler) kills the workers and waits for them; workers ignore SIGINT (a
  terminal sends it to the whole process group) and leave it to the parent;
- a worker whose parent is gone (killed outright) exits at once: its task pipe closes.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import pickle
import queue
import selectors
import signal
import struct
import subprocess
import sys
import threading
import traceback
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from keel.bridge.errors import IngestWorkerFailed, MalformedSource
from keel.bridge.loading import SQL, Names, Stats, accumulate, open_for_load
from keel.bridge.otlp import WHOLE_LIMIT, NotLines, Row, read_lines, read_spans

__all__ = [
    "RANGE_BYTES",
    "Part",
    "Sink",
    "default_processes",
    "read_in_workers",
    "worker_main",
]

RANGE_BYTES = 32 << 20  # a larger file is read in byte ranges of about this size
PART_ROWS = 200_000  # rows per part file when a worker reads a (large) file whole
BATCH_ROWS = 20_000  # rows a worker inserts at a time
WORKER_CACHE_KIB = 16 << 10  # a worker's SQLite page cache, at most
EXIT_WAIT = 10.0  # seconds to wait for a worker to exit before it is killed
_FRAME = struct.Struct("<I")  # a message's length, before its pickle
_ENTRY = "from keel.bridge.parallel import worker_main; worker_main()"
_SRC = str(Path(__file__).resolve().parents[2])  # where this keel was imported from


def default_processes() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class Task:
    """Read ``path`` (the ``file``-th file) from byte ``start`` to ``end``: as JSON lines
    (``lines``) or, from 0 to its end, whole as ``read_spans`` reads it."""

    id: int
    file: int
    path: Path
    start: int
    end: int
    lines: bool
    folder: Path  # where the task's part files go


@dataclass(frozen=True, slots=True)
class Part:
    """A worker's SQLite file of a task's rows (the index's ``spans`` table), in order."""

    task: int
    path: Path
    rows: int
    stats: Stats
    names: Names
    consumed: int  # bytes of the file read up to the end of this part


@dataclass(frozen=True, slots=True)
class _Ended:
    """A task is over: ``refused`` (a range that is not JSON lines: read the file whole),
    ``malformed`` (the file's error: path, reason, line), or ``failed`` (a traceback)."""

    task: int
    refused: bool = False
    malformed: tuple[str, str, int | None] | None = None
    failed: str | None = None


Message = Part | _Ended


class Sink(Protocol):
    """Where the parts go, in file order (``keel.bridge.index`` stores them)."""

    def part(self, file: int, part: Part) -> None:
        """Store a part's rows after those stored so far, and delete its file."""

    def restart(self, file: int) -> None:
        """Take back the rows of ``file`` stored so far: it is read again, whole."""

    def done(self, file: int) -> None:
        """Every row of ``file`` is stored."""


def plan(files: Sequence[Path], folder: Path, range_bytes: int) -> list[Task]:
    """The tasks of reading ``files``: a file of more than 1.5 ``range_bytes`` in ranges of
    about ``range_bytes`` (cut after a newline), any other whole."""
    tasks: list[Task] = []
    for n, path in enumerate(files):
        size = path.stat().st_size
        cuts = [0]
        with path.open("rb") as file:
            while cuts[-1] + range_bytes * 3 // 2 < size:
                cut = _after_newline(file, cuts[-1] + range_bytes)
                if cut is None or cut >= size:
                    break  # no line end soon: the rest is one task
                cuts.append(cut)
        cuts.append(size)
        for start, end in itertools.pairwise(cuts):
            tasks.append(Task(len(tasks), n, path, start, end, len(cuts) > 2, folder))
    return tasks


def _after_newline(file: IO[bytes], at: int) -> int | None:
    """The position just after the first newline at or after ``at``, if one comes within
    :data:`~keel.bridge.otlp.WHOLE_LIMIT` bytes (a longer line is no request of JSON lines
    anyway: a single multi-GB request is not scanned to its end here)."""
    file.seek(at)
    scanned = 0
    while scanned < WHOLE_LIMIT and (block := file.read(1 << 16)):
        found = block.find(b"\n")
        if found >= 0:
            return at + scanned + found + 1
        scanned += len(block)
    return None


def read_in_workers(
    files: Sequence[Path], sink: Sink, *, processes: int, folder: Path, range_bytes: int
) -> None:
    """Read ``files`` in ``processes`` worker processes into ``sink`` (see the module).

    Raises:
        MalformedSource: a file that is not OTLP/JSON (the first in order).
        IngestWorkerFailed: a worker died or failed.
    """
    tasks = plan(files, folder, range_bytes)
    with _Workers(min(processes, len(tasks))) as workers:
        _Schedule(tasks, sink, workers, window=2 * processes + 2).run()


# --- in the parent ------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen[bytes]
    task: int | None = None  # the task it is reading
    buffer: bytearray = field(default_factory=bytearray)  # bytes of a message not all here
    inbox: deque[Message] = field(default_factory=deque)


class _Workers:
    """The worker processes, their pipes, and who is busy."""

    def __init__(self, count: int) -> None:
        self.count = max(1, count)
        self.workers: list[_Worker] = []
        self.selector = selectors.DefaultSelector()

    def __enter__(self) -> _Workers:
        # This keel first on the path, whatever the caller did to sys.path; -P: never the
        # current directory's modules in its place.
        path = os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        try:
            for _ in range(self.count):
                process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                    [sys.executable, "-P", "-c", _ENTRY],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                )
                worker = _Worker(process)
                self.workers.append(worker)
                assert process.stdout is not None
                self.selector.register(process.stdout.fileno(), selectors.EVENT_READ, worker)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        for worker in self.workers:
            if kind is not None:  # leaving on an error: no reason to let them finish
                worker.process.kill()
            with contextlib.suppress(OSError):
                assert worker.process.stdin is not None
                worker.process.stdin.close()  # a worker exits when its task pipe closes
        for worker in self.workers:
            try:
                worker.process.wait(EXIT_WAIT)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            assert worker.process.stdout is not None
            worker.process.stdout.close()
        self.selector.close()

    def idle(self) -> list[_Worker]:
        return [w for w in self.workers if w.task is None]

    def send(self, worker: _Worker, task: Task) -> None:
        body = pickle.dumps(task)
        assert worker.process.stdin is not None
        try:
            worker.process.stdin.write(_FRAME.pack(len(body)) + body)
            worker.process.stdin.flush()
        except OSError:
            raise self._died(worker) from None
        worker.task = task.id

    def receive(self) -> tuple[_Worker, Message]:
        """The next message of any worker (waiting for one)."""
        while True:
            for worker in self.workers:
                if worker.inbox:
                    return worker, worker.inbox.popleft()
            for key, _ in self.selector.select():
                worker = key.data
                data = os.read(key.fd, 1 << 20)
                if not data:
                    raise self._died(worker)
                worker.buffer += data
                while len(worker.buffer) >= _FRAME.size:
                    (size,) = _FRAME.unpack_from(worker.buffer)
                    if len(worker.buffer) < _FRAME.size + size:
                        break
                    body = bytes(worker.buffer[_FRAME.size : _FRAME.size + size])
                    del worker.buffer[: _FRAME.size + size]
                    worker.inbox.append(pickle.loads(body))  # noqa: S301 - our own worker's

    def _died(self, worker: _Worker) -> IngestWorkerFailed:
        try:
            code = worker.process.wait(EXIT_WAIT)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}" if code is not None else "closed its pipe"
        return IngestWorkerFailed(
            f"trace ingest stopped: worker process {worker.process.pid} {how}; "
            "the index was left as it was"
        )


class _Schedule:
    """Which worker reads which task, and the parts stored in file order as they come."""

    def __init__(self, tasks: list[Task], sink: Sink, workers: _Workers, window: int) -> None:
        self.order = list(tasks)  # tasks not yet stored, in file order
        self.tasks = {t.id: t for t in tasks}  # every task, dropped ones too
        self.sink, self.workers, self.window = sink, workers, window
        self.given: set[int] = set()
        self.inbox: dict[int, deque[Message]] = {}  # messages of a task, to store in order
        self.ended: set[int] = set()
        self.dropped: set[int] = set()  # tasks of a file read again whole: parts discarded
        self.next_id = len(tasks)

    def run(self) -> None:
        while self.order:
            for worker in self.workers.idle():
                # The first tasks in order only: the head is always among them, so the
                # store never waits for a task no worker was given.
                task = next((t for t in self.order[: self.window] if t.id not in self.given), None)
                if task is None:
                    break
                self.given.add(task.id)
                self.workers.send(worker, task)
            worker, message = self.workers.receive()
            self._take(worker, message)
            self._store()

    def _take(self, worker: _Worker, message: Message) -> None:
        if isinstance(message, _Ended):
            worker.task = None
            if message.failed is not None:
                path = self.tasks[message.task].path
                error = message.failed.strip().splitlines()[-1]  # the exception, one line
                raise IngestWorkerFailed(
                    f"trace ingest stopped: a worker process failed reading {path}: "
                    f"{error}; the index was left as it was",
                    detail=message.failed,
                )
            self.ended.add(message.task)
        if message.task in self.dropped:
            if isinstance(message, Part):
                message.path.unlink(missing_ok=True)
        elif isinstance(message, _Ended) and message.refused:
            self._whole(self.tasks[message.task])
        else:
            self.inbox.setdefault(message.task, deque()).append(message)

    def _store(self) -> None:
        while self.order:
            head = self.order[0]
            inbox = self.inbox.pop(head.id, deque())
            for message in inbox:
                if isinstance(message, Part):
                    self.sink.part(head.file, message)
                elif message.malformed is not None:
                    raise MalformedSource(*message.malformed)
            if head.id not in self.ended:
                return
            self.order.pop(0)
            if not self.order or self.order[0].file != head.file:
                self.sink.done(head.file)

    def _whole(self, refused: Task) -> None:
        """Read the file of a refused range again, whole: drop its ranges and their parts,
        take back what was stored of it."""
        mine = [t for t in self.order if t.file == refused.file]
        for task in mine:
            self.dropped.add(task.id)
            for message in self.inbox.pop(task.id, ()):
                if isinstance(message, Part):
                    message.path.unlink(missing_ok=True)
        at = self.order.index(mine[0])
        self.order = [t for t in self.order if t.file != refused.file]
        end = max(t.end for t in mine)
        whole = Task(self.next_id, refused.file, refused.path, 0, end, False, refused.folder)
        self.order.insert(at, whole)
        self.tasks[whole.id] = whole
        self.next_id += 1
        self.sink.restart(refused.file)


# --- in a worker --------------------------------------------------------------------


def worker_main() -> None:
    """A worker process: tasks from stdin, messages to stdout, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    gc.disable()  # a worker makes no reference cycles; collecting would only cost time
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to stderr, never into the messages
    tasks: queue.SimpleQueue[Task] = queue.SimpleQueue()
    threading.Thread(target=_listen, args=(sys.stdin.buffer, tasks), daemon=True).start()
    while True:
        task = tasks.get()
        for message in _messages(task):
            body = pickle.dumps(message)
            out.write(_FRAME.pack(len(body)) + body)
            out.flush()


def _listen(stream: IO[bytes], tasks: queue.SimpleQueue[Task]) -> None:
    """Pass the parent's tasks on; when the pipe closes (the parent is done, or gone),
    end the process, even in the middle of a task."""
    try:
        while len(head := stream.read(_FRAME.size)) == _FRAME.size:
            (size,) = _FRAME.unpack(head)
            tasks.put(pickle.loads(stream.read(size)))  # noqa: S301 - from our own parent
    finally:
        os._exit(0)


class _PartFile:
    """One part file being written."""

    def __init__(self, task: Task, number: int) -> None:
        self.task = task
        self.path = task.folder / f"{task.id}-{number}.db"
        self.conn = open_for_load(self.path, WORKER_CACHE_KIB)
        self.conn.execute("BEGIN")
        self.rows = 0
        self.pending: list[Row] = []
        self.stats: Stats = {}
        self.names: Names = {}

    def add(self, rows: list[Row]) -> None:
        accumulate(self.stats, self.names, rows)
        self.pending.extend(rows)
        self.rows += len(rows)
        if len(self.pending) >= BATCH_ROWS:
            self.conn.executemany(SQL["insert_span"], self.pending)
            self.pending = []

    def close(self, consumed: int) -> Part:
        self.conn.executemany(SQL["insert_span"], self.pending)
        self.conn.execute("COMMIT")
        self.conn.close()
        return Part(self.task.id, self.path, self.rows, self.stats, self.names, consumed)

    def discard(self) -> None:
        self.conn.close()
        self.path.unlink(missing_ok=True)


def _trace() -> str:
    return traceback.format_exc()


def _messages(task: Task) -> Iterator[Message]:
    """Read a task: its parts, then how it ended."""
    part: _PartFile | None = None
    parts = 0
    reached = [task.start]  # bytes of the file read so far (read_spans tells)
    try:
        if task.lines:
            batches = read_lines(task.path, task.start, task.end)
        else:
            batches = read_spans(task.path, reached.append)
        for rows in batches:
            if part is None:
                part = _PartFile(task, parts)
                parts += 1
            part.add(rows)
            if part.rows >= PART_ROWS:
                yield part.close(reached[-1] if not task.lines else task.end)
                part = None
        if part is not None:
            yield part.close(task.end)
            part = None
        yield _Ended(task.id)
    except NotLines:
        yield _Ended(task.id, refused=True)  # read whole, the file tells what is wrong
    except MalformedSource as exc:
        yield _Ended(task.id, malformed=(str(exc.path), exc.reason, exc.line))
    except OSError:  # a range cannot be read: read whole, the file tells why
        yield _Ended(task.id, refused=True) if task.lines else _Ended(task.id, failed=_trace())
    except Exception:  # anything else is a bug or the disk: the parent reports it
        yield _Ended(task.id, failed=_trace())
    finally:
        if part is not None:
            part.discard()
