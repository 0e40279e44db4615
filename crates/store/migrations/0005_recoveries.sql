-- How often recovery has dispatched a task's current attempt again (an
-- expired lease, a lost message). Past a limit the attempt is failed instead
-- of being dispatched forever. Counted per attempt without touching the hot
-- path: a new attempt differs from `recovered_attempt`, which restarts it.
ALTER TABLE task_instances ADD COLUMN recovered_attempt integer, ADD COLUMN recoveries integer NOT NULL DEFAULT 0;
