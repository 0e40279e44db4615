//! `handle(run_id, event)`: the one way a run changes. One transaction: lock
//! the run row, load its tasks, apply the pure state machine, write the
//! changes, outbox rows and history, notify, commit. A crash anywhere rolls
//! all of it back, and the run lock serializes events of one run across every
//! coordinator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use composer_core::definition::Workflow;
use composer_core::machine::{self, Event, RunStatus};
use composer_store::definitions::DefinitionRow;
use composer_store::runs::{self, NewRun, RunRow};
use composer_store::transitions::{write_transitions, Change};
use composer_store::Pool;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, Notify};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("run {0} not found")]
    RunNotFound(Uuid),
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error("the coordinator is shutting down")]
    Stopped,
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
    /// NOTIFY other coordinators of new outbox rows: only needed when this
    /// one runs no enqueuer of its own (it wakes its own in-process).
    notify_outbox: bool,
    /// Definition versions are immutable, so a compiled workflow is cached
    /// for the life of the process.
    workflows: Mutex<HashMap<Uuid, Arc<Workflow>>>,
    queue: mpsc::UnboundedSender<Pending>,
    inbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>,
}

/// An event waiting for a batch.
struct Pending {
    run_id: Uuid,
    event: Event,
    reply: oneshot::Sender<Result<Handled>>,
}

/// Most events one transaction applies.
const MAX_BATCH: usize = 128;

impl Engine {
    pub fn new(pool: Pool, shards: u32, outbox_wake: Arc<Notify>, notify_outbox: bool) -> Engine {
        let (queue, inbox) = mpsc::unbounded_channel();
        Engine {
            pool,
            shards: shards as i32,
            outbox_wake,
            notify_outbox,
            workflows: Mutex::new(HashMap::new()),
            queue,
            inbox: Arc::new(tokio::sync::Mutex::new(inbox)),
        }
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
    pub async fn start_run(
        &self,
        def: &DefinitionRow,
        input: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<(RunRow, bool)> {
        let wf = self.compile(def)?;
        let mut client = composer_store::client(&self.pool).await?;
        let tx = client.transaction().await?;
        if let Some(key) = idempotency_key {
            if let Some(existing) = runs::lock_idempotency_key(&tx, &def.name, key).await? {
                return Ok((existing, false));
            }
        }
        let new = NewRun {
            id: Uuid::now_v7(),
            workflow_definition_id: def.id,
            workflow_name: &def.name,
            workflow_version: def.version,
            input,
            idempotency_key,
        };
        let mut row = runs::insert_run(&tx, &new).await?;
        let mut run = machine::Run::new(row.id, input.clone());
        let tr = self.apply(&tx, &wf, &mut run, Event::RunStarted).await?;
        let change = Change { wf: &wf, run: &run, tr: &tr };
        write_transitions(&tx, &[change], self.shards, self.notify_outbox).await?;
        tx.commit().await?;
        if !tr.dispatch.is_empty() {
            self.outbox_wake.notify_one();
        }
        composer_metrics::inc(composer_metrics::RUNS_STARTED, &[], 1);
        if run.status.is_terminal() {
            composer_metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", run.status.as_str())], 1);
        }
        row.status = run.status;
        row.output = run.output;
        row.error = run.error;
        tracing::debug!(run_id = %row.id, workflow = %def.name, version = def.version, "run started");
        Ok((row, true))
    }

    /// Applies `event`, then delivers any buffered external event to the
    /// WAIT_FOR_EVENT tasks it created, all in the caller's transaction.
    async fn apply(
        &self,
        tx: &composer_store::Transaction<'_>,
        wf: &Workflow,
        run: &mut machine::Run,
        event: Event,
    ) -> Result<machine::Transition> {
        let mut tr = machine::apply(wf, run, &event, Utc::now(), &mut Uuid::now_v7);
        let mut checked = 0;
        loop {
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
                    let next = machine::apply(
                        wf,
                        run,
                        &Event::EventReceived { task_id, payload },
                        Utc::now(),
                        &mut Uuid::now_v7,
                    );
                    tr.merge(next);
                    delivered = true;
                }
            }
            if !delivered {
                return Ok(tr);
            }
        }
    }

