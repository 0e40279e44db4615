-- A definition's deadlines (`deadlines`, a run's and each node's): a row
-- per deadline armed, from the commit that starts the run (or creates the
-- step) until the commit that fires it, or finds the run or step ended,
-- deletes it. `node_id` is '' for the run's own; `idx` its place in the
-- definition's list.
CREATE TABLE run_deadlines (
    run_id   uuid NOT NULL,
    node_id  text NOT NULL,
    idx      integer NOT NULL,
    due_at   timestamptz NOT NULL,
    PRIMARY KEY (run_id, node_id, idx)
);
CREATE INDEX run_deadlines_due ON run_deadlines (due_at);
