-- SUB_WORKFLOW: a child run knows the task (and the attempt of it) that
-- started it, and how deep it is nested. The engine starts a child in the
-- transaction that starts the attempt, so there is one per (task, attempt);
-- PostgreSQL cannot enforce that across partitions with a unique index (it
-- would have to include the run id).
ALTER TABLE workflow_runs
    ADD COLUMN parent_run_id uuid,
    ADD COLUMN parent_task_id uuid,
    ADD COLUMN parent_attempt integer,
    ADD COLUMN depth integer NOT NULL DEFAULT 0;
CREATE INDEX workflow_runs_by_parent_task ON workflow_runs (parent_task_id) WHERE parent_task_id IS NOT NULL;
CREATE INDEX workflow_runs_children ON workflow_runs (parent_run_id, id DESC) WHERE parent_run_id IS NOT NULL;
CREATE INDEX workflow_runs_open_children ON workflow_runs (parent_run_id)
    WHERE parent_run_id IS NOT NULL AND status IN ('RUNNING', 'PAUSED');
-- The recovery sweep's way in: SUB_WORKFLOW attempts waiting for their child.
CREATE INDEX task_instances_child_waits ON task_instances (updated_at)
    WHERE state = 'RUNNING' AND node_type = 'SUB_WORKFLOW';
