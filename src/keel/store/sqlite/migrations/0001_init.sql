-- Keel SQLite schema, version 1: tasks, their history, their step checkpoints.
-- The database enforces what it can: status values, lease shape, one task per
-- (owner, idempotency key).

-- The implicit rowid numbers tasks in the order they were stored: listing follows it.
CREATE TABLE tasks (
    task_id          TEXT PRIMARY KEY,
    status           TEXT NOT NULL CHECK (status IN
                         ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    owner            TEXT NOT NULL DEFAULT '',
    name             TEXT,
    arguments        TEXT NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    status_message   TEXT,
    input_requests   TEXT NOT NULL DEFAULT '{}',
    input_responses  TEXT NOT NULL DEFAULT '{}',
    result           TEXT,
    error            TEXT,
    idempotency_key  TEXT,
    attempt          INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_attempts     INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    lease_owner      TEXT,
    lease_expires_at REAL,
    fence            INTEGER NOT NULL DEFAULT 0 CHECK (fence >= 0),
    ready_at         REAL NOT NULL,
    ttl              REAL CHECK (ttl IS NULL OR ttl >= 0),
    closed_fence     INTEGER,
    expires_at       REAL,
    request_digest   TEXT NOT NULL DEFAULT '',
    -- A lease is an owner and an expiry together, and only a working task holds one.
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK (lease_owner IS NULL OR status = 'working'),
    CHECK (error IS NULL OR status = 'failed')
) STRICT;

CREATE UNIQUE INDEX tasks_owner_idempotency_key
    ON tasks (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Claims: ready working tasks without a lease, oldest first.
CREATE INDEX tasks_ready ON tasks (ready_at) WHERE status = 'working' AND lease_owner IS NULL;

-- Recovery of expired leases.
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE lease_owner IS NOT NULL;

-- purge: finished tasks by expiry.
CREATE INDEX tasks_expiry ON tasks (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('completed', 'failed', 'cancelled');

CREATE TABLE task_events (
    id          INTEGER PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    at          REAL NOT NULL,
    from_status TEXT,
    to_status   TEXT NOT NULL,
    reason      TEXT NOT NULL,
    actor       TEXT NOT NULL
) STRICT;

CREATE INDEX task_events_task ON task_events (task_id, id);

CREATE TABLE task_steps (
    task_id    TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (task_id, name)
) STRICT, WITHOUT ROWID;
