-- A dispatched attempt of a node with a `timeout` carries its deadline in
-- wake_at; the timer loop finds the ones past it here.
CREATE INDEX task_instances_deadlines ON task_instances (wake_at)
    WHERE state IN ('PENDING', 'RUNNING') AND wake_at IS NOT NULL;
