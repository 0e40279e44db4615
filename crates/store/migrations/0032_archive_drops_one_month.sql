-- Archiving drops one month at a time, after its runs are written out. The
-- month's three tables are locked first, their parents before them (nothing
-- reads or writes runs until the drop commits, and what is under way is
-- waited for, at most 5 s: a brief stop once a month), then the
-- month goes only if it holds no open run and nothing of it changed since
-- `unchanged_since`: no run, task, history line or log line (a run retried,
-- or an event ignored, while the month was read is written again on the
-- next pass, not dropped unwritten). Advisory-locked like
-- composer_drop_partitions.
CREATE FUNCTION composer_drop_month(month text, unchanged_since timestamptz)
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
    -- Parents first, as every query locks them (and as the DROP would):
    -- locking a partition before its parent deadlocks with a reader.
    PERFORM set_config('lock_timeout', '5s', true);
    LOCK TABLE ONLY workflow_runs, ONLY task_instances, ONLY run_events IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('LOCK TABLE %I, %I, %I IN ACCESS EXCLUSIVE MODE', runs, tasks, events);
    lo := composer_month_uuid(to_date(month, 'YYYY_MM')::timestamp AT TIME ZONE 'UTC');
    hi := composer_month_uuid((to_date(month, 'YYYY_MM') + interval '1 month')::timestamp AT TIME ZONE 'UTC');
    EXECUTE format(
        'SELECT EXISTS (SELECT 1 FROM %I WHERE status NOT IN (%L, %L, %L) OR updated_at >= $1)
             OR EXISTS (SELECT 1 FROM %I WHERE updated_at >= $1)
             OR EXISTS (SELECT 1 FROM %I WHERE created_at >= $1)
             OR EXISTS (SELECT 1 FROM task_logs WHERE at >= $1 AND run_id >= $2 AND run_id < $3)',
        runs, 'SUCCEEDED', 'FAILED', 'CANCELLED', tasks, events)
        INTO held USING unchanged_since, lo, hi;
    IF held THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %I, %I, %I', events, tasks, runs);
    RETURN true;
END
$$;

-- Once a coordinator with an archive has started on this schema, its months
-- are archived: a coordinator without one (misconfigured, or of an older
-- build) must not drop them unwritten. The row says so; deleting it (by
-- hand, `DELETE FROM archive_required`) is how archiving is turned off.
CREATE TABLE archive_required (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    since    timestamptz NOT NULL DEFAULT now()
);

-- Retention without an archive: as before (a month holding any run not yet
-- finished is kept), but nothing is dropped while archiving is required,
-- and the parents are locked before a partition is dropped, as every query
-- locks them (dropping a partition locks it and then its parent, and a
-- reader holding the parent waiting for the partition deadlocks with it).
CREATE OR REPLACE FUNCTION composer_drop_partitions(before timestamptz)
RETURNS TABLE (month text, dropped boolean)
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    month_end timestamptz;
    open_runs boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('composer_partitions'));
    IF EXISTS (SELECT 1 FROM archive_required) THEN
        RETURN;
    END IF;
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
            LOCK TABLE ONLY workflow_runs, ONLY task_instances, ONLY run_events IN ACCESS EXCLUSIVE MODE;
            EXECUTE format('DROP TABLE IF EXISTS %I, %I, %I',
                'run_events_p' || month, 'task_instances_p' || month, 'workflow_runs_p' || month);
            dropped := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
