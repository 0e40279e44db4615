-- A namespace's quotas (NULL: none): most open runs (queued, running or
-- paused), starts per second, schedules, limits set on step limit keys, and
-- bytes stored in its schema (runs, outputs, logs and the rest, as
-- PostgreSQL counts them).
ALTER TABLE namespaces
    ADD COLUMN quota_open_runs bigint CHECK (quota_open_runs > 0),
    ADD COLUMN quota_starts_per_second bigint CHECK (quota_starts_per_second > 0),
    ADD COLUMN quota_schedules bigint CHECK (quota_schedules >= 0),
    ADD COLUMN quota_limits bigint CHECK (quota_limits >= 0),
    ADD COLUMN quota_stored_bytes bigint CHECK (quota_stored_bytes > 0);
