//! Messages that cross process boundaries: the dispatch a worker reads from a
//! stream, and the report it sends back to a coordinator.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// The queue of a node type that names none: its name in lower case.
pub fn default_queue(node_type: &str) -> String {
    node_type.to_ascii_lowercase()
}

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
}

/// The outcome a worker reports for one attempt of a task.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReportStatus {
    Completed,
    Failed,
}

/// `POST /internal/v1/tasks/{id}/result`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskReport {
    pub run_id: Uuid,
    pub attempt: i32,
    pub worker_id: String,
    pub status: ReportStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub retryable: bool,
}

/// The coordinator's answer to a report. An ignored report (duplicate, late,
/// stale) is still a success for the worker: it acks the message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReportAck {
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
}
