//! Phase 2: apply each request's event to its locked run, in order. A
//! worker's report applies only while the worker holds the attempt's lease
//! (as the batch locked it); a bulk job's action at most once per run
//! (marked in this transaction); an operator's action carries who and why
//! into the history.

use composer_core::machine::Event;
use uuid::Uuid;

use super::super::effects;
use super::super::error::{EngineError, Result};
use super::super::request::{Answer, By, Control, EventRequest};
use super::super::store::Tx;
use super::super::tally;
use super::{Batch, Leases, Offer};

impl Batch<'_> {
    pub(super) async fn apply_events(
        &mut self,
        tx: &composer_store::Transaction<'_>,
        requests: Vec<EventRequest>,
    ) -> Result<()> {
        let store = Tx(tx);
        for EventRequest { run_id, event, by, trace_note } in requests {
            let Some(loaded) = self.runs.get_mut(&run_id) else {
                self.answers.push(Err(EngineError::RunNotFound(run_id)));
                continue;
            };
            let (control, offer) = match by {
                By::Engine => (None, None),
                By::Worker(reporter) => {
                    if let Some(task_id) = lease_lost(&event, &reporter.worker, &self.leases) {
                        self.answers.push(Err(EngineError::LeaseLost(task_id)));
                        continue;
                    }
                    (None, reporter.offer.map(|o| (reporter.worker, o)))
                }
                By::Operator(control) => (Some(control), None),
                By::Bulk(control, job) => {
                    if !composer_store::bulk::mark(tx, job, run_id).await? {
                        self.answers.push(Err(EngineError::AlreadyDone));
                        continue;
                    }
                    (Some(control), None)
                }
            };
            if let (Some(note), Some(_)) = (trace_note, &self.engine.traces) {
                note.add_to(&mut loaded.seen);
            }
            let name = event.name();
            let mut tr = effects::apply(&store, &loaded.wf, &mut loaded.run, event).await?;
            if let (Some(c), Some(first)) = (control, tr.history.first_mut()) {
                record_actor(&mut first.payload, c);
            }
            tally::event(run_id, name, &tr, loaded.run.status);
            if let (Some((worker, offer)), None) = (offer, &tr.ignored) {
                self.offers.push(Offer { at: self.answers.len(), run_id, worker, offer });
            }
            self.answers.push(Ok(Answer::new(loaded.run.status, tr.ignored.clone())));
            loaded.tr.merge(tr);
        }
        Ok(())
    }
}

/// Who took a control action, and why, in the payload of its first
/// history entry.
fn record_actor(payload: &mut serde_json::Value, control: Control) {
    payload["actor"] = serde_json::json!(control.actor);
    if let Some(reason) = control.reason {
        payload["reason"] = serde_json::json!(reason);
    }
}

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
