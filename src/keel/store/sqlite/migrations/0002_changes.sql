-- Keel SQLite schema, version 2: the change feed (keel.store.sqlite.changes).
-- Every write of a task row appends its id to task_changes inside the same transaction,
-- so the log holds committed changes only, in commit order. Listeners in any process
-- read it from their last position when PRAGMA data_version says another connection
-- committed. The log prunes itself: every 1000th entry deletes those 10000 behind it.

CREATE TABLE task_changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL
) STRICT;

CREATE TRIGGER task_changes_on_insert AFTER INSERT ON tasks BEGIN
    INSERT INTO task_changes (task_id) VALUES (NEW.task_id);
END;

CREATE TRIGGER task_changes_on_update AFTER UPDATE ON tasks BEGIN
    INSERT INTO task_changes (task_id) VALUES (NEW.task_id);
END;

CREATE TRIGGER task_changes_prune AFTER INSERT ON task_changes WHEN NEW.seq % 1000 = 0 BEGIN
    DELETE FROM task_changes WHERE seq <= NEW.seq - 10000;
END;
