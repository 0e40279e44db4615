//! The rows of runs and tasks as the store reads them: [`RunRow`],
//! [`TaskRow`] and the parent a child run reports to, with the column lists
//! every `SELECT` of them names. A column is added here, once.

use chrono::{DateTime, Utc};
use composer_core::machine::{self, RunStatus, TaskState};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: Uuid,
    pub workflow_definition_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: i32,
    pub status: RunStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    /// For a SUB_WORKFLOW's child: the task (and its attempt) that started it.
    pub parent: Option<Parent>,
    /// How many parents it has.
    pub depth: i32,
    /// A run of a workflow with a concurrency limit: the limit's key.
    pub concurrency_key: Option<String>,
    /// What started it, when not an API call: `{"schedule", "fire_time"}`.
    pub trigger: Option<Value>,
    /// For a child run: the run at the top of its tree (none: it is a root).
    pub root_run_id: Option<Uuid>,
    /// For a failure handler's run: the run whose end started it.
    pub handles_run_id: Option<Uuid>,
    /// Its tags, `{key: value}`.
    pub tags: Option<Value>,
    /// The W3C `traceparent` it was started under, if any.
    pub traceparent: Option<String>,
    /// 1 (served first) to 5 ([`composer_core::priority`]).
    pub priority: u8,
    /// Whose work it is: its steps go to this key's lane.
    pub fairness_key: Option<String>,
}

impl RunRow {
    /// The root of its run tree: itself, or the root its parent names.
    pub fn root(&self) -> Uuid {
        self.root_run_id.unwrap_or(self.id)
    }
}

/// The SUB_WORKFLOW (or LOOP) attempt a child run reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub run_id: Uuid,
    pub task_id: Uuid,
    pub attempt: i32,
    /// The LOOP iteration the child is (0 for a SUB_WORKFLOW's).
    pub iteration: i32,
}

/// The columns [`RunRow::from_row`] reads, for every `SELECT` of runs.
pub(super) const RUN_COLUMNS: &str = "id, workflow_definition_id, workflow_name, workflow_version, status, input, output, \
                           error, idempotency_key, created_at, updated_at, finished_at, deadline, \
                           parent_run_id, parent_task_id, parent_attempt, depth, concurrency_key, trigger, root_run_id, \
                           handles_run_id, parent_iteration, tags, traceparent, priority, fairness_key";

/// A list's columns: [`RUN_COLUMNS`] without the input and output (a page of
/// runs must not carry their data; read one run for that).
pub(super) const SUMMARY_COLUMNS: &str = "id, workflow_definition_id, workflow_name, workflow_version, status, \
                               'null'::jsonb AS input, NULL::jsonb AS output, \
                               error, idempotency_key, created_at, updated_at, finished_at, deadline, \
                               parent_run_id, parent_task_id, parent_attempt, depth, concurrency_key, trigger, root_run_id, \
                               handles_run_id, parent_iteration, tags, traceparent, priority, fairness_key";

impl RunRow {
    pub(super) fn from_row(r: &Row) -> Result<RunRow> {
        let status: String = r.try_get("status")?;
        Ok(RunRow {
            id: r.try_get("id")?,
            workflow_definition_id: r.try_get("workflow_definition_id")?,
            workflow_name: r.try_get("workflow_name")?,
            workflow_version: r.try_get("workflow_version")?,
            status: status_of(&status)?,
            input: r.try_get("input")?,
            output: r.try_get("output")?,
            error: r.try_get("error")?,
            idempotency_key: r.try_get("idempotency_key")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            finished_at: r.try_get("finished_at")?,
            deadline: r.try_get("deadline")?,
            parent: match (r.try_get("parent_run_id")?, r.try_get("parent_task_id")?, r.try_get("parent_attempt")?) {
                (Some(run_id), Some(task_id), Some(attempt)) => {
                    Some(Parent { run_id, task_id, attempt, iteration: r.try_get("parent_iteration")? })
                }
                _ => None,
            },
            depth: r.try_get("depth")?,
            concurrency_key: r.try_get("concurrency_key")?,
            trigger: r.try_get("trigger")?,
            root_run_id: r.try_get("root_run_id")?,
            handles_run_id: r.try_get("handles_run_id")?,
            tags: r.try_get("tags")?,
            traceparent: r.try_get("traceparent")?,
            priority: priority_of(r.try_get("priority")?)?,
            fairness_key: r.try_get("fairness_key")?,
        })
    }
}

