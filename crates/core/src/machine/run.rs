//! The part of a run the state machine reads and changes, and the attempt
//! a child run belongs to.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::lifecycle::RunStatus;
use super::task::Task;

/// The most of a run's values one expression's scope may hold
/// ([`Run::max_read`]), in about bytes of JSON: the largest value a run
/// holds (an offloaded one, at most 1 GiB) with room. Two such values read
/// by one node are refused rather than converted at once.
pub const SCOPE_MAX_BYTES: usize = crate::expr::PATH_OUTPUT;

/// How many scopes' worth ([`Run::max_read`]) of the run's values the
/// expressions of one event may have converted in all: each node an event
/// evaluates converts what its expressions read, so ten thousand nodes
/// reading one large value would convert it ten thousand times. Past it,
/// the next scope is refused as one too large is, naming this.
pub const EVENT_READS: usize = 4;

/// The part of a run the state machine reads and changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: Uuid,
    pub status: RunStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub tasks: Vec<Task>,
    /// The most of the run's values one expression's scope may hold, in
    /// about bytes of JSON ([`storable::size_up_to`](crate::storable::size_up_to)):
    /// what a scope reads is converted for the expression engine before it
    /// is evaluated, so this bounds that work and memory (default
    /// [`SCOPE_MAX_BYTES`]). A scope past it
    /// fails each expression evaluated in it, naming it.
    pub max_read: usize,
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
    /// task names it in [`Transition::missing`](crate::machine::Transition::missing) instead of guessing; the
    /// engine loads it and applies the event again.
    pub known: Option<Vec<bool>>,
    /// A MAP that gathers its items' outputs (`collect: "all"`) and does
    /// not hold all its items asks storage for the entries, read a page at
    /// a time ([`Need::Collect`](crate::machine::Need::Collect)), instead of
    /// for every item whole ([`Need::All`](crate::machine::Need::All)): what
    /// the engine does. `simulate` holds every item.
    pub collects_in_storage: bool,
    /// It holds a MAP's output the engine gathered (which may be as large
    /// as the value limit): the engine then applies its events without a
    /// copy of the run (to put back or to try inline). The state machine
    /// does not look at it.
    pub holds_gathered_output: bool,
    /// Some of its values are still references to the objects they are
    /// kept in ([`storable::is_reference`](crate::storable::is_reference)),
    /// left unread by the engine: its input, and the inputs and outputs of
    /// ended node tasks. A machine that needs one of them says so in
    /// [`Transition::unread`](crate::machine::Transition::unread) instead
    /// of reading the reference; the engine reads them and applies the
    /// event again.
    pub unread: bool,
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
            max_read: SCOPE_MAX_BYTES,
            max_payload: crate::storable::DEFAULT_MAX_PAYLOAD,
            items_left: u64::MAX,
            deadline: None,
            parent: None,
            concurrency_key: None,
            known: None,
            collects_in_storage: false,
            holds_gathered_output: false,
            unread: false,
        }
    }

    pub fn task(&self, id: Uuid) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id && !t.removed)
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
