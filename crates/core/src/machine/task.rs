//! One node's task within a run, and what it carries: a failure's code
//! and message, a MAP item's place, a MAP's item counts.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::codes;
use super::lifecycle::TaskState;

/// One node's task within a run. A retry reuses the row with `attempt + 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: Uuid,
    /// Index of the node in [`Workflow::nodes`](crate::definition::Workflow::nodes).
    pub node: usize,
    pub state: TaskState,
    pub attempt: i32,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub wake_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The `(event, key)` a WAIT_FOR_EVENT task waits for.
    pub event: Option<(String, String)>,
    /// For a MAP's item: its MAP's task and its position in the items.
    pub item: Option<Item>,
    /// For a MAP's task: how its items stand.
    pub progress: Option<MapProgress>,
    /// What is known of its failure besides the message in `error`.
    pub error_info: Option<ErrorInfo>,
    /// A LOOP task's current iteration (from 0); while it runs, `output`
    /// holds the last iteration's output (`.previous`).
    pub iteration: Option<u32>,
    /// Reset (a retry went back to before it): no longer part of the run,
    /// and deleted by the writer. Kept in place only so that indices into
    /// `run.tasks` stay valid for the rest of the transition.
    pub removed: bool,
    /// The keys of its node's `limits`, evaluated when it was created (in
    /// the node's order); empty for a node without limits.
    pub limit_keys: Vec<String>,
}

/// What a failure edge can test of a failure besides its message
/// (`.nodes.X.error`: `{message, code, retryable, attempts, status?}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorInfo {
    /// A stable name for what went wrong ([`codes`], or a worker's own).
    pub code: String,
    /// Whether the last error could have been retried (its retries ran out).
    pub retryable: bool,
    /// The HTTP status a target answered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// Why an attempt failed: the message people read, and the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub message: String,
    pub info: ErrorInfo,
    /// How long the target asked to wait before trying again (a 429's
    /// `Retry-After`).
    pub retry_after: Option<std::time::Duration>,
}

impl Failure {
    /// A failure that retrying would not change.
    pub fn fatal(code: &str, message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            info: ErrorInfo { code: code.to_string(), retryable: false, status: None },
            retry_after: None,
        }
    }

    pub fn retryable(code: &str, message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            info: ErrorInfo { code: code.to_string(), retryable: true, status: None },
            retry_after: None,
        }
    }
}

impl Task {
    /// The id its row and messages carry: its node's, and for a MAP's item
    /// the item's position too (`resize[3]`).
    pub fn node_id<'a>(&self, node: &'a crate::definition::Node) -> std::borrow::Cow<'a, str> {
        match self.item {
            Some(item) => format!("{}[{}]", node.id, item.index).into(),
            None => node.id.as_str().into(),
        }
    }

    /// Its next attempt begins: the last one's error and end are forgotten.
    pub(super) fn begin_next_attempt(&mut self) {
        self.attempt += 1;
        self.error = None;
        self.error_info = None;
        self.finished_at = None;
    }

    /// An ended MAP is open again (an item of it runs again): its error and
    /// end are forgotten, its attempt stays.
    pub(super) fn reopen(&mut self) {
        self.state = TaskState::Running;
        self.error = None;
        self.error_info = None;
        self.finished_at = None;
    }

    /// A new task of `node` at its first attempt, not yet started.
    pub(super) fn new(id: Uuid, node: usize, item: Option<Item>) -> Task {
        Task {
            id,
            node,
            state: TaskState::Pending,
            attempt: 1,
            input: json!({}),
            output: None,
            error: None,
            wake_at: None,
            finished_at: None,
            event: None,
            item,
            progress: None,
            error_info: None,
            iteration: None,
            removed: false,
            limit_keys: Vec::new(),
        }
    }

    /// `.nodes.X.error` of a FAILED task.
    pub fn error_json(&self) -> Option<Value> {
        if self.state != TaskState::Failed {
            return None;
        }
        let info = self.error_info.as_ref();
        let mut e = json!({
            "message": self.error.as_deref().unwrap_or(""),
            "code": info.map_or(codes::TASK_FAILED, |i| i.code.as_str()),
            "retryable": info.is_some_and(|i| i.retryable),
            "attempts": self.attempt,
        });
        if let Some(status) = info.and_then(|i| i.status) {
            e["status"] = json!(status);
        }
        Some(e)
    }
}

/// Where an item belongs: its MAP's task, and its index in the items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    pub map: Uuid,
    pub index: u32,
}

/// A MAP task's item counts. Kept on the MAP's task so that an item's result
/// is applied without reading the other items: `queued + open + completed +
/// failed == total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MapProgress {
    pub total: u32,
    /// Waiting for a slot.
    pub queued: u32,
    /// Started and not finished (dispatched, running, or waiting to retry).
    pub open: u32,
    pub completed: u32,
    /// Failed for good, or cancelled.
    pub failed: u32,
    /// Items created so far (the rest are still in the MAP's list, to come
    /// a chunk at a time); absent on MAPs that created every item at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u32>,
}

impl MapProgress {
    /// Items created so far.
    pub fn created(&self) -> u32 {
        self.created.unwrap_or(self.total)
    }
}
