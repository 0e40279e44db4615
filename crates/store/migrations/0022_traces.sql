-- OpenTelemetry traces of runs. A run's spans go to the trace of the W3C
-- traceparent it was started under (a caller's header, the event that
-- triggered it, its parent's attempt), kept here; without one the run is a
-- trace of its own, named by its id. Span ids are derived from run and task
-- ids, so nothing else about traces is stored.
ALTER TABLE workflow_runs ADD COLUMN traceparent text;
