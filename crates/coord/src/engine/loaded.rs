//! A run as a transaction holds it: locked (or just created), in the state
//! machine's form, with what the transaction's events changed so far.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use composer_core::definition::Workflow;
use composer_core::machine::{self, AfterCommit};
use composer_store::runs::RunRow;
use composer_store::transitions::{Change, Eager, Offloaded, Order};

use crate::trace::Seen;
use composer_api::wire::EagerOffer;
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
    /// Tasks its commit leases to the worker that reported (eager dispatch).
    pub eager: Vec<Eager>,
    /// Its tasks that were PENDING when it was read (and locked): its write
    /// fails if a poll leased one meanwhile, since polls take no run lock.
    pub pending_at_read: Vec<Uuid>,
    /// The references its offloaded values were read from.
    pub read: crate::payloads::ReadFrom,
    /// Its values the write puts in objects (filled just before it).
    pub offloaded: Offloaded,
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
            eager: Vec::new(),
            pending_at_read: Vec::new(),
            read: crate::payloads::ReadFrom::default(),
            offloaded: Offloaded::default(),
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
            eager: &self.eager,
            pending_at_read: &self.pending_at_read,
            offloaded: &self.offloaded,
        }
    }

    /// Leases to `worker`, in this commit, up to `offer.slots` of the tasks
    /// this run's transition dispatches (its events', or its start's when
    /// a freed slot started it) to the offer's queues and that no limit holds;
    /// returns their ids. Not at-most-once steps: one whose answer is lost
    /// would go IN_DOUBT when its lease expires, though it was never sent.
    /// A coordinator's own executor is given only steps it may run.
    pub fn give_eagerly(&mut self, worker: &str, offer: &EagerOffer) -> Vec<Uuid> {
        let mut given = Vec::new();
        for &i in &self.tr.dispatch {
            if given.len() >= offer.slots as usize {
                break;
            }
            let task = &self.run.tasks[i];
            let node = &self.wf.nodes[task.node];
            // The scans of what the transition wrote come last: a MAP can
            // dispatch 10,000 items in one event, and they run only for a
            // task that is about to be given.
            if self.may_lease_in_commit(i)
                && offer.queues.iter().any(|q| q == node.dispatch_queue())
                && (node.coordinator_may_run || !offer.coordinator)
                && !self.eager.iter().any(|e| e.task == i)
                && (self.tr.created.contains(&i) || self.tr.updated.contains(&i))
            {
                self.eager.push(Eager { task: i, owner: worker.to_string(), lease: offer.lease });
                given.push(task.id);
            }
        }
        given
    }

    /// The tasks its transition dispatches that its commit may lease to a
    /// worker (as [`Loaded::give_eagerly`] would give them), by queue, each
    /// queue's in dispatch order. Worked out once, with sets: a MAP can
    /// dispatch 10,000 items in one event.
    pub fn givable(&self) -> HashMap<&str, VecDeque<usize>> {
        let mut by_queue: HashMap<&str, VecDeque<usize>> = HashMap::new();
        let changed: HashSet<usize> = self.tr.created.iter().chain(&self.tr.updated).copied().collect();
        let given: HashSet<usize> = self.eager.iter().map(|e| e.task).collect();
        for &i in &self.tr.dispatch {
            if self.may_lease_in_commit(i) && changed.contains(&i) && !given.contains(&i) {
                let node = &self.wf.nodes[self.run.tasks[i].node];
                by_queue.entry(node.dispatch_queue()).or_default().push_back(i);
            }
        }
        by_queue
    }

    /// Whether task `i`, which its transition dispatches, may be leased in
    /// its commit rather than sent: still PENDING, held by no limit, not
    /// at-most-once (one whose answer is lost would go IN_DOUBT, though it
    /// was never sent), not removed.
    fn may_lease_in_commit(&self, i: usize) -> bool {
        let task = &self.run.tasks[i];
        task.state == machine::TaskState::Pending
            && task.limit_keys.is_empty()
            && !self.wf.nodes[task.node].at_most_once
            && !task.removed
    }

    /// Whether a coordinator may run task `i` itself (an HTTP call that
    /// reads no secret).
    pub fn coordinator_may_run(&self, i: usize) -> bool {
        self.wf.nodes[self.run.tasks[i].node].coordinator_may_run
    }

    /// Leases task `i` (one of [`Loaded::givable`]) to `worker` in this
    /// commit; returns its id.
    pub fn lease_in_commit(&mut self, i: usize, worker: &str, lease: std::time::Duration) -> Uuid {
        self.eager.push(Eager { task: i, owner: worker.to_string(), lease });
        self.run.tasks[i].id
    }

    /// What its commit owes other runs, each with the run it comes from.
    pub fn after_commit(&self) -> impl Iterator<Item = (Uuid, AfterCommit)> + '_ {
        machine::after_commit(&self.wf, &self.run, &self.tr).into_iter().map(|e| (self.run.id, e))
    }
}
