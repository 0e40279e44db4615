//! Events that start runs. An event (`POST /v1/events`, or a webhook's
//! delivery) is recorded once by its name and id, and in that same commit
//! every trigger of every workflow listening to its name that matches
//! starts its run: a coordinator that dies before the commit leaves neither
//! the event nor its runs, so the sender's retry (the same id) does it all
//! once, and one that dies after leaves both, so the retry starts nothing
//! and answers the same runs. Waiting steps get the event after the commit,
//! as before triggers existed (see [`composer_store::events`]).

use composer_api::{EventSent, TriggerFailure, TriggerHeld, TriggeredRun};
use composer_core::definition::{Fired, Workflow};
use composer_core::machine::Event;
use composer_store::definitions::DefinitionRow;
use composer_store::triggers::{self, EventRun, LoggedEvent, NewEvent};
use serde_json::{json, Value};
use std::sync::Arc;
use uuid::Uuid;

use crate::config::Config;
use crate::engine::evaluator::Subject;
use crate::engine::starts::{StartOptions, Started};
use crate::engine::Engine;
use crate::engine::{EngineError, EventRequest, Rejection};
use crate::flows::{AfterCommit, Arrival};
use composer_store::Pool;

/// An event as it arrived, checked for size by the caller.
pub struct Incoming<'a> {
    pub name: &'a str,
    pub key: &'a str,
    /// The sender's id; one is made when `None`.
    pub id: Option<&'a str>,
    pub payload: &'a Value,
    /// `api`, or `webhook:NAME`.
    pub source: &'a str,
    /// The sender's W3C `traceparent`: the runs the event starts continue
    /// its trace, the steps it completes link to it.
    pub traceparent: Option<&'a str>,
}

/// What sending an event did: its answer, and for an event sent before,
/// the key and payload the first sending recorded (to tell a retry from an
/// id reused for another event).
pub struct Sent {
    pub answer: EventSent,
    pub first: Option<(String, Value)>,
}

/// Most runs one event may start (`max_event_runs`); the triggers past it
/// are listed as failed.
pub const MAX_EVENT_RUNS: usize = 100;

/// Longest error of a trigger kept with its event, in bytes.
const MAX_TRIGGER_ERROR: usize = 1024;

/// What a matching trigger asks for, worked out before the transaction.
pub(crate) struct Planned {
    pub def: DefinitionRow,
    pub index: usize,
    pub fired: Result<Option<Fired>, String>,
}

