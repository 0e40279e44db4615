-- MAP: one task per item, besides the MAP node's own task.
--   parent_task_id, item_index: an item's MAP task and its position in `items`;
--   progress: on a MAP task, its item counts ({total, queued, open, completed, failed}).
-- QUEUED is an item waiting for a slot under the MAP's max_concurrency.
ALTER TABLE task_instances
    ADD COLUMN parent_task_id uuid,
    ADD COLUMN item_index integer,
    ADD COLUMN progress jsonb;
ALTER TABLE task_instances DROP CONSTRAINT task_instances_state_known;
ALTER TABLE task_instances ADD CONSTRAINT task_instances_state_known
    CHECK (state IN ('QUEUED', 'PENDING', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'SKIPPED', 'CANCELLED'));

-- The engine loads a run's node tasks without its items, so an event costs
-- the same whether a MAP has ten items or ten thousand ...
CREATE INDEX task_instances_nodes ON task_instances (run_id) WHERE parent_task_id IS NULL;
-- ... reads the next items to start, lowest index first ...
CREATE INDEX task_instances_queued_items ON task_instances (parent_task_id, item_index) WHERE state = 'QUEUED';
-- ... and all of a MAP's items only once, to gather its output.
CREATE INDEX task_instances_items ON task_instances (parent_task_id, item_index) WHERE parent_task_id IS NOT NULL;
