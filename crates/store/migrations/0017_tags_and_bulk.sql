-- Tags on runs: the definition's (evaluated over the input when the run is
-- created) and the start's, `{key: value}` text; found with `@>`.
ALTER TABLE workflow_runs ADD COLUMN tags jsonb;
CREATE INDEX workflow_runs_tags ON workflow_runs USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL;

-- Bulk actions: a job works through the runs its filter matches, oldest
-- first, a batch at a time, on any coordinator (a claim with SKIP LOCKED);
-- `cursor` is the last run it looked at. A run it acted on is marked in
-- bulk_job_runs in the same commit as the action, so each run is acted on
-- once whatever crashes. Jobs and their marks go a week after they end.
CREATE TABLE bulk_jobs (
    id          uuid PRIMARY KEY,
    filter      jsonb NOT NULL,
    action      text NOT NULL CHECK (action IN ('cancel', 'retry', 'pause', 'resume', 'rerun')),
    -- The steps a rerun starts from.
    rerun_from  text[],
    actor       text NOT NULL,
    reason      text,
    status      text NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'CANCELLED')),
    -- Runs the filter matched when the job was created (an estimate: runs
    -- keep being created), and how it stands.
    matched     bigint NOT NULL,
    looked_at   bigint NOT NULL DEFAULT 0,
    acted_on    bigint NOT NULL DEFAULT 0,
    refused     bigint NOT NULL DEFAULT 0,
    cursor      uuid,
    -- Runs created after this are not the job's.
    until_id    uuid NOT NULL,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX bulk_jobs_running ON bulk_jobs (updated_at) WHERE status = 'RUNNING';

CREATE TABLE bulk_job_runs (
    job_id uuid NOT NULL REFERENCES bulk_jobs (id) ON DELETE CASCADE,
    run_id uuid NOT NULL,
    PRIMARY KEY (job_id, run_id)
);
