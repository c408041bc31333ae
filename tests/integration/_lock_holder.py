"""Lock helper: another process holding the write lock of a SQLite file.

Usage: ``python _lock_holder.py DB``

Opens DB with the standard ``sqlite3`` module and takes its write lock (``BEGIN
IMMEDIATE``). A brand-new file is still in rollback-journal mode, exactly as a new Keel
store is while its first opener switches it to WAL. Says ``locked``, waits for
``release`` on stdin, commits, says ``released`` and exits 0.
"""

from __future__ import annotations

import sqlite3
import sys


def main(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        print("locked", flush=True)
        line = sys.stdin.readline().strip()
        if line != "release":
            raise SystemExit(f"expected 'release' on stdin, got {line!r}")
        conn.execute("COMMIT")
    finally:
        conn.close()
    print("released", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
