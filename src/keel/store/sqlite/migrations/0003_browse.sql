-- Keel SQLite schema, version 3: indexes for browsing (keel.store.browse): tasks newest
-- first, by created_at then task_id, whole or filtered by one column, a keyset page at a
-- time. The implicit rowid is not the order: an imported task keeps its created_at.

CREATE INDEX tasks_created ON tasks (created_at, task_id);
CREATE INDEX tasks_status_created ON tasks (status, created_at, task_id);
CREATE INDEX tasks_name_created ON tasks (name, created_at, task_id);
CREATE INDEX tasks_owner_created ON tasks (owner, created_at, task_id);
