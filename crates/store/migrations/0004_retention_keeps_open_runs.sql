-- Retention never deletes an open run: a month whose partition still holds a
-- RUNNING or PAUSED run (waiting on an event or a long timer) is kept, and reported as
-- kept, until its last run ends. The function now says, per expired month,
-- whether it was dropped.
DROP FUNCTION composer_drop_partitions(timestamptz);
CREATE FUNCTION composer_drop_partitions(before timestamptz)
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
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE status IN (%L, %L))', part.name, 'RUNNING', 'PAUSED')
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
