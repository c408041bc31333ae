"""Span rows into a SQLite file of the trace index's schema, as a bulk load.

Both the ingest's own process (``keel.bridge.index``) and its worker processes
(``keel.bridge.parallel``, each filling a small file of its own that the index then copies
in whole) open their files here and count the per-service per-minute aggregates here, so
that either way the index holds the same rows and the same aggregates.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from keel.bridge.otlp import OUTGOING, Row
from keel.bridge.records import NS_PER_MINUTE
from keel.store import load_queries

__all__ = ["SQL", "Names", "Stats", "accumulate", "merge", "open_for_load"]

SQL = load_queries("keel.bridge", "index.sql")

Stats = dict[tuple[str, int], list[int]]
"""{(service, minute): [spans, errors, duration_ns sum, duration_ns max]}"""
Names = dict[tuple[str, str], int]
"""{(aka, peer): client spans}: the two names callers give one callee."""


def open_for_load(path: Path, cache_kib: int) -> sqlite3.Connection:
    """A new SQLite file at ``path`` with the index's tables (no indexes yet), set up for a
    bulk load: autocommit (``BEGIN`` when wanted), no journal, no fsync. The file is
    private until it is complete (an index is swapped in whole, after an fsync; a worker's
    file is copied into the index and deleted), so nothing durable is lost this way."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute(f"PRAGMA cache_size = -{int(cache_kib)}")  # KiB of page cache at most
    conn.executescript(SQL["schema"])
    return conn


def accumulate(stats: Stats, names: Names, rows: list[Row]) -> None:
    """Add spans to the per-service per-minute aggregates [spans, errors, sum, max]; a
    service's client and producer spans time its callees, and are left out (their
    callee's two names, if they give two, are counted in ``names``)."""
    for row in rows:
        if row[8] in OUTGOING:
            if row[10] is not None and row[9] is not None:
                pair = (row[10], row[9])
                names[pair] = names.get(pair, 0) + 1
            continue
        key = (row[3], row[5] // NS_PER_MINUTE)
        duration = row[6] - row[5]
        agg = stats.get(key)
        if agg is None:
            stats[key] = [1, row[7], duration, duration]
        else:
            agg[0] += 1
            agg[1] += row[7]
            agg[2] += duration
            agg[3] = max(agg[3], duration)


def merge(stats: Stats, names: Names, more_stats: Stats, more_names: Names) -> None:
    """Add the aggregates of other spans (``accumulate``d apart) to ``stats`` and ``names``."""
    for key, more in more_stats.items():
        agg = stats.get(key)
        if agg is None:
            stats[key] = list(more)
        else:
            agg[0] += more[0]
            agg[1] += more[1]
            agg[2] += more[2]
            agg[3] = max(agg[3], more[3])
    for pair, count in more_names.items():
        names[pair] = names.get(pair, 0) + count
