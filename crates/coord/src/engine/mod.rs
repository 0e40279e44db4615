//! The engine: the one way a run changes. Every change is an event applied
//! in a transaction: lock the run row, load its tasks, apply the pure state
//! machine and the effects it asks for, write the changes, outbox rows and
//! history, commit. A crash anywhere rolls all of it back, and the run lock
//! serializes events of one run across every coordinator. What a commit
//! owes other runs (a child to start, a parent to tell, a queued run to
//! admit) runs after it, each in a transaction of its own, with a recovery
//! sweep behind it.
//!
//! The way in is [`Engine::handle`] with an [`EventRequest`] (which run,
//! which event, who asks); runs start through [`starts`]. Requests wait in
//! the [`queue`]; a batch loop ([`loops`]) takes what waits into one
//! [`batch`], whose phases are each a file of their own.
//!
//! - this file: the [`Engine`] value, what every part of it reads: the
//!   pool, the queue, the compiled workflows, the bounds.
//! - [`request`]: what is asked of the engine, by whom, and its answer.
//! - [`queue`]: requests and starts waiting for a batch loop, by priority.
//! - [`loops`]: the batch loops, the one entry point, and a batch that
//!   failed applied again piece by piece.
//! - [`batch`]: one batch's transaction, phase by phase.
//! - [`write`]: writing what a transaction's runs changed, and publishing
//!   it once committed.
//! - [`after_commit`]: what a commit owes other runs, run after it.
//! - [`starts`]: starting a run in a transaction of its own or a caller's.
//! - [`children`]: the child run of a SUB_WORKFLOW attempt.
//! - [`promote`]: the queued runs a concurrency key's free slots start.
//! - [`tally`]: what the engine counts (events, finished runs).
//! - [`effects`]: applies an event and the effects it asks for.
//! - [`evaluator`]: the one door to the evaluator, and the threads that
//!   evaluate what is not simple, off the async runtime.
//! - [`flight`]: the flight recorder, which names what an evaluation that
//!   killed the process was for, and the coordinator's state directory.
//! - [`admission`]: creating a run under its concurrency limit.
//! - [`handler`]: the hooks a run's end starts (`on_failure`, `on_success`,
//!   `on_end`), in its commit.
//! - [`arming`]: the deadlines a run or a step arms, written with it.
//! - [`deadlines`]: the timer loop's firing of due deadlines.
//! - [`loaded`]: a run as a transaction holds it.
//! - [`idle`]: polls waiting for work, which a batch's commit leases tasks to.
//! - [`publisher`]: what a commit hands to the publishing loop.
//! - [`store`]: the seam with storage ([`store::RunStore`]).
//! - [`error`]: [`EngineError`] and the typed [`Rejection`]s.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use composer_core::definition::Workflow;
use composer_core::machine;
use composer_store::definitions::DefinitionRow;
use composer_store::outbox::Outbound;
use composer_store::runs::RunRow;
use composer_store::transitions::Publish;
use composer_store::Pool;
use tokio::sync::Notify;
use uuid::Uuid;

pub mod admission;
pub mod after_commit;
pub mod arming;
pub mod batch;
pub mod children;
pub mod deadlines;
pub mod effects;
pub mod error;
pub mod evaluator;
pub mod flight;
pub mod handler;
pub mod idle;
pub mod loaded;
pub mod loops;
pub mod promote;
pub mod publisher;
pub mod queue;
pub mod request;
pub mod starts;
pub mod store;
pub mod tally;
pub mod write;

pub use admission::{Bounds, TreeBudget};
pub use error::{EngineError, Rejection, Result};
pub use queue::{Lane, URGENT_LOOPS};
pub use request::{Answer, By, Control, EventRequest, Report};

/// Most open large runs a coordinator keeps in mind to read in part (16
/// bytes each).
const LARGE_RUNS_KEPT: usize = 100_000;

