-- Every statement the PostgreSQL adapter runs, by name. psycopg named parameters
-- (%(name)s) throughout. Statements of a write transaction that read a task lock it
-- (FOR UPDATE): the conditional update that follows can then never miss.

-- name: get_task
SELECT * FROM tasks WHERE task_id = %(task_id)s;

-- name: get_task_locked
SELECT * FROM tasks WHERE task_id = %(task_id)s FOR UPDATE;

-- name: get_tasks_locked
-- The tasks a group of writes is about to change, locked in one consistent order (by id)
-- so that two processes locking overlapping groups cannot deadlock each other. Lists of
-- ids go as binary arrays (the "b" placeholder): as text, psycopg searches every id with
-- a regular expression for characters to quote.
SELECT * FROM tasks WHERE task_id = ANY(%(task_ids)b::text[]) ORDER BY task_id FOR UPDATE;

-- name: get_tasks
SELECT * FROM tasks WHERE task_id = ANY(%(task_ids)b::text[]);

-- name: get_task_by_key
SELECT * FROM tasks WHERE owner = %(owner)s AND idempotency_key = %(idempotency_key)s;

-- name: insert_task
INSERT INTO tasks (
    task_id, status, owner, name, arguments, created_at, updated_at, status_message,
    input_requests, input_responses, result, error, idempotency_key, attempt, max_attempts,
    lease_owner, lease_expires_at, fence, ready_at, ttl, closed_fence, expires_at,
    request_digest, trace_context, claimed_at
) VALUES (
    %(task_id)s, %(status)s, %(owner)s, %(name)s, %(arguments)s, %(created_at)s,
    %(updated_at)s, %(status_message)s, %(input_requests)s, %(input_responses)s, %(result)s,
    %(error)s, %(idempotency_key)s, %(attempt)s, %(max_attempts)s, %(lease_owner)s,
    %(lease_expires_at)s, %(fence)s, %(ready_at)s, %(ttl)s, %(closed_fence)s, %(expires_at)s,
    %(request_digest)s, %(trace_context)s, %(claimed_at)s
);

-- name: update_tasks
-- The held-back updates of a group, in one statement: one JSON array of rows (task ids
-- distinct), one text parameter for the driver to send, however many rows. Conditional:
-- a row matches only if nobody changed the task since it was read (the row is locked, so
-- a row count short of the number of tasks means a bug, and the transaction is refused
-- rather than guessed). Times are JSON numbers in their shortest round-trip form, which
-- float8 reads back exactly.
UPDATE tasks AS t SET
    status = u.status, updated_at = u.updated_at, status_message = u.status_message,
    input_requests = u.input_requests, input_responses = u.input_responses,
    result = u.result, error = u.error, attempt = u.attempt,
    lease_owner = u.lease_owner, lease_expires_at = u.lease_expires_at, fence = u.fence,
    ready_at = u.ready_at, ttl = u.ttl, closed_fence = u.closed_fence,
    expires_at = u.expires_at, claimed_at = u.claimed_at
FROM json_to_recordset(%(rows)s::json) AS u (
    task_id text, old_status text, old_fence bigint, status text, updated_at float8,
    status_message text, input_requests text, input_responses text, result text,
    error text, attempt integer, lease_owner text, lease_expires_at float8, fence bigint,
    ready_at float8, ttl float8, closed_fence bigint, expires_at float8, claimed_at float8
)
WHERE t.task_id = u.task_id AND t.status = u.old_status AND t.fence = u.old_fence;

-- name: insert_events
-- The held-back history entries of a group, in one statement (one JSON array of rows),
-- in the order given (their ids ascending in that order).
INSERT INTO task_events (task_id, at, from_status, to_status, reason, actor)
SELECT e.task_id, e.at, e.from_status, e.to_status, e.reason, e.actor
FROM ROWS FROM (
    json_to_recordset(%(rows)s::json) AS (
        task_id text, at float8, from_status text, to_status text, reason text, actor text
    )
) WITH ORDINALITY AS e (task_id, at, from_status, to_status, reason, actor, n)
ORDER BY e.n;

