-- When things go wrong.
--   error_info: what a failure edge can test of a task's failure besides its
--     message: {code, retryable, status?}.
--   iteration: a LOOP task's current iteration (from 0); its child runs say
--     which one they are (parent_iteration), so each iteration has one child.
--   at_most_once: a task of a node with `delivery: "at_most_once"`, whose
--     attempt must never be sent twice: an attempt whose outcome is unknown
--     (its lease expired, its request timed out) goes IN_DOUBT instead of
--     being dispatched again, until an operator resolves it.
ALTER TABLE task_instances
    ADD COLUMN error_info jsonb,
    ADD COLUMN iteration integer,
    ADD COLUMN at_most_once boolean NOT NULL DEFAULT false;
ALTER TABLE task_instances DROP CONSTRAINT task_instances_state_known;
ALTER TABLE task_instances ADD CONSTRAINT task_instances_state_known
    CHECK (state IN ('QUEUED', 'PENDING', 'RUNNING', 'WAITING', 'IN_DOUBT', 'COMPLETED', 'FAILED', 'SKIPPED',
                     'CANCELLED'));

--   handles_run_id: a failure handler's run names the run whose end started it
--     (a definition's `on_failure`), in the commit of that end.
--   parent_iteration: the LOOP iteration a child run is.
--   abandoned: a child whose node says `on_parent_close: "abandon"`: its parent
--     never cancels it.
ALTER TABLE workflow_runs
    ADD COLUMN handles_run_id uuid,
    ADD COLUMN parent_iteration integer NOT NULL DEFAULT 0,
    ADD COLUMN abandoned boolean NOT NULL DEFAULT false;
CREATE INDEX workflow_runs_handlers ON workflow_runs (handles_run_id) WHERE handles_run_id IS NOT NULL;

-- The recovery sweep's way in for LOOP children, as for SUB_WORKFLOW's.
CREATE INDEX task_instances_loop_waits ON task_instances (updated_at)
    WHERE state = 'RUNNING' AND node_type = 'LOOP';
