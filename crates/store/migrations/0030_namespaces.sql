-- Namespaces. `default` keeps its data in this schema, as before there were
-- any; every other namespace keeps its data in a schema of its own
-- (composer_ns_<id>), made by running these same migrations there, so that
-- no query can reach another namespace's rows. What is cluster-wide (this
-- registry, keys, UI sessions) is read and written through the default
-- namespace's connections only: a namespace's schema holds empty copies.
CREATE TABLE namespaces (
    name            text PRIMARY KEY,
    id              bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    description     text NOT NULL DEFAULT '',
    state           text NOT NULL DEFAULT 'creating' CHECK (state IN ('creating', 'active', 'deleting')),
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    deleting_since  timestamptz
);
INSERT INTO namespaces (name, description, state, created_by)
VALUES ('default', 'what every call reaches when it names no namespace', 'active', 'composer');

-- The namespace a key is bound to; NULL: every namespace.
ALTER TABLE api_keys ADD COLUMN namespace text;
