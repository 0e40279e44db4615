-- What the namespace's offloaded objects hold, as the sweep last listed
-- them: counted in its stored bytes (quota stored_bytes) with its tables.
CREATE TABLE payload_usage (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    objects     bigint NOT NULL,
    bytes       bigint NOT NULL,
    measured_at timestamptz NOT NULL DEFAULT now()
);
