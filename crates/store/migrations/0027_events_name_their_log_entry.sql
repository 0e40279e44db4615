-- A kept event names the event log entry it was recorded with, so that a
-- step taking it later (one that began to wait after it came, or the
-- recovery sweep's delivery) is counted on that entry's `delivered`, as
-- the steps its sender completed are: the events list and page say how many
-- steps each event completed, not only those that waited when it came.
-- Rows kept before this have none and are not counted.
ALTER TABLE events ADD COLUMN log_seq bigint;