    /// Applies `event` to the run under its lock and commits the result.
    /// Events that arrive together share a transaction (see [`Engine::run_batches`]):
    /// batching is what keeps PostgreSQL commits per step low under load, and
    /// adds no wait when there is nothing to batch with.
    pub async fn handle(&self, run_id: Uuid, event: Event) -> Result<Handled> {
        let (reply, answer) = oneshot::channel();
        self.queue.send(Pending { run_id, event, reply }).map_err(|_| EngineError::Stopped)?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// Takes whatever events are queued (up to a batch) and applies them in
    /// one transaction; several of these loops run so that one batch's commit
    /// overlaps the next one's work.
    pub async fn run_batches(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            let batch = {
                let mut inbox = self.inbox.lock().await;
                let first = tokio::select! {
                    _ = shutdown.cancelled() => {
                        // Refuse new events and answer queued ones, so no
                        // request waits forever while the server drains.
                        inbox.close();
                        while let Ok(p) = inbox.try_recv() {
                            let _ = p.reply.send(Err(EngineError::Stopped));
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
            self.process(batch).await;
        }
    }

    async fn process(&self, batch: Vec<Pending>) {
        let events: Vec<(Uuid, Event)> = batch.iter().map(|p| (p.run_id, p.event.clone())).collect();
        match self.apply_batch(&events).await {
            Ok(results) => {
                for (p, r) in batch.into_iter().zip(results) {
                    let _ = p.reply.send(r);
                }
            }
            // One bad event must not fail the others: retry each on its own.
            Err(e) if batch.len() > 1 => {
                tracing::warn!(error = %e, events = batch.len(), "batch failed; applying its events one by one");
                for p in batch {
                    let r = match self.apply_batch(&[(p.run_id, p.event.clone())]).await {
                        Ok(mut rs) => rs.pop().unwrap_or(Err(EngineError::RunNotFound(p.run_id))),
                        Err(e) => Err(e),
                    };
                    let _ = p.reply.send(r);
                }
            }
            Err(e) => {
                if let Some(p) = batch.into_iter().next() {
                    let _ = p.reply.send(Err(e));
                }
            }
        }
    }

    /// One transaction: lock every run named (in id order), load their tasks,
    /// apply each event in order, write all changes set-based, commit.
    async fn apply_batch(&self, events: &[(Uuid, Event)]) -> Result<Vec<Result<Handled>>> {
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
        let changes: Vec<Change> = runs.values().map(|l| Change { wf: &l.wf, run: &l.run, tr: &l.tr }).collect();
        write_transitions(&tx, &changes, self.shards, self.notify_outbox).await?;
        tx.commit().await?;
        if changes.iter().any(|c| !c.tr.dispatch.is_empty()) {
            self.outbox_wake.notify_one();
        }
        for c in changes.iter().filter(|c| c.tr.run_changed && c.run.status.is_terminal()) {
            composer_metrics::inc(composer_metrics::RUNS_FINISHED, &[("status", c.run.status.as_str())], 1);
        }
        for _ in events {
            composer_metrics::observe(composer_metrics::EVENT_DURATION, &[], started.elapsed());
        }
        Ok(results)
    }

    /// Locks the runs `events` name, in id order (so two batches cannot
    /// deadlock), and loads them into the state machine's form.
    async fn lock_runs(
        &self,
        tx: &composer_store::Transaction<'_>,
        events: &[(Uuid, Event)],
    ) -> Result<HashMap<Uuid, Loaded>> {
        let mut run_ids: Vec<Uuid> = events.iter().map(|(id, _)| *id).collect();
        run_ids.sort();
        run_ids.dedup();
        let mut runs = HashMap::new();
        for (row, tasks) in runs::lock_many(tx, &run_ids).await? {
            let wf = self.workflow(row.workflow_definition_id).await?;
            let run = runs::to_machine(&wf, &row, &tasks)?;
            runs.insert(row.id, Loaded { wf, run, tr: machine::Transition::default() });
        }
        Ok(runs)
    }
}

/// A locked run in a batch, with what the batch's events changed so far.
struct Loaded {
    wf: Arc<Workflow>,
    run: machine::Run,
    tr: machine::Transition,
}

fn count_event(run_id: Uuid, event: &Event, tr: &machine::Transition, status: RunStatus) {
    let result = tr.ignored_kind.map(|k| k.as_str()).unwrap_or("applied");
    composer_metrics::inc(composer_metrics::EVENTS, &[("event", event.name()), ("result", result)], 1);
    match &tr.ignored {
        Some(reason) => tracing::debug!(%run_id, event = event.name(), %reason, "event ignored"),
        None => tracing::debug!(%run_id, event = event.name(), %status, "event applied"),
    }
}
