//! The events that move a run: a worker's report, a timer, an operator's
//! action, what the engine loaded.

use serde_json::Value;
use uuid::Uuid;

use super::lifecycle::RunStatus;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    RunStarted,
    TaskCompleted {
        task_id: Uuid,
        attempt: i32,
        output: Value,
    },
    TaskFailed {
        task_id: Uuid,
        attempt: i32,
        error: String,
        retryable: bool,
        /// The worker's code for the failure ([`codes::TASK_FAILED`](crate::machine::codes::TASK_FAILED) without one).
        code: Option<String>,
        /// The HTTP status the target answered with.
        status: Option<u16>,
        /// How long a 429 answer asked to wait (its `Retry-After`).
        retry_after: Option<std::time::Duration>,
    },
    TimerFired {
        task_id: Uuid,
    },
    /// An external event matched the WAIT_FOR_EVENT task.
    EventReceived {
        task_id: Uuid,
        payload: Value,
    },
    /// A person's vote on an APPROVAL task, with their groups and the
    /// votes storage holds for the attempt (read under the run's lock).
    ApprovalVote {
        task_id: Uuid,
        attempt: i32,
        vote: Box<crate::definition::approval::Vote>,
        groups: Vec<String>,
        earlier: Vec<crate::definition::approval::Vote>,
    },
    CancelRun,
    RetryRun,
    PauseRun,
    ResumeRun,
    /// The run's deadline passed.
    RunTimedOut,
    /// An at-most-once attempt's outcome became unknown (its lease expired
    /// while it ran): it goes IN_DOUBT.
    TaskInDoubt {
        task_id: Uuid,
        attempt: i32,
        reason: String,
    },
    /// An operator says how an IN_DOUBT attempt ended.
    ResolveTask {
        task_id: Uuid,
        resolution: Resolution,
    },
    /// An operator runs the run again from these tasks (nodes' tasks or MAP
    /// items): they and everything after them are reset and run again, with
    /// the run's input or `input`.
    RerunFrom {
        tasks: Vec<Uuid>,
        input: Option<Value>,
        /// A SUCCEEDED run may be rerun only when this says so.
        allow_completed: bool,
    },
    /// An operator ends a step with an output, whatever it was doing (a
    /// failed one, in a failed run, too), and the run goes on.
    CompleteTask {
        task_id: Uuid,
        output: Value,
    },
    /// The engine loaded the items a MAP asked for ([`Need`](crate::machine::Need)); the MAP
    /// carries on with them. (Also: a MAP that stopped creating items for
    /// one event carries on.)
    ItemsLoaded {
        task_id: Uuid,
    },
    /// The engine gathered a MAP's output ([`Need::Collect`](crate::machine::Need::Collect)).
    ItemsCollected {
        task_id: Uuid,
        output: Value,
    },
    /// The engine read elements `from..` of a MAP's list ([`Need::Sources`](crate::machine::Need::Sources)).
    SourcesLoaded {
        task_id: Uuid,
        from: u32,
        items: Vec<Value>,
    },
    /// The child run a SUB_WORKFLOW attempt started has ended, or (`child:
    /// None`) could not be started, for the reason in `error`.
    ChildFinished {
        task_id: Uuid,
        attempt: i32,
        /// The LOOP iteration the child was (0 for a SUB_WORKFLOW's).
        iteration: u32,
        child: Option<Uuid>,
        status: RunStatus,
        output: Option<Value>,
        error: Option<String>,
    },
    /// An operator moves the run to another version of its workflow
    /// (`definition`, `to_version`). The engine renames its steps first
    /// ([`move_run`](crate::machine::migrate::move_run), refusing a run that
    /// cannot move) and applies this under the new version: it records the
    /// move and starts what the new version readies.
    Migrate {
        definition: Uuid,
        from_version: i32,
        to_version: i32,
        map: crate::machine::migrate::Mapping,
    },
}

/// How an operator resolves an IN_DOUBT attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// It took effect, with this output.
    Completed(Value),
    /// It did not, for good: the node fails with this error.
    Failed(String),
    /// Send it again (a new attempt, under the same idempotency key).
    Retry,
}

impl Event {
    /// Whether the event may be applied to a run loaded in part
    /// ([`Run::known`](crate::machine::Run::known)): a step's own news (its result, its timer, its
    /// event, its child's end), which changes that step and what comes
    /// after it. An operator's or the run's own event (cancel, retry,
    /// rerun, pause, a timeout, a start) may touch any step: its run is
    /// loaded whole.
    pub fn reads_in_part(&self) -> bool {
        matches!(
            self,
            Event::TaskCompleted { .. }
                | Event::TaskFailed { .. }
                | Event::TimerFired { .. }
                | Event::EventReceived { .. }
                | Event::ApprovalVote { .. }
                | Event::TaskInDoubt { .. }
                | Event::ChildFinished { .. }
                | Event::ItemsLoaded { .. }
                | Event::ItemsCollected { .. }
                | Event::SourcesLoaded { .. }
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Event::RunStarted => "RunStarted",
            Event::TaskCompleted { .. } => "TaskCompleted",
            Event::TaskFailed { .. } => "TaskFailed",
            Event::TimerFired { .. } => "TimerFired",
            Event::EventReceived { .. } => "EventReceived",
            Event::ApprovalVote { .. } => "ApprovalVote",
            Event::CancelRun => "CancelRun",
            Event::RetryRun => "RetryRun",
            Event::PauseRun => "PauseRun",
            Event::ResumeRun => "ResumeRun",
            Event::RunTimedOut => "RunTimedOut",
            Event::TaskInDoubt { .. } => "TaskInDoubt",
            Event::ResolveTask { .. } => "ResolveTask",
            Event::RerunFrom { .. } => "RerunFrom",
            Event::CompleteTask { .. } => "CompleteTask",
            Event::ItemsLoaded { .. } => "ItemsLoaded",
            Event::ItemsCollected { .. } => "ItemsCollected",
            Event::SourcesLoaded { .. } => "SourcesLoaded",
            Event::ChildFinished { .. } => "ChildFinished",
            Event::Migrate { .. } => "Migrate",
        }
    }

    /// The task the event reports on, if it names one.
    pub fn task_id(&self) -> Option<Uuid> {
        match self {
            Event::TaskCompleted { task_id, .. }
            | Event::TaskFailed { task_id, .. }
            | Event::TimerFired { task_id }
            | Event::EventReceived { task_id, .. }
            | Event::ApprovalVote { task_id, .. }
            | Event::TaskInDoubt { task_id, .. }
            | Event::SourcesLoaded { task_id, .. }
            | Event::ResolveTask { task_id, .. }
            | Event::CompleteTask { task_id, .. }
            | Event::ChildFinished { task_id, .. } => Some(*task_id),
            _ => None,
        }
    }

    /// Every task the event names (a rerun names several).
    pub fn task_ids(&self) -> Vec<Uuid> {
        match self {
            Event::RerunFrom { tasks, .. } => tasks.clone(),
            other => other.task_id().into_iter().collect(),
        }
    }
}
