//! Runs and tasks, their states, the events that move them and what a
//! transition records.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

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

/// One node's task within a run. A retry reuses the row with `attempt + 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: Uuid,
    /// Index of the node in [`Workflow::nodes`].
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

/// The error codes the engine gives; a worker may report codes of its own.
pub mod codes {
    /// A worker's failure that named no code.
    pub const TASK_FAILED: &str = "task_failed";
    /// The target answered with a status the node does not accept (`status` says which).
    pub const HTTP_STATUS: &str = "http_status";
    /// The request could not be made or its answer read (connection, TLS, DNS).
    pub const TRANSPORT: &str = "transport";
    /// The request, or the attempt (the node's `timeout`), ran out of time.
    pub const TIMEOUT: &str = "timeout";
    /// The request was refused before it was sent (egress rules, a secret's hosts, a redirect).
    pub const REFUSED: &str = "refused";
    /// The node's evaluated config cannot be used (a bad header, URL or method).
    pub const CONFIG: &str = "config";
    /// An expression failed when the node started (its config, a MAP's items, an edge's `when`).
    pub const EXPRESSION: &str = "expression";
    /// A value was too large, too deep or unstorable (`COMPOSER_MAX_PAYLOAD`).
    pub const PAYLOAD: &str = "payload";
    /// A SUB_WORKFLOW's or LOOP's child run failed, was cancelled or could not start.
    pub const CHILD_FAILED: &str = "child_failed";
    /// A WAIT_FOR_EVENT timed out.
    pub const EVENT_TIMEOUT: &str = "event_timeout";
    /// A MAP's item failed (or more than it tolerates).
    pub const ITEM_FAILED: &str = "item_failed";
    /// The attempt was dispatched more often than `COMPOSER_MAX_DISPATCHES`.
    pub const MAX_DISPATCHES: &str = "max_dispatches";
    /// No worker has a handler for the node's type on its queue.
    pub const NO_HANDLER: &str = "no_handler";
    /// A LOOP ran `max_iterations` without its `until` holding.
    pub const MAX_ITERATIONS: &str = "max_iterations";
    /// An operator resolved an in-doubt attempt as failed.
    pub const RESOLVED: &str = "resolved";
    /// An at-most-once attempt whose outcome is unknown; also what a custom
    /// handler reports when it cannot tell whether its effect happened.
    pub const IN_DOUBT: &str = "in_doubt";
    /// The request could not connect: it was not sent.
    pub const CONNECT: &str = "connect";
    /// A coordinator refused a worker's report of the attempt as it stood
    /// (an output too large to send, a field it does not take): the attempt
    /// failed with the coordinator's reason instead of running again.
    pub const REPORT_REFUSED: &str = "report_refused";

    /// The code of a failure to evaluate a value: [`PAYLOAD`] when the value
    /// was evaluated but cannot be kept (what `storable::check` and
    /// `storable::check_text` refuse), else [`EXPRESSION`].
    pub fn of_evaluation(error: &str) -> &'static str {
        let refused = ["(COMPOSER_MAX_PAYLOAD)", "which cannot be stored", "is nested deeper than the limit"];
        if refused.iter().any(|r| error.contains(r)) {
            PAYLOAD
        } else {
            EXPRESSION
        }
    }
}

impl Task {
    /// A new task of `node` at its first attempt, not yet started.
    /// The id its row and messages carry: its node's, and for a MAP's item
    /// the item's position too (`resize[3]`).
    pub fn node_id<'a>(&self, node: &'a crate::definition::Node) -> std::borrow::Cow<'a, str> {
        match self.item {
            Some(item) => format!("{}[{}]", node.id, item.index).into(),
            None => node.id.as_str().into(),
        }
    }

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

