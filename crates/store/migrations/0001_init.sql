-- Composer's schema. Run-scoped tables are partitioned by month on their run
-- id: ids are UUIDv7, whose first 48 bits are the creation time in unix
-- milliseconds, so a month is a contiguous uuid range, a query naming a run
-- touches one partition, and a month of runs, tasks and history is dropped
-- with three DROP TABLEs.

CREATE TABLE workflow_definitions (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    version     integer NOT NULL,
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);

CREATE TABLE workflow_runs (
    id                      uuid NOT NULL,
    workflow_definition_id  uuid NOT NULL,
    workflow_name           text NOT NULL,
    workflow_version        integer NOT NULL,
    status                  text NOT NULL,
    input                   jsonb NOT NULL,
    output                  jsonb,
    error                   text,
    idempotency_key         text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    finished_at             timestamptz,
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX workflow_runs_by_workflow ON workflow_runs (workflow_name, id DESC);
CREATE INDEX workflow_runs_by_status ON workflow_runs (status, id DESC);

CREATE TABLE task_instances (
    run_id            uuid NOT NULL,
    id                uuid NOT NULL,
    node_id           text NOT NULL,
    node_type         text NOT NULL,
    queue             text,
    state             text NOT NULL,
    attempt           integer NOT NULL,
    input_json        jsonb NOT NULL,
    output_json       jsonb,
    error             text,
    lease_owner       text,
    lease_expires_at  timestamptz,
    wake_at           timestamptz,
    started_at        timestamptz,
    finished_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, id)
) PARTITION BY RANGE (run_id);
-- The sweeps and the timer loop look only at open tasks: partial indexes keep
-- their cost proportional to the open work, not to history.
CREATE INDEX task_instances_running ON task_instances (lease_expires_at) WHERE state = 'RUNNING';
CREATE INDEX task_instances_pending ON task_instances (updated_at) WHERE state = 'PENDING';
CREATE INDEX task_instances_waiting ON task_instances (wake_at) WHERE state = 'WAITING';

CREATE SEQUENCE run_events_seq;
CREATE TABLE run_events (
    run_id      uuid NOT NULL,
    seq         bigint NOT NULL DEFAULT nextval('run_events_seq'),
    type        text NOT NULL,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
) PARTITION BY RANGE (run_id);

-- Transient: a row lives from the commit that dispatches a task until its
-- message is on a stream. `next_attempt_at` is the one claim condition: new
-- rows are due at once, a claim pushes it forward by the claim timeout (so a
-- crash between XADD and DELETE republishes later), a Redis error by a backoff.
CREATE TABLE outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id          uuid NOT NULL,
    stream           text NOT NULL,
    payload          jsonb NOT NULL,
    type             text NOT NULL DEFAULT 'TASK_EXECUTION',
    status           text NOT NULL DEFAULT 'PENDING',
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claimed_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_task_id ON outbox (task_id);
CREATE INDEX outbox_due ON outbox (next_attempt_at);

-- The smallest UUIDv7 of the millisecond `ts`: a partition bound.
CREATE FUNCTION composer_month_uuid(ts timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0')
            || '00000000000000000000')::uuid
$$;

-- Creates the monthly partitions of run-scoped tables from the current month
-- to `months_ahead` months ahead; returns how many tables it created. The
-- advisory lock makes concurrent calls from many coordinators safe.
CREATE FUNCTION composer_ensure_partitions(months_ahead integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    month_start timestamp;
    parent text;
    part text;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('composer_partitions'));
    FOR i IN 0..months_ahead LOOP
        month_start := date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i);
        FOREACH parent IN ARRAY ARRAY['workflow_runs', 'task_instances', 'run_events'] LOOP
            part := parent || '_p' || to_char(month_start, 'YYYY_MM');
            IF to_regclass(part) IS NULL THEN
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                    part, parent,
                    composer_month_uuid(month_start AT TIME ZONE 'UTC'),
                    composer_month_uuid((month_start + interval '1 month') AT TIME ZONE 'UTC'));
                created := created + 1;
            END IF;
        END LOOP;
    END LOOP;
    RETURN created;
END
$$;

-- Drops every whole month that ended at or before `before`, with its runs,
-- tasks and history; returns the months dropped (YYYY_MM). Advisory-locked
-- like composer_ensure_partitions.
CREATE FUNCTION composer_drop_partitions(before timestamptz) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    month text;
    month_end timestamptz;
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
        IF month_end <= before THEN
            EXECUTE format('DROP TABLE IF EXISTS %I, %I, %I',
                'run_events_p' || month, 'task_instances_p' || month, 'workflow_runs_p' || month);
            RETURN NEXT month;
        END IF;
    END LOOP;
END
$$;
