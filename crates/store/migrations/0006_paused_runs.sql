-- A run may be PAUSED: open, nothing new starting (retention keeps a month
-- that holds one: see composer_drop_partitions).
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_known;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_known
    CHECK (status IN ('RUNNING', 'PAUSED', 'SUCCEEDED', 'FAILED', 'CANCELLED'));
