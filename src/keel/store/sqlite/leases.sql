-- The SQLite adapter's reads of live leases (keel.store.leases), by name; the indexes
-- they read are those of migrations/0004_leases.sql (and tasks_leased, 0001).

-- name: worker_leases
SELECT lease_owner AS worker, count(*) AS leases,
       sum(lease_expires_at < :now) AS expired,
       max(updated_at) AS last_renewal, min(updated_at) AS oldest_renewal,
       min(lease_expires_at) AS next_expiry
FROM tasks
WHERE lease_owner IS NOT NULL
GROUP BY lease_owner
ORDER BY lease_owner;

-- name: leased_by
SELECT * FROM tasks
WHERE lease_owner = :worker
ORDER BY lease_expires_at, task_id
LIMIT :limit;

-- name: leased_by_after
SELECT * FROM tasks
WHERE lease_owner = :worker AND (lease_expires_at, task_id) > (:mark_at, :mark_id)
ORDER BY lease_expires_at, task_id
LIMIT :limit;

-- name: lapsed_leases
SELECT * FROM tasks
WHERE lease_owner IS NOT NULL AND lease_expires_at < :now
ORDER BY lease_expires_at, task_id
LIMIT :limit;

-- name: waiting_since
-- INDEXED BY: else the planner may take tasks_status_created and sort every waiting task.
SELECT * FROM tasks INDEXED BY tasks_waiting
WHERE status = 'input_required' AND updated_at < :before
ORDER BY updated_at, task_id
LIMIT :limit;

-- name: claimed_before
-- :cutoffs is {tool name: time}; a leased task's latest history entry is its claim.
-- Step by step (MATERIALIZED), else the planner looks up every leased task's claim, or
-- walks every task of a name: the leased tasks of those tools, then their claims, then
-- the rows of those past the cutoff.
WITH leased AS MATERIALIZED (
    SELECT lease.task_id, cutoff.value AS cutoff
    FROM tasks AS lease INDEXED BY tasks_leased
    CROSS JOIN json_each(:cutoffs) AS cutoff
    WHERE lease.lease_owner IS NOT NULL AND cutoff.key = lease.name
), claimed AS MATERIALIZED (
    SELECT task_id, cutoff,
           (SELECT at FROM task_events WHERE task_events.task_id = leased.task_id
            ORDER BY id DESC LIMIT 1) AS at
    FROM leased
)
SELECT tasks.*, claimed.at AS claimed_at, claimed.cutoff - claimed.at AS overdue
FROM claimed JOIN tasks ON tasks.task_id = claimed.task_id
WHERE claimed.at < claimed.cutoff
ORDER BY overdue DESC, tasks.task_id
LIMIT :limit;
