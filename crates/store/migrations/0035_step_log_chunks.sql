-- With offloading, an attempt's log lines past the offload threshold are
-- sealed: the lines still in rows are written as one object (a chunk) of
-- their run's, and their rows replaced by one row naming it. An attempt's
-- chunks hold its lines up to the first row's seq; readers read chunks,
-- then rows. row_bytes counts what the attempt's rows hold (as `bytes`
-- counts), to tell when to seal.
CREATE TABLE task_log_chunks (
    task_id    uuid NOT NULL,
    attempt    integer NOT NULL,
    first_seq  integer NOT NULL,
    last_seq   integer NOT NULL,
    run_id     uuid NOT NULL,
    -- A reference to the chunk's object ({"$composer_offloaded": …}).
    object     jsonb NOT NULL,
    PRIMARY KEY (task_id, attempt, first_seq)
);
CREATE INDEX task_log_chunks_run ON task_log_chunks (run_id);
ALTER TABLE task_log_usage ADD COLUMN row_bytes bigint NOT NULL DEFAULT 0;
UPDATE task_log_usage SET row_bytes = bytes;
