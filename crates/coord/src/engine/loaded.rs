//! A run as a transaction holds it: locked (or just created), in the state
//! machine's form, with what the transaction's events changed so far.

use std::sync::Arc;

use composer_core::definition::Workflow;
use composer_core::machine::{self, AfterCommit};
use composer_store::runs::RunRow;
use composer_store::transitions::{Change, Order};

use crate::trace::Seen;
use uuid::Uuid;

#[derive(Debug)]
pub struct Loaded {
    pub wf: Arc<Workflow>,
    pub run: machine::Run,
    pub tr: machine::Transition,
    /// How many parents it has.
    pub depth: i32,
    /// Its definition's id and version.
    pub definition: (Uuid, i32),
    /// The root of its run tree, which its MAP items are charged to.
    pub root: Uuid,
    /// For a failure handler's run: the run whose end started it.
    pub handles: Option<Uuid>,
    /// The `traceparent` it was started under.
    pub traceparent: Option<String>,
    /// What its spans are made of (empty unless traces are on).
    pub seen: Seen,
    /// Its priority (1 served first, 5 last).
    pub priority: u8,
    /// Whose work it is: its messages go to this key's lane.
    pub fairness_key: Option<String>,
}

impl Loaded {
    pub fn new(wf: Arc<Workflow>, run: machine::Run, tr: machine::Transition, row: &RunRow) -> Loaded {
        Loaded {
            wf,
            run,
            tr,
            depth: row.depth,
            definition: (row.workflow_definition_id, row.workflow_version),
            root: row.root(),
            handles: row.handles_run_id,
            traceparent: row.traceparent.clone(),
            seen: Seen::default(),
            priority: row.priority,
            fairness_key: row.fairness_key.clone(),
        }
    }

    /// What storage writes for it.
    pub fn change(&self) -> Change<'_> {
        Change {
            wf: &self.wf,
            run: &self.run,
            tr: &self.tr,
            definition: self.definition,
            traceparent: self.traceparent.as_deref(),
            order: Order { priority: self.priority, fairness_key: self.fairness_key.as_deref() },
        }
    }

    /// What its commit owes other runs, each with the run it comes from.
    pub fn after_commit(&self) -> impl Iterator<Item = (Uuid, AfterCommit)> + '_ {
        machine::after_commit(&self.wf, &self.run, &self.tr).into_iter().map(|e| (self.run.id, e))
    }
}