/// The part of a run the state machine reads and changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: Uuid,
    pub status: RunStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub tasks: Vec<Task>,
    /// Largest value the engine may compute for this run, as JSON bytes
    /// (`COMPOSER_MAX_PAYLOAD`): evaluated inputs, TRANSFORM outputs and
    /// the run's output beyond it fail their node (or the run).
    pub max_payload: usize,
    /// MAP items the run's tree (its root and every child run under it) may
    /// still create: its fan-out budget. A MAP with more items fails.
    pub items_left: u64,
    /// When the run times out (the definition's `timeout` after its start).
    pub deadline: Option<DateTime<Utc>>,
    /// For a child run: the SUB_WORKFLOW attempt it reports its end to.
    pub parent: Option<ParentRef>,
    /// For a run under a concurrency limit: the limit's key.
    pub concurrency_key: Option<String>,
    /// Which nodes' tasks `tasks` holds. `None`: all of them. `Some(mask)`:
    /// the nodes marked true (their task, or the knowledge that they have
    /// none yet), and whatever the mask says, every task that is not
    /// COMPLETED, SKIPPED or CANCELLED. A machine that needs another node's
    /// task names it in [`Transition::missing`] instead of guessing; the
    /// engine loads it and applies the event again.
    pub known: Option<Vec<bool>>,
}

impl Run {
    pub fn new(id: Uuid, input: Value) -> Run {
        Run {
            id,
            status: RunStatus::Running,
            input,
            output: None,
            error: None,
            tasks: Vec::new(),
            max_payload: crate::storable::DEFAULT_MAX_PAYLOAD,
            items_left: u64::MAX,
            deadline: None,
            parent: None,
            concurrency_key: None,
            known: None,
        }
    }

    pub fn task(&self, id: Uuid) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id && !t.removed)
    }
}

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
        /// The worker's code for the failure ([`codes::TASK_FAILED`] without one).
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
    /// The engine loaded the items a MAP asked for ([`Need`]); the MAP
    /// carries on with them. (Also: a MAP that stopped creating items for
    /// one event carries on.)
    ItemsLoaded {
        task_id: Uuid,
    },
    /// The engine read elements `from..` of a MAP's list ([`Need::Sources`]).
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

/// Items of a MAP the state machine needs and the run does not hold: the
/// engine loads only the items an event names, so that an item's result
/// costs the same with ten items or ten thousand. It loads these
/// ([`Effect::LoadItems`]), then applies [`Event::ItemsLoaded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Up to `count` QUEUED items, lowest index first, to start.
    Queued { map: Uuid, count: u32 },
    /// Every item, to gather the MAP's output.
    All { map: Uuid },
    /// `count` elements of the MAP's list from index `from`, to create
    /// their items ([`Event::SourcesLoaded`]).
    Sources { map: Uuid, from: u32, count: u32 },
}

