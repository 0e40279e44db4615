-- Schedules: cron-triggered runs, fired by every coordinator's timer loop.
-- A schedule's row lock and its next_fire_at, moved forward in the
-- transaction that starts the run, make each fire time start one run; the
-- fires table's key says so again.
CREATE TABLE schedules (
    id                text PRIMARY KEY,
    spec              jsonb NOT NULL,
    workflow          text NOT NULL,
    paused            boolean NOT NULL DEFAULT false,
    -- The next fire time not yet handled; NULL when the cron never fires again.
    next_fire_at      timestamptz,
    -- overlap buffer_one: a fire time waiting for the schedule's open run to end.
    buffered_fire_at  timestamptz,
    last_run_id       uuid,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
CREATE INDEX schedules_buffered ON schedules (buffered_fire_at) WHERE buffered_fire_at IS NOT NULL;

CREATE TABLE schedule_fires (
    schedule_id  text NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    fire_time    timestamptz NOT NULL,
    run_id       uuid,
    outcome      text NOT NULL CHECK (outcome IN ('started', 'skipped', 'buffered', 'triggered')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, fire_time)
);
CREATE INDEX schedule_fires_age ON schedule_fires (created_at);

-- A run started by a schedule says so: {"schedule": id, "fire_time": …}.
ALTER TABLE workflow_runs ADD COLUMN trigger jsonb;
