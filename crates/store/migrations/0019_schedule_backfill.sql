-- Backfill: past fire times an operator asks a schedule to run, queued on
-- the fires table (the key on schedule and fire time makes a second ask
-- queue nothing) and started by the timer loop under the backfill's
-- overlap, each in the commit that records its run.
ALTER TABLE schedule_fires DROP CONSTRAINT schedule_fires_outcome_check;
ALTER TABLE schedule_fires ADD CONSTRAINT schedule_fires_outcome_check
    CHECK (outcome IN ('started', 'skipped', 'buffered', 'triggered', 'queued'));
-- A backfilled fire's overlap; NULL for the cron's own fires.
ALTER TABLE schedule_fires ADD COLUMN backfill text CHECK (backfill IN ('allow', 'skip', 'buffer_all'));
CREATE INDEX schedule_fires_queued ON schedule_fires (schedule_id, fire_time) WHERE outcome = 'queued';
