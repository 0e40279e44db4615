-- Updates sent to runs (`POST /v1/runs/{id}/update`): each answered once
-- by its id. An accepted one is written in the engine's transaction that
-- completes the step with its output, so it is applied once whichever
-- coordinator takes it and whatever dies; a refused one is written with its
-- reason. A retry with the same id reads its answer here.
CREATE TABLE run_updates (
    run_id      uuid NOT NULL,
    update_id   text NOT NULL,
    name        text NOT NULL,
    -- SHA-256 of the payload's JSON, to tell a retry from an id reused.
    digest      text NOT NULL,
    node_id     text NOT NULL,
    accepted    boolean NOT NULL,
    output      jsonb,
    reason      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, update_id)
);
CREATE INDEX run_updates_age ON run_updates (created_at);
