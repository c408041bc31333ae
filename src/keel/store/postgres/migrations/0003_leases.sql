-- Keel PostgreSQL schema, version 3: live leases for operators (keel.store.leases).
-- Per worker, each worker's leases soonest expiry first (task_id in byte order, as every
-- other Keel store orders ids). Input waits by age: the longest waiting first.
--
-- updated_at is in no lease index: a heartbeat changes lease_expires_at (indexed already,
-- tasks_leased) and updated_at, and the per-worker summary reads updated_at from the rows
-- it counts. tasks_waiting indexes updated_at, which makes an update of a status message
-- (updated_at only) no longer a HOT update.

CREATE INDEX tasks_lease_owner ON tasks (lease_owner, lease_expires_at, task_id COLLATE "C")
    WHERE lease_owner IS NOT NULL;
CREATE INDEX tasks_waiting ON tasks (updated_at, task_id COLLATE "C")
    WHERE status = 'input_required';
