//! One batch: the requests and starts a loop took, applied in one
//! transaction, phase by phase. [`Engine::apply_batch`] reads as the list
//! of phases; each phase is a method of [`Batch`] in a file of its own.
//!
//! 1. [`lock`]: lock every run the requests name (in id order) and load it.
//! 2. [`events`]: apply each request's event in order, checking what who
//!    asked requires (a report's lease, a bulk job's mark).
//! 3. [`offers`]: lease what the events made ready to the workers whose
//!    reports offered to take it.
//! 4. [`admit`]: create the runs of the batch's starts.
//! 5. write (here): lease what no report took to waiting polls, and write
//!    every change set-based ([`Engine::write`]).
//! 6. [`hand_over`]: hand the slots ended runs freed to their keys' next
//!    queued runs, in the same transaction.
//! 7. commit (here).
//! 8. [`answer`]: after the commit, give leased tasks to their workers and
//!    polls, count, and say what the commit owes other runs.

use std::collections::{BTreeSet, HashMap, HashSet};

use composer_api::wire::EagerOffer;
use composer_core::machine::AfterCommit;
use composer_store::runs::RunRow;
use uuid::Uuid;

use super::error::Result;
use super::idle::Claimed;
use super::loaded::Loaded;
use super::queue::QueuedStart;
use super::request::{Answer, EventRequest};
use super::write::Receipt;
use super::Engine;

mod admit;
mod answer;
mod events;
mod hand_over;
mod lock;
mod offers;

/// What one batch came to: an answer per request and a run per start, in
/// the order they were given, and what its commit owes other runs.
pub struct BatchResult {
    pub events: Vec<Result<Answer>>,
    pub starts: Vec<RunRow>,
    pub after_commit: Vec<(Uuid, AfterCommit)>,
}

/// A batch between its phases.
struct Batch<'e> {
    engine: &'e Engine,
    /// When it began, for each event's duration.
    began: std::time::Instant,
    /// How many requests it applies.
    requests: usize,
    /// Every run it locked or created, by id.
    runs: HashMap<Uuid, Loaded>,
    /// Who holds the lease of each reported task, as the batch locked it.
    leases: Leases,
    /// One per request, in order.
    answers: Vec<Result<Answer>>,
    /// Reports whose event applied and that offer to take more.
    offers: Vec<Offer>,
    /// Tasks leased to each report: (its place among the requests, tasks).
    given: Vec<(usize, Vec<Uuid>)>,
    /// What the offers left, for runs a freed slot starts.
    spare: Vec<Spare>,
    /// The runs its starts created.
    created: Vec<RunRow>,
    /// Waiting polls its write leased tasks to.
    to_idle: Vec<Claimed>,
}

/// Who holds the lease of each reported task, at which attempt, and
/// whether it is RUNNING, as the batch's transaction locked it.
type Leases = HashMap<Uuid, (Option<String>, i32, bool)>;

/// A report that offers to take its run's next tasks.
struct Offer {
    /// Its place among the requests.
    at: usize,
    run_id: Uuid,
    worker: String,
    offer: EagerOffer,
}

/// What a worker's offer to take more tasks has left once its own run's
/// next tasks were given: for a run a freed slot starts.
struct Spare {
    /// Its report's place among the requests.
    at: usize,
    worker: String,
    offer: EagerOffer,
    /// The least urgent priority it takes: the more urgent of its run's
    /// and the one the worker offered for.
    priority: u8,
}

/// What the hand-over phase did: the keys whose slots ended runs freed,
/// those it served in full, the queued runs it started and their write.
#[derive(Default)]
struct HandOver {
    freed: BTreeSet<(String, String)>,
    handed: HashSet<(String, String)>,
    promoted: Vec<Loaded>,
    receipt: Option<Receipt>,
    /// Tasks of `promoted` leased to a reporting worker: (its report's
    /// place in the batch, the tasks).
    given: Vec<(usize, Vec<Uuid>)>,
    /// Tasks of `promoted` leased to polls waiting for work.
    to_idle: Vec<Claimed>,
}

impl Engine {
    /// One transaction for a batch's requests and starts. Rows this
    /// coordinator published since its last write are deleted in it: no
    /// commit of their own (given back for the next write if it fails).
    pub(super) async fn apply_batch(&self, requests: Vec<EventRequest>, starts: &[QueuedStart]) -> Result<BatchResult> {
        let published = self.publisher.as_ref().map(|(p, _)| p.take_published()).unwrap_or_default();
        let result = self.run_phases(requests, starts, &published).await;
        if result.is_err() {
            if let Some((p, _)) = &self.publisher {
                p.give_back(published);
            }
        }
        result
    }

    /// The phases of a batch, in order.
    async fn run_phases(
        &self,
        requests: Vec<EventRequest>,
        starts: &[QueuedStart],
        published: &[i64],
    ) -> Result<BatchResult> {
        let began = std::time::Instant::now();
        let mut client = composer_store::client(&self.pool).await?;
        // `BEGIN` goes with the locked read; its answer, in before the
        // read's, is checked before anything is written.
        let mut tx = composer_store::begin_pipelined(&mut client);
        let mut batch = Batch::lock(self, began, &tx, &requests).await?;
        tx.confirm().await?;
        batch.apply_events(&tx, requests).await?;
        batch.offer();
        batch.admit(&tx, starts).await?;
        let receipt = batch.write(&tx, published).await?;
        let handed = batch.hand_over(&tx).await?;
        tx.commit().await?;
        Ok(batch.answer(receipt, handed))
    }
}

impl Batch<'_> {
    /// Phase 5: what no report took goes to the polls waiting for work,
    /// then every run's change is written.
    async fn write(&mut self, tx: &composer_store::Transaction<'_>, published: &[i64]) -> Result<Receipt> {
        self.to_idle = self.engine.idle.give(self.runs.values_mut());
        self.engine.write(tx, self.runs.values_mut(), published).await
    }
}
