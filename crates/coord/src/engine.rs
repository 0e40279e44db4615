//! `handle(run_id, event)`: the one way a run changes. One transaction: lock
//! the run row, load its tasks, apply the pure state machine, write the
//! changes, outbox rows and history, notify, commit. A crash anywhere rolls
//! all of it back, and the run lock serializes events of one run across every
//! coordinator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use composer_core::definition::{Workflow, SUB_WORKFLOW_MAX_DEPTH};
use composer_core::machine::{self, Event, RunStatus};
use composer_store::definitions::DefinitionRow;
use composer_store::outbox::Outbound;
use composer_store::runs::{self, NewRun, RunRow};
use composer_store::transitions::{write_transitions, Change, Publish};
use composer_store::Pool;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::publish::Publisher;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("run {0} not found")]
    RunNotFound(Uuid),
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
    /// The request cannot be served as given (a run input whose
    /// concurrency key does not evaluate).
    #[error("{0}")]
    Rejected(String),
}

impl EngineError {
    /// True when applying the same event again cannot succeed.
    fn is_permanent(&self) -> bool {
        match self {
            EngineError::Fault { .. } => true,
            EngineError::Store(e) => e.is_permanent(),
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

/// The result of handling one event.
#[derive(Debug, Clone)]
pub struct Handled {
    pub status: RunStatus,
    /// Why the event changed nothing (duplicate, late, stale …).
    pub ignored: Option<String>,
}

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
    queue: mpsc::Sender<Pending>,
    inbox: Arc<tokio::sync::Mutex<mpsc::Receiver<Pending>>>,
    /// Runs whose last event failed permanently, and how often in a row: a
    /// repeat fails the run, so one poisoned run cannot fail forever.
    faults: Mutex<HashMap<Uuid, u32>>,
    /// Batch loops running now (`/readyz` is 503 when one has stopped).
    live_loops: std::sync::atomic::AtomicUsize,
    /// `COMPOSER_MAX_PAYLOAD`, for the values the state machine computes.
    max_payload: usize,
}

/// Work waiting for a batch: an event for a run, or a new run to start.
enum Pending {
    Event {
        run_id: Uuid,
        event: Event,
        reply: oneshot::Sender<Result<Handled>>,
    },
    /// A run without an idempotency key or a concurrency limit (whose
    /// locks could make two batches wait for each other).
    Start {
        def: DefinitionRow,
        input: Value,
        reply: oneshot::Sender<Result<RunRow>>,
    },
}

/// A new run for [`Engine::apply_batch`]: its definition and input.
type NewStart<'a> = (&'a DefinitionRow, &'a Value);

/// What one batch's work came to, in the order it was given.
struct Applied {
    events: Vec<Result<Handled>>,
    starts: Vec<RunRow>,
    followups: FollowUps,
}

/// Most events one transaction applies.
const MAX_BATCH: usize = 128;

impl Engine {
    pub fn new(
        pool: Pool,
        shards: u32,
        outbox_wake: Arc<Notify>,
        publisher: Option<(Arc<Publisher>, std::time::Duration)>,
        max_payload: usize,
        queue_capacity: usize,
    ) -> Engine {
        let (queue, inbox) = mpsc::channel(queue_capacity.max(1));
        Engine {
            pool,
            shards: shards as i32,
            outbox_wake,
            publisher,
            workflows: Mutex::new(HashMap::new()),
            queue,
            inbox: Arc::new(tokio::sync::Mutex::new(inbox)),
            faults: Mutex::new(HashMap::new()),
            live_loops: std::sync::atomic::AtomicUsize::new(0),
            max_payload,
        }
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

    /// Batch loops running now.
    pub fn live_loops(&self) -> usize {
        self.live_loops.load(std::sync::atomic::Ordering::Relaxed)
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
        let wf = Workflow::parse(&def.spec).map_err(|e| {
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
        &self,
        def: &DefinitionRow,
        input: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<(RunRow, bool)> {
        if idempotency_key.is_none() && self.compile(def)?.concurrency.is_none() {
            let (reply, answer) = oneshot::channel();
            self.enqueue(Pending::Start { def: def.clone(), input: input.clone(), reply })?;
            return Ok((answer.await.map_err(|_| EngineError::Stopped)??, true));
        }
        let mut client = composer_store::client(&self.pool).await?;
        let tx = client.transaction().await?;
        let started = self.start_run_in(&tx, def, input, idempotency_key, None).await?;
        tx.commit().await?;
        Ok(self.started(started))
    }

    /// [`Engine::start_run`] inside the caller's transaction (a schedule's
    /// fire: the run and the schedule's move commit together). The caller
    /// commits, then hands the result to [`Engine::started`].
    pub async fn start_run_in(
        &self,
        tx: &composer_store::Transaction<'_>,
        def: &DefinitionRow,
        input: &Value,
        idempotency_key: Option<&str>,
        trigger: Option<&Value>,
    ) -> Result<Started> {
        let wf = self.compile(def)?;
        if let Some(key) = idempotency_key {
            if let Some(existing) = runs::lock_idempotency_key(tx, &def.name, key).await? {
                return Ok(Started { row: existing, new: false, batch: HashMap::new(), outbound: Vec::new() });
            }
        }
        let how = NewRunOf { def, input, idempotency_key, parent: None, depth: 0, trigger };
        let (row, loaded) = match self.create_run(tx, wf, how).await? {
            Ok(created) => created,
            Err(e) => return Err(EngineError::Rejected(e)),
        };
        let Some(loaded) = loaded else {
            return Ok(Started { row, new: true, batch: HashMap::new(), outbound: Vec::new() });
        };
        let mut batch = HashMap::from([(row.id, loaded)]);
        self.start_children(tx, &mut batch).await?;
        let changes: Vec<Change> = batch.values().map(Loaded::change).collect();
        let outbound = write_transitions(tx, &changes, self.shards, self.publish_mode(), &[]).await?;
        tracing::debug!(run_id = %row.id, workflow = %def.name, version = def.version, "run started");
        Ok(Started { row, new: true, batch, outbound })
    }

    /// After the commit of [`Engine::start_run_in`]: wakes the outbox,
    /// counts, and returns the run as it now stands (and whether it is new).
    pub fn started(&self, started: Started) -> (RunRow, bool) {
        let Started { mut row, new, batch, outbound } = started;
        if !new {
            return (row, false);
        }
        self.dispatched(outbound, batch.values().any(|l| !l.tr.dispatch.is_empty()));
        composer_metrics::inc(composer_metrics::RUNS_STARTED, &[], batch.len().max(1) as u64);
        for l in batch.values().filter(|l| l.run.status.is_terminal()) {
            run_finished(&l.wf, &l.run);
        }
        if let Some(l) = batch.get(&row.id) {
            row.status = l.run.status;
            row.output = l.run.output.clone();
            row.error = l.run.error.clone();
        }
        (row, true)
    }

    /// Applies `event`, then loads the MAP items the state machine asked for
    /// and delivers any buffered external event to the WAIT_FOR_EVENT tasks
    /// it created, all in the caller's transaction.
    async fn apply(
        &self,
        tx: &composer_store::Transaction<'_>,
        wf: &Workflow,
        run: &mut machine::Run,
        event: Event,
    ) -> Result<machine::Transition> {
        let mut tr = apply_contained(wf, run, &event)?;
        let mut checked = 0;
        loop {
            let needs = std::mem::take(&mut tr.needs);
            if !needs.is_empty() {
                for need in needs {
                    let (map, which) = match need {
                        machine::Need::Queued { map, count } => (map, runs::Items::Queued(count)),
                        machine::Need::All { map } => (map, runs::Items::All),
                    };
                    if load_items(tx, wf, run, Some(map), which).await? == 0 {
                        return Err(composer_store::Error::Corrupt(format!(
                            "MAP task {map} of run {} counts items that are not stored",
                            run.id
                        ))
                        .into());
                    }
                    tr.merge(apply_contained(wf, run, &Event::ItemsLoaded { task_id: map })?);
                }
                continue;
            }
            let waits: Vec<(Uuid, String, String)> = tr.created[checked..]
                .iter()
                .chain(tr.updated.iter())
                .filter_map(|&t| {
                    let task = &run.tasks[t];
                    let (name, key) = task.event.clone()?;
                    (task.state == machine::TaskState::Waiting).then_some((task.id, name, key))
                })
                .collect();
            checked = tr.created.len();
            let mut delivered = false;
            for (task_id, name, key) in waits {
                if let Some(payload) = composer_store::events::consume_buffered(tx, &name, &key, task_id).await? {
                    let next = apply_contained(wf, run, &Event::EventReceived { task_id, payload })?;
                    tr.merge(next);
                    delivered = true;
                }
            }
            if !delivered {
                return Ok(tr);
            }
        }
    }

    /// Starts the child runs the batch's SUB_WORKFLOW attempts asked for, in
    /// its transaction: one per (task, attempt), committed with the attempt
    /// or not at all. A child that ends at once (or cannot start) is
    /// reported to its parent here too; children may start children.
    async fn start_children(
        &self,
        tx: &composer_store::Transaction<'_>,
        batch: &mut HashMap<Uuid, Loaded>,
    ) -> Result<()> {
        let mut started = std::collections::HashSet::new();
        loop {
            let mut asks = Vec::new();
            for l in batch.values_mut() {
                for &t in &l.tr.children[l.children_seen..] {
                    let task = &l.run.tasks[t];
                    let waits =
                        task.state == machine::TaskState::Running && l.wf.nodes[task.node].kind.traits().has_child;
                    if waits && started.insert((task.id, task.attempt)) {
                        let parent = runs::Parent { run_id: l.run.id, task_id: task.id, attempt: task.attempt };
                        asks.push((parent, task.input.clone(), l.depth));
                    }
                }
                l.children_seen = l.tr.children.len();
            }
            if asks.is_empty() {
                return Ok(());
            }
            for (parent, spec, depth) in asks {
                let report = match self.start_child(tx, parent, &spec, depth).await? {
                    Ok(child) => {
                        let report = child.run.status.is_terminal().then(|| child_finished(parent, &child.run));
                        let mut child = child;
                        child.reported = report.is_some();
                        batch.insert(child.run.id, child);
                        report
                    }
                    Err(error) => Some(Event::ChildFinished {
                        task_id: parent.task_id,
                        attempt: parent.attempt,
                        child: None,
                        status: RunStatus::Failed,
                        output: None,
                        error: Some(error),
                    }),
                };
                if let (Some(event), Some(p)) = (report, batch.get_mut(&parent.run_id)) {
                    let tr = self.apply(tx, &p.wf, &mut p.run, event).await?;
                    p.tr.merge(tr);
                }
            }
        }
    }

    /// Inserts and starts one child run; `Err` says why it cannot start.
    async fn start_child(
        &self,
        tx: &composer_store::Transaction<'_>,
        parent: runs::Parent,
        spec: &Value,
        parent_depth: i32,
    ) -> Result<std::result::Result<Loaded, String>> {
        let depth = parent_depth + 1;
        if depth > SUB_WORKFLOW_MAX_DEPTH {
            return Ok(Err(format!(
                "SUB_WORKFLOW nesting deeper than {SUB_WORKFLOW_MAX_DEPTH} levels ({})",
                machine::DEPTH_LIMIT
            )));
        }
        let name = spec["workflow"].as_str().unwrap_or_default();
        let version = spec["version"].as_i64().and_then(|v| i32::try_from(v).ok());
        let Some(def) = composer_store::definitions::by_name(tx, name, version).await? else {
            let which = version.map(|v| format!(" version {v}")).unwrap_or_default();
            return Ok(Err(format!("workflow {name:?}{which} is not registered")));
        };
        let wf = self.compile(&def)?;
        let input = match spec.get("input") {
            None | Some(Value::Null) => serde_json::json!({}),
            Some(v) => v.clone(),
        };
        let how =
            NewRunOf { def: &def, input: &input, idempotency_key: None, parent: Some(parent), depth, trigger: None };
        let (row, loaded) = match self.create_run(tx, wf.clone(), how).await? {
            Ok(created) => created,
            Err(e) => return Ok(Err(e)),
        };
        tracing::debug!(child = %row.id, parent = %parent.run_id, workflow = %def.name, status = %row.status, "child run created");
        let mut run = runs::to_machine(&wf, &row, &[])?;
        run.max_payload = self.max_payload;
        Ok(Ok(loaded.unwrap_or_else(|| Loaded::new(wf, run, machine::Transition::default(), &row))))
    }

    /// Inserts a run — QUEUED when its concurrency limit says so, else
    /// RUNNING with `RunStarted` applied (returned as loaded, to write) —
    /// in the caller's transaction. `Err` says why its input is refused.
    async fn create_run(
        &self,
        tx: &composer_store::Transaction<'_>,
        wf: Arc<Workflow>,
        how: NewRunOf<'_>,
    ) -> Result<std::result::Result<(RunRow, Option<Loaded>), String>> {
        let def = how.def;
        let (key, status) = match self.admit(tx, &wf, &def.name, how.input).await? {
            Ok(admitted) => admitted,
            Err(e) => return Ok(Err(e)),
        };
        let deadline = (status == RunStatus::Running).then(|| deadline_of(&wf)).flatten();
        let new = NewRun {
            id: Uuid::now_v7(),
            workflow_definition_id: def.id,
            workflow_name: &def.name,
            workflow_version: def.version,
            input: how.input,
            idempotency_key: how.idempotency_key,
            deadline,
            parent: how.parent,
            depth: how.depth,
            status,
            concurrency_key: key.as_deref(),
            trigger: how.trigger,
        };
        let row = runs::insert_run(tx, &new).await?;
        if status == RunStatus::Queued {
            tracing::debug!(run_id = %row.id, workflow = %def.name, "run queued by its concurrency limit");
            return Ok(Ok((row, None)));
        }
        let mut run = runs::to_machine(&wf, &row, &[])?;
        run.max_payload = self.max_payload;
        let tr = self.apply(tx, &wf, &mut run, Event::RunStarted).await?;
        let loaded = Loaded::new(wf, run, tr, &row);
        Ok(Ok((row, Some(loaded))))
    }

    /// Whether a new run of `wf` may start or must wait QUEUED, and its
    /// concurrency key. Under the key's lock (held to the commit) every
    /// coordinator sees the same count; a run queues behind any already
    /// queued, so the queue is first come, first served. `Err` says why the
    /// key could not be computed from the input.
    async fn admit(
        &self,
        tx: &composer_store::Transaction<'_>,
        wf: &Workflow,
        workflow: &str,
        input: &Value,
    ) -> Result<std::result::Result<(Option<String>, RunStatus), String>> {
        let Some(limit) = &wf.concurrency else { return Ok(Ok((None, RunStatus::Running))) };
        let key = match limit.key_of(input) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        runs::lock_concurrency_key(tx, workflow, &key).await?;
        let (open, queued) = runs::concurrency_usage(tx, workflow, &key).await?;
        let status = if queued || open >= limit.max as i64 { RunStatus::Queued } else { RunStatus::Running };
        Ok(Ok((Some(key), status)))
    }

    /// Starts the oldest QUEUED runs of a concurrency key while it has free
    /// slots (by the limit of the oldest run's definition); returns how many.
    pub async fn promote(self: &Arc<Self>, workflow: &str, key: &str) -> Result<usize> {
        let mut client = composer_store::client(&self.pool).await?;
        let tx = client.transaction().await?;
        runs::lock_concurrency_key(&tx, workflow, key).await?;
        let Some(oldest) = runs::lock_queued(&tx, workflow, key, 1).await?.pop() else { return Ok(0) };
        let wf = self.workflow(oldest.workflow_definition_id).await?;
        let max = wf.concurrency.as_ref().map_or(i64::MAX, |c| c.max as i64);
        let (open, _) = runs::concurrency_usage(&tx, workflow, key).await?;
        if open >= max {
            return Ok(0);
        }
        let mut batch = HashMap::new();
        for row in runs::lock_queued(&tx, workflow, key, max - open).await? {
            let wf = self.workflow(row.workflow_definition_id).await?;
            let deadline = deadline_of(&wf);
            runs::set_running(&tx, row.id, deadline).await?;
            let mut run = runs::to_machine(&wf, &row, &[])?;
            run.status = RunStatus::Running;
            run.deadline = deadline;
            run.max_payload = self.max_payload;
            let tr = self.apply(&tx, &wf, &mut run, Event::RunStarted).await?;
            batch.insert(row.id, Loaded::new(wf, run, tr, &row));
        }
        let promoted = batch.len();
        self.start_children(&tx, &mut batch).await?;
        let changes: Vec<Change> = batch.values().map(Loaded::change).collect();
        let outbound = write_transitions(&tx, &changes, self.shards, self.publish_mode(), &[]).await?;
        tx.commit().await?;
        self.dispatched(outbound, changes.iter().any(|c| !c.tr.dispatch.is_empty()));
        self.follow_up(FollowUps::of(batch.values()));
        tracing::debug!(workflow, key, promoted, "queued runs started");
        Ok(promoted)
    }

    /// Applies `event` to the run under its lock and commits the result.
    /// Events that arrive together share a transaction (see [`Engine::run_batches`]):
    /// batching is what keeps PostgreSQL commits per step low under load, and
    /// adds no wait when there is nothing to batch with.
    pub async fn handle(&self, run_id: Uuid, event: Event) -> Result<Handled> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Pending::Event { run_id, event, reply })?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    fn enqueue(&self, work: Pending) -> Result<()> {
        self.queue.try_send(work).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => EngineError::Busy,
            mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
        })
    }

    /// Takes whatever events are queued (up to a batch) and applies them in
    /// one transaction; several of these loops run so that one batch's commit
    /// overlaps the next one's work.
    pub async fn run_batches(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        use futures_util::FutureExt;
        let _live = LiveLoop::enter(&self.live_loops);
        loop {
            let batch = {
                let mut inbox = self.inbox.lock().await;
                let first = tokio::select! {
                    _ = shutdown.cancelled() => {
                        // Refuse new events and answer queued ones, so no
                        // request waits forever while the server drains.
                        inbox.close();
                        while let Ok(p) = inbox.try_recv() {
                            match p {
                                Pending::Event { reply, .. } => { let _ = reply.send(Err(EngineError::Stopped)); }
                                Pending::Start { reply, .. } => { let _ = reply.send(Err(EngineError::Stopped)); }
                            }
                        }
                        return;
                    }
                    p = inbox.recv() => match p { Some(p) => p, None => return },
                };
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match inbox.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                batch
            };
            // A panic outside the state machine (which is contained per
            // event) drops this batch's replies (their callers see the
            // coordinator stopping) but not the loop.
            if let Err(panic) = std::panic::AssertUnwindSafe(self.clone().process(batch)).catch_unwind().await {
                tracing::error!(
                    error = composer_core::panic_message(&*panic),
                    "engine batch panicked; its events were not applied"
                );
            }
        }
    }

    async fn process(self: Arc<Self>, batch: Vec<Pending>) {
        let mut events = Vec::new();
        let mut starts = Vec::new();
        for p in &batch {
            match p {
                Pending::Event { run_id, event, .. } => events.push((*run_id, event.clone())),
                Pending::Start { def, input, .. } => starts.push((def, input)),
            }
        }
        match self.apply_batch(&events, &starts).await {
            Ok(applied) => {
                self.follow_up(applied.followups);
                self.clear_faults(&events);
                let (mut events, mut starts) = (applied.events.into_iter(), applied.starts.into_iter());
                for p in batch {
                    match p {
                        Pending::Event { run_id, reply, .. } => {
                            let _ = reply.send(events.next().unwrap_or(Err(EngineError::RunNotFound(run_id))));
                        }
                        Pending::Start { reply, .. } => {
                            let _ = reply.send(starts.next().ok_or(EngineError::Stopped));
                        }
                    }
                }
            }
            // One bad event must not fail the others: retry each on its own.
            Err(e) if batch.len() > 1 => {
                tracing::warn!(error = %e, work = batch.len(), "batch failed; applying its work one by one");
                for p in batch {
                    match p {
                        Pending::Event { run_id, event, reply } => {
                            let r = match self.apply_batch(&[(run_id, event)], &[]).await {
                                Ok(mut applied) => {
                                    self.follow_up(applied.followups);
                                    applied.events.pop().unwrap_or(Err(EngineError::RunNotFound(run_id)))
                                }
                                Err(e) => self.on_failure(run_id, e).await,
                            };
                            let _ = reply.send(r);
                        }
                        Pending::Start { def, input, reply } => {
                            let r = self.apply_batch(&[], &[(&def, &input)]).await.and_then(|mut applied| {
                                self.follow_up(applied.followups);
                                applied.starts.pop().ok_or(EngineError::Stopped)
                            });
                            let _ = reply.send(r);
                        }
                    }
                }
            }
            Err(e) => match batch.into_iter().next() {
                Some(Pending::Event { run_id, reply, .. }) => {
                    let r = self.on_failure(run_id, e).await;
                    let _ = reply.send(r);
                }
                Some(Pending::Start { reply, .. }) => {
                    let _ = reply.send(Err(e));
                }
                None => {}
            },
        }
    }

    /// Sends what a committed batch owes other runs: a finished child's
    /// result to its parent, a cancel to a child its parent no longer waits
    /// for. A crash before this is covered by the recovery sweep.
    fn follow_up(self: &Arc<Self>, followups: FollowUps) {
        if followups.reports.is_empty() && followups.holders.is_empty() && followups.freed.is_empty() {
            return;
        }
        let engine = self.clone();
        tokio::spawn(async move {
            for (workflow, key) in followups.freed {
                if let Err(e) = Box::pin(engine.promote(&workflow, &key)).await {
                    tracing::warn!(workflow, key, error = %e, "starting queued runs failed; the timer loop will");
                }
            }
            for (run_id, event) in followups.reports {
                if let Err(e) = engine.handle(run_id, event).await {
                    tracing::warn!(%run_id, error = %e, "reporting a child run to its parent failed; recovery will");
                }
            }
            if followups.holders.is_empty() {
                return;
            }
            let stale = match composer_store::client(&engine.pool).await {
                Ok(client) => runs::stale_children(&client, &followups.holders).await,
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

    fn clear_faults(&self, events: &[(Uuid, Event)]) {
        let mut faults = self.faults.lock().expect("fault counts");
        if !faults.is_empty() {
            for (run_id, _) in events {
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
        composer_store::runs::fail_faulted(&mut client, run_id, &message).await?;
        self.faults.lock().expect("fault counts").remove(&run_id);
        composer_metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", RunStatus::Failed.as_str())], 1);
        Ok(Handled { status: RunStatus::Failed, ignored: Some(message) })
    }

    /// One transaction: lock every run named (in id order), load their tasks,
    /// apply each event in order, write all changes set-based, commit.
    async fn apply_batch(&self, events: &[(Uuid, Event)], starts: &[NewStart<'_>]) -> Result<Applied> {
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
        events: &[(Uuid, Event)],
        starts: &[NewStart<'_>],
        published: &[i64],
    ) -> Result<Applied> {
        let started = std::time::Instant::now();
        let mut client = composer_store::client(&self.pool).await?;
        let tx = client.transaction().await?;
        let mut runs = self.lock_runs(&tx, events).await?;
        let mut results = Vec::with_capacity(events.len());
        for (run_id, event) in events {
            let Some(loaded) = runs.get_mut(run_id) else {
                results.push(Err(EngineError::RunNotFound(*run_id)));
                continue;
            };
            let tr = self.apply(&tx, &loaded.wf, &mut loaded.run, event.clone()).await?;
            count_event(*run_id, event, &tr, loaded.run.status);
            results.push(Ok(Handled { status: loaded.run.status, ignored: tr.ignored.clone() }));
            loaded.tr.merge(tr);
        }
        let mut created = Vec::with_capacity(starts.len());
        for &(def, input) in starts {
            let wf = self.compile(def)?;
            let how = NewRunOf { def, input, idempotency_key: None, parent: None, depth: 0, trigger: None };
            match self.create_run(&tx, wf, how).await? {
                Ok((row, Some(loaded))) => {
                    runs.insert(row.id, loaded);
                    created.push(row);
                }
                Ok((row, None)) => created.push(row),
                Err(e) => return Err(EngineError::Rejected(e)),
            }
        }
        self.start_children(&tx, &mut runs).await?;
        let changes: Vec<Change> = runs.values().map(Loaded::change).collect();
        let outbound = write_transitions(&tx, &changes, self.shards, self.publish_mode(), published).await?;
        tx.commit().await?;
        let followups = FollowUps::of(runs.values());
        self.dispatched(outbound, changes.iter().any(|c| !c.tr.dispatch.is_empty()));
        for c in changes.iter().filter(|c| c.tr.run_changed && c.run.status.is_terminal()) {
            run_finished(c.wf, c.run);
        }
        for _ in events {
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
        Ok(Applied { events: results, starts: created, followups })
    }

    /// Locks the runs `events` name, in id order (so two batches cannot
    /// deadlock), and loads them into the state machine's form.
    async fn lock_runs(
        &self,
        tx: &composer_store::Transaction<'_>,
        events: &[(Uuid, Event)],
    ) -> Result<HashMap<Uuid, Loaded>> {
        if events.is_empty() {
            return Ok(HashMap::new());
        }
        let mut run_ids: Vec<Uuid> = events.iter().map(|(id, _)| *id).collect();
        run_ids.sort();
        run_ids.dedup();
        // Of MAP items, only those the events name are loaded.
        let item_ids: Vec<Uuid> = events.iter().filter_map(|(_, e)| e.task_id()).collect();
        let mut runs = HashMap::new();
        for (row, tasks) in runs::lock_many(tx, &run_ids, &item_ids).await? {
            let wf = self.workflow(row.workflow_definition_id).await?;
            let mut run = runs::to_machine(&wf, &row, &tasks)?;
            run.max_payload = self.max_payload;
            // A retry may run a MAP's items again: it needs them all. A
            // resume starts items whose retry the pause held.
            let of_run = || events.iter().filter(|(id, _)| *id == row.id).map(|(_, e)| e);
            if of_run().any(|e| matches!(e, Event::RetryRun)) {
                let maps: Vec<Uuid> = run.tasks.iter().filter(|t| t.progress.is_some()).map(|t| t.id).collect();
                for map in maps {
                    load_items(tx, &wf, &mut run, Some(map), runs::Items::All).await?;
                }
            }
            if of_run().any(|e| matches!(e, Event::ResumeRun)) {
                load_items(tx, &wf, &mut run, None, runs::Items::Held).await?;
            }
            runs.insert(row.id, Loaded::new(wf, run, machine::Transition::default(), &row));
        }
        Ok(runs)
    }
}

/// Adds items of a MAP (or of the run, for held ones) that `run` does not
/// hold yet; returns how many.
async fn load_items(
    tx: &composer_store::Transaction<'_>,
    wf: &Workflow,
    run: &mut machine::Run,
    map: Option<Uuid>,
    which: runs::Items,
) -> Result<usize> {
    let held: Vec<Uuid> =
        run.tasks.iter().filter(|t| t.item.is_some_and(|i| map.is_none_or(|m| i.map == m))).map(|t| t.id).collect();
    let rows = runs::load_items(tx, run.id, map, which, &held).await?;
    for row in &rows {
        run.tasks.push(runs::to_machine_task(wf, row)?);
    }
    Ok(rows.len())
}

/// Applies the pure state machine, containing a panic to this event: the
/// run's in-memory state is then discarded with the failed transaction.
fn apply_contained(wf: &Workflow, run: &mut machine::Run, event: &Event) -> Result<machine::Transition> {
    composer_core::expr::use_clock(std::time::Instant::now);
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        machine::apply(wf, run, event, Utc::now(), &mut Uuid::now_v7)
    }));
    applied.map_err(|panic| EngineError::Fault {
        run_id: run.id,
        event: event.name(),
        message: composer_core::panic_message(&*panic),
    })
}

/// Counts a batch loop as live while it runs, however it ends.
struct LiveLoop<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> LiveLoop<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> LiveLoop<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LiveLoop(count)
    }
}

impl Drop for LiveLoop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What [`Engine::create_run`] inserts besides the workflow.
struct NewRunOf<'a> {
    def: &'a DefinitionRow,
    input: &'a Value,
    idempotency_key: Option<&'a str>,
    parent: Option<runs::Parent>,
    depth: i32,
    trigger: Option<&'a Value>,
}

/// A run [`Engine::start_run_in`] created (or found by its idempotency key),
/// with the runs started with it, for [`Engine::started`].
pub struct Started {
    pub row: RunRow,
    /// False when an idempotency key found an existing run.
    pub new: bool,
    batch: HashMap<Uuid, Loaded>,
    /// What its commit dispatched, for the publisher.
    outbound: Vec<Outbound>,
}

/// A locked run in a batch, with what the batch's events changed so far.
struct Loaded {
    wf: Arc<Workflow>,
    run: machine::Run,
    tr: machine::Transition,
    /// The SUB_WORKFLOW attempt this run reports to, if it is a child.
    parent: Option<runs::Parent>,
    depth: i32,
    /// `(workflow, key)` of a run under a concurrency limit.
    limit: Option<(String, String)>,
    /// How many of `tr.children` were looked at.
    children_seen: usize,
    /// Its end was reported to its parent inside the batch.
    reported: bool,
    /// Its definition's id and version.
    definition: (Uuid, i32),
}

impl Loaded {
    fn new(wf: Arc<Workflow>, run: machine::Run, tr: machine::Transition, row: &RunRow) -> Loaded {
        let limit = row.concurrency_key.clone().map(|k| (row.workflow_name.clone(), k));
        let definition = (row.workflow_definition_id, row.workflow_version);
        Loaded {
            wf,
            run,
            tr,
            parent: row.parent,
            depth: row.depth,
            limit,
            children_seen: 0,
            reported: false,
            definition,
        }
    }

    fn change(&self) -> Change<'_> {
        Change { wf: &self.wf, run: &self.run, tr: &self.tr, definition: self.definition }
    }
}

/// What a committed batch owes other runs (see [`Engine::follow_up`]).
#[derive(Default)]
struct FollowUps {
    /// Children that ended: their result, for their parent.
    reports: Vec<(Uuid, Event)>,
    /// SUB_WORKFLOW tasks that changed: their open children that they no
    /// longer wait for are cancelled.
    holders: Vec<runs::ChildHolder>,
    /// Concurrency keys a run ended in: their queued runs may start.
    freed: Vec<(String, String)>,
}

impl FollowUps {
    fn of<'a>(batch: impl Iterator<Item = &'a Loaded>) -> FollowUps {
        let mut f = FollowUps::default();
        for l in batch {
            if let Some(limit) = &l.limit {
                if l.tr.run_changed && l.run.status.is_terminal() && !f.freed.contains(limit) {
                    f.freed.push(limit.clone());
                }
            }
            if let Some(parent) = l.parent {
                if l.tr.run_changed && l.run.status.is_terminal() && !l.reported {
                    f.reports.push((parent.run_id, child_finished(parent, &l.run)));
                }
            }
            for &t in &l.tr.updated {
                let task = &l.run.tasks[t];
                if l.wf.nodes[task.node].kind.traits().has_child {
                    let waiting = task.state == machine::TaskState::Running;
                    // A first attempt that just started has no other child.
                    if !waiting || task.attempt > 1 {
                        f.holders.push(runs::ChildHolder { task_id: task.id, attempt: task.attempt, waiting });
                    }
                }
            }
        }
        f
    }
}

/// Counts a run that ended, and its time from creation (its UUIDv7 id
/// carries the millisecond it was created) to now.
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

/// When a run of `wf` starting now times out.
fn deadline_of(wf: &Workflow) -> Option<chrono::DateTime<Utc>> {
    wf.timeout.and_then(|d| chrono::Duration::from_std(d).ok()).and_then(|d| Utc::now().checked_add_signed(d))
}

/// The event that tells `parent` how its child run ended.
fn child_finished(parent: runs::Parent, child: &machine::Run) -> Event {
    Event::ChildFinished {
        task_id: parent.task_id,
        attempt: parent.attempt,
        child: Some(child.id),
        status: child.status,
        output: child.output.clone(),
        error: child.error.clone(),
    }
}

fn count_event(run_id: Uuid, event: &Event, tr: &machine::Transition, status: RunStatus) {
    let result = tr.ignored_kind.map(|k| k.as_str()).unwrap_or("applied");
    composer_metrics::inc(composer_metrics::EVENTS, &[("event", event.name()), ("result", result)], 1);
    match &tr.ignored {
        Some(reason) => tracing::debug!(%run_id, event = event.name(), %reason, "event ignored"),
        None => tracing::debug!(%run_id, event = event.name(), %status, "event applied"),
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
        let engine = Arc::new(Engine::new(pool, 1, Arc::new(Notify::new()), None, 1024, 1));
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
