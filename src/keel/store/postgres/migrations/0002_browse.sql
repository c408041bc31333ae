-- Keel PostgreSQL schema, version 2: indexes for browsing (keel.store.browse): tasks
-- newest first, by created_at then task_id in byte order (COLLATE "C", as every other
-- Keel store orders ids), whole or filtered by one column, a keyset page at a time.

CREATE INDEX tasks_created ON tasks (created_at, task_id COLLATE "C");
CREATE INDEX tasks_status_created ON tasks (status, created_at, task_id COLLATE "C");
CREATE INDEX tasks_name_created ON tasks (name, created_at, task_id COLLATE "C");
CREATE INDEX tasks_owner_created ON tasks (owner, created_at, task_id COLLATE "C");
