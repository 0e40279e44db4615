-- APPROVAL steps: each person's vote on a step's attempt, written in the
-- engine's transaction that records it in the run's history (and that
-- completes or fails the step when the vote decides), under the run's
-- lock: a person votes once per attempt, and a step is decided once,
-- whichever coordinator takes the vote and whatever dies. `created_at`
-- is the clock's, not the transaction's: votes of one batch keep their order.
CREATE TABLE approval_votes (
    task_id     uuid NOT NULL,
    attempt     integer NOT NULL,
    person      text NOT NULL,
    run_id      uuid NOT NULL,
    vote        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, attempt, person)
);
CREATE INDEX approval_votes_runs ON approval_votes (run_id);
-- The inbox: the waiting APPROVAL steps, newest first, and by assignee.
CREATE INDEX task_instances_approvals ON task_instances (updated_at DESC, id DESC)
    WHERE node_type = 'APPROVAL' AND state = 'WAITING';
CREATE INDEX task_instances_approval_people ON task_instances
    USING gin ((input_json -> 'assignees' -> 'people')) WHERE node_type = 'APPROVAL' AND state = 'WAITING';
CREATE INDEX task_instances_approval_groups ON task_instances
    USING gin ((input_json -> 'assignees' -> 'groups')) WHERE node_type = 'APPROVAL' AND state = 'WAITING';
-- A person's groups, from the identity provider, for approvals assigned to a group.
ALTER TABLE ui_sessions ADD COLUMN groups text[];
