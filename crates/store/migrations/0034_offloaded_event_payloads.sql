-- An event's payload over the offload threshold is kept as an object; its
-- rows (in the event log and, until a step takes it, in the buffer) hold a
-- reference whose `run` names the owner made for the event. The sweep asks
-- which objects an owner's rows still name.
CREATE INDEX event_log_payload_owner ON event_log ((payload -> '$composer_offloaded' ->> 'run'))
    WHERE payload ? '$composer_offloaded';
CREATE INDEX events_payload_owner ON events ((payload -> '$composer_offloaded' ->> 'run'))
    WHERE payload ? '$composer_offloaded';
