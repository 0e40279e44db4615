-- Step logs: lines a worker sends for the attempt it holds the lease of
-- (POST /v1/tasks/{id}/logs), kept with the attempt, at most
-- COMPOSER_TASK_LOG_MAX_BYTES per attempt and COMPOSER_RUN_LOG_MAX_BYTES
-- per run (each line counted as its bytes and 64 for its row; a last line
-- says when more were dropped). They go when their run does: the retention
-- pass deletes the lines and counts of runs no longer there.
CREATE TABLE task_logs (
    task_id   uuid NOT NULL,
    attempt   integer NOT NULL,
    seq       integer NOT NULL,
    run_id    uuid NOT NULL,
    -- The worker that sent it: a lease taken over continues the attempt.
    worker_id text NOT NULL,
    -- When it was stored, after the attempt's lock: in the order of seq.
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    line      text NOT NULL,
    PRIMARY KEY (task_id, attempt, seq)
);
CREATE INDEX task_logs_at ON task_logs (at);

-- What each attempt's log holds, and whether it reached its limit: appends
-- lock this row (after their run's), so counts and seq stay exact across
-- coordinators without reading the lines.
CREATE TABLE task_log_usage (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    run_id  uuid NOT NULL,
    lines   integer NOT NULL DEFAULT 0,
    bytes   bigint NOT NULL DEFAULT 0,
    closed  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (task_id, attempt)
);

-- What a run's logs hold over all its steps and attempts.
CREATE TABLE run_log_usage (
    run_id uuid PRIMARY KEY,
    bytes  bigint NOT NULL DEFAULT 0
);
