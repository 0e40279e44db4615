-- Replays: the triggers of recorded events run again, as a job worked a
-- batch at a time by any coordinator (claimed until `claimed_until`, a
-- lease renewed with each event). `cursor` is the last event sequence
-- number looked at; `until_seq` the newest event when the replay was made
-- (later ones are not its). Each event is replayed in one commit that
-- starts its runs, records them in event_runs (with `replayed_by`) and
-- moves the cursor and the counts past it, so an event worked again after
-- a crash starts nothing twice and the counts hold. `tries`: passing
-- failures of the event after the cursor (at 5 it is counted failed).
CREATE TABLE event_replays (
    id           uuid PRIMARY KEY,
    filter       jsonb NOT NULL,
    actor        text NOT NULL,
    reason       text,
    status       text NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'CANCELLED')),
    matched      bigint NOT NULL,
    looked_at    bigint NOT NULL DEFAULT 0,
    started      bigint NOT NULL DEFAULT 0,
    failed       bigint NOT NULL DEFAULT 0,
    cursor       bigint NOT NULL DEFAULT 0,
    until_seq    bigint NOT NULL,
    claimed_until timestamptz,
    tries        integer NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX event_replays_running ON event_replays (updated_at) WHERE status = 'RUNNING';

-- The replay that started an event's run, when one did (NULL: its sending).
ALTER TABLE event_runs ADD COLUMN replayed_by uuid;