pub struct Engine {
    pool: Pool,
    /// Stream shards per queue, for the outbox rows this engine writes.
    shards: i32,
    outbox_wake: Arc<Notify>,
    /// Publishes what a commit dispatched right after it, the outbox rows
    /// falling due for the enqueuers only after the grace. `None` on a
    /// coordinator that runs no enqueuer: its rows are due at once and
    /// NOTIFY wakes the other coordinators' enqueuers.
    publisher: Option<(Arc<publisher::Publisher>, std::time::Duration)>,
    /// Definition versions are immutable, so a compiled workflow is cached
    /// for the life of the process.
    workflows: Mutex<HashMap<Uuid, Arc<Workflow>>>,
    /// Bounded (`COMPOSER_ENGINE_QUEUE`): when full, callers are told to come
    /// back later rather than queue without end.
    queue: queue::Queue,
    /// Runs whose last event failed permanently, and how often in a row: a
    /// repeat fails the run, so one poisoned run cannot fail forever.
    faults: Mutex<HashMap<Uuid, u32>>,
    /// Concurrency keys (workflow, key) a pass of [`Engine::promote`] runs
    /// for now in this process, each with whether a slot freed meanwhile.
    promoting: Mutex<HashMap<(String, String), bool>>,
    /// Open runs this coordinator has loaded whose definitions have more
    /// than `Bounds::whole_run_nodes` nodes: their steps' results read them
    /// in part. A run not here (its first event on this coordinator) is
    /// read whole, which is always right.
    large_runs: Mutex<HashSet<Uuid>>,
    /// Batch loops running now (`/readyz` is 503 when one has stopped).
    live_loops: AtomicUsize,
    /// The payload limit and the fan-out budget.
    bounds: Bounds,
    /// Where the spans of runs go (`COMPOSER_OTLP_ENDPOINT`); none without.
    traces: Option<Arc<crate::trace::Traces>>,
    /// Task-API polls waiting for work: a batch leases them what it makes
    /// ready of their queues.
    idle: idle::IdlePolls,
    /// The namespace's quotas, which a start from outside a run is held to
    /// ([`Engine::start_run_in`]).
    quotas: Option<Arc<crate::quotas::QuotaState>>,
    /// Where values too large for their rows go (`COMPOSER_OFFLOAD_URL`).
    payloads: composer_archive::payloads::Payloads,
    /// The UI's address, for the links approvals' notifications carry
    /// (`COMPOSER_UI_URL`).
    ui_url: Option<String>,
}

impl Engine {
    pub fn new(
        pool: Pool,
        shards: u32,
        outbox_wake: Arc<Notify>,
        publisher: Option<(Arc<publisher::Publisher>, std::time::Duration)>,
        bounds: Bounds,
        queue_capacity: usize,
    ) -> Engine {
        Engine {
            pool,
            shards: shards as i32,
            outbox_wake,
            publisher,
            workflows: Mutex::new(HashMap::new()),
            queue: queue::Queue::new(queue_capacity),
            faults: Mutex::new(HashMap::new()),
            promoting: Mutex::new(HashMap::new()),
            large_runs: Mutex::new(HashSet::new()),
            live_loops: AtomicUsize::new(0),
            bounds,
            traces: None,
            idle: idle::IdlePolls::default(),
            quotas: None,
            payloads: composer_archive::payloads::Payloads::off(),
            ui_url: None,
        }
    }

    /// Starts the links approvals' notifications carry with `ui_url`.
    pub fn with_ui_url(mut self, ui_url: Option<String>) -> Engine {
        self.ui_url = ui_url;
        self
    }

    /// Keeps values too large for their rows in `payloads` from now on.
    pub fn with_payloads(mut self, payloads: composer_archive::payloads::Payloads) -> Engine {
        self.payloads = payloads;
        self
    }

    /// Where values too large for their rows go, and are read back from.
    pub fn payloads(&self) -> &composer_archive::payloads::Payloads {
        &self.payloads
    }

    /// Holds the runs schedules and triggers start to `quotas` from now on.
    pub fn with_quotas(mut self, quotas: Arc<crate::quotas::QuotaState>) -> Engine {
        self.quotas = Some(quotas);
        self
    }

    /// The pool of its namespace's database.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The task-API polls waiting for work.
    pub fn idle_polls(&self) -> &idle::IdlePolls {
        &self.idle
    }

