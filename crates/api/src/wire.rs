//! Messages that cross process boundaries: the dispatch a coordinator reads
//! from a stream for a worker's poll, and what the engine is told of an
//! attempt besides its result.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// One task to execute, as carried on a Redis stream: built from the task
/// row when the outbox row is claimed, serialized here and parsed by the
/// coordinator that leases it to a polling worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Dispatch {
    pub task_id: Uuid,
    pub run_id: Uuid,
    pub workflow_id: Uuid,
    pub workflow_version: i32,
    pub node_id: String,
    pub node_type: String,
    pub attempt: i32,
    pub input: Value,
    /// When the coordinator put the message on its stream, in microseconds
    /// since the Unix epoch: its time in transit is measured from it
    /// (`composer_step_stage_seconds`). Absent from messages of older
    /// coordinators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at_us: Option<i64>,
    /// The W3C `traceparent` of this attempt's span: an HTTP node sends it
    /// to its target, a handler may pass it on. Absent from messages of
    /// older coordinators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// When the transaction that dispatched the attempt wrote it (µs since
    /// the epoch), for the attempt's span; absent from a message the
    /// outbox's safety net sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatched_at_us: Option<i64>,
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// `stages` only as a JSON object: serde would read a list as the fields in order.
pub fn stage_times<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StageTimes>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Map<String, Value>>::deserialize(d)? {
        None => Ok(None),
        Some(fields) => serde_json::from_value(Value::Object(fields)).map(Some).map_err(D::Error::custom),
    }
}

/// When one attempt passed each stage, in microseconds since the Unix
/// epoch: what the attempt's span shows besides its start and end. A poll's
/// task carries the stages up to its lease; its worker sends them back with
/// its result, with when its handler started and ended.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageTimes {
    /// The dispatching transaction wrote the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub dispatched_at_us: Option<i64>,
    /// Its message went on its stream.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub published_at_us: Option<i64>,
    /// A worker read the message.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub read_at_us: Option<i64>,
    /// The worker's lease was granted.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub leased_at_us: Option<i64>,
    /// The handler started.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub started_at_us: Option<i64>,
    /// The handler ended.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    pub finished_at_us: Option<i64>,
}

/// The header of a result (`/complete`, `/fail`) that names its run's
/// priority (`1` to `5`), as the leased task's `priority` said it: the
/// result waits for the coordinator's next batch at that priority. One that
/// does not read is the default level.
pub const PRIORITY_HEADER: &str = "composer-priority";

/// The level a [`PRIORITY_HEADER`] names: `None` unless `1` to `5`.
pub fn priority_of_header(value: &[u8]) -> Option<u8> {
    match value {
        [d @ b'1'..=b'5'] => Some(d - b'0'),
        _ => None,
    }
}

/// Most tasks one result may ask for with its answer.
pub const MAX_EAGER_SLOTS: u32 = 16;

/// What a result's `next` offers: up to `slots` tasks of `queues`, each
/// leased to the reporting worker for `lease`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EagerOffer {
    pub slots: u32,
    pub lease: std::time::Duration,
    pub queues: Vec<String>,
    /// The reported task's priority as the worker knew it (its
    /// `composer-priority`): what the worker offered for.
    pub priority: u8,
    /// Made by a coordinator's own HTTP executor: only steps a coordinator
    /// may run (HTTP calls that read no secret) are given to it.
    pub coordinator: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(stages: &str) -> Result<crate::CompleteTask, serde_json::Error> {
        let id = Uuid::now_v7();
        serde_json::from_str(&format!(r#"{{"run_id": "{id}", "attempt": 1, "worker_id": "w", "stages": {stages}}}"#))
    }

    #[test]
    fn stage_times_are_an_object_of_whole_microseconds_or_nothing() {
        let r = complete(r#"{"read_at_us": 5, "finished_at_us": 9}"#).unwrap();
        assert_eq!(r.stages.map(|s| (s.read_at_us, s.finished_at_us)), Some((Some(5), Some(9))));
        assert!(complete("null").unwrap().stages.is_none());
        let whole = complete(r#"{"read_at_us": 5.0, "leased_at_us": null}"#).unwrap();
        assert_eq!(whole.stages.map(|s| (s.read_at_us, s.leased_at_us)), Some((Some(5), None)), "5.0 is whole");
        for bad in ["[1, 2, 3]", "[]", r#"{"read_at_us": "5"}"#, r#"{"read_at_us": 5.5}"#, r#"{"lease_at_us": 5}"#, "1"]
        {
            assert!(complete(bad).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn a_priority_header_names_a_level_or_nothing() {
        let levels: Vec<Option<u8>> = [&b"1"[..], b"3", b"5"].iter().map(|v| priority_of_header(v)).collect();
        assert_eq!(levels, [Some(1), Some(3), Some(5)]);
        for bad in [&b"0"[..], b"6", b"", b"11", b" 1", b"1 ", b"-1", b"one", b"\xff"] {
            assert_eq!(priority_of_header(bad), None, "{bad:?}");
        }
    }
}
