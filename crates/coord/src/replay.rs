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
use composer_core::flow::Hold;
use composer_store::replays::{self, EventFilter, ReplayRow};
use composer_store::triggers::{EventRun, LoggedEvent};
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

/// Passing failures of one event before it is counted failed and the
/// replay moves on (a definition quarantined, a store that keeps failing).
pub const MAX_TRIES: i32 = 5;

/// Works one batch of one running replay, if any; true when there was one
/// and the next may follow at once (false after a passing failure: the
/// caller waits before the event is looked at again).
pub async fn work_one_batch(s: &Shared) -> Result<bool, composer_store::Error> {
    let client = composer_store::client(&s.pool).await?;
    let Some(job) = replays::claim(&client).await? else { return Ok(false) };
    let filter = stored_filter(&job)?;
    let seqs = replays::next(&client, &event_filter(&filter), job.cursor, job.until_seq, BATCH).await?;
    let done = (seqs.len() as i64) < BATCH;
    for seq in seqs {
        match replay_one(s, job.id, seq).await {
            Ok(Some(_)) => {}
            // Cancelled, or taken over: this coordinator stops here.
            Ok(None) => return Ok(true),
            Err(e) if is_passing(&e) => {
                let tries = replays::passing_failure(&client, job.id, &e.to_string(), PAUSE).await?;
                if tries < MAX_TRIES || is_quota(&e) {
                    return Ok(false);
                }
                tracing::warn!(replay = %job.id, seq, error = %e, tries, "replaying an event keeps failing; counted failed");
                pass_over(s, job.id, seq, 1, Some(&e.to_string())).await?;
            }
            Err(e) => {
                tracing::warn!(replay = %job.id, seq, error = %e, "replaying an event failed");
                pass_over(s, job.id, seq, 1, Some(&e.to_string())).await?;
            }
        }
    }
    replays::release(&client, job.id, done).await?;
    if done {
        tracing::info!(replay = %job.id, "replay done");
    }
    Ok(true)
}

/// Moves the replay's cursor past event `seq` without replaying it (it
/// was forgotten, or counted `failed`).
async fn pass_over(
    s: &Shared,
    replay: Uuid,
    seq: i64,
    failed: i64,
    error: Option<&str>,
) -> Result<(), composer_store::Error> {
    let mut client = composer_store::client(&s.pool).await?;
    let tx = composer_store::begin(&mut client).await?;
    replays::looked_at(&tx, replay, seq, 0, failed, error).await?;
    tx.commit().await
}

/// How long a replay rests after a passing failure before any coordinator
/// takes it again.
const PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

fn is_passing(e: &EngineError) -> bool {
    !e.is_permanent()
}