    /// Records the spans of runs to `traces` from now on.
    pub fn with_traces(mut self, traces: Option<Arc<crate::trace::Traces>>) -> Engine {
        self.traces = traces;
        self
    }

    /// Where the spans of runs go, if anywhere.
    pub fn traces(&self) -> Option<&Arc<crate::trace::Traces>> {
        self.traces.as_ref()
    }

    /// Batch loops running now.
    pub fn live_loops(&self) -> usize {
        self.live_loops.load(Ordering::Relaxed)
    }

    /// Stream shards per queue.
    pub fn shards(&self) -> i32 {
        self.shards
    }

    /// The compiled workflow of a stored definition.
    pub fn compile(&self, def: &DefinitionRow) -> Result<Arc<Workflow>> {
        if let Some(wf) = self.workflows.lock().expect("workflow cache").get(&def.id) {
            return Ok(wf.clone());
        }
        // On a thread with the evaluation stack: jq's parser recurses as deep
        // as an expression nests, past a tokio worker's 2 MiB. Recorded: a
        // compilation that killed the coordinator quarantines the version.
        let (spec, subject) = (&def.spec, flight::Subject::Definition(def.id));
        if evaluator::quarantined(&subject) {
            return Err(Rejection::Evaluation(evaluator::Lost::Quarantined(subject).to_string()).into());
        }
        let parsed = composer_core::expr::on_eval_stack(|| {
            flight::recording(&subject, || Workflow::parse(spec).map_err(|e| e.to_string()))
        });
        let wf = parsed.and_then(|p| p).map_err(|why| Rejection::StaleDefinition {
            name: def.name.clone(),
            version: def.version,
            why,
        })?;
        let wf = Arc::new(wf);
        self.workflows.lock().expect("workflow cache").insert(def.id, wf.clone());
        Ok(wf)
    }

    /// The compiled workflow of a definition, by its id.
    pub(crate) async fn workflow(&self, definition_id: Uuid) -> Result<Arc<Workflow>> {
        if let Some(wf) = self.workflows.lock().expect("workflow cache").get(&definition_id) {
            return Ok(wf.clone());
        }
        let client = composer_store::client(&self.pool).await?;
        let def = composer_store::definitions::by_id(&client, definition_id).await?.ok_or_else(|| {
            composer_store::Error::Corrupt(format!("definition {definition_id} of a run does not exist"))
        })?;
        self.compile(&def)
    }

    /// How this engine's writes have their outbox rows published.
    fn publish_mode(&self) -> Publish {
        match &self.publisher {
            Some((_, grace)) => Publish::ByWriter { grace: *grace },
            None => Publish::ByEnqueuer { notify: true },
        }
    }

    /// After a commit: publishes what it dispatched, or wakes the enqueuer.
    fn dispatched(&self, outbound: Vec<Outbound>, any: bool) {
        match &self.publisher {
            Some((publisher, _)) => publisher.send(outbound),
            None if any => self.outbox_wake.notify_one(),
            None => {}
        }
    }

    /// Gives a loaded run the payload limit and what its tree's fan-out
    /// budget has left (read only for a workflow with a MAP).
    async fn hold_to_limits(
        &self,
        store: &store::Tx<'_, '_>,
        wf: &Workflow,
        run: &mut machine::Run,
        row: &RunRow,
    ) -> Result<()> {
        run.max_payload = self.bounds.max_payload;
        run.max_read = self.bounds.max_read();
        run.items_left = match wf.has_items() {
            true => admission::items_left(store, row.root(), self.bounds).await?,
            false => self.bounds.tree.items as u64,
        };
        Ok(())
    }

    /// Adds an open large run to (or, ended, takes it from) the runs read in
    /// part; past `LARGE_RUNS_KEPT`, the set starts again (those runs are
    /// read whole once more, then in part).
    fn remember_large(&self, run: Uuid, open: bool) {
        let mut large = self.large_runs.lock().unwrap_or_else(|p| p.into_inner());
        if !open {
            large.remove(&run);
            return;
        }
        if large.len() >= LARGE_RUNS_KEPT {
            large.clear();
        }
        large.insert(run);
    }
}
