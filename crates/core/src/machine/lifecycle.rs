//! The lifecycles of a task and of a run: the states they go through, and
//! what a definition's edges and failure handler make of them.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    /// A MAP item waiting for a slot under its MAP's `max_concurrency`.
    Queued,
    Pending,
    Running,
    Waiting,
    /// An at-most-once attempt whose outcome is unknown (its worker died,
    /// its request timed out): never sent again by itself; an operator
    /// resolves it.
    InDoubt,
    Completed,
    Failed,
    Skipped,
    Cancelled,
}

impl TaskState {
    pub const ALL: [TaskState; 9] = [
        TaskState::Queued,
        TaskState::Pending,
        TaskState::Running,
        TaskState::Waiting,
        TaskState::InDoubt,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Skipped,
        TaskState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "QUEUED",
            TaskState::Pending => "PENDING",
            TaskState::Running => "RUNNING",
            TaskState::Waiting => "WAITING",
            TaskState::InDoubt => "IN_DOUBT",
            TaskState::Completed => "COMPLETED",
            TaskState::Failed => "FAILED",
            TaskState::Skipped => "SKIPPED",
            TaskState::Cancelled => "CANCELLED",
        }
    }

    pub fn parse(s: &str) -> Option<TaskState> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Skipped | TaskState::Cancelled)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    /// Over its workflow's concurrency limit: waits for a slot, not started.
    Queued,
    Running,
    /// Tasks already started finish; nothing new starts until it resumes.
    Paused,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Paused,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "QUEUED",
            RunStatus::Running => "RUNNING",
            RunStatus::Paused => "PAUSED",
            RunStatus::Succeeded => "SUCCEEDED",
            RunStatus::Failed => "FAILED",
            RunStatus::Cancelled => "CANCELLED",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running | RunStatus::Paused)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// What a definition's edges and handler mean for these states (here, not
// in `definition`, which knows nothing of the machine).

impl crate::definition::EdgeOn {
    /// Whether an edge that follows this end is taken from a source in `state`
    /// (its `when` aside).
    pub fn follows(self, state: TaskState) -> bool {
        use crate::definition::EdgeOn;
        use TaskState::{Completed, Failed};
        matches!(
            (self, state),
            (EdgeOn::Success | EdgeOn::Always, Completed) | (EdgeOn::Failure | EdgeOn::Always, Failed)
        )
    }
}

impl crate::definition::Hook {
    /// Whether a run that ended in `status` starts the hook.
    pub fn starts_on(&self, status: RunStatus) -> bool {
        use RunStatus::{Cancelled, Failed, Succeeded};
        let e = self.ends;
        (status == Succeeded && e.succeeded) || (status == Failed && e.failed) || (status == Cancelled && e.cancelled)
    }
}
