-- When a run times out (its definition's `timeout` after its start); the
-- timer loop finds open runs past it here.
ALTER TABLE workflow_runs ADD COLUMN deadline timestamptz;
CREATE INDEX workflow_runs_deadlines ON workflow_runs (deadline)
    WHERE status IN ('RUNNING', 'PAUSED') AND deadline IS NOT NULL;
