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
