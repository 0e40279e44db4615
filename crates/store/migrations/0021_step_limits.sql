-- Limits on steps across runs. A step of a node with limits is dispatched
-- (PENDING) but not sent: it waits in limit_waits, a row per limit key,
-- until the limiter admits it (admitted_at) and puts it in the outbox. An
-- admitted row holds a slot of its key's concurrency until the engine
-- deletes it with the attempt's end, or, when the attempt ended elsewhere
-- than at its worker (a timeout, a cancel) while it ran, until its lease
-- would have ended (linger_until): its worker may still be running it.
CREATE TABLE step_limits (
    key             text PRIMARY KEY,
    -- A token bucket: rate_count tokens every rate_period_ms, at most burst.
    rate_count      integer CHECK (rate_count > 0),
    rate_period_ms  bigint CHECK (rate_period_ms > 0),
    burst           integer CHECK (burst > 0),
    concurrency     integer CHECK (concurrency > 0),
    -- 'definition': as the nodes that use it say; 'api': as PUT /v1/limits
    -- set it, which the definitions no longer change.
    set_by          text NOT NULL CHECK (set_by IN ('definition', 'api')),
    -- The bucket's tokens as of refilled_at.
    tokens          double precision NOT NULL DEFAULT 0,
    refilled_at     timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_count IS NULL) = (rate_period_ms IS NULL) AND (rate_count IS NULL) = (burst IS NULL))
);

CREATE TABLE limit_waits (
    run_id          uuid NOT NULL,
    task_id         uuid NOT NULL,
    attempt         integer NOT NULL,
    key             text NOT NULL,
    -- The node's values for the key (NULL for a named limit).
    rate_count      integer,
    rate_period_ms  bigint,
    burst           integer,
    concurrency     integer,
    -- The attempt's timeout, which runs from its admission.
    timeout_ms      bigint,
    queued_at       timestamptz NOT NULL DEFAULT now(),
    admitted_at     timestamptz,
    linger_until    timestamptz,
    PRIMARY KEY (task_id, attempt, key)
);
-- Each key's queue, oldest first (and the keys that have one).
CREATE INDEX limit_waits_queue ON limit_waits (key, queued_at, task_id) WHERE admitted_at IS NULL;
CREATE INDEX limit_waits_admitted ON limit_waits (key) WHERE admitted_at IS NOT NULL;
CREATE INDEX limit_waits_run ON limit_waits (run_id);

-- A target's Retry-After: nothing of the key is admitted before `until`.
-- Written by the engine only, read by the limiter, so neither waits on the
-- other's locks.
CREATE TABLE limit_holds (
    key    text PRIMARY KEY,
    until  timestamptz NOT NULL
);

-- The keys of a step's limits, evaluated when it was created.
ALTER TABLE task_instances ADD COLUMN limit_keys jsonb;