/// A stored run status.
pub(super) fn status_of(status: &str) -> Result<RunStatus> {
    RunStatus::parse(status).ok_or_else(|| Error::Corrupt(format!("run status {status:?}")))
}

/// A stored priority; the table's check keeps it a level.
pub(super) fn priority_of(p: i16) -> Result<u8> {
    match u8::try_from(p) {
        Ok(p) if composer_core::priority::is_level(p.into()) => Ok(p),
        _ => Err(Error::Corrupt(format!("run priority {p}"))),
    }
}

#[derive(Debug, Clone)]
pub struct TaskRow {
    pub run_id: Uuid,
    pub id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub queue: Option<String>,
    pub state: TaskState,
    pub attempt: i32,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub wake_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub event_name: Option<String>,
    pub event_key: Option<String>,
    /// A MAP item's MAP task and index.
    pub parent_task_id: Option<Uuid>,
    pub item_index: Option<i32>,
    /// A MAP task's item counts.
    pub progress: Option<Value>,
    /// What a failure edge can test of its failure: `{code, retryable, status?}`.
    pub error_info: Option<Value>,
    /// A LOOP task's current iteration.
    pub iteration: Option<i32>,
    /// The keys of its node's limits, as a JSON list of text.
    pub limit_keys: Option<Value>,
}

/// The columns [`TaskRow::from_row`] reads, for every `SELECT` of tasks.
pub(super) const TASK_COLUMNS: &str =
    "run_id, id, node_id, node_type, queue, state, attempt, input_json, output_json, error, \
                            lease_owner, lease_expires_at, wake_at, started_at, finished_at, created_at, updated_at, \
                            event_name, event_key, parent_task_id, item_index, progress, error_info, iteration, \
                            limit_keys";

impl TaskRow {
    pub(super) fn from_row(r: &Row) -> Result<TaskRow> {
        let state: String = r.try_get("state")?;
        Ok(TaskRow {
            run_id: r.try_get("run_id")?,
            id: r.try_get("id")?,
            node_id: r.try_get("node_id")?,
            node_type: r.try_get("node_type")?,
            queue: r.try_get("queue")?,
            state: TaskState::parse(&state).ok_or_else(|| Error::Corrupt(format!("task state {state:?}")))?,
            attempt: r.try_get("attempt")?,
            input: r.try_get("input_json")?,
            output: r.try_get("output_json")?,
            error: r.try_get("error")?,
            lease_owner: r.try_get("lease_owner")?,
            lease_expires_at: r.try_get("lease_expires_at")?,
            wake_at: r.try_get("wake_at")?,
            started_at: r.try_get("started_at")?,
            finished_at: r.try_get("finished_at")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            event_name: r.try_get("event_name")?,
            event_key: r.try_get("event_key")?,
            parent_task_id: r.try_get("parent_task_id")?,
            item_index: r.try_get("item_index")?,
            progress: r.try_get("progress")?,
            error_info: r.try_get("error_info")?,
            iteration: r.try_get("iteration")?,
            limit_keys: r.try_get("limit_keys")?,
        })
    }
}

impl TaskRow {
    /// A MAP task's item counts.
    pub fn map_progress(&self) -> Option<machine::MapProgress> {
        self.progress.as_ref().and_then(|p| serde_json::from_value(p.clone()).ok())
    }
}
