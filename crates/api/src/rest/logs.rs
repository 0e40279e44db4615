//! A step's log: the lines a worker sends for the attempt it holds, and
//! the pages a reader gets back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use composer_core::{schema, whole};

/// `POST /v1/tasks/{id}/logs`: lines of the attempt this worker holds the
/// lease of, kept with the attempt (the step's logs in the API and the UI).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskLogs {
    #[schema(value_type = schema::Name)]
    pub worker_id: String,
    pub run_id: Uuid,
    #[serde(deserialize_with = "whole::int")]
    pub attempt: i32,
    /// 1 to 100 lines, each at most 4,096 bytes (a longer one is cut, and
    /// says so); an attempt keeps at most `COMPOSER_TASK_LOG_MAX_BYTES`, a
    /// run `COMPOSER_RUN_LOG_MAX_BYTES`.
    #[schema(min_items = 1, max_items = 100)]
    pub lines: Vec<String>,
}

/// What was kept of the lines sent: those past the attempt's budget are
/// dropped (the log then ends with a line that says so).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LogsAccepted {
    pub accepted: u32,
    pub dropped: u32,
}

/// Most log lines one call (`POST /v1/tasks/{id}/logs`) may send.
pub const MAX_LOG_LINES: usize = 100;

/// The longest log line a coordinator keeps, in bytes: it cuts a longer
/// one and says so; a worker cuts before it sends.
pub const MAX_LOG_LINE_BYTES: usize = 4096;

/// One line of a step's log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LogLineView {
    pub seq: i32,
    /// The worker that sent it (a lease taken over continues the attempt).
    pub worker_id: String,
    /// When the coordinator stored it.
    pub at: DateTime<Utc>,
    pub line: String,
}

/// How many lines an attempt of a step has.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct AttemptLines {
    pub attempt: i32,
    pub lines: i64,
}

/// `GET /v1/runs/{id}/tasks/{node}/logs`: a page of one attempt's lines
/// (the step's current attempt unless `?attempt=` says), oldest first;
/// `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct StepLogs {
    pub attempt: i32,
    /// Every attempt of the step that has lines.
    pub attempts: Vec<AttemptLines>,
    pub lines: Vec<LogLineView>,
    pub next_after: Option<i32>,
}
