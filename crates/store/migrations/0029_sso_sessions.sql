-- A UI session names who it is: a person signed in with the identity
-- provider (their name and the scopes their groups give), or, where both
-- are NULL, the API token's holder (a login with the token).
ALTER TABLE ui_sessions ADD COLUMN actor text, ADD COLUMN scopes text[];

-- A sign-in under way: the PKCE verifier and nonce of the state the
-- provider sends back, by the state's SHA-256; taken (deleted) once.
CREATE TABLE ui_sso_logins (
    state_hash  bytea PRIMARY KEY,
    verifier    text NOT NULL,
    nonce       text NOT NULL,
    next        text NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX ui_sso_logins_expiry ON ui_sso_logins (expires_at);
