-- Priorities (1 served first, 5 last) and fairness keys.
--
-- A run's priority and fairness key are its tasks' too. An outbox row
-- carries the priority of its message, which names the stream it goes to
-- (one per priority, queue and shard); a run with a fairness key sends
-- every message to its key's shard, so that the shards are lanes that take
-- turns.
--
-- A QUEUED run's turn orders the admission of its concurrency key's queue
-- (start-time fair queueing): the turn of the last queued run of its class
-- (its priority and fairness key) plus that priority's share, 1/16 for
-- priority 1 to 1 for priority 5, or the queue's head if that is later. So
-- the classes with a backlog take turns, a priority-1 class 16 times as
-- often as a priority-5 one, and a class arriving late goes right after
-- the head, not behind another's backlog.
ALTER TABLE workflow_runs
    ADD COLUMN priority smallint NOT NULL DEFAULT 3
        CONSTRAINT workflow_runs_priority_known CHECK (priority BETWEEN 1 AND 5),
    ADD COLUMN fairness_key text,
    ADD COLUMN fair_turn double precision NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN priority smallint NOT NULL DEFAULT 3;

DROP INDEX workflow_runs_queued;
CREATE INDEX workflow_runs_queued ON workflow_runs (workflow_name, concurrency_key, fair_turn, id)
    WHERE status = 'QUEUED';
CREATE INDEX workflow_runs_queued_turns
    ON workflow_runs (workflow_name, concurrency_key, priority, (coalesce(fairness_key, '')), fair_turn)
    WHERE status = 'QUEUED';

-- The shard of a task's stream: its fairness key's, else its own.
CREATE FUNCTION composer_lane(task_id uuid, fairness_key text, shards integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN fairness_key IS NULL THEN composer_shard(task_id, shards)
                ELSE (((hashtextextended(fairness_key, 0) % shards) + shards) % shards)::integer END
$$;
