-- Keel SQLite schema, version 4: live leases for operators (keel.store.leases).
-- Per worker, in worker order, each worker's leases soonest expiry first; updated_at
-- rides along so that the per-worker summary (count, newest and oldest renewal, soonest
-- expiry) reads this index alone. Input waits by age: the longest waiting first.

CREATE INDEX tasks_lease_owner ON tasks (lease_owner, lease_expires_at, task_id, updated_at)
    WHERE lease_owner IS NOT NULL;
CREATE INDEX tasks_waiting ON tasks (updated_at, task_id) WHERE status = 'input_required';
