-- The Incident Bridge's trace index (keel.bridge.index): a SQLite file rebuilt aside and
-- swapped in whole whenever its sources change, so readers never see half an ingest.

-- name: schema
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE spans (
    trace_id  TEXT    NOT NULL,           -- 32 hex digits
    span_id   TEXT    NOT NULL,           -- 16 hex digits
    parent_id TEXT,                       -- NULL for a root span
    service   TEXT    NOT NULL,           -- the resource's service.name
    name      TEXT    NOT NULL,           -- the operation
    start_ns  INTEGER NOT NULL,           -- ns since the epoch
    end_ns    INTEGER NOT NULL CHECK (end_ns >= start_ns),
    error     INTEGER NOT NULL CHECK (error IN (0, 1)),
    kind      INTEGER NOT NULL,           -- OTLP span kind: 2 server, 3 client, 4 producer ...
    peer      TEXT,                       -- what a client/producer span calls, else NULL
    aka       TEXT                        -- the other name it gives that callee (peer_names)
);
-- Which names callers give one callee: a client span that names its callee by
-- peer.service (peer) and by a database, topic or host (aka); callers without
-- peer.service name it by the latter.
CREATE TABLE peer_names (
    aka   TEXT    NOT NULL,
    peer  TEXT    NOT NULL,
    spans INTEGER NOT NULL,
    PRIMARY KEY (aka, peer)
) WITHOUT ROWID;
-- Per service, per minute, of its own spans (not its client and producer spans: those
-- time other services): computed at ingest, so that baselines cost no span scan.
CREATE TABLE minute_stats (
    service     TEXT    NOT NULL,
    minute      INTEGER NOT NULL,         -- start_ns // 60e9
    spans       INTEGER NOT NULL,
    errors      INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,         -- sum of the spans' durations
    max_ns      INTEGER NOT NULL,
    PRIMARY KEY (service, minute)
) WITHOUT ROWID;
CREATE TABLE sources (
    path     TEXT    PRIMARY KEY,
    size     INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    spans    INTEGER NOT NULL
);

-- name: indexes
-- Built after the bulk insert (faster than keeping them up to date row by row).
CREATE INDEX spans_by_service ON spans (service, start_ns);
CREATE INDEX spans_by_trace ON spans (trace_id, span_id);

-- name: duplicate_spans
-- Spans whose (trace_id, span_id) an earlier row already has (the same export ingested
-- twice): the first copy is kept. Runs on spans_by_trace, a covering scan when there are none.
SELECT s.rowid, s.service, s.start_ns, s.kind
FROM (
    SELECT trace_id, span_id, min(rowid) AS keep
    FROM spans GROUP BY trace_id, span_id HAVING count(*) > 1
) AS d
JOIN spans AS s ON s.trace_id = d.trace_id AND s.span_id = d.span_id AND s.rowid <> d.keep;

-- name: minute_of
SELECT count(*), coalesce(sum(error), 0), coalesce(sum(end_ns - start_ns), 0),
       coalesce(max(end_ns - start_ns), 0)
FROM spans WHERE service = ? AND start_ns >= ? AND start_ns < ? AND kind NOT IN (3, 4);

-- name: insert_span
INSERT INTO spans (trace_id, span_id, parent_id, service, name, start_ns, end_ns, error, kind, peer,
                   aka)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: copy_part
-- A worker's part file (keel.bridge.parallel) after the rows so far, in its order: the same
-- table, so SQLite copies the records as they are (its transfer optimization).
INSERT INTO main.spans SELECT * FROM part.spans;

-- name: insert_peer_name
INSERT INTO peer_names (aka, peer, spans) VALUES (?, ?, ?);

-- name: peer_names
SELECT aka, peer FROM peer_names;

-- name: insert_minute
INSERT INTO minute_stats (service, minute, spans, errors, duration_ns, max_ns)
VALUES (?, ?, ?, ?, ?, ?);

-- name: services
SELECT DISTINCT service FROM minute_stats ORDER BY service;

-- name: minutes
SELECT minute, spans, errors, duration_ns
FROM minute_stats
WHERE service = ? AND minute >= ? AND minute < ?
ORDER BY minute;

-- name: window_spans
SELECT trace_id, span_id, end_ns - start_ns, error
FROM spans
WHERE service = ? AND start_ns >= ? AND start_ns < ?;

-- name: span_times
SELECT start_ns, end_ns FROM spans
WHERE service = ? AND start_ns >= ? AND start_ns < ? AND kind NOT IN (3, 4);

-- name: window_edges
-- Who calls `service` in the window: the caller is the parent span's service.
SELECT parent.service, count(*), sum(child.error)
FROM spans AS child
JOIN spans AS parent ON parent.trace_id = child.trace_id AND parent.span_id = child.parent_id
WHERE child.service = ? AND child.start_ns >= ? AND child.start_ns < ?
  AND child.parent_id IS NOT NULL
GROUP BY parent.service;

-- name: service_spans
-- One service's spans starting in [start, end), for trace ids below a bound (a
-- deterministic sample of whole traces when there are many).
SELECT trace_id, span_id, parent_id, service, kind, peer, start_ns, end_ns, error
FROM spans
WHERE service = ? AND start_ns >= ? AND start_ns < ? AND trace_id < ?;

-- name: count_spans
-- Spans of every service in minutes [first, last) (client spans aside: an estimate).
SELECT coalesce(sum(spans), 0) FROM minute_stats WHERE minute >= ? AND minute < ?;
