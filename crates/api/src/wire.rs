//! Messages that cross process boundaries: the dispatch a worker reads from a
//! stream, and the report it sends back to a coordinator.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// One task to execute, as carried on a Redis stream: built from the task
/// row when the outbox row is claimed, serialized here and parsed by the
/// worker. Field names are a contract with workers in other languages.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    /// since the Unix epoch: the worker measures the message's time in
    /// transit from it (`composer_step_stage_seconds`). Absent from messages
    /// of older coordinators.
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

/// The outcome a worker reports for one attempt of a task.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReportStatus {
    Completed,
    Failed,
}

/// `POST /internal/v1/tasks/{id}/result`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskReport {
    pub run_id: Uuid,
    #[serde(deserialize_with = "composer_core::whole::int")]
    pub attempt: i32,
    #[schema(pattern = "^[^\\u0000]*$")]
    pub worker_id: String,
    pub status: ReportStatus,
    /// The attempt's output; a NUL character in it fails the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub retryable: bool,
    /// A failure's code (`.nodes.X.error.code`); `task_failed` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    pub code: Option<String>,
    /// The HTTP status of a failure that is one.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    #[schema(minimum = 100, maximum = 599)]
    pub http_status: Option<u16>,
    /// How long a 429 answer asked to wait (its `Retry-After`), in
    /// milliseconds; the engine waits at most an hour.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "composer_core::whole::opt_int")]
    #[schema(minimum = 0)]
    pub retry_after_ms: Option<u64>,
    /// When the attempt passed each stage on its way, for its span.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "stage_times")]
    pub stages: Option<StageTimes>,
}

/// `stages` only as a JSON object: serde would read a list as the fields in order.
fn stage_times<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StageTimes>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Map<String, Value>>::deserialize(d)? {
        None => Ok(None),
        Some(fields) => serde_json::from_value(Value::Object(fields)).map(Some).map_err(D::Error::custom),
    }
}

/// When one attempt passed each stage, in microseconds since the Unix
/// epoch, as the worker saw them (the first two it was told): what the
/// attempt's span shows besides its start and end.
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

/// The coordinator's answer to a report. An ignored report (duplicate, late,
/// stale) is still a success for the worker: it acks the message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ReportAck {
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(stages: &str) -> Result<TaskReport, serde_json::Error> {
        let id = Uuid::now_v7();
        serde_json::from_str(&format!(
            r#"{{"run_id": "{id}", "attempt": 1, "worker_id": "w", "status": "COMPLETED", "stages": {stages}}}"#
        ))
    }

    #[test]
    fn stage_times_are_an_object_of_whole_microseconds_or_nothing() {
        let r = report(r#"{"read_at_us": 5, "finished_at_us": 9}"#).unwrap();
        assert_eq!(r.stages.map(|s| (s.read_at_us, s.finished_at_us)), Some((Some(5), Some(9))));
        assert!(report("null").unwrap().stages.is_none());
        let whole = report(r#"{"read_at_us": 5.0, "leased_at_us": null}"#).unwrap();
        assert_eq!(whole.stages.map(|s| (s.read_at_us, s.leased_at_us)), Some((Some(5), None)), "5.0 is whole");
        for bad in ["[1, 2, 3]", "[]", r#"{"read_at_us": "5"}"#, r#"{"read_at_us": 5.5}"#, r#"{"lease_at_us": 5}"#, "1"]
        {
            assert!(report(bad).is_err(), "{bad} was taken");
        }
    }
}
