//! The [`Engine`]: its queue and batch loops, the transaction each batch is
//! applied in, and what it runs after a commit.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use composer_api::wire::{EagerOffer, StageTimes};
use composer_core::definition::{Workflow, SUB_WORKFLOW_MAX_DEPTH};
use composer_core::machine::{self, AfterCommit, Event, RunStatus};
use composer_core::priority;
use composer_core::trace::RunTrace;
use composer_store::definitions::DefinitionRow;
use composer_store::outbox::Outbound;
use composer_store::runs::{self, Parent, RunRow};
use composer_store::transitions::{write_transitions, Change, Given, Publish};
use composer_store::Pool;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

use super::admission::{self, Limits, NewRunOf};
use super::batch::{self, Applying, By, Control, Handled, LiveLoop, Pending};
use super::effects;
use super::error::{EngineError, Rejection, Result};
use super::handler;
use super::idle::IdlePolls;
use super::loaded::Loaded;
use super::publisher::Publisher;
use super::store::Tx;
use crate::trace::{self, Told, Traces};

/// Children started at once after a commit (each in its own transaction).
const CHILD_STARTS_AT_ONCE: usize = 8;

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
    publisher: Option<(Arc<Publisher>, std::time::Duration)>,
    /// Definition versions are immutable, so a compiled workflow is cached
    /// for the life of the process.
    workflows: Mutex<HashMap<Uuid, Arc<Workflow>>>,
    /// Bounded (`COMPOSER_ENGINE_QUEUE`): when full, callers are told to come
    /// back later rather than queue without end.
    queue: batch::Queue,
    /// Runs whose last event failed permanently, and how often in a row: a
    /// repeat fails the run, so one poisoned run cannot fail forever.
    faults: Mutex<HashMap<Uuid, u32>>,
    /// Concurrency keys (workflow, key) a pass of [`Engine::promote`] runs
    /// for now in this process, each with whether a slot freed meanwhile.
    promoting: Mutex<HashMap<(String, String), bool>>,
    /// Open runs this coordinator has loaded whose definitions have more
    /// than `Limits::whole_run_nodes` nodes: their steps' results read them
    /// in part. A run not here (its first event on this coordinator) is
    /// read whole, which is always right.
    large_runs: Mutex<HashSet<Uuid>>,
    /// Batch loops running now (`/readyz` is 503 when one has stopped).
    live_loops: AtomicUsize,
    /// The payload limit and the fan-out budget.
    limits: Limits,
    /// Where the spans of runs go (`COMPOSER_OTLP_ENDPOINT`); none without.
    traces: Option<Arc<Traces>>,
    /// Task-API polls waiting for work: a batch leases them what it makes
    /// ready of their queues.
    idle: IdlePolls,
}

/// Which work a batch loop takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Any, by the weighted share.
    All,
    /// Only work more urgent than the default priority, so that it never
    /// waits for a batch of a backlog to commit (see [`batch::Queue`]).
    Urgent,
}

/// Batch loops of [`Lane::Urgent`] a coordinator runs besides its
/// `COMPOSER_ENGINE_WORKERS` of [`Lane::All`].
pub const URGENT_LOOPS: usize = 1;

/// What a worker's report says besides its event: its stage times, what
/// it offers to run next, and its run's priority.
#[derive(Debug)]
pub struct Reported {
    pub stages: Option<StageTimes>,
    pub offer: Option<EagerOffer>,
    pub priority: u8,
}

/// A start queued for a batch: its definition, input, tags and traceparent.
type StartWork = (DefinitionRow, Value, Option<serde_json::Map<String, Value>>, Option<String>, Option<u8>);

/// How a run is started, besides its definition and input.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartOptions<'a> {
    /// A second start with the same key (per workflow) returns the first run.
    pub idempotency_key: Option<&'a str>,
    /// What started it when not an API call (a schedule's fire).
    pub trigger: Option<&'a Value>,
    /// Tags the start gives, besides the definition's.
    pub tags: Option<&'a serde_json::Map<String, Value>>,
    /// The W3C `traceparent` the run continues (checked by the caller).
    pub traceparent: Option<&'a str>,
    /// Its priority instead of its definition's (checked by the caller).
    pub priority: Option<u8>,
}

/// A run [`Engine::start_run_in`] created (or found by its idempotency key),
/// for [`Engine::started`] once the caller committed.
pub struct Started {
    pub row: RunRow,
    /// False when an idempotency key found an existing run.
    pub new: bool,
    loaded: Option<Loaded>,
    /// What its commit wrote, for the publisher (and the handlers it started).
    written: Option<Written>,
    /// The waiting polls its first steps were leased to, answered once the
    /// caller committed (dropped unanswered, they read again).
    to_idle: Vec<super::idle::Claimed>,
}

/// What a write did: the outbox rows it wrote (with their messages),
/// whether any, and the failure handlers it started.
struct Written {
    outbound: Vec<Outbound>,
    /// The tasks leased eagerly.
    eager: Vec<Given>,
    any: bool,
    handlers: Vec<Loaded>,
    /// The spans the commit ends (none unless traces are on).
    spans: Vec<trace::Span>,
}

impl Written {
    /// After the commit: answers the waiting polls the write leased tasks to.
    fn answer(&mut self, polls: Vec<super::idle::Claimed>) {
        if polls.is_empty() {
            return;
        }
        let mut sent: HashMap<Uuid, Given> = self.eager.drain(..).map(|g| (g.dispatch.task_id, g)).collect();
        for poll in polls {
            poll.send(&mut sent);
        }
    }
}

/// Where the answer to one piece of a batch's work goes.
enum Reply {
    Event(Uuid, oneshot::Sender<Result<Handled>>),
    Start(oneshot::Sender<Result<RunRow>>),
}

/// What one batch's work came to, in the order it was given.
struct Applied {
    events: Vec<Result<Handled>>,
    starts: Vec<RunRow>,
    after_commit: Vec<(Uuid, AfterCommit)>,
}

impl Engine {
    pub fn new(
        pool: Pool,
        shards: u32,
        outbox_wake: Arc<Notify>,
        publisher: Option<(Arc<Publisher>, std::time::Duration)>,
        limits: Limits,
        queue_capacity: usize,
    ) -> Engine {
        Engine {
            pool,
            shards: shards as i32,
            outbox_wake,
            publisher,
            workflows: Mutex::new(HashMap::new()),
            queue: batch::Queue::new(queue_capacity),
            faults: Mutex::new(HashMap::new()),
            promoting: Mutex::new(HashMap::new()),
            large_runs: Mutex::new(HashSet::new()),
            live_loops: AtomicUsize::new(0),
            limits,
            traces: None,
            idle: IdlePolls::default(),
        }
    }

    /// The task-API polls waiting for work.
    pub fn idle_polls(&self) -> &IdlePolls {
        &self.idle
    }

    /// Records the spans of runs to `traces` from now on.
    pub fn with_traces(mut self, traces: Option<Arc<Traces>>) -> Engine {
        self.traces = traces;
        self
    }

