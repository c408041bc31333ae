"""The Bridge's trace index: spans from OTLP/JSON files in one SQLite file.

``build_index`` streams the trace files into a new SQLite file beside the index (spans in
batches, per-service per-minute aggregates kept in a dict as it goes, the indexes built
at the end) and swaps it in with one ``os.replace``: a malformed file or a crash leaves
the previous index as it was. Memory is bounded by one batch plus the aggregates
(services x minutes), whatever the size of the files.

``TraceIndex`` answers the queries of the diagnosis and of ``search_traces``; each call
opens its own read-only connection (diagnosis steps run in worker threads).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from keel.bridge.errors import BridgeError, MalformedSource
from keel.bridge.evidence import ScopedSpan
from keel.bridge.loading import SQL, Names, Stats, accumulate, merge, open_for_load
from keel.bridge.otlp import OUTGOING, Row, read_spans
from keel.bridge.parallel import RANGE_BYTES, Part, default_processes, read_in_workers
from keel.bridge.records import NS_PER_MINUTE, Span
from keel.errors import ConfigurationError, StoreError

__all__ = [
    "INDEX_FORMAT",
    "IngestReport",
    "Progress",
    "Reader",
    "TraceIndex",
    "build_index",
    "fingerprint",
]

MAX_SPANS = 300_000  # spans in a diagnosis's windows above which traces are sampled
INDEX_FORMAT = "3"  # bump when the schema changes: an older index is rebuilt
_SQL = SQL


Reader = Callable[[Path, Callable[[int], object] | None], Iterable[list[Row]]]
"""A trace source's reader: the spans of a file in batches, telling the bytes read so
far to the callable given (if any) before each batch."""


class Progress(Protocol):
    """Told how an ingest goes (``keel bridge ingest`` draws a progress bar with it)."""

    def start(self, total_bytes: int) -> None:
        """The ingest begins; its files hold ``total_bytes``."""

    def advance(self, bytes_done: int, spans_read: int) -> None:
        """A batch was stored: ``bytes_done`` of the files were read (the files finished,
        and of the current one what its reader consumed so far)."""


Fingerprint = list[list[str | int]]
"""[[path, size, mtime_ns], …] of the trace files an index was built from."""


def fingerprint(files: Iterable[Path]) -> Fingerprint:
    """What identifies the content of ``files`` cheaply (a stat each)."""
    out: Fingerprint = []
    for path in files:
        st = path.stat()
        out.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    return out


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What one ingest did."""

    files: int
    spans: int  # distinct spans indexed
    bytes: int
    seconds: float
    duplicates: int = 0  # spans read again (same trace and span id) and dropped

    @property
    def spans_per_second(self) -> float:
        return self.spans / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mib_per_second(self) -> float:
        return self.bytes / 2**20 / self.seconds if self.seconds > 0 else float("inf")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_leftovers(dest: Path) -> None:
    """Remove what an ingest into ``dest`` killed outright left (its half-built file and
    its workers' part files), if its process is gone."""
    prefix = f"{dest.name}.building-"
    for leftover in dest.parent.glob(f"{glob.escape(prefix)}*"):
        pid = leftover.name.removeprefix(prefix).removesuffix(".parts")
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or another's process with that pid): left alone
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _drop_duplicates(conn: sqlite3.Connection, stats: Stats) -> int:
    """Delete the second and later copies of each (trace_id, span_id) and recount the
    minutes they were counted in; returns how many were dropped."""
    dropped = conn.execute(_SQL["duplicate_spans"]).fetchall()
    if not dropped:
        return 0
    conn.executemany("DELETE FROM spans WHERE rowid = ?", [(row[0],) for row in dropped])
    for service, minute in {
        (row[1], row[2] // NS_PER_MINUTE) for row in dropped if row[3] not in OUTGOING
    }:
        start = minute * NS_PER_MINUTE
        stats[(service, minute)] = list(
            conn.execute(_SQL["minute_of"], (service, start, start + NS_PER_MINUTE)).fetchone()
        )
    return len(dropped)


class _Ingest:
    """One ingest's state: the connection to the new file, the per-minute aggregates, the
    counts, and who is told how it goes. Spans come either from ``file`` (read here) or,
    read by worker processes, as parts (``keel.bridge.parallel.Sink``)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        files: Sequence[Path],
        log: Callable[[str], object] | None,
        progress: Progress | None,
    ) -> None:
        self.conn, self.files, self.log, self.progress = conn, files, log, progress
        self.began = time.perf_counter()
        self.stats: Stats = {}
        self.names: Names = {}
        self.sources: list[tuple[str, int, int, int]] = []
        self.total = self.done_bytes = self.duplicates = 0
        self.within = 0  # bytes of the current file its reader consumed so far
        self.count = 0  # spans of the current file stored so far (rowids total+1 …)
        self.file_stats: Stats = {}  # the current file's aggregates, from its parts
        self.file_names: Names = {}

    def _consumed(self, at: int) -> None:
        self.within = at

    def _advance(self) -> None:
        if self.progress is not None:
            size = self.files[len(self.sources)].stat().st_size
            done = self.done_bytes + min(self.within, size)
            self.progress.advance(done, self.total + self.count)

    def file(self, path: Path, read: Reader, batch_size: int) -> None:
        """Read and store the spans of one file, in batches."""
        pending: list[Row] = []
        self.count = self.within = 0
        for rows in read(path, self._consumed if self.progress is not None else None):
            accumulate(self.stats, self.names, rows)
            pending.extend(rows)
            if len(pending) >= batch_size:
                self.conn.executemany(_SQL["insert_span"], pending)
                self.count += len(pending)
                pending = []
                self._advance()
        if pending:
            self.conn.executemany(_SQL["insert_span"], pending)
            self.count += len(pending)
        self._file_done(path)

    def part(self, file: int, part: Part) -> None:
        """Copy a worker's part file in (after the rows so far), and delete it."""
        self.conn.execute("ATTACH DATABASE ? AS part", (str(part.path),))
        try:
            self.conn.execute(_SQL["copy_part"])
        finally:
            self.conn.execute("DETACH DATABASE part")
        part.path.unlink()
        merge(self.file_stats, self.file_names, part.stats, part.names)
        self.count += part.rows
        self.within = part.consumed
        self._advance()

    def restart(self, file: int) -> None:
        """Take back what was stored of ``file`` (it is read again, whole)."""
        if file != len(self.sources):
            return  # not the file being stored: nothing of it is stored yet
        if self.count:
            self.conn.execute("DELETE FROM spans WHERE rowid > ?", (self.total,))
        self.count = self.within = 0
        self.file_stats, self.file_names = {}, {}

    def done(self, file: int) -> None:
        """Every part of the current file is in."""
        merge(self.stats, self.names, self.file_stats, self.file_names)
        self.file_stats, self.file_names = {}, {}
        self._file_done(self.files[file])
        self.within = 0

    def _file_done(self, path: Path) -> None:
        count, self.count = self.count, 0
        self.total += count
        st = path.stat()
        self.done_bytes += st.st_size
        # A file name need not be UTF-8 (such a byte arrives as a lone surrogate), and
        # SQLite text must be: the record keeps the name readable, the byte escaped.
        name = os.fsencode(path.resolve()).decode("utf-8", "backslashreplace")
        self.sources.append((name, st.st_size, st.st_mtime_ns, count))
        if self.progress is not None:
            self.progress.advance(self.done_bytes, self.total)
        if self.log is not None:
            rate = self.total / max(time.perf_counter() - self.began, 1e-9)
            self.log(f"  indexed {path.name}: {count:,} spans ({rate:,.0f} spans/s so far)")

    def finish(self, threads: int) -> None:
        """Index, drop duplicate spans, store the aggregates and what was read."""
        conn = self.conn
        # Sorting for the indexes may use ``threads`` more threads (SQLite's own).
        conn.execute(f"PRAGMA threads = {int(threads)}")
        conn.executescript(_SQL["indexes"])  # commits the open transaction first
        conn.execute("BEGIN")
        self.duplicates = _drop_duplicates(conn, self.stats)
        self.total -= self.duplicates
        conn.executemany(
            _SQL["insert_minute"],
            [(s, m, *agg) for (s, m), agg in sorted(self.stats.items()) if agg[0]],
        )
        conn.executemany("INSERT INTO sources VALUES (?, ?, ?, ?)", self.sources)
        conn.executemany(
            _SQL["insert_peer_name"], [(a, p, n) for (a, p), n in sorted(self.names.items())]
        )
        minutes = [m for _, m in self.stats]
        meta = {
            "format": INDEX_FORMAT,
            "fingerprint": json.dumps(fingerprint(self.files)),
            "spans": str(self.total),
            "first_ns": str(min(minutes, default=0) * NS_PER_MINUTE),
            "last_ns": str((max(minutes, default=0) + 1) * NS_PER_MINUTE),
        }
        conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        conn.execute("COMMIT")
        conn.execute("ANALYZE")


def build_index(
    files: Sequence[Path],
    dest: Path,
    *,
    read: Reader = read_spans,
    log: Callable[[str], object] | None = None,
    progress: Progress | None = None,
    batch_size: int = 20_000,
    processes: int | None = None,
    range_bytes: int = RANGE_BYTES,
) -> IngestReport:
    """Index the spans of ``files`` (read by ``read``, a trace source's reader) into
    ``dest``, replacing it atomically; ``progress`` hears of every batch stored.

    ``processes`` (default: the CPUs this process may use) is how many processes read
    the files; with more than one, and more than ``range_bytes`` of files read by
    ``read_spans``, worker processes read them (``keel.bridge.parallel``; large files in
    ranges of about ``range_bytes``) while this one stores their rows. 1 reads them here.
    Either way, the same index.

    Raises:
        MalformedSource: a file that is not OTLP/JSON (names the file and line); ``dest``
            is left as it was.
        IngestWorkerFailed: a worker process died or failed; ``dest`` is left as it was.
        StoreError: SQLite failed (disk full …); ``dest`` is left as it was.
    """
    processes = default_processes() if processes is None else processes
    if processes < 1:
        raise ConfigurationError(f"ingest processes must be >= 1, not {processes!r}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(dest)
    tmp = dest.with_name(f"{dest.name}.building-{os.getpid()}")
    parts = tmp.with_name(f"{tmp.name}.parts")
    tmp.unlink(missing_ok=True)
    size = sum(f.stat().st_size for f in files)
    workers = processes > 1 and read is read_spans and size > range_bytes
    if progress is not None:
        progress.start(size)
    try:
        # The file is private until it is swapped in (and fsynced first): no journal.
        conn = open_for_load(tmp, 65536)  # KiB: 64 MiB of page cache at most
        try:
            ingest = _Ingest(conn, files, log, progress)
            if workers:
                parts.mkdir(exist_ok=True)
                read_in_workers(
                    files, ingest, processes=processes, folder=parts, range_bytes=range_bytes
                )
            else:
                conn.execute("BEGIN")
                for path in files:
                    ingest.file(path, read, batch_size)
            ingest.finish(threads=processes - 1 if workers else 0)
        finally:
            conn.close()
            shutil.rmtree(parts, ignore_errors=True)
        _fsync(tmp)
        os.replace(tmp, dest)
        with contextlib.suppress(OSError):  # not every filesystem lets a folder be fsynced
            _fsync(dest.parent)
    except MalformedSource:
        tmp.unlink(missing_ok=True)
        raise
    except sqlite3.Error as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot build the trace index {dest}: {exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    seconds = time.perf_counter() - ingest.began
    return IngestReport(len(files), ingest.total, size, seconds, ingest.duplicates)


@dataclass(frozen=True, slots=True)
class WindowSpans:
    """One service's spans in a time window, as the diagnosis needs them."""

    durations_ns: list[int]
    errors: int
    exemplars: list[tuple[str, str, int, int]]  # (trace, span, duration_ns, error), worst first


class TraceIndex:
    """Read-only queries on an index file built by :func:`build_index`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self.path.exists():
            raise BridgeError(f"no trace index at {self.path}: run `keel bridge ingest` first")
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the trace index {self.path}: {exc}") from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"trace index {self.path}: {exc}") from exc
        finally:
            conn.close()

    def meta(self) -> dict[str, str]:
        """The index's metadata (format, fingerprint, spans, first_ns, last_ns)."""
        with self._connect() as conn:
            return dict(conn.execute("SELECT key, value FROM meta").fetchall())

    def services(self) -> list[str]:
        """Every service that has spans, sorted."""
        with self._connect() as conn:
            return [row[0] for row in conn.execute(_SQL["services"])]

    def minutes(self, service: str, first: int, last: int) -> list[tuple[int, int, int, int]]:
        """(minute, spans, errors, duration_ns) of ``service`` for minutes in [first, last)."""
        with self._connect() as conn:
            return list(conn.execute(_SQL["minutes"], (service, first, last)))

    def span_times(self, service: str, start: int, end: int) -> list[tuple[int, int]]:
        """(start_ns, end_ns) of ``service``'s spans that start in [start, end)."""
        with self._connect() as conn:
            return list(conn.execute(_SQL["span_times"], (service, start, end)))

    def window(
        self, services: Sequence[str], start: int, end: int, *, exemplars: int = 3
    ) -> dict[str, WindowSpans]:
        """Each service's spans that start in [start, end)."""
        out: dict[str, WindowSpans] = {}
        with self._connect() as conn:
            for service in services:
                rows = conn.execute(_SQL["window_spans"], (service, start, end)).fetchall()
                if not rows:
                    continue
                errors = sum(r[3] for r in rows)
                # Exemplars: errors first, then the slowest; ties broken by id (deterministic).
                worst = sorted(rows, key=lambda r: (-r[3], -r[2], r[0], r[1]))[:exemplars]
                out[service] = WindowSpans(
                    [r[2] for r in rows], errors, [(r[0], r[1], r[2], r[3]) for r in worst]
                )
        return out

    def peer_names(self) -> dict[str, str]:
        """{other name: peer.service} of the callees that callers name two ways
        (``peer_names``), where the other name is given to one callee only and is no
        service's name."""
        with self._connect() as conn:
            pairs = conn.execute(_SQL["peer_names"]).fetchall()
            known = {row[0] for row in conn.execute(_SQL["services"])}
        peers: dict[str, set[str]] = {}
        for aka, peer in pairs:
            peers.setdefault(aka, set()).add(peer)
        return {
            aka: next(iter(found))
            for aka, found in peers.items()
            if len(found) == 1 and aka not in known and aka not in found
        }

    def spans_between(
        self, services: Sequence[str], start: int, end: int, *, limit: int = MAX_SPANS
    ) -> tuple[list[ScopedSpan], float]:
        """Every span of ``services`` that starts in [start, end), and the share of traces
        read: above ``limit`` spans in the window, a deterministic sample of whole traces
        (by trace id) is read instead, so memory and time stay bounded. A callee some
        callers name by ``peer.service`` is named so for all (``peer_names``)."""
        first, last = start // NS_PER_MINUTE, -(-end // NS_PER_MINUTE)
        rows: list[ScopedSpan] = []
        names = self.peer_names()
        with self._connect() as conn:
            count = conn.execute(_SQL["count_spans"], (first, last)).fetchone()[0]
            share = min(1.0, limit / count) if count else 1.0
            bound = "g" if share >= 1.0 else f"{int(share * 0x10000):04x}"
            for service in services:
                found = conn.execute(_SQL["service_spans"], (service, start, end, bound))
                if not names:
                    rows.extend(found)
                    continue
                rows.extend(
                    (*row[:5], names[row[5]], *row[6:]) if row[5] in names else row for row in found
                )
        return rows, share

    def callers(
        self, services: Sequence[str], start: int, end: int
    ) -> list[tuple[str, str, int, int]]:
        """Call edges (caller, callee, calls, callee errors) seen in [start, end)."""
        edges: list[tuple[str, str, int, int]] = []
        with self._connect() as conn:
            for service in services:
                for caller, calls, errors in conn.execute(
                    _SQL["window_edges"], (service, start, end)
                ):
                    if caller != service:
                        edges.append((caller, service, calls, errors or 0))
        return sorted(edges)

    def search(
        self,
        *,
        service: str | None = None,
        start: int | None = None,
        end: int | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
        errors_only: bool = False,
        min_duration_ns: int | None = None,
        limit: int = 50,
    ) -> tuple[list[Span], int]:
        """Spans matching every given filter (oldest first, at most ``limit``), and how
        many matched in all."""
        where: list[str] = []
        args: list[str | int] = []
        for column, value in (("trace_id", trace_id), ("span_id", span_id), ("service", service)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if start is not None:
            where.append("start_ns >= ?")
            args.append(start)
        if end is not None:
            where.append("start_ns < ?")
            args.append(end)
        if errors_only:
            where.append("error = 1")
        if min_duration_ns is not None:
            where.append("end_ns - start_ns >= ?")
            args.append(min_duration_ns)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        columns = "trace_id, span_id, parent_id, service, name, start_ns, end_ns, error, kind, peer"
        with self._connect() as conn:
            # The filters are fixed column names; only values are bound as parameters.
            total = conn.execute(f"SELECT count(*) FROM spans {clause}", args).fetchone()[0]  # noqa: S608
            rows = conn.execute(
                f"SELECT {columns} FROM spans {clause} "  # noqa: S608
                "ORDER BY start_ns, trace_id, span_id LIMIT ?",
                [*args, limit],
            ).fetchall()
        spans = [
            Span(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), kind=r[8], peer=r[9])
            for r in rows
        ]
        return spans, total
