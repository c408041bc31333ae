-- Keel SQLite schema, version 6: two columns of a task, each fixed by one kind of write.
--
-- trace_context: the W3C trace context (traceparent, tracestate) of the span the task
-- was created in, as JSON text, written with the task (keel.telemetry.tracing). Stores
-- of earlier versions kept it as the reserved step 'keel:trace-context': moved here, and
-- the step deleted, so their tasks keep their traces.
--
-- claimed_at: when the task's latest attempt was claimed, written by every claim, so
-- that whichever process ends an attempt can time it. For a task leased now, its claim
-- is its latest history entry (no other write of a leased task records one).
--
-- (The updates below append to task_changes, as every write of a task row does.)

ALTER TABLE tasks ADD COLUMN trace_context TEXT;
ALTER TABLE tasks ADD COLUMN claimed_at REAL;

UPDATE tasks SET trace_context = (
    SELECT value FROM task_steps
    WHERE task_steps.task_id = tasks.task_id AND task_steps.name = 'keel:trace-context'
)
WHERE task_id IN (SELECT task_id FROM task_steps WHERE name = 'keel:trace-context');

DELETE FROM task_steps WHERE name = 'keel:trace-context';

UPDATE tasks SET claimed_at = (
    SELECT at FROM task_events WHERE task_events.task_id = tasks.task_id
    ORDER BY id DESC LIMIT 1
)
WHERE lease_owner IS NOT NULL;
