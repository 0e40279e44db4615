-- Step logs: lines a worker sends for the attempt it holds the lease of
-- (POST /v1/tasks/{id}/logs), kept with the attempt, at most
-- COMPOSER_TASK_LOG_MAX_BYTES of them per attempt (a marker line says when
-- more were dropped). They go when their run does: the retention pass
-- deletes the lines of runs no longer there.
CREATE TABLE task_logs (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    seq     integer NOT NULL,
    run_id  uuid NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    line    text NOT NULL,
    PRIMARY KEY (task_id, attempt, seq)
);
CREATE INDEX task_logs_at ON task_logs (at);
