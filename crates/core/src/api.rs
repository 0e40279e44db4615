//! The REST API's request and response bodies, shared by the coordinator
//! that serves them and by every client (the CLI, the bench, the test kit),
//! so a field is named in one place.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::machine::{HistoryKind, MapProgress, RunStatus, TaskState};

/// `POST /v1/runs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StartRun {
    pub workflow: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// `POST /v1/events`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SendEvent {
    pub name: String,
    pub key: String,
    #[serde(default)]
    pub payload: Value,
}

/// What `POST /v1/events` did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EventSent {
    /// Waiting tasks the event completed.
    pub matched: usize,
    /// No task waited: the event is kept for one to come.
    pub buffered: bool,
}

/// A run; `tasks` only where one run is asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunView {
    pub id: Uuid,
    pub workflow: String,
    pub version: i32,
    pub workflow_id: Uuid,
    pub status: RunStatus,
    /// Absent in lists: read the run for its input and output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// What started the run when not an API call: `{"schedule", "fire_time"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Value>,
    /// A SUB_WORKFLOW's child run: the run and task that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<TaskView>>,
}

impl RunView {
    /// The task of node `node_id`, if one was created.
    pub fn task(&self, node_id: &str) -> Option<&TaskView> {
        self.tasks.as_deref()?.iter().find(|t| t.node_id == node_id)
    }
}

/// One task of a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TaskView {
    pub id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub state: TaskState,
    pub attempt: i32,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub wake_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// A MAP item's MAP task and position (`node_id` is `ship_each[3]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_index: Option<i32>,
    /// A MAP task's item counts: `{total, queued, open, completed, failed}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<MapProgress>,
}

/// `GET /v1/runs/{id}/items?node=…`: a MAP's items by index; `next_after`
/// fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ItemPage {
    pub items: Vec<TaskView>,
    pub next_after: Option<i32>,
}

/// A schedule as the API shows it: its spec, and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScheduleView {
    #[serde(flatten)]
    pub spec: crate::schedule::ScheduleSpec,
    pub paused: bool,
    /// The next five fire times (none while paused).
    pub next_fire_times: Vec<DateTime<Utc>>,
    pub last_run_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/schedules`: by id; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SchedulePage {
    pub schedules: Vec<ScheduleView>,
    pub next_after: Option<String>,
}

/// `GET /v1/runs`: newest first; `next_cursor` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    pub next_cursor: Option<String>,
}

/// One line of a run's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntryView {
    pub seq: i64,
    #[serde(rename = "type")]
    pub kind: HistoryKind,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/runs/{id}/events`: oldest first; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryPage {
    pub events: Vec<HistoryEntryView>,
    pub next_after: Option<i64>,
}

/// A workflow definition version; `spec` and `versions` where one workflow
/// is asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DefinitionView {
    pub id: Uuid,
    pub name: String,
    pub version: i32,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<DefinitionView>>,
    /// More versions: pass it as `?before=` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions_next: Option<i32>,
}

/// `GET /v1/workflows`: the latest version of each.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkflowList {
    pub workflows: Vec<DefinitionView>,
}

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorDetail {
    /// Stable, for programs: `invalid_request`, `not_found`, `unauthorized` …
    pub code: String,
    /// For people: names the field or the thing concerned.
    pub message: String,
}

/// The error code of a 404 that means the run (and so its task) does not
/// exist: a worker drops a report only on this code.
pub const RUN_NOT_FOUND: &str = "run_not_found";
