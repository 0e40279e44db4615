-- The outbox keeps where a dispatch goes (queue and shard) and which attempt
-- it is, not a prebuilt stream name and message: the stream is named by the
-- stream crate and the message is built from the task row by the enqueuer, so
-- each has one owner in the code.
ALTER TABLE outbox ADD COLUMN run_id uuid, ADD COLUMN queue text, ADD COLUMN shard integer, ADD COLUMN attempt integer;
UPDATE outbox
   SET run_id = (payload ->> 'run_id')::uuid,
       attempt = (payload ->> 'attempt')::integer,
       queue = substring(stream FROM 'tasks:(.*)\.[0-9]+$'),
       shard = substring(stream FROM '\.([0-9]+)$')::integer;
ALTER TABLE outbox
    ALTER COLUMN run_id SET NOT NULL,
    ALTER COLUMN queue SET NOT NULL,
    ALTER COLUMN shard SET NOT NULL,
    ALTER COLUMN attempt SET NOT NULL,
    DROP COLUMN stream,
    DROP COLUMN payload,
    DROP COLUMN type,
    DROP COLUMN claimed_at;

-- The shard of a task's stream: `hashtextextended` can be negative, and the
-- double modulo keeps the result in 0..shards.
CREATE FUNCTION composer_shard(task_id uuid, shards integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (((hashtextextended(task_id::text, 0) % shards) + shards) % shards)::integer
$$;

-- The states the engine knows; anything else is a bug, refused at the write.
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_known
    CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'));
ALTER TABLE task_instances ADD CONSTRAINT task_instances_state_known
    CHECK (state IN ('PENDING', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'SKIPPED', 'CANCELLED'));
ALTER TABLE outbox ADD CONSTRAINT outbox_status_known CHECK (status IN ('PENDING', 'CLAIMED', 'RETRY'));
