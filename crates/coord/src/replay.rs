//! Replays at work: every coordinator takes a running replay in turn (its
//! row locked, so one at a time works it), replays the next batch of the
//! events its filter matches, oldest first, and records the batch.
//!
//! Each event is replayed in a commit of its own, which locks the event's
//! row, reads what its triggers did, starts the run of each trigger that
//! fires now and has none, and records it in `event_runs`: an event worked
//! again after a crash, or by two replays at once, starts no trigger's run
//! twice. The triggers are those of the workflows' latest versions, as a
//! sending now would apply them; waiting steps are not sent the event again.

use std::collections::HashSet;

use composer_api::{ReplayFilter, ReplayPreview, ReplayTrigger, TriggerFailure};
use composer_store::replays::{self, Batch, EventFilter, ReplayRow};
use composer_store::triggers::LoggedEvent;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::engine::{Engine, EngineError};
use crate::shared::Shared;
use crate::triggers::{Planned, Sending, MAX_EVENT_RUNS};
use composer_store::Pool;
use std::sync::Arc;

/// Events one batch of a replay looks at.
pub const BATCH: i64 = 100;

/// A replay's filter as the store reads it.
pub fn event_filter(f: &ReplayFilter) -> EventFilter<'_> {
    EventFilter { name: f.name.as_deref(), key: f.key.as_deref(), from: f.from, to: f.to, failed_only: f.failed_only }
}

/// Works one batch of one running replay, if any; true when there was one
/// and the next may follow at once (false after a passing failure: the
/// caller waits before the event is looked at again).
pub async fn work_one_batch(s: &Shared) -> Result<bool, composer_store::Error> {
    let mut client = composer_store::client(&s.pool).await?;
    let tx = composer_store::begin(&mut client).await?;
    let Some(job) = replays::claim(&tx).await? else { return Ok(false) };
    let filter = stored_filter(&job)?;
    let read = composer_store::client(&s.pool).await?;
    let seqs = replays::next(&read, &event_filter(&filter), job.cursor, job.until_seq, BATCH).await?;
    drop(read);
    let mut batch = Batch { done: (seqs.len() as i64) < BATCH, ..Batch::default() };
    let mut last_error = None;
    let mut passing = false;
    for seq in seqs {
        match replay_one(s, job.id, seq).await {
            Ok(Replayed { started, failed }) => {
                batch.started += started;
                batch.failed += failed;
            }
            // The event is looked at again, by the next batch.
            Err(e) if !e.is_permanent() => {
                last_error = Some(e.to_string());
                batch.done = false;
                passing = true;
                break;
            }
            Err(e) => {
                tracing::warn!(replay = %job.id, seq, error = %e, "replaying an event failed");
                batch.failed += 1;
                last_error = Some(e.to_string());
            }
        }
        batch.cursor = Some(seq);
        batch.looked_at += 1;
    }
    replays::advance(&tx, job.id, &batch, last_error.as_deref()).await?;
    tx.commit().await?;
    if batch.done {
        tracing::info!(replay = %job.id, "replay done");
    }
    Ok(!passing)
}

fn stored_filter(job: &ReplayRow) -> Result<ReplayFilter, composer_store::Error> {
    serde_json::from_value(job.filter.clone())
        .map_err(|e| composer_store::Error::Corrupt(format!("replay {}: its filter: {e}", job.id)))
}

/// What replaying one event did.
#[derive(Debug, Default)]
struct Replayed {
    started: i64,
    failed: i64,
}

/// The event as its triggers see it (as a sending gives it them), with its
/// payload read back when it was kept as an object.
async fn trigger_input(engine: &Engine, e: &LoggedEvent) -> Result<Value, EngineError> {
    let mut payload = e.payload.clone().unwrap_or(Value::Null);
    crate::payloads::resolve(engine.payloads(), &mut payload).await?;
    Ok(json!({"id": e.event_id, "name": e.name, "key": e.key, "payload": payload, "source": e.source}))
}

