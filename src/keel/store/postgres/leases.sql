-- The PostgreSQL adapter's reads of live leases (keel.store.leases), by name; the indexes
-- they read are those of migrations/0003_leases.sql (and tasks_leased, 0001). Task ids
-- compare in byte order (COLLATE "C"), as the indexes keep them.

-- name: worker_leases
SELECT lease_owner AS worker, count(*) AS leases,
       count(*) FILTER (WHERE lease_expires_at < %(now)s) AS expired,
       max(updated_at) AS last_renewal, min(updated_at) AS oldest_renewal,
       min(lease_expires_at) AS next_expiry
FROM tasks
WHERE lease_owner IS NOT NULL
GROUP BY lease_owner
ORDER BY lease_owner COLLATE "C";

-- name: leased_by
SELECT * FROM tasks
WHERE lease_owner = %(worker)s
ORDER BY lease_expires_at, task_id COLLATE "C"
LIMIT %(limit)s;

-- name: leased_by_after
SELECT * FROM tasks
WHERE lease_owner = %(worker)s
  AND (lease_expires_at, task_id COLLATE "C") > (%(mark_at)s, %(mark_id)s)
ORDER BY lease_expires_at, task_id COLLATE "C"
LIMIT %(limit)s;

-- name: lapsed_leases
SELECT * FROM tasks
WHERE lease_owner IS NOT NULL AND lease_expires_at < %(now)s
ORDER BY lease_expires_at, task_id COLLATE "C"
LIMIT %(limit)s;

-- name: waiting_since
SELECT * FROM tasks
WHERE status = 'input_required' AND updated_at < %(before)s
ORDER BY updated_at, task_id COLLATE "C"
LIMIT %(limit)s;

-- name: claimed_before
-- (name, cutoff) pairs; a leased task's latest history entry is its claim.
SELECT tasks.*, claim.at AS claimed_at, cutoff.at - claim.at AS overdue
FROM unnest(%(names)s::text[], %(cutoffs)s::double precision[]) AS cutoff (name, at)
JOIN tasks ON tasks.name = cutoff.name AND tasks.lease_owner IS NOT NULL
CROSS JOIN LATERAL (
    SELECT at FROM task_events WHERE task_events.task_id = tasks.task_id
    ORDER BY id DESC LIMIT 1
) AS claim
WHERE claim.at < cutoff.at
ORDER BY overdue DESC, tasks.task_id COLLATE "C"
LIMIT %(limit)s;
