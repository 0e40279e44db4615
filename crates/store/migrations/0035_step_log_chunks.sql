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
-- When a chunk was sealed: a month is not dropped while a chunk of its runs
-- was sealed after its runs were read (the lines it holds may have come
-- later), as for a line stored after.
ALTER TABLE task_log_chunks ADD COLUMN sealed_at timestamptz NOT NULL DEFAULT now();
CREATE OR REPLACE FUNCTION composer_drop_month(month text, unchanged_since timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    runs text := 'workflow_runs_p' || month;
    tasks text := 'task_instances_p' || month;
    events text := 'run_events_p' || month;
    lo uuid;
    hi uuid;
    held boolean;
BEGIN
    IF month !~ '^[0-9]{4}_[0-9]{2}$' THEN
        RAISE EXCEPTION 'not a month: %', month;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('composer_partitions'));
    IF to_regclass(runs) IS NULL THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', '5s', true);
    LOCK TABLE ONLY workflow_runs, ONLY task_instances, ONLY run_events IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('LOCK TABLE %I, %I, %I IN ACCESS EXCLUSIVE MODE', runs, tasks, events);
    lo := composer_month_uuid(to_date(month, 'YYYY_MM')::timestamp AT TIME ZONE 'UTC');
    hi := composer_month_uuid((to_date(month, 'YYYY_MM') + interval '1 month')::timestamp AT TIME ZONE 'UTC');
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM %I WHERE status NOT IN (%L, %L, %L) OR updated_at >= $1)
             OR EXISTS (SELECT 1 FROM %I WHERE updated_at >= $1)
             OR EXISTS (SELECT 1 FROM %I WHERE created_at >= $1)
             OR EXISTS (SELECT 1 FROM task_logs WHERE at >= $1 AND run_id >= $2 AND run_id < $3)
             OR EXISTS (SELECT 1 FROM task_log_chunks WHERE sealed_at >= $1 AND run_id >= $2 AND run_id < $3)',
        runs, 'SUCCEEDED', 'FAILED', 'CANCELLED', tasks, events)
        INTO held USING unchanged_since, lo, hi;
    IF held THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %I, %I, %I', events, tasks, runs);
    RETURN true;
END
$$;
