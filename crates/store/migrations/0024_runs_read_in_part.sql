-- A step's result reads only what it needs of a large run: the run's open
-- and failed node tasks, then the nodes the state machine asks for by
-- (run, node id). This index serves those two reads and the read of all
-- of a run's node tasks, in place of the one by run alone. `state` in its
-- key costs no write: a task's every update writes a new entry into each
-- of its indexes anyway (none of them is HOT).
CREATE INDEX task_instances_node_tasks ON task_instances (run_id, state, node_id) WHERE parent_task_id IS NULL;
DROP INDEX task_instances_nodes;