/// Replays event `seq` for replay `replay`.
async fn replay_one(s: &Shared, replay: Uuid, seq: i64) -> Result<Replayed, EngineError> {
    let event = {
        let client = composer_store::client(&s.pool).await?;
        composer_store::triggers::by_seq(&client, seq).await?
    };
    // Forgotten since it was matched: nothing to replay.
    let Some(event) = event else { return Ok(Replayed::default()) };
    let input = trigger_input(&s.engine, &event).await?;
    // Evaluated before the transaction, holding no connection.
    let planned = crate::triggers::plan(&s.pool, &s.engine, &event.name, &input).await?;
    let mut client = composer_store::client(&s.pool).await?;
    let mut tx = composer_store::begin(&mut client).await?;
    if !replays::lock_event(&tx, seq).await? {
        return Ok(Replayed::default());
    }
    let done = replays::runs_of(&tx, seq).await?;
    let has_run: HashSet<(String, i32)> =
        done.iter().filter(|r| r.run_id.is_some()).map(|r| (r.workflow.clone(), r.trigger)).collect();
    let owed: Vec<Planned> =
        planned.into_iter().filter(|p| !has_run.contains(&(p.def.name.clone(), p.index as i32))).collect();
    if owed.iter().all(|p| matches!(p.fired, Ok(None))) {
        return Ok(Replayed::default());
    }
    let sending = Sending {
        config: &s.config,
        engine: &s.engine,
        name: &event.name,
        event_id: &event.event_id,
        traceparent: None,
        replay: Some(replay),
    };
    let (runs, started) = sending.start_runs(&mut tx, owed, has_run.len()).await?;
    for run in &runs {
        replays::record(&tx, seq, run, replay).await?;
    }
    tx.commit().await?;
    let replayed =
        Replayed { started: started.len() as i64, failed: runs.iter().filter(|r| r.run_id.is_none()).count() as i64 };
    for s_ in started {
        s.engine.started(s_);
    }
    Ok(replayed)
}

/// Most events a dry run shows what replaying would do.
pub const PREVIEWED: i64 = 20;

/// What replaying the first [`PREVIEWED`] events `filter` matches would
/// start now, and which of their triggers would fail.
pub async fn preview(
    pool: &Pool,
    engine: &Arc<Engine>,
    filter: &ReplayFilter,
) -> Result<Vec<ReplayPreview>, EngineError> {
    let seqs = {
        let client = composer_store::client(pool).await?;
        replays::next(&client, &event_filter(filter), 0, i64::MAX, PREVIEWED).await?
    };
    let mut shown = Vec::new();
    for seq in seqs {
        let client = composer_store::client(pool).await?;
        let Some(event) = composer_store::triggers::by_seq(&client, seq).await? else { continue };
        drop(client);
        let input = trigger_input(engine, &event).await?;
        let has_run: HashSet<(String, i32)> =
            event.runs.iter().filter(|r| r.run_id.is_some()).map(|r| (r.workflow.clone(), r.trigger)).collect();
        let mut p = ReplayPreview {
            seq,
            name: event.name.clone(),
            id: event.event_id.clone(),
            received_at: event.received_at,
            would_start: Vec::new(),
            would_fail: Vec::new(),
        };
        for planned in crate::triggers::plan(pool, engine, &event.name, &input).await? {
            let (workflow, trigger) = (planned.def.name.clone(), planned.index as i32);
            if has_run.contains(&(workflow.clone(), trigger)) {
                continue;
            }
            match planned.fired {
                Ok(None) => {}
                Ok(Some(_)) if has_run.len() + p.would_start.len() >= MAX_EVENT_RUNS => {
                    p.would_fail.push(TriggerFailure {
                        workflow,
                        trigger,
                        error: format!("the event already started {MAX_EVENT_RUNS} runs (max_event_runs)"),
                    })
                }
                Ok(Some(_)) => p.would_start.push(ReplayTrigger { workflow, trigger }),
                Err(error) => p.would_fail.push(TriggerFailure { workflow, trigger, error }),
            }
        }
        shown.push(p);
    }
    Ok(shown)
}