/// Records the event, starts what its triggers start, delivers it to the
/// steps waiting for it, and says what it did.
pub async fn send(config: &Config, pool: &Pool, engine: &Arc<Engine>, ev: Incoming<'_>) -> Result<Sent, EngineError> {
    let event_id = ev.id.map_or_else(|| Uuid::now_v7().to_string(), str::to_string);
    let offloads = config.offloads_events_and_logs() && engine.payloads().offloads(Uuid::nil(), ev.payload);
    if offloads && ev.id.is_some() {
        // A retry of a large event: answered before its payload is written again.
        let client = composer_store::client(pool).await?;
        if let Some(first) = triggers::find(&client, ev.name, &event_id).await? {
            let recorded = Some((first.key.clone(), first.payload.clone().unwrap_or(Value::Null)));
            return Ok(Sent { answer: duplicate(&event_id, Some(first)), first: recorded });
        }
    }
    let event = json!({"id": event_id, "name": ev.name, "key": ev.key, "payload": ev.payload, "source": ev.source});
    let planned = plan(pool, engine, ev.name, &event).await?;
    // A large payload is kept as an object, written before the commit that
    // names it; its rows hold the reference. Triggers and waiters get it whole.
    let offloaded = match offloads {
        true => engine.payloads().offload_event(ev.payload).await.map_err(crate::payloads::store_error)?,
        false => None,
    };
    let stored = offloaded.as_ref().unwrap_or(ev.payload);
    let mut client = composer_store::client(pool).await?;
    let mut tx = composer_store::begin(&mut client).await?;
    let logged = NewEvent { name: ev.name, event_id: &event_id, key: ev.key, payload: stored, source: ev.source };
    let Some(seq) = triggers::log_event(&tx, logged).await? else {
        tx.rollback().await?;
        let first = triggers::find(&client, ev.name, &event_id).await?;
        let recorded = first.as_ref().map(|f| (f.key.clone(), f.payload.clone().unwrap_or(Value::Null)));
        return Ok(Sent { answer: duplicate(&event_id, first), first: recorded });
    };
    let sending =
        Sending { config, engine, seq, name: ev.name, event_id: &event_id, traceparent: ev.traceparent, replay: None };
    let (runs, after) = sending.start_runs(&mut tx, planned, 0).await?;
    for run in &runs {
        triggers::record_run(&tx, seq, run).await?;
    }
    // Last: this takes the (name, key) lock the waiters share, held to the commit.
    let (buffered_id, waiters) =
        composer_store::events::record(&tx, ev.name, ev.key, stored, config.event_retention, seq).await?;
    tx.commit().await?;
    after.run(engine).await;
    let link = ev.traceparent.and_then(|t| composer_core::trace::TraceContext::parse(t).ok());
    let delivered = deliver(engine, &client, buffered_id, &waiters, ev.payload, link).await?;
    if delivered > 0 {
        triggers::add_delivered(&client, seq, delivered as i32).await?;
    }
    Ok(Sent { answer: answer(event_id, delivered, &runs, false), first: None })
}

/// What every trigger of the workflows listening to events named `name`
/// asks of `event`, those that match. The triggers are evaluated before the
/// transaction, holding no connection: an evaluation may take its whole
/// time limit, and waits for an evaluation thread.
pub(crate) async fn plan(
    pool: &Pool,
    engine: &Arc<Engine>,
    name: &str,
    event: &Value,
) -> Result<Vec<Planned>, EngineError> {
    let mut listening = Vec::new();
    {
        let client = composer_store::client(pool).await?;
        for workflow in triggers::workflows_for(&client, name).await? {
            if let Some(def) = composer_store::definitions::by_name(&client, &workflow, None).await? {
                listening.push(def);
            }
        }
    }
    let mut planned = Vec::new();
    for def in listening {
        // A definition that no longer compiles fails its triggers, not the event.
        let wf = match engine.compile(&def) {
            Ok(wf) => wf,
            Err(e) if e.is_permanent() => {
                planned.push(Planned { def, index: 0, fired: Err(format!("the workflow cannot be compiled: {e}")) });
                continue;
            }
            Err(e) => return Err(e),
        };
        for (index, fired) in evaluate(def.id, wf, name, event).await {
            if !matches!(fired, Ok(None)) {
                planned.push(Planned { def: def.clone(), index, fired });
            }
        }
    }
    Ok(planned)
}

/// One event being recorded, or replayed (kept beside the flow control
/// that takes it too).
pub(crate) use crate::flows::Sending;

