-- A trigger's flow control (debounce, batch, throttle, singleton): what one
-- key of one trigger holds between events, in one row. A trigger is known
-- by its place and its event's name: a new version that moves triggers
-- about does not mix one trigger's events with another's. The transaction that
-- records an event of the key locks the row (an upsert), and so does the
-- timer loop's when the row is due (FOR UPDATE SKIP LOCKED): each writes
-- back what the key holds in the commit that starts the runs it decided.
CREATE TABLE trigger_flows (
    workflow_name  text NOT NULL,
    trigger_index  integer NOT NULL,
    event_name     text NOT NULL,
    key            text NOT NULL,
    -- How its events are held (debounce, batch or throttle and their
    -- numbers), as when the last event came; NULL for a singleton alone.
    hold           jsonb,
    singleton      text CHECK (singleton IN ('skip', 'cancel')),
    -- When the burst, the batch or the throttle's period began.
    opened_at      timestamptz,
    -- When the timer loop looks at it again; NULL: it holds nothing.
    due_at         timestamptz,
    -- Runs started in the throttle's period.
    count          integer NOT NULL DEFAULT 0,
    -- The last run the key started: a singleton's running one.
    last_run       uuid,
    PRIMARY KEY (workflow_name, trigger_index, event_name, key)
);
CREATE INDEX trigger_flows_due ON trigger_flows (due_at) WHERE due_at IS NOT NULL;
-- A singleton's keys that hold no events, for the sweep that forgets those
-- whose run ended.
CREATE INDEX trigger_flows_idle ON trigger_flows (last_run) WHERE due_at IS NULL;

-- The events a key holds (a trailing debounce's last, a batch's, a
-- throttle's queue), a row each: an event adds its row and a start deletes
-- its events' rows, so a key holding n events costs each new one a row,
-- not a rewrite of all n.
CREATE TABLE trigger_flow_events (
    workflow_name  text NOT NULL,
    trigger_index  integer NOT NULL,
    event_name     text NOT NULL,
    key            text NOT NULL,
    -- The event's place in the event log.
    seq            bigint NOT NULL,
    -- The order the key took them in (under its row's lock): not the
    -- log's, which two events racing for the lock, or a replayed event,
    -- may not follow.
    pos            bigint GENERATED ALWAYS AS IDENTITY,
    -- {seq, event_id, input, idempotency_key?}
    event          jsonb NOT NULL,
    PRIMARY KEY (workflow_name, trigger_index, event_name, key, seq),
    FOREIGN KEY (workflow_name, trigger_index, event_name, key)
        REFERENCES trigger_flows ON DELETE CASCADE
);

-- Runs a singleton trigger cancels, written in the commit that starts the
-- run that replaces them, and cancelled after it (by the timer loop, when
-- the coordinator died first).
CREATE TABLE trigger_cancels (
    run_id      uuid PRIMARY KEY,
    written_at  timestamptz NOT NULL DEFAULT now()
);

-- What a trigger's flow control did with an event: the flow, and a held,
-- replaced or dropped event's note (its run_id is set when its run starts).
ALTER TABLE event_runs ADD COLUMN flow text, ADD COLUMN flow_note text;
