-- What an expression's evaluation killed a coordinator on, so that no
-- coordinator evaluates it again: a definition version's start-time
-- expressions (its tags, keys, triggers) or a webhook's transform. A run
-- that did is failed instead, and is not listed here.
CREATE TABLE quarantine (
    kind    text NOT NULL CHECK (kind IN ('definition', 'webhook')),
    key     text NOT NULL,
    reason  text NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);
