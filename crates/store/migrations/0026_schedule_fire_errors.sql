-- A fire time whose run could not start (its workflow gone, its input or
-- tags refused by the definition) says why: outcome 'failed' with its
-- error, which the schedule's view shows for its latest fire. A backfill
-- may ask for a failed fire time again, as for a skipped one.
ALTER TABLE schedule_fires ADD COLUMN error text;
ALTER TABLE schedule_fires DROP CONSTRAINT schedule_fires_outcome_check;
ALTER TABLE schedule_fires ADD CONSTRAINT schedule_fires_outcome_check
    CHECK (outcome IN ('started', 'skipped', 'buffered', 'triggered', 'queued', 'failed'));
