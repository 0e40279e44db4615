-- API keys: each a name, scopes and optionally queues and an expiry. The
-- key's secret part is kept only as its SHA-256: a read of the table (or a
-- backup) lets nobody in. A key is revoked, never deleted, so the audit log
-- and runs' history keep naming a key that exists.
CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    name         text NOT NULL,
    secret_hash  bytea NOT NULL CHECK (octet_length(secret_hash) = 32),
    scopes       text[] NOT NULL CHECK (cardinality(scopes) > 0),
    queues       text[],
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    expires_at   timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_keys_created ON api_keys (created_at DESC);

-- The audit log: one row written before a change is made (what was asked,
-- by whom, from where), one when it was answered (the status and what it
-- left). Append-only: the trigger refuses every UPDATE and DELETE, and
-- run retention never touches it.
CREATE TABLE audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    request_id  uuid NOT NULL,
    answered    boolean NOT NULL,
    actor       text NOT NULL,
    key_id      uuid,
    source      text NOT NULL,
    method      text NOT NULL,
    route       text NOT NULL,
    path        text NOT NULL,
    body        jsonb,
    status      integer,
    UNIQUE (request_id, answered)
);

CREATE FUNCTION audit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_is_append_only();
