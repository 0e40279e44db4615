-- Logins to the web UI. The cookie holds a random session id; the table holds
-- only its SHA-256, so a read of the table (or a backup) logs nobody in.
-- Any coordinator can check a session, so no load balancer needs to be sticky.
CREATE TABLE ui_sessions (
    id_hash     bytea PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX ui_sessions_expiry ON ui_sessions (expires_at);
