//! Writing what a transaction's runs changed ([`Engine::write`]): the
//! hooks their ends start, the deadlines they arm and disarm, the fan-out
//! they spend, their spans,
//! and the set-based write of every change; then, once the transaction
//! committed, publishing it ([`Engine::written`]).

use std::collections::HashMap;

use composer_core::machine::AfterCommit;
use composer_store::definitions::DefinitionRow;
use composer_store::outbox::Outbound;
use composer_store::transitions::{write_transitions, Change, EagerLease, Offloaded};
use serde_json::Value;
use uuid::Uuid;

use super::error::{EngineError, Result};
use super::idle::Claimed;
use super::loaded::Loaded;
use super::store::Tx;
use super::{handler, tally, Engine};
use crate::trace;

/// What a write did, for after its commit: the outbox rows it wrote (with
/// their messages), whether any, the tasks it leased in the commit, the
/// failure handlers it started and the spans it ends.
pub struct Receipt {
    pub(super) outbound: Vec<Outbound>,
    /// The tasks leased in the commit (eager dispatch, waiting polls).
    pub(super) eager: Vec<EagerLease>,
    pub(super) any: bool,
    pub(super) handlers: Vec<Loaded>,
    /// The spans the commit ends (none unless traces are on).
    pub(super) spans: Vec<trace::Span>,
}

impl Receipt {
    /// After the commit: answers the waiting polls the write leased tasks to.
    pub(super) fn answer(&mut self, polls: Vec<Claimed>) {
        if polls.is_empty() {
            return;
        }
        let mut sent: HashMap<Uuid, EagerLease> = self.eager.drain(..).map(|g| (g.dispatch.task_id, g)).collect();
        for poll in polls {
            poll.send(&mut sent);
        }
    }
}

impl Engine {
    /// Writes what the runs' events changed, in the caller's transaction,
    /// with the failure handlers their ends start (returned, for the caller
    /// to follow up after its commit). `published`: outbox rows this
    /// coordinator published since its last write, deleted here.
    pub(super) async fn write<'l>(
        &self,
        tx: &composer_store::Transaction<'_>,
        loaded: impl Iterator<Item = &'l mut Loaded>,
        published: &[i64],
    ) -> Result<Receipt> {
        let mut loaded: Vec<&mut Loaded> = loaded.collect();
        for l in &loaded {
            self.charge_items(tx, l).await?;
        }
        // A hook's run joins the ended run's tree: its MAP sees the items
        // charged before it, its own charged before the next hook reads.
        let mut handlers = Vec::new();
        let compile = |def: &DefinitionRow| self.compile(def);
        for l in loaded.iter_mut() {
            for hook in handler::owed_hooks(l) {
                if let Some(h) = handler::start(&Tx(tx, &self.payloads), &compile, l, &hook, self.bounds).await? {
                    self.charge_items(tx, &h).await?;
                    handlers.push(h);
                }
            }
        }
        if self.payloads.is_on() {
            for l in loaded.iter_mut().map(|l| &mut **l).chain(handlers.iter_mut()) {
                l.offloaded = self.offloaded(&super::store::Tx(tx, &self.payloads), l).await?;
            }
        }
        let all: Vec<&Loaded> = loaded.iter().map(|l| &**l).chain(handlers.iter()).collect();
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
        let (armed, ended) = super::arming::arming(&all);
        composer_store::deadlines::arm(tx, &armed).await?;
        composer_store::deadlines::disarm(tx, &ended).await?;
        let changes: Vec<Change> = all.into_iter().map(Loaded::change).collect();
        let any = changes.iter().any(|c| !c.tr.dispatch.is_empty());
        let wrote = write_transitions(tx, &changes, self.shards, self.publish_mode(), published).await?;
        Ok(Receipt { outbound: wrote.outbound, eager: wrote.eager, any, handlers, spans })
    }

    /// Charges the MAP items `l`'s transition started to its tree (a MAP's
    /// items are charged in all when it starts).
    async fn charge_items(&self, tx: &composer_store::Transaction<'_>, l: &Loaded) -> Result<()> {
        let items = l.tr.charged_items as i64;
        if items > 0 && !composer_store::trees::charge_items(tx, l.root, items, self.bounds.tree.items).await? {
            // Another run of the tree spent the budget since this one read
            // it: applied again, the MAP sees what is left.
            return Err(EngineError::BudgetRace { run_id: l.run.id });
        }
        Ok(())
    }

    /// The values of `l` the write puts in objects, written now (before the
    /// commit that refers to them): those over the threshold of its run
    /// and of the tasks its events created or changed.
    async fn offloaded(&self, objects: &super::store::Tx<'_, '_>, l: &Loaded) -> Result<Offloaded> {
        use crate::payloads::Which::{Input, Output};
        let (run, tr) = (&l.run, &l.tr);
        let put = |value, task, which| Self::offload(objects, l, value, task, which);
        let mut out = Offloaded::default();
        if tr.run_changed {
            if let Some(output) = &run.output {
                out.run_output = put(output, None, Output).await?;
            }
        }
        if tr.input_changed {
            out.run_input = put(&run.input, None, Input).await?;
        }
        for &i in tr.created.iter().chain(&tr.updated) {
            let t = &run.tasks[i];
            if t.removed || out.inputs.contains_key(&i) || out.outputs.contains_key(&i) {
                continue;
            }
            if let Some(input) = put(&t.input, Some(t.id), Input).await? {
                out.inputs.insert(i, input);
            }
            if let Some(output) = &t.output {
                if let Some(output) = put(output, Some(t.id), Output).await? {
                    out.outputs.insert(i, output);
                }
            }
        }
        Ok(out)
    }

    /// The reference `value` of run `l` (of its task `task`) is written as, if any.
    async fn offload(
        objects: &super::store::Tx<'_, '_>,
        l: &Loaded,
        value: &Value,
        task: Option<Uuid>,
        which: crate::payloads::Which,
    ) -> Result<Option<Value>> {
        Ok(objects.offload(l.run.id, value, l.read.get(task, which)).await?)
    }

    /// After the commit of a write: publishes it, records its spans, counts
    /// the failure handlers it started, and returns what their commit owes.
    pub(super) fn written(&self, receipt: Receipt) -> Vec<(Uuid, AfterCommit)> {
        self.dispatched(receipt.outbound, receipt.any);
        if let (Some(traces), false) = (&self.traces, receipt.spans.is_empty()) {
            traces.record(receipt.spans);
        }
        if receipt.handlers.is_empty() {
            return Vec::new();
        }
        crate::metrics::inc(composer_metrics::RUNS_STARTED, &[], receipt.handlers.len() as u64);
        for h in receipt.handlers.iter().filter(|h| h.run.status.is_terminal()) {
            tally::run_finished(&h.wf, &h.run);
        }
        receipt.handlers.iter().flat_map(Loaded::after_commit).collect()
    }
}
