//! The queued runs a concurrency key's free slots start: a pass after the
//! commit that freed a slot ([`Engine::promote_freed`]), or the same
//! promotion inside a batch that freed it ([`Engine::promote_in`], used by
//! the batch's hand-over).

use std::collections::HashMap;
use std::sync::Arc;

use composer_core::machine::{Event, RunStatus};
use composer_store::runs;
use uuid::Uuid;

use super::admission;
use super::effects;
use super::error::Result;
use super::loaded::Loaded;
use super::store::Tx;
use super::Engine;

impl Engine {
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
        let mut receipt = self.write(&tx, batch.iter_mut(), &[]).await?;
        tx.commit().await?;
        receipt.answer(to_idle);
        let owed = self.written(receipt);
        self.follow_up(owed);
        self.follow_up(batch.iter().flat_map(Loaded::after_commit).collect());
        tracing::debug!(workflow, key, promoted = batch.len(), "queued runs started");
        Ok(batch.len())
    }

    /// The promotion of [`Engine::promote`] in `tx`, which holds the key's
    /// lock: the queued runs it starts, loaded, to write, and whether it
    /// started all that the key's free slots allow (false when a run of
    /// `held`, which the caller has loaded and writes itself, was next).
    pub(super) async fn promote_in(
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
        let store = Tx(tx, &self.payloads);
        let mut batch = Vec::with_capacity(rows.len());
        for ((wf, mut row), deadline) in rows.into_iter().zip(deadlines) {
            let mut read = crate::payloads::ReadFrom::default();
            store.resolve_run(&mut row, &mut read).await?;
            let mut run = runs::into_machine(&wf, &mut row, Vec::new())?;
            run.status = RunStatus::Running;
            run.deadline = deadline;
            self.hold_to_limits(&store, &wf, &mut run, &row).await?;
            let tr = effects::apply(&store, &wf, &mut run, Event::RunStarted).await?;
            let mut loaded = Loaded::new(wf, run, tr, &row);
            loaded.read = read;
            batch.push(loaded);
        }
        Ok((batch, all))
    }

    /// [`Engine::promote`] for a slot that freed, one pass at a time per key
    /// in this process: a slot freed while a pass runs makes that pass run
    /// once more when it is done, instead of queueing another transaction
    /// behind the key's lock. (Each pass starts as many queued runs as the
    /// key has free slots, so one pass serves any number of freed slots.)
    pub(super) async fn promote_freed(self: &Arc<Self>, workflow: String, key: String) {
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
}
