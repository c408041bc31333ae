-- Every statement the SQLite adapter runs, by name. Named parameters (:name) throughout.

-- name: get_task
SELECT * FROM tasks WHERE task_id = :task_id;

-- name: get_tasks
SELECT * FROM tasks WHERE task_id IN (SELECT value FROM json_each(:task_ids));

-- name: get_task_by_key
SELECT * FROM tasks WHERE owner = :owner AND idempotency_key = :idempotency_key;

-- name: insert_task
INSERT INTO tasks (
    task_id, status, owner, name, arguments, created_at, updated_at, status_message,
    input_requests, input_responses, result, error, idempotency_key, attempt, max_attempts,
    lease_owner, lease_expires_at, fence, ready_at, ttl, closed_fence, expires_at,
    request_digest, trace_context, claimed_at
) VALUES (
    :task_id, :status, :owner, :name, :arguments, :created_at, :updated_at, :status_message,
    :input_requests, :input_responses, :result, :error, :idempotency_key, :attempt,
    :max_attempts, :lease_owner, :lease_expires_at, :fence, :ready_at, :ttl, :closed_fence,
    :expires_at, :request_digest, :trace_context, :claimed_at
);

-- name: update_task
-- Conditional: it matches only if nobody changed the task since it was read.
-- {assignments} is "column = :column, …" for the columns that changed: SQLite maintains
-- an index whenever one of its columns is assigned, changed or not.
UPDATE tasks SET {assignments}
WHERE task_id = :task_id AND status = :old_status AND fence = :old_fence;

-- name: insert_event_row
-- Positional: history entries are inserted a group at a time with executemany.
INSERT INTO task_events (task_id, at, from_status, to_status, reason, actor)
VALUES (?, ?, ?, ?, ?, ?);

-- name: ready_tasks
SELECT * FROM tasks
WHERE status = 'working' AND lease_owner IS NULL AND ready_at <= :now
  AND name IN (SELECT value FROM json_each(:names))
ORDER BY ready_at, rowid
LIMIT :limit;

-- name: expired_leases
SELECT * FROM tasks
WHERE lease_owner IS NOT NULL AND lease_expires_at < :now
ORDER BY lease_expires_at, task_id
LIMIT :limit;

-- name: stale_tasks
SELECT * FROM tasks
WHERE status IN ('working', 'input_required') AND updated_at < :cutoff
ORDER BY updated_at, task_id;

-- name: purgeable_tasks
SELECT task_id FROM tasks
WHERE expires_at IS NOT NULL AND expires_at <= :now
  AND status IN ('completed', 'failed', 'cancelled')
ORDER BY expires_at, task_id
LIMIT :limit;

-- name: delete_tasks
-- History and steps go with them (ON DELETE CASCADE).
DELETE FROM tasks WHERE task_id IN (SELECT value FROM json_each(:task_ids));

-- name: put_step
INSERT INTO task_steps (task_id, name, value, created_at)
VALUES (:task_id, :name, :value, :created_at)
ON CONFLICT (task_id, name) DO NOTHING;

-- name: get_steps
SELECT name, value FROM task_steps WHERE task_id = :task_id ORDER BY created_at, name;

-- name: get_events
SELECT * FROM task_events WHERE task_id = :task_id ORDER BY id;

-- name: page_tasks
SELECT * FROM tasks
WHERE (:status IS NULL OR status = :status)
  AND (:owner IS NULL OR owner = :owner)
  AND (:after IS NULL OR rowid > (SELECT rowid FROM tasks WHERE task_id = :after))
ORDER BY rowid
LIMIT :limit;

-- name: count_by_status
SELECT status, count(*) AS n FROM tasks GROUP BY status;

-- name: task_statuses
SELECT task_id, status, fence FROM tasks
WHERE task_id IN (SELECT value FROM json_each(:task_ids));

-- name: browse_tasks
-- Newest first, a keyset page (keel.store.browse); {where} is its condition. Each filter
-- column has an index on (column, created_at, task_id) (migration 0003_browse).
SELECT * FROM tasks WHERE {where}
ORDER BY created_at DESC, task_id DESC
LIMIT :limit;
