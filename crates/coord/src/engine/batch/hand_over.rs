//! Phase 6: hand the slots that runs of this batch freed to their keys'
//! next queued runs, in the transaction that freed them, for each key whose
//! lock no other transaction holds (one that does is a pass or a batch, and
//! the pass after the commit comes next). In a savepoint, with a short lock
//! timeout: whatever goes wrong there (a queued run's row another
//! transaction holds, a run that cannot start, a lock cycle) is rolled back
//! and left to the pass, not charged to the batch's events.

use std::collections::{BTreeSet, HashMap};

use composer_store::runs;
use uuid::Uuid;

use super::super::error::{EngineError, Result};
use super::super::loaded::Loaded;
use super::super::write::Receipt;
use super::{Batch, HandOver, Spare};

/// How long a hand-over waits for a lock (a queued run's row) before it
/// gives up and leaves the key to a pass after the commit: the batch's
/// other events wait with it.
const HAND_OVER_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

impl Batch<'_> {
    pub(super) async fn hand_over(&mut self, tx: &composer_store::Transaction<'_>) -> Result<HandOver> {
        let freed = freed_keys(&self.runs);
        if freed.is_empty() {
            return Ok(HandOver::default());
        }
        let mut locked = Vec::new();
        for (workflow, key) in &freed {
            if runs::try_lock_concurrency_key(tx, workflow, key).await? {
                locked.push((workflow.clone(), key.clone()));
            }
        }
        if locked.is_empty() {
            return Ok(HandOver { freed, ..HandOver::default() });
        }
        let savepoint = format!("SAVEPOINT hand_over; SET LOCAL lock_timeout = {}", HAND_OVER_LOCK_TIMEOUT.as_millis());
        tx.batch_execute(&savepoint).await.map_err(composer_store::Error::from)?;
        let mut handed = HandOver { freed, ..HandOver::default() };
        match self.promote_locked(tx, locked, &mut handed).await {
            Ok(receipt) => {
                handed.receipt = receipt;
                Ok(handed)
            }
            Err(e) => {
                tracing::warn!(error = %e, "handing freed slots over failed; the pass after the commit will start them");
                // Undoes the timeout too (it was set in the savepoint).
                tx.batch_execute("ROLLBACK TO SAVEPOINT hand_over").await.map_err(composer_store::Error::from)?;
                Ok(HandOver { freed: handed.freed, ..HandOver::default() })
            }
        }
    }

    /// Starts the queued runs of the keys it holds the locks of, gives their
    /// first steps to what the offers left and then to waiting polls, and
    /// writes them.
    async fn promote_locked(
        &mut self,
        tx: &composer_store::Transaction<'_>,
        locked: Vec<(String, String)>,
        handed: &mut HandOver,
    ) -> Result<Option<Receipt>> {
        for (workflow, key) in locked {
            let (more, all) = self.engine.promote_in(tx, &workflow, &key, &self.runs).await?;
            handed.promoted.extend(more);
            if all {
                handed.handed.insert((workflow, key));
            }
        }
        handed.given = give_to_spare(&mut handed.promoted, &mut self.spare);
        // What no report took, to the polls waiting for work.
        handed.to_idle = self.engine.idle.give(handed.promoted.iter_mut());
        let receipt = match handed.promoted.is_empty() {
            true => None,
            false => Some(self.engine.write(tx, handed.promoted.iter_mut(), &[]).await?),
        };
        // The rest of the transaction (its commit, which waits for the
        // notify queue's lock) under the usual timeout.
        tx.batch_execute("SET LOCAL lock_timeout TO DEFAULT").await.map_err(composer_store::Error::from)?;
        Ok::<_, EngineError>(receipt)
    }
}

/// A started run's first steps go to a worker of the batch whose report
/// offered more than its own run took, as its own run's next would: no
/// stream, no poll, no lease of their own. Not to an offer made for a more
/// urgent priority than the run's.
fn give_to_spare(promoted: &mut [Loaded], spare: &mut [Spare]) -> Vec<(usize, Vec<Uuid>)> {
    let mut given = Vec::new();
    for loaded in promoted {
        let priority = loaded.priority;
        for s in spare.iter_mut().filter(|s| s.offer.slots > 0 && priority <= s.priority) {
            let tasks = loaded.give_eagerly(&s.worker, &s.offer);
            s.offer.slots -= tasks.len() as u32;
            if !tasks.is_empty() {
                given.push((s.at, tasks));
            }
        }
    }
    given
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