-- name: claim
-- One statement: pick up to :limit ready tasks, skipping rows other claimers hold, lease
-- them with a bumped fencing token and log the claim. It is keel.model.transitions.claim
-- written in SQL (a test checks that the two agree).
WITH picked AS MATERIALIZED (
    SELECT task_id FROM tasks
    WHERE status = 'working' AND lease_owner IS NULL AND ready_at <= %(now)s
      AND name = ANY(%(names)b::text[])
    ORDER BY ready_at, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE tasks AS t
    SET lease_owner = %(worker)s,
        lease_expires_at = %(now)s + %(lease)s,
        fence = t.fence + 1,
        updated_at = %(now)s,
        claimed_at = %(now)s
    WHERE t.task_id IN (SELECT task_id FROM picked)
    RETURNING t.*
), logged AS (
    INSERT INTO task_events (task_id, at, from_status, to_status, reason, actor)
    SELECT task_id, %(now)s, 'working', 'working',
           'claimed by ' || %(worker)s || ' (attempt ' || attempt || '/' || max_attempts
               || ', fence ' || fence || ')',
           'worker:' || %(worker)s
    FROM claimed
    ORDER BY ready_at, seq
)
SELECT * FROM claimed ORDER BY ready_at, seq;

-- name: ready_tasks
SELECT * FROM tasks
WHERE status = 'working' AND lease_owner IS NULL AND ready_at <= %(now)s
  AND name = ANY(%(names)b::text[])
ORDER BY ready_at, seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: expired_leases
SELECT * FROM tasks
WHERE lease_owner IS NOT NULL AND lease_expires_at < %(now)s
ORDER BY lease_expires_at, task_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: any_expired
SELECT task_id FROM tasks WHERE lease_owner IS NOT NULL AND lease_expires_at < %(now)s LIMIT 1;

-- name: stale_tasks
SELECT * FROM tasks
WHERE status IN ('working', 'input_required') AND updated_at < %(cutoff)s
ORDER BY updated_at, task_id
FOR UPDATE;

-- name: purgeable_tasks
SELECT task_id FROM tasks
WHERE expires_at IS NOT NULL AND expires_at <= %(now)s
  AND status IN ('completed', 'failed', 'cancelled')
ORDER BY expires_at, task_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: delete_tasks
-- History and steps go with them (ON DELETE CASCADE).
DELETE FROM tasks WHERE task_id = ANY(%(task_ids)b::text[]);

-- name: put_step
INSERT INTO task_steps (task_id, name, value, created_at)
VALUES (%(task_id)s, %(name)s, %(value)s, %(created_at)s)
ON CONFLICT (task_id, name) DO NOTHING;

-- name: get_steps
SELECT name, value FROM task_steps WHERE task_id = %(task_id)s ORDER BY created_at, name;

-- name: get_events
SELECT * FROM task_events WHERE task_id = %(task_id)s ORDER BY id;

-- name: page_tasks
SELECT * FROM tasks
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
  AND (%(after)s::text IS NULL OR seq > (SELECT seq FROM tasks WHERE task_id = %(after)s::text))
ORDER BY seq
LIMIT %(limit)s;

-- name: count_by_status
SELECT status, count(*) AS n FROM tasks GROUP BY status;

-- name: task_statuses
SELECT task_id, status, fence FROM tasks WHERE task_id = ANY(%(task_ids)b::text[]);

-- name: log_write
INSERT INTO keel_write_log (op_id) VALUES (%(op_id)s);

-- name: trim_write_log
DELETE FROM keel_write_log WHERE written_at < now() - interval '1 hour';

-- name: notify
-- A group's notifications, (channel, payload) pairs, in one statement: sent in this order.
-- The payloads go as a binary array (the "b" placeholder): as text, every double quote of their
-- JSON is escaped by psycopg in Python, a regex substitution per quote (two per task id).
SELECT pg_notify(m.channel, m.payload)
FROM unnest(%(channels)s::text[], %(payloads)b::text[]) AS m (channel, payload);

-- name: browse_tasks
-- Newest first, a keyset page (keel.store.browse); {where} is its condition. Each filter
-- column has an index on (column, created_at, task_id COLLATE "C") (0002_browse.sql).
SELECT * FROM tasks WHERE {where}
ORDER BY created_at DESC, task_id COLLATE "C" DESC
LIMIT %(limit)s;
