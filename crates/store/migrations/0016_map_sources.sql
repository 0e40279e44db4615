-- The list of a MAP with more items than it creates at once: its elements,
-- a chunk to a row, kept until the MAP ends, so that its items are created
-- a chunk at a time as the MAP needs them (memory and each transaction stay
-- bounded whatever the number of items). Written in the commit that starts
-- the MAP; read under the run's lock; deleted in the commit that ends it.
CREATE TABLE map_sources (
    run_id  uuid NOT NULL,
    map_id  uuid NOT NULL,
    -- Elements chunk * size .. (chunk + 1) * size - 1 of the list.
    chunk   integer NOT NULL,
    items   jsonb NOT NULL,
    PRIMARY KEY (run_id, map_id, chunk)
);

-- The recovery sweep's way in: MAPs that stopped creating items with slots
-- free, when the coordinator that was to carry them on died.
CREATE INDEX task_instances_open_maps ON task_instances (updated_at)
    WHERE state = 'RUNNING' AND node_type = 'MAP';