/// Over the namespace's quota: the replay waits, however long, and the
/// event is not counted failed.
fn is_quota(e: &EngineError) -> bool {
    matches!(e, EngineError::Rejected(crate::engine::Rejection::OverQuota { .. }))
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

/// The planned triggers a replay of an event starts: those of the
/// workflows that have no run for it yet. A workflow with a run for the
/// event is left as it is: a trigger is known by its place in the
/// workflow's `triggers`, which a new version may shift, so a failed
/// trigger of such a workflow could be another trigger that already ran.
fn owed(planned: Vec<Planned>, done: &[EventRun]) -> Vec<Planned> {
    // An event a flow control held, replaced or dropped was taken as it meant.
    let taken = |r: &&EventRun| r.run_id.is_some() || (r.flow.is_some() && r.error.is_none());
    let with_run: HashSet<&str> = done.iter().filter(taken).map(|r| r.workflow.as_str()).collect();
    planned.into_iter().filter(|p| !with_run.contains(p.def.name.as_str())).collect()
}

/// Replays event `seq` for replay `replay`: `None` when the replay no
/// longer holds it (cancelled, or the event was replayed by another
/// coordinator that took the replay over).
async fn replay_one(s: &Shared, replay: Uuid, seq: i64) -> Result<Option<Replayed>, EngineError> {
    let event = {
        let client = composer_store::client(&s.pool).await?;
        composer_store::triggers::by_seq(&client, seq).await?
    };
    // Forgotten since it was matched: nothing to replay.
    let Some(event) = event else {
        pass_over(s, replay, seq, 0, None).await?;
        return Ok(Some(Replayed::default()));
    };
    let input = trigger_input(&s.engine, &event).await?;
    // Evaluated before the transaction, holding no connection.
    let planned = crate::triggers::plan(&s.pool, &s.engine, &event.name, &input).await?;
    let mut client = composer_store::client(&s.pool).await?;
    let mut tx = composer_store::begin(&mut client).await?;
    if !replays::lock_for(&tx, replay, seq).await? {
        return Ok(None);
    }
    let mut replayed = Replayed::default();
    if replays::lock_event(&tx, seq).await? {
        let done = replays::runs_of(&tx, seq).await?;
        let already = done.iter().filter(|r| r.run_id.is_some()).count();
        let sending = Sending {
            config: &s.config,
            engine: &s.engine,
            seq,
            name: &event.name,
            event_id: &event.event_id,
            traceparent: None,
            replay: Some(replay),
        };
        let (runs, after) = sending.start_runs(&mut tx, owed(planned, &done), already).await?;
        for run in &runs {
            replays::record(&tx, seq, run).await?;
        }
        replayed.started = runs.iter().filter(|r| r.replayed_by.is_some() && r.run_id.is_some()).count() as i64;
        // Held, replaced or dropped by a flow control is taken, not failed.
        replayed.failed = runs.iter().filter(|r| r.run_id.is_none() && r.error.is_some()).count() as i64;
        replays::looked_at(&tx, replay, seq, replayed.started, replayed.failed, None).await?;
        tx.commit().await?;
        after.run(&s.engine).await;
    } else {
        replays::looked_at(&tx, replay, seq, 0, 0, None).await?;
        tx.commit().await?;
    }
    Ok(Some(replayed))
}

/// Most events a dry run shows what replaying would do.
pub const PREVIEWED: i64 = 20;

/// The longest a dry run spends working out what the events would start:
/// past it, it shows the events it got to.
pub const PREVIEW_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// What replaying the first [`PREVIEWED`] events `filter` matches would
/// start now, and which of their triggers would fail, for as many as
/// [`PREVIEW_BUDGET`] allows.
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
    let until = tokio::time::Instant::now() + PREVIEW_BUDGET;
    for seq in seqs {
        let client = composer_store::client(pool).await?;
        let Some(event) = composer_store::triggers::by_seq(&client, seq).await? else { continue };
        drop(client);
        let mut p = ReplayPreview {
            seq,
            name: event.name.clone(),
            id: event.event_id.clone(),
            received_at: event.received_at,
            would_start: Vec::new(),
            would_fail: Vec::new(),
            error: None,
        };
        let planned = async {
            let input = trigger_input(engine, &event).await?;
            crate::triggers::plan(pool, engine, &event.name, &input).await
        };
        match tokio::time::timeout_at(until, planned).await {
            Err(_) => break,
            Ok(Err(e)) => p.error = Some(e.to_string()),
            Ok(Ok(planned)) => preview_one(&mut p, owed(planned, &event.runs), &event.runs),
        }
        shown.push(p);
    }
    Ok(shown)
}

/// What the planned triggers of one event would do, into its preview.
fn preview_one(p: &mut ReplayPreview, planned: Vec<Planned>, done: &[EventRun]) {
    let already = done.iter().filter(|r| r.run_id.is_some()).count();
    for planned in planned {
        let (workflow, trigger) = (planned.def.name.clone(), planned.index as i32);
        match planned.fired {
            Ok(None) => {}
            Ok(Some(_)) if already + p.would_start.len() >= MAX_EVENT_RUNS => p.would_fail.push(TriggerFailure {
                workflow,
                trigger,
                error: format!("the event already started {MAX_EVENT_RUNS} runs (max_event_runs)"),
            }),
            Ok(Some(fired)) => {
                let flow = fired.flow.map(|f| f.hold.as_ref().map_or("singleton", Hold::name).to_string());
                p.would_start.push(ReplayTrigger { workflow, trigger, flow })
            }
            Err(error) => p.would_fail.push(TriggerFailure { workflow, trigger, error }),
        }
    }
}