    /// Where the spans of runs go, if anywhere.
    pub fn traces(&self) -> Option<&Arc<Traces>> {
        self.traces.as_ref()
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

    /// Writes what the runs' events changed, in the caller's transaction,
    /// with the failure handlers their ends start (returned, for the caller
    /// to follow up after its commit).
    async fn write<'l>(
        &self,
        tx: &composer_store::Transaction<'_>,
        loaded: impl Iterator<Item = &'l mut Loaded>,
        published: &[i64],
    ) -> Result<Written> {
        let mut loaded: Vec<&mut Loaded> = loaded.collect();
        let mut handlers = Vec::new();
        let compile = |def: &DefinitionRow| self.compile(def);
        for l in loaded.iter_mut().filter(|l| handler::owes_handler(l)) {
            if let Some(h) = handler::start(&Tx(tx), &compile, l, self.limits).await? {
                handlers.push(h);
            }
        }
        let all: Vec<&Loaded> = loaded.iter().map(|l| &**l).chain(handlers.iter()).collect();
        for l in &all {
            // A MAP's items are charged in all when it starts.
            let items = l.tr.charged_items as i64;
            if items > 0 && !composer_store::trees::charge_items(tx, l.root, items, self.limits.tree.items).await? {
                // Another run of the tree spent the budget since this one read
                // it: applied again, the MAP sees what is left.
                return Err(EngineError::BudgetRace { run_id: l.run.id });
            }
        }
        let spans = match &self.traces {
            Some(_) => {
                let now = std::time::SystemTime::now();
                all.iter()
                    .flat_map(|l| {
                        let traceparent = l.traceparent.as_deref();
                        trace::spans_of(&l.wf, l.definition.1, &l.run, &l.tr, traceparent, &l.seen, now)
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        let changes: Vec<Change> = all.into_iter().map(Loaded::change).collect();
        let any = changes.iter().any(|c| !c.tr.dispatch.is_empty());
        let wrote = write_transitions(tx, &changes, self.shards, self.publish_mode(), published).await?;
        Ok(Written { outbound: wrote.outbound, eager: wrote.eager, any, handlers, spans })
    }

    /// After the commit of a write: publishes it, counts the failure
    /// handlers it started, and returns what their commit owes.
    fn written(&self, w: Written) -> Vec<(Uuid, AfterCommit)> {
        self.dispatched(w.outbound, w.any);
        if let (Some(traces), false) = (&self.traces, w.spans.is_empty()) {
            traces.record(w.spans);
        }
        if w.handlers.is_empty() {
            return Vec::new();
        }
        composer_metrics::inc(composer_metrics::RUNS_STARTED, &[], w.handlers.len() as u64);
        for h in w.handlers.iter().filter(|h| h.run.status.is_terminal()) {
            run_finished(&h.wf, &h.run);
        }
        w.handlers.iter().flat_map(Loaded::after_commit).collect()
    }

    /// Gives a loaded run the payload limit and what its tree's fan-out
    /// budget has left (read only for a workflow with a MAP).
    async fn hold_to_limits(
        &self,
        store: &Tx<'_, '_>,
        wf: &Workflow,
        run: &mut machine::Run,
        row: &RunRow,
    ) -> Result<()> {
        run.max_payload = self.limits.max_payload;
        run.items_left = match wf.has_items() {
            true => admission::items_left(store, row.root(), self.limits).await?,
            false => self.limits.tree.items as u64,
        };
        Ok(())
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
        let (spec, subject) = (&def.spec, super::flight::Subject::Definition(def.id));
        if super::evaluator::quarantined(&subject) {
            return Err(
                super::error::Rejection::Evaluation(super::evaluator::Lost::Quarantined(subject).to_string()).into()
            );
        }
        let parsed = composer_core::expr::on_eval_stack(|| {
            super::flight::recording(&subject, || Workflow::parse(spec).map_err(|e| e.to_string()))
        });
        let wf = parsed.and_then(|p| p).map_err(|e| {
            composer_store::Error::Corrupt(format!("stored definition {} v{} is invalid: {e}", def.name, def.version))
        })?;
        let wf = Arc::new(wf);
        self.workflows.lock().expect("workflow cache").insert(def.id, wf.clone());
        Ok(wf)
    }

    async fn workflow(&self, definition_id: Uuid) -> Result<Arc<Workflow>> {
        if let Some(wf) = self.workflows.lock().expect("workflow cache").get(&definition_id) {
            return Ok(wf.clone());
        }
        let client = composer_store::client(&self.pool).await?;
        let def = composer_store::definitions::by_id(&client, definition_id).await?.ok_or_else(|| {
            composer_store::Error::Corrupt(format!("definition {definition_id} of a run does not exist"))
        })?;
        self.compile(&def)
    }

    /// Inserts a run and applies RunStarted in the same commit, so a run
    /// never exists without its first dispatches. With an idempotency key, a
    /// run already started with that key (for this workflow) is returned
    /// instead, and `false` says so; concurrent starts with one key make one run.
    ///
    /// A start without a key, of a workflow without a concurrency limit, is
    /// queued for the engine's batches like an event: starts that arrive
    /// together share one transaction and one set-based write.
    pub async fn start_run(
        self: &Arc<Self>,
        def: &DefinitionRow,
        input: &Value,
        opts: StartOptions<'_>,
    ) -> Result<(RunRow, bool)> {
        let wf = self.compile(def)?;
        if opts.idempotency_key.is_none() && opts.trigger.is_none() && wf.concurrency.is_none() {
            let (reply, answer) = oneshot::channel();
            let (tags, traceparent) = (opts.tags.cloned(), opts.traceparent.map(str::to_string));
            let priority = opts.priority;
            let start = Pending::Start { def: def.clone(), input: input.clone(), tags, traceparent, priority, reply };
            self.enqueue(priority.unwrap_or(wf.priority), start)?;
            return Ok((answer.await.map_err(|_| EngineError::Stopped)??, true));
        }
        // Its own transaction, which may lease the first steps to waiting
        // polls, runs to its end in a task of its own: a caller that goes
        // away during the commit must not leave a committed lease untold.
        let (engine, def, input) = (self.clone(), def.clone(), input.clone());
        let StartOptions { idempotency_key, trigger, tags, traceparent, priority } = opts;
        let (key, trigger, tags, traceparent) =
            (idempotency_key.map(str::to_string), trigger.cloned(), tags.cloned(), traceparent.map(str::to_string));
        let own = tokio::spawn(async move {
            let opts = StartOptions {
                idempotency_key: key.as_deref(),
                trigger: trigger.as_ref(),
                tags: tags.as_ref(),
                traceparent: traceparent.as_deref(),
                priority,
            };
            let mut client = composer_store::client(&engine.pool).await?;
            let tx = composer_store::begin(&mut client).await?;
            let started = engine.start_in(&tx, &def, &input, opts, FirstSteps::ToWaitingPolls).await?;
            tx.commit().await?;
            Ok(engine.started(started))
        });
        own.await.map_err(|_| EngineError::Stopped)?
    }

    /// [`Engine::start_run`] inside the caller's transaction (a schedule's
    /// fire: the run and the schedule's move commit together). The caller
    /// commits, then hands the result to [`Engine::started`]. Its first
    /// steps go through their streams: the caller's transaction may go on
    /// to wait for locks, and the caller may be dropped in its commit, while
    /// a poll given a step would wait with its lease running.
    pub async fn start_run_in(
        &self,
        tx: &composer_store::Transaction<'_>,
        def: &DefinitionRow,
        input: &Value,
        opts: StartOptions<'_>,
    ) -> Result<Started> {
        self.start_in(tx, def, input, opts, FirstSteps::ToStreams).await
    }

    /// [`Engine::start_run_in`], which may lease the run's first steps to
    /// waiting polls when the transaction commits right after, whatever
    /// its caller does.
    async fn start_in(
        &self,
        tx: &composer_store::Transaction<'_>,
        def: &DefinitionRow,
        input: &Value,
        opts: StartOptions<'_>,
        first_steps: FirstSteps,
    ) -> Result<Started> {
        let wf = self.compile(def)?;
        let StartOptions { idempotency_key, trigger, tags, traceparent, priority } = opts;
        if let Some(key) = idempotency_key {
            if let Some(existing) = runs::lock_idempotency_key(tx, &def.name, key).await? {
                return Ok(Started { row: existing, new: false, loaded: None, written: None, to_idle: Vec::new() });
            }
        }
        let how = NewRunOf {
            def,
            input,
            idempotency_key,
            parent: None,
            depth: 0,
            trigger,
            root: None,
            handles: None,
            abandoned: false,
            tags,
            traceparent,
            priority,
            fairness_key: None,
        };
        let (row, mut loaded) = admission::create_run(&Tx(tx), wf, how, self.limits).await?;
        // Its first steps go to the polls waiting for work, as a batched
        // start's do.
        let to_idle = match first_steps {
            FirstSteps::ToWaitingPolls => self.idle.give(loaded.iter_mut()),
            FirstSteps::ToStreams => Vec::new(),
        };
        let written = self.write(tx, loaded.iter_mut(), &[]).await?;
        tracing::debug!(run_id = %row.id, workflow = %def.name, version = def.version, "run started");
        Ok(Started { row, new: true, loaded, written: Some(written), to_idle })
    }

    /// After the commit of [`Engine::start_run_in`]: publishes, counts, runs
    /// what the commit owes, and returns the run as it now stands (and
    /// whether it is new).
    pub fn started(self: &Arc<Self>, started: Started) -> (RunRow, bool) {
        let Started { mut row, new, loaded, written, to_idle } = started;
        if !new {
            return (row, false);
        }
        composer_metrics::inc(composer_metrics::RUNS_STARTED, &[], 1);
        if let Some(mut w) = written {
            w.answer(to_idle);
            let owed = self.written(w);
            self.follow_up(owed);
        }
        if let Some(l) = loaded {
            if l.run.status.is_terminal() {
                run_finished(&l.wf, &l.run);
            }
            row.status = l.run.status;
            row.output = l.run.output.clone();
            row.error = l.run.error.clone();
            self.follow_up(l.after_commit().collect());
        }
        (row, true)
    }

    /// Applies `event` to the run under its lock and commits the result.
    /// Events that arrive together share a transaction (see [`Engine::run_batches`]):
    /// batching is what keeps PostgreSQL commits per step low under load, and
    /// adds no wait when there is nothing to batch with.
    pub async fn handle(&self, run_id: Uuid, event: Event) -> Result<Handled> {
        self.handle_by(run_id, event, By::Engine).await
    }

    /// Applies a worker's report of a task's attempt, only while `worker`
    /// holds that attempt's lease ([`EngineError::LeaseLost`] otherwise),
    /// checked on the rows the batch's transaction locked: no read of its own.
    /// The report waits for a batch at its run's priority, as the worker
    /// was told it.
    pub async fn handle_reported(
        &self,
        run_id: Uuid,
        event: Event,
        worker: String,
        reported: Reported,
    ) -> Result<Handled> {
        let Reported { stages, offer, priority } = reported;
        let told = Told { task_id: event.task_id(), stages, link: None };
        self.handle_told(run_id, event, By::Worker(worker, offer), Some(told), priority).await
    }

    /// Applies `event` with what it tells its task's span.
    pub async fn handle_telling(&self, run_id: Uuid, event: Event, told: Told) -> Result<Handled> {
        self.handle_told(run_id, event, By::Engine, Some(told), priority::DEFAULT).await
    }

    /// Applies an operator's control action; the history records who took
    /// it and why. It goes before the work of every priority: a cancel or a
    /// pause must not wait behind the backlog it may be meant to stop.
    pub async fn handle_control(&self, run_id: Uuid, event: Event, control: Control) -> Result<Handled> {
        self.handle_told(run_id, event, By::Operator(control), None, priority::HIGHEST).await
    }

    /// Applies a bulk job's action to one run, once: `None` when the job
    /// already acted on the run (marked in the same commit as the action).
    pub async fn handle_bulk(
        &self,
        run_id: Uuid,
        event: Event,
        control: Control,
        job: Uuid,
    ) -> Result<Option<Handled>> {
        match self.handle_by(run_id, event, By::Bulk(control, job)).await {
            Err(EngineError::AlreadyDone) => Ok(None),
            other => other.map(Some),
        }
    }

    async fn handle_by(&self, run_id: Uuid, event: Event, by: By) -> Result<Handled> {
        self.handle_told(run_id, event, by, None, priority::DEFAULT).await
    }

    async fn handle_told(
        &self,
        run_id: Uuid,
        event: Event,
        by: By,
        told: Option<Told>,
        priority: u8,
    ) -> Result<Handled> {
        let (reply, answer) = oneshot::channel();
        // Nothing to tell when no span is recorded.
        let told = told.filter(|_| self.traces.is_some());
        self.enqueue(priority, Pending::Event { applying: Applying { run_id, event, by, told }, reply })?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    fn enqueue(&self, priority: u8, work: Pending) -> Result<()> {
        self.queue.push(priority, work)
    }

    /// Takes whatever work is queued (up to a batch) and applies it in one
    /// transaction; several of these loops run so that one batch's commit
    /// overlaps the next one's work, and one more for urgent work only
    /// ([`Lane::Urgent`]).
    pub async fn run_batches(self: Arc<Self>, lane: Lane, shutdown: tokio_util::sync::CancellationToken) {
        use futures_util::FutureExt;
        let _live = LiveLoop::enter(&self.live_loops);
        loop {
            let taken = async {
                match lane {
                    Lane::All => self.queue.take().await,
                    Lane::Urgent => self.queue.take_urgent().await,
                }
            };
            let work = tokio::select! {
                _ = shutdown.cancelled() => {
                    self.queue.close();
                    return;
                }
                work = taken => match work { Some(w) => w, None => return },
            };
            // A panic outside the state machine (which is contained per
            // event) drops this batch's replies (their callers see the
            // coordinator stopping) but not the loop.
            if let Err(panic) = std::panic::AssertUnwindSafe(self.clone().process(work)).catch_unwind().await {
                tracing::error!(
                    error = composer_core::panic_message(&*panic),
                    "engine batch panicked; its events were not applied"
                );
            }
        }
    }

    async fn process(self: Arc<Self>, work: Vec<Pending>) {
        let mut events = Vec::new();
        let mut starts = Vec::new();
        let mut replies = Vec::with_capacity(work.len());
        for p in work {
            match p {
                Pending::Event { applying, reply } => {
                    replies.push(Reply::Event(applying.run_id, reply));
                    events.push(applying);
                }
                Pending::Start { def, input, tags, traceparent, priority, reply } => {
                    starts.push((def, input, tags, traceparent, priority));
                    replies.push(Reply::Start(reply));
                }
            }
        }
        // Kept to apply the events one by one should the batch fail; a
        // batch of one has nothing to isolate, and costs no copy.
        let backup = (replies.len() > 1).then(|| events.clone());
        let run_ids: Vec<Uuid> = events.iter().map(|a| a.run_id).collect();
        match self.apply_batch(events, &starts).await {
            Ok(applied) => {
                self.follow_up(applied.after_commit);
                self.clear_faults(&run_ids);
                let (mut events, mut starts) = (applied.events.into_iter(), applied.starts.into_iter());
                for reply in replies {
                    match reply {
                        Reply::Event(run_id, reply) => {
                            let _ = reply.send(events.next().unwrap_or(Err(EngineError::RunNotFound(run_id))));
                        }
                        Reply::Start(reply) => {
                            let _ = reply.send(starts.next().ok_or(EngineError::Stopped));
                        }
                    }
                }
            }
            // One bad event must not fail the others: apply each on its own.
            Err(e) if backup.is_some() => {
                tracing::warn!(error = %e, work = replies.len(), "batch failed; applying its work one by one");
                let mut events = backup.unwrap_or_default().into_iter();
                let mut starts = starts.iter();
                for reply in replies {
                    match reply {
                        Reply::Event(run_id, reply) => {
                            let Some(event) = events.next() else { break };
                            let r = match self.apply_batch(vec![event], &[]).await {
                                Ok(mut applied) => {
                                    self.follow_up(std::mem::take(&mut applied.after_commit));
                                    applied.events.pop().unwrap_or(Err(EngineError::RunNotFound(run_id)))
                                }
                                Err(e) => self.on_failure(run_id, e).await,
                            };
                            let _ = reply.send(r);
                        }
                        Reply::Start(reply) => {
                            let Some(start) = starts.next() else { break };
                            let r = self.apply_batch(Vec::new(), std::slice::from_ref(start)).await.and_then(
                                |mut applied| {
                                    self.follow_up(std::mem::take(&mut applied.after_commit));
                                    applied.starts.pop().ok_or(EngineError::Stopped)
                                },
                            );
                            let _ = reply.send(r);
                        }
                    }
                }
            }
            Err(e) => match replies.into_iter().next() {
                Some(Reply::Event(run_id, reply)) => {
                    let r = self.on_failure(run_id, e).await;
                    let _ = reply.send(r);
                }
                Some(Reply::Start(reply)) => {
                    let _ = reply.send(Err(e));
                }
                None => {}
            },
        }
    }

    fn clear_faults(&self, runs: &[Uuid]) {
        let mut faults = self.faults.lock().expect("fault counts");
        if !faults.is_empty() {
            for run_id in runs {
                faults.remove(run_id);
            }
        }
    }

    /// An event of one run failed on its own. The first permanent failure
    /// fails the event (its sender may retry); a repeat fails the run with
    /// the message, so a poisoned run cannot stall a loop, a worker or the
    /// timer loop forever.
    async fn on_failure(&self, run_id: Uuid, e: EngineError) -> Result<Handled> {
        if !e.is_permanent() {
            return Err(e);
        }
        let repeats = {
            let mut faults = self.faults.lock().expect("fault counts");
            if faults.len() > 10_000 {
                faults.clear();
            }
            let n = faults.entry(run_id).or_insert(0);
            *n += 1;
            *n
        };
        tracing::error!(%run_id, error = %e, repeats, "event failed permanently");
        if repeats < 2 {
            return Err(e);
        }
        let message = format!("run failed: {e}");
        let mut client = composer_store::client(&self.pool).await?;
        runs::fail_faulted(&mut client, run_id, &message).await?;
        self.faults.lock().expect("fault counts").remove(&run_id);
        composer_metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", RunStatus::Failed.as_str())], 1);
        Ok(Handled::new(RunStatus::Failed, Some(message)))
    }

    /// One transaction: lock every run named (in id order), load their tasks,
    /// apply each event in order, create the new runs, write all changes
    /// set-based, commit.
    async fn apply_batch(&self, events: Vec<Applying>, starts: &[StartWork]) -> Result<Applied> {
        // Rows this coordinator published since its last write are deleted
        // in this one's transaction: no commit of their own.
        let published = self.publisher.as_ref().map(|(p, _)| p.take_published()).unwrap_or_default();
        let applied = self.apply_batch_deleting(events, starts, &published).await;
        if applied.is_err() {
            if let Some((p, _)) = &self.publisher {
                p.give_back(published);
            }
        }
        applied
    }

    async fn apply_batch_deleting(
        &self,
        events: Vec<Applying>,
        starts: &[StartWork],
        published: &[i64],
    ) -> Result<Applied> {
        let started = std::time::Instant::now();
        let mut client = composer_store::client(&self.pool).await?;
        // `BEGIN` goes with the locked read; its answer, in before the
        // read's, is checked before anything is written.
        let mut tx = composer_store::begin_pipelined(&mut client);
        let (mut runs, leases) = self.lock_runs(&tx, &events).await?;
        tx.confirm().await?;
        let store = Tx(&tx);
        let mut results: Vec<Result<Handled>> = Vec::with_capacity(events.len());
        let applied = events.len();
        // Reports that offer to take their run's next tasks: (result, run, worker, offer).
        let mut offers = Vec::new();
        for Applying { run_id, event, by, told } in events {
            let Some(loaded) = runs.get_mut(&run_id) else {
                results.push(Err(EngineError::RunNotFound(run_id)));
                continue;
            };
            let mut offer = None;
            let control = match by {
                By::Engine => None,
                By::Worker(worker, offered) => {
                    if let Some(task_id) = lease_lost(&event, &worker, &leases) {
                        results.push(Err(EngineError::LeaseLost(task_id)));
                        continue;
                    }
                    offer = offered.map(|o| (worker, o));
                    None
                }
                By::Operator(control) => Some(control),
                By::Bulk(control, job) => {
                    if !composer_store::bulk::mark(&tx, job, run_id).await? {
                        results.push(Err(EngineError::AlreadyDone));
                        continue;
                    }
                    Some(control)
                }
            };
            if let (Some(told), Some(_)) = (told, &self.traces) {
                told.add_to(&mut loaded.seen);
            }
            let name = event.name();
            let mut tr = effects::apply(&store, &loaded.wf, &mut loaded.run, event).await?;
            if let (Some(c), Some(first)) = (control, tr.history.first_mut()) {
                first.payload["actor"] = serde_json::json!(c.actor);
                if let Some(reason) = c.reason {
                    first.payload["reason"] = serde_json::json!(reason);
                }
            }
            count_event(run_id, name, &tr, loaded.run.status);
            if let (Some((worker, offer)), None) = (offer, &tr.ignored) {
                offers.push((results.len(), run_id, worker, offer));
            }
            results.push(Ok(Handled::new(loaded.run.status, tr.ignored.clone())));
            loaded.tr.merge(tr);
        }
        // After every event: a later one of the batch may have ended what an
        // earlier one dispatched.
        let mut given: Vec<(usize, Vec<Uuid>)> = Vec::new();
        // What the offers leave, for runs a freed slot starts here.
        let mut spare = Vec::new();
        for (at, run_id, worker, offer) in offers {
            if let Some(loaded) = runs.get_mut(&run_id) {
                let tasks = loaded.give_eagerly(&worker, &offer);
                let slots = offer.slots.saturating_sub(tasks.len() as u32);
                if slots > 0 {
                    // The more urgent of the run's priority now and the
                    // one the worker offered for (a run lowered since its
                    // step was sent may report from an urgent slot).
                    let priority = loaded.priority.min(offer.priority);
                    spare.push(Spare { at, worker, offer: EagerOffer { slots, ..offer }, priority });
                }
                given.push((at, tasks));
            }
        }
        let mut creating = Vec::with_capacity(starts.len());
        for (def, input, tags, traceparent, priority) in starts {
            let how = NewRunOf {
                tags: tags.as_ref(),
                traceparent: traceparent.as_deref(),
                priority: *priority,
                ..NewRunOf::of(def, input)
            };
            creating.push((self.compile(def)?, how));
        }
        let mut created = Vec::with_capacity(starts.len());
        for (row, loaded) in admission::create_runs(&store, creating, self.limits).await? {
            if let Some(loaded) = loaded {
                runs.insert(row.id, loaded);
            }
            created.push(row);
        }
        // What no report took goes to the polls waiting for work.
        let to_idle = self.idle.give(runs.values_mut());
        let mut written = self.write(&tx, runs.values_mut(), published).await?;
        let freed = freed_keys(&runs);
        let HandOver { handed, promoted, written: mut promoted_written, given: handed_given, to_idle: handed_idle } =
            match freed.is_empty() {
                true => HandOver::default(),
                false => self.hand_over_slots(&tx, &runs, &freed, spare).await?,
            };
        tx.commit().await?;
        let handed_eager = promoted_written.as_mut().map(|w| std::mem::take(&mut w.eager)).unwrap_or_default();
        if !written.eager.is_empty() || !handed_eager.is_empty() {
            let mut sent: HashMap<Uuid, Given> =
                written.eager.drain(..).chain(handed_eager).map(|g| (g.dispatch.task_id, g)).collect();
            for (at, tasks) in given.into_iter().chain(handed_given) {
                if let Some(Ok(handled)) = results.get_mut(at) {
                    handled.next.extend(tasks.iter().filter_map(|t| sent.remove(t)));
                }
            }
            for poll in to_idle.into_iter().chain(handed_idle) {
                poll.send(&mut sent);
            }
        }
        let mut handlers_owe = self.written(written);
        if let Some(w) = promoted_written {
            handlers_owe.extend(self.written(w));
            handlers_owe.extend(promoted.iter().flat_map(Loaded::after_commit));
            composer_metrics::inc(composer_metrics::SLOTS_HANDED_OVER, &[], promoted.len() as u64);
        }
        for l in runs.values().chain(&promoted).filter(|l| l.tr.run_changed && l.run.status.is_terminal()) {
            run_finished(&l.wf, &l.run);
            self.remember_large(l.run.id, false);
        }
        for _ in 0..applied {
            composer_metrics::observe(composer_metrics::EVENT_DURATION, &[], started.elapsed());
        }
        if !created.is_empty() {
            composer_metrics::inc(composer_metrics::RUNS_STARTED, &[], created.len() as u64);
        }
        // Each new run as its first transitions left it.
        for row in &mut created {
            if let Some(l) = runs.get(&row.id) {
                row.status = l.run.status;
                row.output = l.run.output.clone();
                row.error = l.run.error.clone();
            }
        }
        // A key whose slots went over here needs no pass after the commit;
        // one whose lock was busy, or whose hand-over failed, gets one.
        let passes = freed
            .into_iter()
            .filter(|k| !handed.contains(k))
            .map(|(workflow, key)| (Uuid::nil(), AfterCommit::FreeSlot { workflow, key }));
        let after_commit = runs
            .values()
            .flat_map(Loaded::after_commit)
            .filter(|(_, e)| !matches!(e, AfterCommit::FreeSlot { .. }))
            .chain(passes)
            .chain(handlers_owe)
            .collect();
        Ok(Applied { events: results, starts: created, after_commit })
    }

    /// Hands the slots that runs of this batch freed to their keys' next
    /// queued runs, in the transaction that freed them, for each key whose
    /// lock no other transaction holds (one that does is a pass or a batch,
    /// and the pass after the commit comes next). In a savepoint, with a
    /// short lock timeout: whatever goes wrong there (a queued run's row
    /// another transaction holds, a run that cannot start, a lock cycle) is
    /// rolled back and left to the pass, not charged to the batch's events.
    async fn hand_over_slots(
        &self,
        tx: &composer_store::Transaction<'_>,
        runs: &HashMap<Uuid, Loaded>,
        freed: &BTreeSet<(String, String)>,
        mut spare: Vec<Spare>,
    ) -> Result<HandOver> {
        let mut locked = Vec::new();
        for (workflow, key) in freed {
            if runs::try_lock_concurrency_key(tx, workflow, key).await? {
                locked.push((workflow, key));
            }
        }
        if locked.is_empty() {
            return Ok(HandOver::default());
        }
        let savepoint = format!("SAVEPOINT hand_over; SET LOCAL lock_timeout = {}", HAND_OVER_LOCK_TIMEOUT.as_millis());
        tx.batch_execute(&savepoint).await.map_err(composer_store::Error::from)?;
        let mut handed = HashSet::new();
        let mut promoted = Vec::new();
        let mut given = Vec::new();
        let mut to_idle = Vec::new();
        let tried = async {
            for (workflow, key) in locked {
                let (more, all) = self.promote_in(tx, workflow, key, runs).await?;
                promoted.extend(more);
                if all {
                    handed.insert((workflow.clone(), key.clone()));
                }
            }
            // A started run's first steps go to a worker of the batch whose
            // report offered more than its own run took, as its own run's
            // next would: no stream, no poll, no lease of their own. Not
            // to an offer made for a more urgent priority than the run's.
            for loaded in &mut promoted {
                let priority = loaded.priority;
                for s in spare.iter_mut().filter(|s| s.offer.slots > 0 && priority <= s.priority) {
                    let tasks = loaded.give_eagerly(&s.worker, &s.offer);
                    s.offer.slots -= tasks.len() as u32;
                    if !tasks.is_empty() {
                        given.push((s.at, tasks));
                    }
                }
            }
            // What no report took, to the polls waiting for work.
            to_idle = self.idle.give(promoted.iter_mut());
            let written = match promoted.is_empty() {
                true => None,
                false => Some(self.write(tx, promoted.iter_mut(), &[]).await?),
            };
            // The rest of the transaction (its commit, which waits for the
            // notify queue's lock) under the usual timeout.
            tx.batch_execute("SET LOCAL lock_timeout TO DEFAULT").await.map_err(composer_store::Error::from)?;
            Ok::<_, EngineError>(written)
        }
        .await;
        match tried {
            Ok(written) => Ok(HandOver { handed, promoted, written, given, to_idle }),
            Err(e) => {
                tracing::warn!(error = %e, "handing freed slots over failed; the pass after the commit will start them");
                // Undoes the timeout too (it was set in the savepoint).
                tx.batch_execute("ROLLBACK TO SAVEPOINT hand_over").await.map_err(composer_store::Error::from)?;
                Ok(HandOver::default())
            }
        }
    }

    /// Locks the runs `events` name, in id order (so two batches cannot
    /// deadlock), and loads them into the state machine's form.
    async fn lock_runs(
        &self,
        tx: &composer_store::Transaction<'_>,
        events: &[Applying],
    ) -> Result<(HashMap<Uuid, Loaded>, Leases)> {
        let mut leases = Leases::new();
        if events.is_empty() {
            return Ok((HashMap::new(), leases));
        }
        let mut run_ids: Vec<Uuid> = events.iter().map(|a| a.run_id).collect();
        run_ids.sort();
        run_ids.dedup();
        // Of MAP items, only those the events name are loaded.
        let items: Vec<(Uuid, Uuid)> =
            events.iter().flat_map(|a| a.event.task_ids().into_iter().map(|t| (a.run_id, t))).collect();
        let reported: Vec<Uuid> =
            events.iter().filter(|a| matches!(a.by, By::Worker(..))).filter_map(|a| a.event.task_id()).collect();
        // Large runs seen before are read in part, unless an event of theirs
        // may touch any step.
        let in_part: Vec<Uuid> = {
            let large = self.large_runs.lock().unwrap_or_else(|p| p.into_inner());
            let whole: HashSet<Uuid> = events.iter().filter(|a| !a.event.reads_in_part()).map(|a| a.run_id).collect();
            run_ids.iter().copied().filter(|r| large.contains(r) && !whole.contains(r)).collect()
        };
        // The tasks the events name, a MAP that carries on (`ItemsLoaded`) too.
        let carries_on = events.iter().filter_map(|a| match a.event {
            Event::ItemsLoaded { task_id } => Some(task_id),
            _ => None,
        });
        let named: Vec<Uuid> = items.iter().map(|i| i.1).chain(carries_on).collect();
        let part = runs::InPart { runs: &in_part, named: &named };
        let store = Tx(tx);
        let mut runs = HashMap::new();
        for (mut row, tasks, in_part) in runs::lock_many(tx, &run_ids, &items, part).await? {
            for t in tasks.iter().filter(|t| reported.contains(&t.id)) {
                leases.insert(t.id, (t.lease_owner.clone(), t.attempt, t.state == machine::TaskState::Running));
            }
            let mut seen = trace::Seen::default();
            if self.traces.is_some() {
                for t in &tasks {
                    let since = match t.state {
                        machine::TaskState::Running => t.started_at.unwrap_or(t.updated_at),
                        _ => t.updated_at,
                    };
                    seen.task(t.id, t.attempt, t.state, since);
                }
            }
            let wf = self.workflow(row.workflow_definition_id).await?;
            if !in_part && wf.nodes.len() > usize::try_from(self.limits.whole_run_nodes).unwrap_or(0) {
                self.remember_large(row.id, !row.status.is_terminal());
            }
            let mut run = runs::into_machine(&wf, &mut row, tasks)?;
            if in_part {
                let mut known = vec![false; wf.nodes.len()];
                for t in run.tasks.iter().filter(|t| t.item.is_none()) {
                    known[t.node] = true;
                }
                run.known = Some(known);
            }
            self.hold_to_limits(&store, &wf, &mut run, &row).await?;
            // A retry may run a MAP's items again: it needs them all. A
            // resume starts items whose retry the pause held.
            let of_run = || events.iter().filter(|a| a.run_id == row.id).map(|a| &a.event);
            if of_run().any(|e| matches!(e, Event::RetryRun)) {
                let maps: Vec<Uuid> = run.tasks.iter().filter(|t| t.progress.is_some()).map(|t| t.id).collect();
                for map in maps {
                    effects::load_items(&store, &wf, &mut run, Some(map), runs::Items::All).await?;
                }
            }
            if of_run().any(|e| matches!(e, Event::ResumeRun)) {
                effects::load_items(&store, &wf, &mut run, None, runs::Items::Held).await?;
            }
            let mut loaded = Loaded::new(wf, run, machine::Transition::default(), &row);
            loaded.seen = seen;
            runs.insert(row.id, loaded);
        }
        Ok((runs, leases))
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

    /// Starts the oldest QUEUED runs of a concurrency key while it has free
    /// slots (by the limit of the oldest run's definition); returns how many.
    pub async fn promote(self: &Arc<Self>, workflow: &str, key: &str) -> Result<usize> {
        let mut client = composer_store::client(&self.pool).await?;
        let tx = composer_store::begin(&mut client).await?;
        runs::lock_concurrency_key(&tx, workflow, key).await?;
        let (mut batch, _) = self.promote_in(&tx, workflow, key, &HashMap::new()).await?;
        if batch.is_empty() {
            return Ok(0);
        }
        let to_idle = self.idle.give(batch.iter_mut());
        let mut written = self.write(&tx, batch.iter_mut(), &[]).await?;
        tx.commit().await?;
        written.answer(to_idle);
        let owed = self.written(written);
        self.follow_up(owed);
        self.follow_up(batch.iter().flat_map(Loaded::after_commit).collect());
        tracing::debug!(workflow, key, promoted = batch.len(), "queued runs started");
        Ok(batch.len())
    }

    /// The promotion of [`Engine::promote`] in `tx`, which holds the key's
    /// lock: the queued runs it starts, loaded, to write, and whether it
    /// started all that the key's free slots allow (false when a run of
    /// `held`, which the caller has loaded and writes itself, was next).
    async fn promote_in(
        &self,
        tx: &composer_store::Transaction<'_>,
        workflow: &str,
        key: &str,
        held: &HashMap<Uuid, Loaded>,
    ) -> Result<(Vec<Loaded>, bool)> {
        let Some((head, open)) = runs::queue_head(tx, workflow, key).await? else { return Ok((Vec::new(), true)) };
        let wf = self.workflow(head).await?;
        let max = wf.concurrency.as_ref().map_or(i64::MAX, |c| c.max as i64);
        if open >= max {
            return Ok((Vec::new(), true));
        }
        let mut all = true;
        let mut rows = Vec::new();
        for row in runs::lock_queued(tx, workflow, key, max - open).await? {
            match held.contains_key(&row.id) {
                true => all = false,
                false => rows.push((self.workflow(row.workflow_definition_id).await?, row)),
            }
        }
        let deadlines: Vec<_> = rows.iter().map(|(wf, _)| admission::deadline_of(wf)).collect();
        let ids: Vec<Uuid> = rows.iter().map(|(_, row)| row.id).collect();
        if !ids.is_empty() {
            runs::set_running(tx, &ids, &deadlines).await?;
        }
        let store = Tx(tx);
        let mut batch = Vec::with_capacity(rows.len());
        for ((wf, mut row), deadline) in rows.into_iter().zip(deadlines) {
            let mut run = runs::into_machine(&wf, &mut row, Vec::new())?;
            run.status = RunStatus::Running;
            run.deadline = deadline;
            self.hold_to_limits(&store, &wf, &mut run, &row).await?;
            let tr = effects::apply(&store, &wf, &mut run, Event::RunStarted).await?;
            batch.push(Loaded::new(wf, run, tr, &row));
        }
        Ok((batch, all))
    }

    /// [`Engine::promote`] for a slot that freed, one pass at a time per key
    /// in this process: a slot freed while a pass runs makes that pass run
    /// once more when it is done, instead of queueing another transaction
    /// behind the key's lock. (Each pass starts as many queued runs as the
    /// key has free slots, so one pass serves any number of freed slots.)
    async fn promote_freed(self: &Arc<Self>, workflow: String, key: String) {
        let slot = (workflow, key);
        {
            let mut running = self.promoting.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(again) = running.get_mut(&slot) {
                *again = true;
                return;
            }
            running.insert(slot.clone(), false);
        }
        loop {
            if let Err(e) = Box::pin(self.promote(&slot.0, &slot.1)).await {
                tracing::warn!(workflow = slot.0, key = slot.1, error = %e, "starting queued runs failed; the timer loop will");
            }
            let mut running = self.promoting.lock().unwrap_or_else(|p| p.into_inner());
            match running.get_mut(&slot) {
                Some(again) if *again => *again = false,
                _ => {
                    running.remove(&slot);
                    return;
                }
            }
        }
    }

    /// Starts the child run of a SUB_WORKFLOW attempt in a transaction of its
    /// own, unless the attempt no longer waits or has its child already (so
    /// it is safe to call again: the recovery sweep does, for attempts whose
    /// coordinator died before starting their child). A child that cannot
    /// start fails the attempt, naming why.
    pub async fn start_child(
        self: &Arc<Self>,
        run_id: Uuid,
        task_id: Uuid,
        attempt: i32,
        iteration: u32,
    ) -> Result<()> {
        // In a task of its own, as a start's: the transaction may lease the
        // child's first steps to waiting polls, and must tell them what it
        // committed even if its caller (a sweep stopping) goes away.
        let engine = self.clone();
        let own = tokio::spawn(async move { engine.start_child_now(run_id, task_id, attempt, iteration).await });
        own.await.map_err(|_| EngineError::Stopped)?
    }

    async fn start_child_now(
        self: &Arc<Self>,
        run_id: Uuid,
        task_id: Uuid,
        attempt: i32,
        iteration: u32,
    ) -> Result<()> {
        let at = i32::try_from(iteration).unwrap_or(i32::MAX);
        let parent = Parent { run_id, task_id, attempt, iteration: at };
        let mut client = composer_store::client(&self.pool).await?;
        let tx = composer_store::begin(&mut client).await?;
        let Some(slot) = runs::claim_child_slot(&tx, run_id, task_id, attempt, at).await? else { return Ok(()) };
        let created = self.create_child(&tx, parent, &slot).await;
        let child = match created {
            Ok(child) => child,
            Err(EngineError::Rejected(why)) => {
                drop(tx);
                let event = Event::ChildFinished {
                    task_id,
                    attempt,
                    iteration,
                    child: None,
                    status: RunStatus::Failed,
                    output: None,
                    error: Some(why.to_string()),
                };
                self.handle(run_id, event).await?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut child = child;
        // Its first steps go to the polls waiting for work, as a start's do.
        let to_idle = self.idle.give(child.1.iter_mut());
        let mut written = self.write(&tx, child.1.iter_mut(), &[]).await?;
        tx.commit().await?;
        written.answer(to_idle);
        let owed = self.written(written);
        self.follow_up(owed);
        composer_metrics::inc(composer_metrics::RUNS_STARTED, &[], 1);
        tracing::debug!(child = %child.0.id, parent = %run_id, status = %child.0.status, "child run started");
        if let Some(l) = child.1 {
            if l.run.status.is_terminal() {
                run_finished(&l.wf, &l.run);
            }
            self.follow_up(l.after_commit().collect());
        }
        Ok(())
    }

    /// Inserts (and starts, unless its concurrency limit queues it) the
    /// child run a claimed slot asks for.
    async fn create_child(
        &self,
        tx: &composer_store::Transaction<'_>,
        parent: Parent,
        slot: &runs::ChildSlot,
    ) -> Result<(RunRow, Option<Loaded>)> {
        let depth = slot.parent_depth + 1;
        if depth > SUB_WORKFLOW_MAX_DEPTH {
            return Err(Rejection::TooDeep { max: SUB_WORKFLOW_MAX_DEPTH, limit: machine::DEPTH_LIMIT }.into());
        }
        let name = slot.spec["workflow"].as_str().unwrap_or_default();
        let version = slot.spec["version"].as_i64().and_then(|v| i32::try_from(v).ok());
        let def = composer_store::definitions::by_name(&**tx, name, version)
            .await?
            .ok_or_else(|| Rejection::UnknownWorkflow { name: name.to_string(), version })?;
        let wf = self.compile(&def)?;
        let input = match slot.spec.get("input") {
            None | Some(Value::Null) => serde_json::json!({}),
            Some(v) => v.clone(),
        };
        // The child's span sits under its parent's attempt.
        let traceparent = RunTrace::of(parent.run_id, slot.parent_traceparent.as_deref())
            .attempt(parent.task_id, parent.attempt)
            .header();
        if !composer_store::trees::charge_run(tx, slot.root, self.limits.tree.runs).await? {
            return Err(Rejection::TreeTooBig { what: "runs", max: self.limits.tree.runs }.into());
        }
        let how = NewRunOf {
            def: &def,
            input: &input,
            idempotency_key: None,
            parent: Some(parent),
            depth,
            trigger: None,
            root: Some(slot.root),
            handles: None,
            abandoned: slot.spec["on_parent_close"] == "abandon",
            tags: None,
            traceparent: Some(&traceparent),
            priority: Some(slot.parent_priority),
            fairness_key: slot.parent_fairness_key.as_deref(),
        };
        admission::create_run(&Tx(tx), wf, how, self.limits).await
    }

    /// Runs what committed transitions owe other runs: children to start, a
    /// finished child's result for its parent, children a parent no longer
    /// waits for, queued runs a freed slot lets start. A crash before this
    /// is covered by the recovery sweep.
    fn follow_up(self: &Arc<Self>, owed: Vec<(Uuid, AfterCommit)>) {
        if owed.is_empty() {
            return;
        }
        let engine = self.clone();
        tokio::spawn(async move {
            let mut children = Vec::new();
            let mut holders = Vec::new();
            let mut maps = Vec::new();
            for (run_id, effect) in owed {
                match effect {
                    AfterCommit::FreeSlot { workflow, key } => Box::pin(engine.promote_freed(workflow, key)).await,
                    AfterCommit::NotifyParent { parent_run, event } => {
                        if let Err(e) = engine.handle(parent_run, event).await {
                            tracing::warn!(%run_id, error = %e, "reporting a child run to its parent failed; recovery will");
                        }
                    }
                    AfterCommit::ContinueMap { task_id } => {
                        if let Err(e) = engine.handle(run_id, Event::ItemsLoaded { task_id }).await {
                            tracing::warn!(%run_id, %task_id, error = %e, "carrying a MAP on failed; recovery will");
                        }
                    }
                    AfterCommit::StartChild { task_id, attempt, iteration } => {
                        children.push((run_id, task_id, attempt, iteration))
                    }
                    AfterCommit::CancelChildren { task_id, attempt, iteration, waiting } => {
                        let iteration = i32::try_from(iteration).unwrap_or(i32::MAX);
                        holders.push(runs::ChildHolder { task_id, attempt, iteration, waiting })
                    }
                    AfterCommit::CancelItemChildren { map_task_id } => maps.push(map_task_id),
                }
            }
            futures_util::stream::iter(children)
                .for_each_concurrent(CHILD_STARTS_AT_ONCE, |(run_id, task_id, attempt, iteration)| {
                    let engine = engine.clone();
                    async move {
                        if let Err(e) = Box::pin(engine.start_child(run_id, task_id, attempt, iteration)).await {
                            tracing::warn!(%run_id, %task_id, error = %e, "starting a child run failed; recovery will");
                        }
                    }
                })
                .await;
            if holders.is_empty() && maps.is_empty() {
                return;
            }
            let stale = match composer_store::client(&engine.pool).await {
                Ok(client) => match runs::stale_children(&client, &holders).await {
                    Ok(mut stale) => runs::stale_item_children(&client, &maps).await.map(|more| {
                        stale.extend(more);
                        stale
                    }),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match stale {
                Ok(children) => {
                    for child in children {
                        if let Err(e) = engine.handle(child, Event::CancelRun).await {
                            tracing::warn!(%child, error = %e, "cancelling a child run failed; recovery will");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "finding child runs to cancel failed; recovery will"),
            }
        });
    }
}

/// Counts a run that ended, and its time from creation (its UUIDv7 id
/// carries the millisecond it was created) to now.
/// Who holds the lease of each reported task, at which attempt, and
/// whether it is RUNNING, as the batch's transaction locked it.
type Leases = HashMap<Uuid, (Option<String>, i32, bool)>;

/// The task a report names when `worker` does not hold its lease at the
/// report's attempt; `None` when it does.
fn lease_lost(event: &Event, worker: &str, leases: &Leases) -> Option<Uuid> {
    let (task_id, attempt) = match event {
        Event::TaskCompleted { task_id, attempt, .. } | Event::TaskFailed { task_id, attempt, .. } => {
            (*task_id, *attempt)
        }
        _ => return None,
    };
    let held = leases
        .get(&task_id)
        .is_some_and(|(owner, at, running)| *running && *at == attempt && owner.as_deref() == Some(worker));
    (!held).then_some(task_id)
}

/// The concurrency keys whose slots runs of a batch freed: `(workflow, key)`
/// of the runs it ended (as `machine::after_commit` owes `FreeSlot`), in
/// order.
fn freed_keys(runs: &HashMap<Uuid, Loaded>) -> BTreeSet<(String, String)> {
    runs.values()
        .filter(|l| l.tr.run_changed && l.run.status.is_terminal())
        .filter_map(|l| Some((l.wf.spec.name.clone(), l.run.concurrency_key.clone()?)))
        .collect()
}

/// Where a start outside the engine's batches sends its run's first steps.
#[derive(Clone, Copy)]
enum FirstSteps {
    /// Leased to polls waiting for work in its transaction, when that
    /// transaction commits right after whatever its caller does.
    ToWaitingPolls,
    /// Through their streams, as every step a poll did not take.
    ToStreams,
}

/// What [`Engine::hand_over_slots`] did: the keys it served in full, the
/// queued runs it started, and their write.
#[derive(Default)]
struct HandOver {
    handed: HashSet<(String, String)>,
    promoted: Vec<Loaded>,
    written: Option<Written>,
    /// Tasks of `promoted` leased to a reporting worker: (its report's
    /// place in the batch, the tasks).
    given: Vec<(usize, Vec<Uuid>)>,
    /// Tasks of `promoted` leased to polls waiting for work.
    to_idle: Vec<super::idle::Claimed>,
}

/// What a worker's offer to take more tasks has left once its own run's
/// next tasks were given: for a run a freed slot starts.
struct Spare {
    /// Its report's place in the batch.
    at: usize,
    worker: String,
    offer: EagerOffer,
    /// The least urgent priority it takes: the more urgent of its run's
    /// and the one the worker offered for.
    priority: u8,
}

/// How long a hand-over waits for a lock (a queued run's row) before it
/// gives up and leaves the key to a pass after the commit: the batch's
/// other events wait with it.
const HAND_OVER_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

fn run_finished(wf: &Workflow, run: &machine::Run) {
    let status = run.status.as_str();
    composer_metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", status)], 1);
    if let Some((secs, nanos)) = run.id.get_timestamp().map(|t| t.to_unix()) {
        let created = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
        if let Ok(took) = std::time::SystemTime::now().duration_since(created) {
            composer_metrics::observe(
                composer_metrics::RUN_DURATION,
                &[("workflow", &wf.spec.name), ("status", status)],
                took,
            );
        }
    }
}

fn count_event(run_id: Uuid, event: &'static str, tr: &machine::Transition, status: RunStatus) {
    let result = tr.ignored_kind.map(|k| k.as_str()).unwrap_or("applied");
    composer_metrics::inc(composer_metrics::EVENTS, &[("event", event), ("result", result)], 1);
    match &tr.ignored {
        Some(reason) => tracing::debug!(%run_id, event, %reason, "event ignored"),
        None => tracing::debug!(%run_id, event, %status, "event applied"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_is_refused_at_once_not_queued_without_end() {
        // No database is reached: nothing runs the queue.
        let pool = composer_store::connect("postgres://nobody@127.0.0.1:9/none", 1, std::time::Duration::from_secs(1))
            .expect("a lazy pool");
        let engine = Arc::new(Engine::new(
            pool,
            1,
            Arc::new(Notify::new()),
            None,
            Limits { max_payload: 1024, ..Limits::DEFAULT },
            1,
        ));
        let waiting = tokio::spawn({
            let engine = engine.clone();
            async move { engine.handle(Uuid::now_v7(), Event::CancelRun).await }
        });
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let second = engine.handle(Uuid::now_v7(), Event::CancelRun).await;
        assert!(matches!(second, Err(EngineError::Busy)), "{second:?}");
        waiting.abort();
    }
}
