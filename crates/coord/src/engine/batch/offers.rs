//! Phase 3: lease what the events made ready to the workers whose reports
//! offered to take it, in this commit (eager dispatch). After every event:
//! a later one of the batch may have ended what an earlier one dispatched.
//! What an offer leaves is kept for runs a freed slot starts.

use composer_api::wire::EagerOffer;

use super::{Batch, Offer, Spare};

impl Batch<'_> {
    pub(super) fn offer(&mut self) {
        for Offer { at, run_id, worker, offer } in std::mem::take(&mut self.offers) {
            let Some(loaded) = self.runs.get_mut(&run_id) else { continue };
            let tasks = loaded.give_eagerly(&worker, &offer);
            let slots = offer.slots.saturating_sub(tasks.len() as u32);
            if slots > 0 {
                // The more urgent of the run's priority now and the one the
                // worker offered for (a run lowered since its step was sent
                // may report from an urgent slot).
                let priority = loaded.priority.min(offer.priority);
                self.spare.push(Spare { at, worker, offer: EagerOffer { slots, ..offer }, priority });
            }
            self.given.push((at, tasks));
        }
    }
}
