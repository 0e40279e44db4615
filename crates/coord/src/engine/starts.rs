//! Starting a run outside the engine's batches: with an idempotency key,
//! from a trigger or a schedule's fire, or under a concurrency limit (whose
//! lock could make two batches wait for each other), in a transaction of
//! its own or in the caller's ([`Engine::start_run_in`]). A plain start
//! waits in the queue for a batch, as an event does.

use std::sync::Arc;

use composer_core::machine::AfterCommit;
use composer_store::definitions::DefinitionRow;
use composer_store::runs::{self, RunRow};
use serde_json::Value;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::admission::{self, NewRunOf};
use super::error::{EngineError, Rejection, Result};
use super::idle::Claimed;
use super::loaded::Loaded;
use super::queue::{Pending, QueuedStart};
use super::store::Tx;
use super::write::Receipt;
use super::{tally, Engine};

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
    /// A deadline's run: the run whose deadline started it.
    pub owed: Option<Owed>,
}

/// A run another run owes (its deadline's): it starts no hooks and arms no
/// deadlines of its own, and joins that run's tree without being charged to
/// its budget of runs (every child it starts is; its MAPs share the items').
#[derive(Debug, Clone, Copy)]
pub struct Owed {
    pub by: Uuid,
    /// The root of the tree of `by`.
    pub root: Uuid,
}

/// A run [`Engine::start_run_in`] created (or found by its idempotency key),
/// for [`Engine::started`] once the caller committed.
pub struct Started {
    pub row: RunRow,
    /// False when an idempotency key found an existing run.
    pub new: bool,
    loaded: Option<Loaded>,
    /// What its commit wrote, for the publisher (and the handlers it started).
    receipt: Option<Receipt>,
    /// The waiting polls its first steps were leased to, answered once the
    /// caller committed (dropped unanswered, they read again).
    to_idle: Vec<Claimed>,
}

/// Where a start is held to its namespace's quotas.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QuotaCheck {
    /// Before it was asked of the engine (the API's starts, which answer a 429).
    Done,
    /// In its transaction, once it is known to be new.
    Here,
}

/// Where a start outside the engine's batches sends its run's first steps.
#[derive(Clone, Copy)]
pub(super) enum FirstSteps {
    /// Leased to polls waiting for work in its transaction, when that
    /// transaction commits right after whatever its caller does.
    ToWaitingPolls,
    /// Through their streams, as every step a poll did not take.
    ToStreams,
}

