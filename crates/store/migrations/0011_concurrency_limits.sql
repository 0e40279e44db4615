-- Concurrency limits: a run of a limited workflow carries its key; over the
-- limit it is created QUEUED and started, oldest first, when a slot frees.
ALTER TABLE workflow_runs ADD COLUMN concurrency_key text;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_known;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_known
    CHECK (status IN ('QUEUED', 'RUNNING', 'PAUSED', 'SUCCEEDED', 'FAILED', 'CANCELLED'));
-- The open runs of a key, counted under the key's lock ...
CREATE INDEX workflow_runs_limited_open ON workflow_runs (workflow_name, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status IN ('RUNNING', 'PAUSED');
-- ... and its queue, oldest first.
CREATE INDEX workflow_runs_queued ON workflow_runs (workflow_name, concurrency_key, id) WHERE status = 'QUEUED';

-- Retention keeps a month that holds any run not yet finished (QUEUED too).
CREATE OR REPLACE FUNCTION composer_drop_partitions(before timestamptz)
RETURNS TABLE (month text, dropped boolean)
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    month_end timestamptz;
    open_runs boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('composer_partitions'));
    FOR part IN
        SELECT c.relname::text AS name
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'workflow_runs'::regclass
           AND c.relname ~ '^workflow_runs_p[0-9]{4}_[0-9]{2}$'
         ORDER BY 1
    LOOP
        month := right(part.name, 7);
        month_end := (to_date(month, 'YYYY_MM') + interval '1 month')::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN month_end > before;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE status NOT IN (%L, %L, %L))',
                       part.name, 'SUCCEEDED', 'FAILED', 'CANCELLED')
            INTO open_runs;
        IF open_runs THEN
            dropped := false;
        ELSE
            EXECUTE format('DROP TABLE IF EXISTS %I, %I, %I',
                'run_events_p' || month, 'task_instances_p' || month, 'workflow_runs_p' || month);
            dropped := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
