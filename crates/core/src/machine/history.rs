//! A run's history: one line per thing that happened, by kind.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line of a run's history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEntry {
    pub kind: HistoryKind,
    pub payload: Value,
}

/// What a line of history records; stored and returned by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum HistoryKind {
    RunStarted,
    TaskDispatched,
    TaskWaiting,
    TaskRetryScheduled,
    TaskCompleted,
    TaskFailed,
    TaskSkipped,
    TaskCancelled,
    RunSucceeded,
    RunFailed,
    RunCancelled,
    RunRetried,
    RunPaused,
    RunResumed,
    EventIgnored,
    MapStarted,
    /// An at-most-once attempt's outcome is unknown.
    TaskInDoubt,
    /// An operator resolved an IN_DOUBT attempt.
    TaskResolved,
    /// A task was reset: a retry went back before it, and it runs again
    /// when it becomes ready.
    TaskReset,
    /// An operator reran the run from some of its steps.
    RunRerun,
    /// The run's end started its failure handler (`run_id`), or could not
    /// (`error`).
    HandlerStarted,
    /// An operator changed the run's priority (`priority`, `from`).
    PriorityChanged,
    /// An operator moved the run to another version of its workflow
    /// (`from_version`, `to_version`, `map`: old step → new step, as asked).
    RunMigrated,
    /// A deadline passed with the run (or its step `node`) not ended: it
    /// started `run_id`, or could not (`error`). The run is not changed.
    DeadlinePassed,
    /// A person voted on an APPROVAL step (`vote`: `person`, `answer`,
    /// `via` when an administrator decided for them).
    ApprovalVoted,
    /// An APPROVAL's deadline passed and it escalated (`assignees`, `due_at`).
    ApprovalEscalated,
}

impl HistoryKind {
    pub const ALL: [HistoryKind; 26] = [
        HistoryKind::RunStarted,
        HistoryKind::TaskDispatched,
        HistoryKind::TaskWaiting,
        HistoryKind::TaskRetryScheduled,
        HistoryKind::TaskCompleted,
        HistoryKind::TaskFailed,
        HistoryKind::TaskSkipped,
        HistoryKind::TaskCancelled,
        HistoryKind::RunSucceeded,
        HistoryKind::RunFailed,
        HistoryKind::RunCancelled,
        HistoryKind::RunRetried,
        HistoryKind::RunPaused,
        HistoryKind::RunResumed,
        HistoryKind::EventIgnored,
        HistoryKind::MapStarted,
        HistoryKind::TaskInDoubt,
        HistoryKind::TaskResolved,
        HistoryKind::TaskReset,
        HistoryKind::RunRerun,
        HistoryKind::HandlerStarted,
        HistoryKind::PriorityChanged,
        HistoryKind::RunMigrated,
        HistoryKind::DeadlinePassed,
        HistoryKind::ApprovalVoted,
        HistoryKind::ApprovalEscalated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::RunStarted => "RunStarted",
            HistoryKind::TaskDispatched => "TaskDispatched",
            HistoryKind::TaskWaiting => "TaskWaiting",
            HistoryKind::TaskRetryScheduled => "TaskRetryScheduled",
            HistoryKind::TaskCompleted => "TaskCompleted",
            HistoryKind::TaskFailed => "TaskFailed",
            HistoryKind::TaskSkipped => "TaskSkipped",
            HistoryKind::TaskCancelled => "TaskCancelled",
            HistoryKind::RunSucceeded => "RunSucceeded",
            HistoryKind::RunFailed => "RunFailed",
            HistoryKind::RunCancelled => "RunCancelled",
            HistoryKind::RunRetried => "RunRetried",
            HistoryKind::RunPaused => "RunPaused",
            HistoryKind::RunResumed => "RunResumed",
            HistoryKind::EventIgnored => "EventIgnored",
            HistoryKind::MapStarted => "MapStarted",
            HistoryKind::TaskInDoubt => "TaskInDoubt",
            HistoryKind::TaskResolved => "TaskResolved",
            HistoryKind::TaskReset => "TaskReset",
            HistoryKind::RunRerun => "RunRerun",
            HistoryKind::HandlerStarted => "HandlerStarted",
            HistoryKind::PriorityChanged => "PriorityChanged",
            HistoryKind::RunMigrated => "RunMigrated",
            HistoryKind::DeadlinePassed => "DeadlinePassed",
            HistoryKind::ApprovalVoted => "ApprovalVoted",
            HistoryKind::ApprovalEscalated => "ApprovalEscalated",
        }
    }

    pub fn parse(s: &str) -> Option<HistoryKind> {
        HistoryKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for HistoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
