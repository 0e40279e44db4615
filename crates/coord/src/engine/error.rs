//! How handling an event or starting a run can fail: the engine's own
//! errors, and the typed reasons a request is refused.

use uuid::Uuid;

/// Why a run cannot be started as asked. The caller's fault (a 400 at the
/// API; the failure of the SUB_WORKFLOW attempt that asked for a child).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The input does not match the workflow's `input_schema`.
    #[error("workflow {workflow:?}: {why}")]
    Input { workflow: String, why: String },
    /// The workflow's concurrency key does not evaluate over this input.
    #[error("{0}")]
    ConcurrencyKey(String),
    /// A child names a workflow (or version) that is not registered.
    #[error("workflow {name:?}{} is not registered", version.map(|v| format!(" version {v}")).unwrap_or_default())]
    UnknownWorkflow { name: String, version: Option<i32> },
    /// A child would nest deeper than `sub_workflow_max_depth`.
    #[error("SUB_WORKFLOW nesting deeper than {max} levels ({limit})")]
    TooDeep { max: i32, limit: &'static str },
    /// A child would take its run tree past its fan-out budget.
    #[error("the run tree already has the most {what} its fan-out budget allows ({max}, COMPOSER_MAX_TREE_{})", what.to_uppercase())]
    TreeTooBig { what: &'static str, max: i64 },
    /// A failure handler's input does not evaluate, or is too large.
    #[error("{0}")]
    HandlerInput(String),
    /// The run's tags do not evaluate, or are not tags.
    #[error("{0}")]
    Tags(String),
    /// The workflow's fairness key does not evaluate over this input.
    #[error("{0}")]
    FairnessKey(String),
    /// Its expressions could not be evaluated at all: past the evaluation
    /// backstop, or quarantined since they killed a coordinator.
    #[error("{0}")]
    Evaluation(String),
    /// A stored definition no longer passes the checks it is compiled with
    /// (registered before a rule it breaks).
    #[error(
        "stored definition {name:?} version {version} no longer passes today's checks ({why}): register a new version"
    )]
    StaleDefinition { name: String, version: i32, why: String },
    /// The namespace is past quota `quota` (a 429 at the API, with
    /// `Retry-After: retry_after`).
    #[error("{message}")]
    OverQuota { quota: &'static str, message: String, retry_after: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("run {0} not found")]
    RunNotFound(Uuid),
    /// The worker that reported a task's attempt does not hold its lease.
    #[error("task {0}: the reporting worker does not hold its lease")]
    LeaseLost(Uuid),
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error("the coordinator is shutting down")]
    Stopped,
    /// The engine's queue is full (`COMPOSER_ENGINE_QUEUE`).
    #[error("the engine is busy; retry shortly")]
    Busy,
    /// Applying the event panicked: a bug, contained to this event.
    #[error("engine fault applying {event} to run {run_id}: {message}")]
    Fault { run_id: Uuid, event: &'static str, message: String },
    /// Another run of the tree spent its fan-out budget while this batch
    /// applied: applying again sees what is left.
    #[error("run {run_id}: its run tree's fan-out budget changed meanwhile; retry")]
    BudgetRace { run_id: Uuid },
    /// A move to another version came in a batch after other events of
    /// its run: the batch is applied again a request at a time.
    #[error("run {run_id}: moved to another version in a batch with its other events; applied on its own")]
    MovedWithOthers { run_id: Uuid },
    /// The request cannot be served as given.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A bulk job already acted on this run.
    #[error("the bulk job already acted on this run")]
    AlreadyDone,
    /// A service other than PostgreSQL is away (Redis, counting starts).
    #[error("{0}")]
    Unavailable(String),
}

impl EngineError {
    /// True when applying the same event again cannot succeed.
    pub(crate) fn is_permanent(&self) -> bool {
        match self {
            EngineError::Fault { .. } => true,
            EngineError::Store(e) => e.is_permanent(),
            // As a corrupt row would be: its runs cannot go on.
            EngineError::Rejected(Rejection::StaleDefinition { .. }) => true,
            _ => false,
        }
    }
}

impl From<tokio_postgres::Error> for EngineError {
    fn from(e: tokio_postgres::Error) -> Self {
        EngineError::Store(e.into())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