impl Engine {
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
            let start = QueuedStart {
                def: def.clone(),
                input: input.clone(),
                tags: opts.tags.cloned(),
                traceparent: opts.traceparent.map(str::to_string),
                priority: opts.priority,
            };
            self.queue.push(opts.priority.unwrap_or(wf.priority), Pending::Start { start, reply })?;
            return Ok((answer.await.map_err(|_| EngineError::Stopped)??, true));
        }
        // Its own transaction, which may lease the first steps to waiting
        // polls, runs to its end in a task of its own: a caller that goes
        // away during the commit must not leave a committed lease untold.
        let (engine, def, input) = (self.clone(), def.clone(), input.clone());
        let StartOptions { idempotency_key, trigger, tags, traceparent, priority, owed } = opts;
        let (key, trigger, tags, traceparent) =
            (idempotency_key.map(str::to_string), trigger.cloned(), tags.cloned(), traceparent.map(str::to_string));
        let own = crate::metrics::spawn(async move {
            let opts = StartOptions {
                idempotency_key: key.as_deref(),
                trigger: trigger.as_ref(),
                tags: tags.as_ref(),
                traceparent: traceparent.as_deref(),
                priority,
                owed,
            };
            let mut client = composer_store::client(&engine.pool).await?;
            let tx = composer_store::begin(&mut client).await?;
            let started =
                engine.start_in(&tx, &def, &input, opts, FirstSteps::ToWaitingPolls, QuotaCheck::Done).await?;
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
    ///
    /// The start is held to the namespace's quotas (a refusal is a
    /// [`Rejection::OverQuota`]), as the API's are before they are asked
    /// for. A run's own work (its children, its hooks, a deadline's run: `owed`) is not:
    /// refusing it would fail work already admitted, and a namespace full
    /// of parents waiting for children would never drain.
    pub async fn start_run_in(
        &self,
        tx: &composer_store::Transaction<'_>,
        def: &DefinitionRow,
        input: &Value,
        opts: StartOptions<'_>,
    ) -> Result<Started> {
        // A run another run owes (a deadline's) is that run's own work.
        let quotas = if opts.owed.is_some() { QuotaCheck::Done } else { QuotaCheck::Here };
        self.start_in(tx, def, input, opts, FirstSteps::ToStreams, quotas).await
    }

    /// Refuses a start past the namespace's quotas.
    async fn within_quotas(&self, client: &composer_store::Client) -> Result<()> {
        use crate::quotas::QuotaError;
        let Some(quotas) = &self.quotas else { return Ok(()) };
        match quotas.may_start_in(client).await {
            Ok(()) => Ok(()),
            Err(QuotaError::Over { quota, message, retry_after }) => {
                Err(Rejection::OverQuota { quota, message, retry_after }.into())
            }
            Err(QuotaError::Store(e)) => Err(e.into()),
            Err(QuotaError::Redis(why)) => Err(EngineError::Unavailable(why)),
        }
    }

    /// [`Engine::start_run_in`], which may lease the run's first steps to
    /// waiting polls when the transaction commits right after, whatever
    /// its caller does. A start that is not new (its idempotency key's run
    /// exists) is answered before the quotas are looked at.
    async fn start_in(
        &self,
        tx: &composer_store::Transaction<'_>,
        def: &DefinitionRow,
        input: &Value,
        opts: StartOptions<'_>,
        first_steps: FirstSteps,
        quotas: QuotaCheck,
    ) -> Result<Started> {
        let wf = self.compile(def)?;
        let StartOptions { idempotency_key, trigger, tags, traceparent, priority, owed } = opts;
        if let Some(key) = idempotency_key {
            if let Some(existing) = runs::lock_idempotency_key(tx, &def.name, key).await? {
                return Ok(Started { row: existing, new: false, loaded: None, receipt: None, to_idle: Vec::new() });
            }
        }
        if quotas == QuotaCheck::Here {
            self.within_quotas(tx).await?;
        }
        let (handles, root) = (owed.map(|o| o.by), owed.map(|o| o.root));
        let how = NewRunOf {
            idempotency_key,
            trigger,
            tags,
            traceparent,
            priority,
            handles,
            root,
            ..NewRunOf::of(def, input)
        };
        let (row, mut loaded) = admission::create_run(&Tx(tx, &self.payloads), wf, how, self.bounds).await?;
        // Its first steps go to the polls waiting for work, as a batched
        // start's do.
        let to_idle = match first_steps {
            FirstSteps::ToWaitingPolls => self.idle.give(loaded.iter_mut()),
            FirstSteps::ToStreams => Vec::new(),
        };
        let receipt = self.write(tx, loaded.iter_mut(), &[]).await?;
        tracing::debug!(run_id = %row.id, workflow = %def.name, version = def.version, "run started");
        Ok(Started { row, new: true, loaded, receipt: Some(receipt), to_idle })
    }

    /// After the commit of [`Engine::start_run_in`]: publishes, counts, runs
    /// what the commit owes, and returns the run as it now stands (and
    /// whether it is new).
    pub fn started(self: &Arc<Self>, started: Started) -> (RunRow, bool) {
        let Started { mut row, new, loaded, receipt, to_idle } = started;
        if !new {
            return (row, false);
        }
        crate::metrics::inc(composer_metrics::RUNS_STARTED, &[], 1);
        if let Some(mut receipt) = receipt {
            receipt.answer(to_idle);
            let owed = self.written(receipt);
            self.follow_up(owed);
        }
        if let Some(l) = loaded {
            if l.run.status.is_terminal() {
                tally::run_finished(&l.wf, &l.run);
            }
            row.status = l.run.status;
            row.output = l.run.output.clone();
            row.error = l.run.error.clone();
            let owed: Vec<(Uuid, AfterCommit)> = l.after_commit().collect();
            self.follow_up(owed);
        }
        (row, true)
    }
}
