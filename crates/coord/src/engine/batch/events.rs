//! Phase 2: apply each request's event to its locked run, in order. A
//! worker's report applies only while the worker holds the attempt's lease
//! (as the batch locked it); a bulk job's action at most once per run
//! (marked in this transaction); an operator's action carries who and why
//! into the history. A move to another version renames the run's steps
//! and switches the run to the new version before the machine sees it.

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
        let store = Tx(tx, &self.engine.payloads);
        for EventRequest { run_id, mut event, by, trace_note } in requests {
            let mut updating = None;
            let Some(loaded) = self.runs.get_mut(&run_id) else {
                self.answers.push(Err(EngineError::RunNotFound(run_id)));
                continue;
            };
            // A move swaps the version the run's tasks index: no change of
            // this transaction to them may come before it.
            let changed = !loaded.tr.updated.is_empty() || !loaded.tr.created.is_empty();
            if changed && matches!(event, Event::Migrate { .. }) {
                return Err(EngineError::MovedWithOthers { run_id });
            }
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
                By::Update(accepted) => {
                    // Decided under another version than the run is on now
                    // (moved since): sent back to be decided again.
                    let moved = loaded.definition.0 != accepted.definition;
                    if moved || !composer_store::updates::record_accepted(tx, run_id, &accepted).await? {
                        self.answers.push(Err(EngineError::AlreadyDone));
                        continue;
                    }
                    updating = Some(accepted);
                    (None, None)
                }
            };
            if let (Some(note), Some(_)) = (trace_note, &self.engine.traces) {
                note.add_to(&mut loaded.seen);
            }
            let name = event.name();
            if let Event::Migrate { definition, from_version, to_version, map } = &event {
                let versions = (*from_version, (*definition, *to_version));
                if let Err(refused) = self.engine.move_run(&store, loaded, versions, map).await? {
                    self.answers.push(Ok(Answer::new(loaded.run.status, Some(refused))));
                    continue;
                }
            }
            let voted = with_earlier_votes(tx, run_id, &mut event).await?;
            let mut tr = effects::apply(&store, &loaded.wf, &mut loaded.run, event).await?;
            if let (Some((at, vote)), None) = (voted, &tr.ignored) {
                composer_store::approvals::record(tx, at, &vote.person, &serde_json::json!(vote)).await?;
            }
            if let (Some(c), Some(first)) = (control, tr.history.first_mut()) {
                record_actor(&mut first.payload, c);
            }
            if let Some(u) = updating {
                note_update(tx, run_id, &u, &mut tr).await?;
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

/// An accepted update, once its event was applied: named in the history
/// line that records it, or forgotten when the step did not take it.
async fn note_update(
    tx: &composer_store::Transaction<'_>,
    run_id: Uuid,
    u: &composer_store::updates::Accepted,
    tr: &mut composer_core::machine::Transition,
) -> Result<()> {
    match (&tr.ignored, tr.history.first_mut()) {
        // Not applied: the update is not recorded either.
        (Some(_), _) => composer_store::updates::forget(tx, run_id, &u.id).await?,
        (None, Some(first)) => first.payload["update"] = serde_json::json!({"id": u.id, "name": u.name}),
        (None, None) => {}
    }
    Ok(())
}

/// A vote on an approval's attempt, judged with the votes cast before it,
/// read here under the run's lock: the vote and where it goes, to record
/// once it is applied; `None` for any other event.
async fn with_earlier_votes(
    tx: &composer_store::Transaction<'_>,
    run_id: Uuid,
    event: &mut Event,
) -> Result<Option<((Uuid, Uuid, i32), Box<composer_core::definition::approval::Vote>)>> {
    let Event::ApprovalVote { task_id, attempt, earlier, vote, .. } = event else { return Ok(None) };
    let stored = composer_store::approvals::votes(tx, *task_id, *attempt).await?;
    *earlier = stored.into_iter().filter_map(|v| serde_json::from_value(v).ok()).collect();
    Ok(Some(((run_id, *task_id, *attempt), vote.clone())))
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

impl super::super::Engine {
    /// Moves `loaded` to `definition` (its id and version) when it can move
    /// there under `map`: its steps renamed in storage and in the machine's
    /// form, and the new version is what the rest of the transaction applies
    /// its events under. `Err` names why it cannot move (nothing changed).
    async fn move_run(
        &self,
        store: &Tx<'_, '_>,
        loaded: &mut super::super::loaded::Loaded,
        (from_version, definition): (i32, (Uuid, i32)),
        map: &composer_core::machine::migrate::Mapping,
    ) -> Result<std::result::Result<(), String>> {
        let new = self.workflow(definition.0).await?;
        if new.spec.name != loaded.wf.spec.name {
            return Ok(Err(format!("version {} is of another workflow", definition.1)));
        }
        if loaded.definition.1 != from_version {
            return Ok(Err(format!("the run is on version {}, not {from_version}", loaded.definition.1)));
        }
        let renamed = match composer_core::machine::migrate::move_run(&loaded.wf, &new, &mut loaded.run, map) {
            Ok(renamed) => renamed,
            Err(plan) => return Ok(Err(plan.reasons.join("; "))),
        };
        composer_store::runs::move_to(store.0, loaded.run.id, definition, &renamed).await?;
        // A MAP the new version adds is charged to what the run's tree has
        // left, as the old version's would have been.
        if new.has_items() && !loaded.wf.has_items() {
            loaded.run.items_left = super::super::admission::items_left(store, loaded.root, self.bounds).await?;
        }
        loaded.wf = new;
        loaded.definition = definition;
        Ok(Ok(()))
    }
}
