-- WAIT_FOR_EVENT: what each waiting task waits for, and events that arrived
-- before their waiter (kept until they expire or a waiter consumes them).
ALTER TABLE task_instances ADD COLUMN event_name text, ADD COLUMN event_key text;
CREATE INDEX task_instances_event_waits ON task_instances (event_name, event_key)
    WHERE state = 'WAITING' AND event_name IS NOT NULL;

CREATE TABLE events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL,
    key          text NOT NULL,
    payload      jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    consumed_by  uuid
);
CREATE INDEX events_unconsumed ON events (name, key, id) WHERE consumed_by IS NULL;
CREATE INDEX events_expiry ON events (expires_at);

-- Idempotent starts look a key up per workflow.
CREATE INDEX workflow_runs_idempotency ON workflow_runs (workflow_name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