impl Event {
    /// Whether the event may be applied to a run loaded in part
    /// ([`Run::known`]): a step's own news (its result, its timer, its
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
                | Event::TaskInDoubt { .. }
                | Event::ChildFinished { .. }
                | Event::ItemsLoaded { .. }
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
            Event::SourcesLoaded { .. } => "SourcesLoaded",
            Event::ChildFinished { .. } => "ChildFinished",
        }
    }

    /// The task the event reports on, if it names one.
    pub fn task_id(&self) -> Option<Uuid> {
        match self {
            Event::TaskCompleted { task_id, .. }
            | Event::TaskFailed { task_id, .. }
            | Event::TimerFired { task_id }
            | Event::EventReceived { task_id, .. }
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
}

impl HistoryKind {
    pub const ALL: [HistoryKind; 22] = [
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

/// Why an event changed nothing, as a stable name fit for a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IgnoreKind {
    AlreadyStarted,
    RunFinished,
    UnknownTask,
    StaleAttempt,
    AlreadyFinished,
    NotWaiting,
    NotDue,
    NotFailed,
    NotPaused,
    NotDispatched,
    NotInDoubt,
}

impl IgnoreKind {
    pub const ALL: [IgnoreKind; 11] = [
        IgnoreKind::AlreadyStarted,
        IgnoreKind::RunFinished,
        IgnoreKind::UnknownTask,
        IgnoreKind::StaleAttempt,
        IgnoreKind::AlreadyFinished,
        IgnoreKind::NotWaiting,
        IgnoreKind::NotDue,
        IgnoreKind::NotFailed,
        IgnoreKind::NotPaused,
        IgnoreKind::NotDispatched,
        IgnoreKind::NotInDoubt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IgnoreKind::AlreadyStarted => "already_started",
            IgnoreKind::RunFinished => "run_finished",
            IgnoreKind::UnknownTask => "unknown_task",
            IgnoreKind::StaleAttempt => "stale_attempt",
            IgnoreKind::AlreadyFinished => "already_finished",
            IgnoreKind::NotWaiting => "not_waiting",
            IgnoreKind::NotDue => "not_due",
            IgnoreKind::NotFailed => "not_failed",
            IgnoreKind::NotPaused => "not_paused",
            IgnoreKind::NotDispatched => "not_dispatched",
            IgnoreKind::NotInDoubt => "not_in_doubt",
        }
    }
}

/// What applying one event changed. Indices point into `run.tasks`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transition {
    /// Why the event was ignored; nothing else is set when it was.
    pub ignored: Option<String>,
    /// A stable name for the reason, fit for a metric label.
    pub ignored_kind: Option<IgnoreKind>,
    /// Tasks that existed before the event and were changed by it.
    pub updated: Vec<usize>,
    /// Tasks created by the event (appended to `run.tasks`).
    pub created: Vec<usize>,
    /// Tasks (created or updated) to send to a worker.
    pub dispatch: Vec<usize>,
    /// The run's status, output or error changed.
    pub run_changed: bool,
    pub history: Vec<HistoryEntry>,
    /// MAP tasks that ended with items still queued or open, some of them
    /// maybe not in `run.tasks`: storage cancels those.
    pub cancel_items: Vec<usize>,
    /// What the engine must do, in the event's transaction, before the
    /// run can go on; each result comes back as an event.
    pub effects: Vec<Effect>,
    /// SUB_WORKFLOW tasks whose current attempt needs its child run started.
    pub children: Vec<usize>,
    /// MAP items the transition's MAPs will create in all: charged to the
    /// run tree's fan-out budget when they start.
    pub charged_items: u64,
    /// The lists of MAPs that have items still to create, for storage:
    /// `(MAP task, the first chunk's index, the elements from it on)`.
    pub sources: Vec<(usize, u32, Vec<Value>)>,
    /// MAPs that stopped creating items for this event with slots still
    /// free: they carry on after the commit.
    pub continue_maps: Vec<usize>,
    /// The run's input was replaced (a rerun with an edited input).
    pub input_changed: bool,
    /// Tasks whose limit keys a target's `Retry-After` holds, and until when.
    pub limit_holds: Vec<(usize, DateTime<Utc>)>,
    /// Tasks whose attempt its worker reported the end of: the worker has
    /// stopped, so what the attempt held is free at once (an attempt ended
    /// otherwise — a timeout, a cancel — may still be running there).
    pub reported: Vec<usize>,
    /// Nodes whose tasks a run loaded in part ([`Run::known`]) lacked and
    /// this event needed. A transition with any is void: the engine drops
    /// it, loads these nodes' tasks, and applies the event again.
    pub missing: Vec<usize>,
}

impl Transition {
    pub(super) fn ignore(Ignore(kind, reason): Ignore, about: Probe) -> Transition {
        let mut payload = json!({"event": about.name, "reason": reason});
        if let Some(id) = about.task_id {
            payload["task_id"] = json!(id);
        }
        if let Some(attempt) = about.attempt {
            payload["attempt"] = json!(attempt);
        }
        Transition {
            ignored: Some(reason),
            ignored_kind: Some(kind),
            history: vec![HistoryEntry { kind: HistoryKind::EventIgnored, payload }],
            ..Transition::default()
        }
    }

    /// Folds a follow-up transition (applied to the same run right after this
    /// one, in the same commit) into this one.
    pub fn merge(&mut self, next: Transition) {
        for t in next.created {
            self.created.push(t);
        }
        for t in next.updated {
            self.touch(t);
        }
        for t in next.dispatch {
            if !self.dispatch.contains(&t) {
                self.dispatch.push(t);
            }
        }
        self.run_changed |= next.run_changed;
        self.history.extend(next.history);
        for t in next.cancel_items {
            if !self.cancel_items.contains(&t) {
                self.cancel_items.push(t);
            }
        }
        for e in next.effects {
            if !self.effects.contains(&e) {
                self.effects.push(e);
            }
        }
        // The engine starts a child only for a task's current attempt, once.
        self.children.extend(next.children);
        self.charged_items += next.charged_items;
        self.input_changed |= next.input_changed;
        self.sources.extend(next.sources);
        self.limit_holds.extend(next.limit_holds);
        self.reported.extend(next.reported);
        debug_assert!(next.missing.is_empty(), "a void transition (missing tasks) was merged");
        for m in next.continue_maps {
            if !self.continue_maps.contains(&m) {
                self.continue_maps.push(m);
            }
        }
    }

