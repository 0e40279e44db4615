-- The fan-out budget of a run tree: a root run and every run started under
-- it by SUB_WORKFLOW. A child names its root; the root's row here counts the
-- runs and MAP items its tree has created, so no tree can grow past the
-- limits however its definitions call each other.
ALTER TABLE workflow_runs ADD COLUMN root_run_id uuid;

CREATE TABLE run_trees (
    root_run_id uuid PRIMARY KEY,
    -- Runs in the tree, the root included.
    runs        bigint NOT NULL,
    -- MAP items created anywhere in the tree.
    items       bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
