//! A run as the API starts, changes and shows it: the start, its priority
//! and control actions, the run and its tasks, pages of runs, MAP items and
//! history.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::machine::{ErrorInfo, HistoryKind, MapProgress, RunStatus, TaskState};
use composer_core::{schema, whole};

use super::limits::HeldView;

/// `POST /v1/runs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"workflow": "example", "input": {"name": "Ada"}}))]
pub struct StartRun {
    #[schema(value_type = schema::Name)]
    pub workflow: String,
    /// The latest version without it.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1)]
    pub version: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub input: Option<Value>,
    /// A second start with the same key returns the first run (200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub idempotency_key: Option<String>,
    /// Tags of the run, `{key: text}`, besides its definition's (these win
    /// on a key both have); at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::RunTags>)]
    pub tags: Option<serde_json::Map<String, Value>>,
    /// Its priority, 1 (served first) to 5 (last), instead of its definition's.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 5)]
    pub priority: Option<u8>,
}

/// `PUT /v1/runs/{id}/priority`: the run's new priority.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPriority {
    /// 1 (served first) to 5 (last).
    #[serde(deserialize_with = "whole::int")]
    #[schema(minimum = 1, maximum = 5)]
    pub priority: u8,
}

/// The body of a control action (cancel, retry, pause, resume): why, for
/// the run's history (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlRun {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// A run a hook or a deadline of another run started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HookRun {
    /// `on_failure`, `on_success`, `on_end` or `deadline`.
    pub hook: String,
    pub run_id: Uuid,
}

/// A run; `tasks` only where one run is asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
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
    /// Its tags, `{key: text}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::HashMap<String, String>>)]
    pub tags: Option<Value>,
    /// What started the run when not an API call: `{"schedule", "fire_time"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Value>,
    /// A SUB_WORKFLOW's child run: the run and task that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    /// A LOOP's child run: the iteration it is (from 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_iteration: Option<i32>,
    /// A hook's run (a failure handler, `on_success`, `on_end`) or a
    /// deadline's: the run whose end or deadline started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handles_run_id: Option<Uuid>,
    /// The failure handler runs (`on_failure`) this run's ends started
    /// (where one run is asked for), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_handler_run_ids: Option<Vec<Uuid>>,
    /// Every hook's run this run's end started (`on_failure`, `on_success`,
    /// `on_end`) and every run its deadlines started (`deadline`), oldest
    /// first (where one run is asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_runs: Option<Vec<HookRun>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<TaskView>>,
    /// The OpenTelemetry trace its spans go to (32 hex digits): its own id,
    /// or the trace of the `traceparent` it was started under. (Read as
    /// empty from a coordinator older than traces.)
    #[serde(default)]
    #[schema(required = true, pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
    /// 1 (served first) to 5 (last): its steps' and its queued start's.
    /// (Read as 3 from a coordinator older than priorities.)
    #[serde(default = "default_priority")]
    #[schema(required = true, minimum = 1, maximum = 5)]
    pub priority: u8,
    /// Whose work it is: runs and steps of different keys take turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
}

impl RunView {
    /// The task of node `node_id`, if one was created.
    pub fn task(&self, node_id: &str) -> Option<&TaskView> {
        self.tasks.as_deref()?.iter().find(|t| t.node_id == node_id)
    }
}

/// A run's priority where an older coordinator sent none.
pub(super) fn default_priority() -> u8 {
    composer_core::priority::DEFAULT
}

/// One task of a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TaskView {
    pub id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub state: TaskState,
    pub attempt: i32,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    /// What a failure edge can test of its failure (`.nodes.X.error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_info: Option<ErrorInfo>,
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
    /// A PENDING step its limits hold back (not sent to a worker yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldView>,
}

/// `GET /v1/runs`: newest first; `next_cursor` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    pub next_cursor: Option<String>,
}

/// `GET /v1/runs/{id}/items?node=…`: a MAP's items by index; `next_after`
/// fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ItemPage {
    pub items: Vec<TaskView>,
    pub next_after: Option<i32>,
}

/// One line of a run's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HistoryEntryView {
    pub seq: i64,
    #[serde(rename = "type")]
    pub kind: HistoryKind,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/runs/{id}/events`: oldest first; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HistoryPage {
    pub events: Vec<HistoryEntryView>,
    pub next_after: Option<i64>,
}