impl Sending<'_> {
    /// Starts in `tx` the run of each planned trigger that fired, up to
    /// [`MAX_EVENT_RUNS`] with the `already` the event started, or hands
    /// the event to the trigger's flow control; returns what each trigger
    /// did, and the runs started, to hand to the engine after the commit.
    pub async fn start_runs(
        &self,
        tx: &mut composer_store::Transaction<'_>,
        planned: Vec<Planned>,
        already: usize,
    ) -> Result<(Vec<EventRun>, AfterCommit), EngineError> {
        let mut runs: Vec<EventRun> = Vec::new();
        let mut after = AfterCommit::default();
        // The runs the event itself started (not those of events held before).
        let mut own = 0;
        for Planned { def, index, fired } in planned {
            let mut run = EventRun {
                workflow: def.name.clone(),
                trigger: index as i32,
                run_id: None,
                error: None,
                replayed_by: self.replay,
                flow: None,
                flow_note: None,
            };
            match fired {
                Ok(None) => continue,
                Err(e) => run.error = Some(e),
                Ok(Some(_)) if already + own >= MAX_EVENT_RUNS => {
                    run.error = Some(format!("the event already started {MAX_EVENT_RUNS} runs (max_event_runs)"));
                }
                Ok(Some(mut fired)) => match fired.flow.take() {
                    Some(flowed) => {
                        let arrival = Arrival { sending: self, def: &def, index };
                        arrival.arrive(tx, fired, flowed, &mut run, &mut after).await?;
                    }
                    None => match self.start_fired(tx, &def, index, fired).await? {
                        Ok(s) => {
                            run.run_id = Some(s.row.id);
                            // An idempotency key found a run another started.
                            if !s.new {
                                run.replayed_by = None;
                            }
                            after.started.push(s);
                        }
                        Err(why) => run.error = Some(why),
                    },
                },
            }
            own += usize::from(run.run_id.is_some());
            if let Some(e) = &mut run.error {
                *e = composer_core::clipped(e, MAX_TRIGGER_ERROR);
                tracing::warn!(workflow = %run.workflow, trigger = index, event = %self.name, error = %e, "trigger started no run");
            }
            runs.push(run);
        }
        Ok((runs, after))
    }

    /// Starts the run trigger `index` of `def` fired; `Ok(Err(why))` when
    /// its input, its key or the definition refused it.
    async fn start_fired(
        &self,
        tx: &mut composer_store::Transaction<'_>,
        def: &DefinitionRow,
        index: usize,
        fired: Fired,
    ) -> Result<Result<Started, String>, EngineError> {
        let Fired { input, idempotency_key, .. } = fired;
        // As a start's input: past COMPOSER_MAX_PAYLOAD only with offloading.
        if let Err(why) = composer_core::storable::check(&input, "input", self.config.max_value()) {
            return Ok(Err(format!("the run's input: {why}")));
        }
        if idempotency_key.as_deref().is_some_and(|k| k.contains('\0')) {
            return Ok(Err("idempotency_key: contains a NUL character, which cannot be stored".into()));
        }
        let mut trigger = json!({"event": self.name, "event_id": self.event_id, "trigger": index});
        if let Some(replay) = self.replay {
            trigger["replay"] = json!(replay);
        }
        let opts = StartOptions {
            idempotency_key: idempotency_key.as_deref(),
            trigger: Some(&trigger),
            traceparent: self.traceparent,
            ..Default::default()
        };
        // A savepoint: a start refused half way leaves the rest standing.
        let sp = tx.savepoint("trigger_start").await?;
        match self.engine.start_run_in(&sp, def, &input, opts).await {
            Ok(s) => {
                sp.commit().await?;
                Ok(Ok(s))
            }
            // A replay waits for the quota rather than failing its trigger.
            Err(e @ EngineError::Rejected(Rejection::OverQuota { .. })) if self.replay.is_some() => Err(e),
            Err(EngineError::Rejected(why)) => {
                sp.rollback().await?;
                Ok(Err(why.to_string()))
            }
            Err(e) => Err(e),
        }
    }
}

/// Each trigger of `wf` (of the definition `definition_id`) for events
/// named `name` applied to `event`, by its place in the definition, through
/// the evaluator's door (a trigger is an expression someone wrote).
async fn evaluate(
    definition_id: Uuid,
    wf: Arc<Workflow>,
    name: &str,
    event: &Value,
) -> Vec<(usize, Result<Option<Fired>, String>)> {
    let simple = wf.triggers.iter().filter(|t| t.event == name).all(|t| t.is_simple());
    let input = (wf, name.to_string(), event.clone());
    let applied = crate::engine::evaluator::evaluate(
        Subject::Definition(definition_id),
        simple,
        input,
        |sb, (wf, name, event)| {
            wf.triggers
                .iter()
                .enumerate()
                .filter(|(_, t)| t.event == name)
                .map(|(i, t)| (i, t.fire(sb, &event)))
                .collect::<Vec<_>>()
        },
    )
    .await;
    applied.unwrap_or_else(|lost| vec![(0, Err(lost.to_string()))])
}

