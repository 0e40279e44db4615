-- Runs started by events. event_triggers says which workflows' latest
-- versions have a trigger for an event name (kept by registration, in its
-- transaction); event_log records each event once by its id, with the runs
-- its triggers started in the same commit (event_runs), so that sending it
-- again starts nothing and answers the same runs.
CREATE TABLE event_triggers (
    event_name     text NOT NULL,
    workflow_name  text NOT NULL,
    PRIMARY KEY (event_name, workflow_name)
);
CREATE INDEX event_triggers_workflow ON event_triggers (workflow_name);

CREATE TABLE event_log (
    seq          bigserial PRIMARY KEY,
    name         text NOT NULL,
    -- The sender's id for the event, or one made when it gave none.
    event_id     text NOT NULL,
    key          text NOT NULL,
    payload      jsonb NOT NULL,
    -- 'api', or 'webhook:NAME'.
    source       text NOT NULL,
    -- Waiting steps it completed (counted after its commit).
    delivered    integer NOT NULL DEFAULT 0,
    received_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, event_id)
);
CREATE INDEX event_log_age ON event_log (received_at);

CREATE TABLE event_runs (
    event_seq      bigint NOT NULL REFERENCES event_log (seq) ON DELETE CASCADE,
    workflow_name  text NOT NULL,
    trigger_index  integer NOT NULL,
    -- NULL when the trigger could not start its run (error says why).
    run_id         uuid,
    error          text,
    PRIMARY KEY (event_seq, workflow_name, trigger_index)
);

-- Webhooks: a signed delivery from another service turned into an event.
-- The signing secret is never here: the spec names the coordinator's
-- environment variable that holds it.
CREATE TABLE webhooks (
    name        text PRIMARY KEY,
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