    pub(super) fn touch(&mut self, task: usize) {
        if !self.updated.contains(&task) && !self.created.contains(&task) {
            self.updated.push(task);
        }
    }

    pub fn log(&mut self, kind: HistoryKind, payload: Value) {
        self.history.push(HistoryEntry { kind, payload });
    }
}

/// The SUB_WORKFLOW (or LOOP) attempt a child run belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParentRef {
    pub run_id: Uuid,
    pub task_id: Uuid,
    pub attempt: i32,
    /// The LOOP iteration it is (0 for a SUB_WORKFLOW's child).
    pub iteration: u32,
}

/// What the state machine asks of the engine within the event's
/// transaction: work that needs storage. The engine does it and applies
/// the result as an event ([`Event::ItemsLoaded`], [`Event::EventReceived`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Load MAP items the run does not hold.
    LoadItems(Need),
    /// A task began to wait for `(event, key)`: deliver an event that came
    /// before it, if one is kept.
    TakeBufferedEvent { task_id: Uuid, event: String, key: String },
}

/// What a committed transition owes other runs, run by the engine after the
/// commit (and by the recovery sweeps when a coordinator dies first). See
/// [`super::after_commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum AfterCommit {
    /// Start the child run of a SUB_WORKFLOW attempt, in a transaction of
    /// its own.
    StartChild { task_id: Uuid, attempt: i32, iteration: u32 },
    /// Cancel the open children of a SUB_WORKFLOW task that it no longer
    /// waits for: those of older attempts, or all once it is no longer
    /// `waiting` for one.
    CancelChildren { task_id: Uuid, attempt: i32, iteration: u32, waiting: bool },
    /// A MAP whose items are SUB_WORKFLOWs ended early (its run cancelled
    /// or failed, or an item failed it): the open children of its items,
    /// which storage cancelled without the run holding them, are cancelled.
    CancelItemChildren { map_task_id: Uuid },
    /// The run ended: its parent run's attempt ends with it (`event` is the
    /// parent's [`Event::ChildFinished`]).
    NotifyParent { parent_run: Uuid, event: Event },
    /// A run under a concurrency limit ended: the next queued run of
    /// `(workflow, key)` may start.
    FreeSlot { workflow: String, key: String },
    /// A MAP stopped creating items for one event: it carries on in a
    /// transaction of its own ([`Event::ItemsLoaded`]).
    ContinueMap { task_id: Uuid },
}

/// What the history says of an event that was ignored: taken before the
/// event is applied (and consumed).
pub(super) struct Probe {
    name: &'static str,
    task_id: Option<Uuid>,
    attempt: Option<i32>,
}

impl Probe {
    pub(super) fn of(event: &Event) -> Probe {
        let attempt = match event {
            Event::TaskCompleted { attempt, .. }
            | Event::TaskFailed { attempt, .. }
            | Event::TaskInDoubt { attempt, .. }
            | Event::ChildFinished { attempt, .. } => Some(*attempt),
            _ => None,
        };
        Probe { name: event.name(), task_id: event.task_id(), attempt }
    }
}

/// Why an event changes nothing: a stable kind and a message for people.
pub(super) struct Ignore(pub(super) IgnoreKind, pub(super) String);

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

impl crate::definition::OnFailure {
    /// Whether a run that ended in `status` starts the handler.
    pub fn starts_on(&self, status: RunStatus) -> bool {
        use RunStatus::{Cancelled, Failed};
        (status == Failed && self.on_failed) || (status == Cancelled && self.on_cancelled)
    }
}