/// Delivers the event to the steps that were waiting for it; how many took
/// it. It was recorded first: an error here leaves it buffered, for the
/// recovery sweep to deliver, or for a later waiter. It is marked consumed
/// once a waiter has it.
async fn deliver(
    engine: &Arc<Engine>,
    client: &composer_store::Client,
    buffered_id: i64,
    waiters: &[composer_store::events::Waiter],
    payload: &Value,
    link: Option<composer_core::trace::TraceContext>,
) -> Result<usize, EngineError> {
    let mut taken_by = None;
    let mut matched = 0;
    for w in waiters {
        let event = Event::EventReceived { task_id: w.task_id, payload: payload.clone() };
        let note = crate::trace::TraceNote { task_id: Some(w.task_id), stages: None, link };
        if engine.handle(EventRequest::new(w.run_id, event).noting(note)).await?.ignored.is_none() {
            taken_by.get_or_insert(w.task_id);
            matched += 1;
        }
    }
    if let Some(task_id) = taken_by {
        composer_store::events::mark_consumed(client, buffered_id, task_id).await?;
    }
    Ok(matched)
}

fn answer(id: String, delivered: usize, runs: &[EventRun], duplicate: bool) -> EventSent {
    let started_runs = runs
        .iter()
        .filter_map(|r| {
            r.run_id.map(|run_id| TriggeredRun {
                workflow: r.workflow.clone(),
                trigger: r.trigger,
                run_id,
                replayed_by: r.replayed_by,
            })
        })
        .collect();
    let trigger_errors = runs
        .iter()
        .filter_map(|r| {
            r.error.clone().map(|error| TriggerFailure { workflow: r.workflow.clone(), trigger: r.trigger, error })
        })
        .collect();
    let held = runs
        .iter()
        .filter(|r| r.run_id.is_none() && r.error.is_none())
        .filter_map(|r| {
            Some(TriggerHeld {
                workflow: r.workflow.clone(),
                trigger: r.trigger,
                flow: r.flow.clone()?,
                note: r.flow_note.clone().unwrap_or_default(),
            })
        })
        .collect();
    EventSent {
        held,
        matched: delivered,
        buffered: delivered == 0,
        id,
        delivered_to_waiters: delivered,
        started_runs,
        trigger_errors,
        duplicate,
    }
}

/// What a recorded event did, as the answer to its sending says it.
pub fn outcome(e: &LoggedEvent) -> EventSent {
    answer(e.event_id.clone(), e.delivered as usize, &e.runs, false)
}

/// The answer to an event sent again: what the first sending did.
fn duplicate(id: &str, first: Option<LoggedEvent>) -> EventSent {
    match first {
        Some(e) => answer(id.to_string(), e.delivered as usize, &e.runs, true),
        // Forgotten between the refused insert and the read: as good as new,
        // but reported as seen, since it was.
        None => answer(id.to_string(), 0, &[], true),
    }
}

/// The oldest an event in the log may be: received `COMPOSER_EVENT_LOG_KEPT`
/// ago (a sender's retry comes within minutes, an operator's look or a
/// replay after a fix within days).
pub fn kept_since(config: &Config) -> chrono::DateTime<chrono::Utc> {
    // The setting is at most 3650 days: it converts.
    crate::clock::now() - chrono::Duration::from_std(config.event_log_kept).unwrap_or(chrono::Duration::days(7))
}

/// Forgets events received before [`kept_since`].
pub async fn forget_old_events(config: &Config, client: &composer_store::Client) -> Result<u64, composer_store::Error> {
    triggers::forget(client, kept_since(config)).await
}
