-- Keel PostgreSQL schema, version 1: tasks, their history, their step checkpoints, and
-- the write log that makes a retried transaction idempotent.
-- Times are seconds since the epoch (double precision), as in every Keel store, so that
-- an injected clock round-trips exactly. JSON columns are text, stored verbatim.

CREATE TABLE tasks (
    -- The order tasks were stored in: listing and claims (after ready_at) follow it.
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    task_id          text PRIMARY KEY,
    status           text NOT NULL CHECK (status IN
                         ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    owner            text NOT NULL DEFAULT '',
    name             text,
    arguments        text NOT NULL,
    created_at       double precision NOT NULL,
    updated_at       double precision NOT NULL,
    status_message   text,
    input_requests   text NOT NULL DEFAULT '{}',
    input_responses  text NOT NULL DEFAULT '{}',
    result           text,
    error            text,
    idempotency_key  text,
    attempt          integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_attempts     integer NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    lease_owner      text,
    lease_expires_at double precision,
    fence            bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    ready_at         double precision NOT NULL,
    ttl              double precision CHECK (ttl IS NULL OR ttl >= 0),
    closed_fence     bigint,
    expires_at       double precision,
    request_digest   text NOT NULL DEFAULT '',
    -- A lease is an owner and an expiry together, and only a working task holds one.
    CONSTRAINT tasks_lease_shape CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT tasks_lease_working CHECK (lease_owner IS NULL OR status = 'working'),
    CONSTRAINT tasks_error_failed CHECK (error IS NULL OR status = 'failed')
);

CREATE UNIQUE INDEX tasks_seq ON tasks (seq);

-- One task per (owner, idempotency key), where a key is set.
CREATE UNIQUE INDEX tasks_owner_idempotency_key
    ON tasks (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Claims: ready working tasks without a lease, earliest ready_at first, then stored order.
CREATE INDEX tasks_ready ON tasks (ready_at, seq)
    WHERE status = 'working' AND lease_owner IS NULL;

-- Recovery of expired leases.
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE lease_owner IS NOT NULL;

-- purge: finished tasks by expiry.
CREATE INDEX tasks_expiry ON tasks (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('completed', 'failed', 'cancelled');

-- reclaim: live tasks by last update.
CREATE INDEX tasks_live ON tasks (updated_at) WHERE status IN ('working', 'input_required');

CREATE TABLE task_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     text NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    at          double precision NOT NULL,
    from_status text,
    to_status   text NOT NULL,
    reason      text NOT NULL,
    actor       text NOT NULL
);

CREATE INDEX task_events_task ON task_events (task_id, id);

CREATE TABLE task_steps (
    task_id    text NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
    name       text NOT NULL,
    value      text NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (task_id, name)
);

-- One row per committed write transaction, keyed by the id its process gave it. A retry
-- of a transaction whose COMMIT reply was lost inserts the same id first: a duplicate key
-- means the first try committed (and its outcome stands); no duplicate means it did not.
-- Rows older than an hour are deleted as writes go by.
CREATE TABLE keel_write_log (
    op_id      uuid PRIMARY KEY,
    written_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX keel_write_log_written_at ON keel_write_log (written_at);
