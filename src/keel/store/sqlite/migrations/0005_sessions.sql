-- Keel SQLite schema, version 5: who has the store open (keel.store.sqlite.sessions).
-- A row per open connection, written through to the database file when it opens and
-- deleted when it closes: a row left by a process that is gone, in a file whose -wal is
-- missing, means a crash whose last commits were in the lost log.

CREATE TABLE keel_sessions (
    token TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    identity TEXT NOT NULL,      -- boot and start time of the process (sessions.process_identity)
    host TEXT NOT NULL,
    opened_at REAL NOT NULL
) STRICT;
