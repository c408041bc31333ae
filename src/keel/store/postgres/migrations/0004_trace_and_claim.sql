-- Keel PostgreSQL schema, version 4: two columns of a task, each fixed by one kind of
-- write.
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
-- Adding a nullable column without a default rewrites no rows.

ALTER TABLE tasks ADD COLUMN trace_context text, ADD COLUMN claimed_at double precision;

UPDATE tasks SET trace_context = s.value
FROM task_steps AS s
WHERE s.task_id = tasks.task_id AND s.name = 'keel:trace-context';

DELETE FROM task_steps WHERE name = 'keel:trace-context';

UPDATE tasks SET claimed_at = (
    SELECT e.at FROM task_events AS e WHERE e.task_id = tasks.task_id
    ORDER BY e.id DESC LIMIT 1
)
WHERE lease_owner IS NOT NULL;
