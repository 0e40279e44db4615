//! `GET /v1/runs/{id}/explain`: why a run is where it is — for every open
//! step, what it waits for, in words and as data.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use chrono::Utc;
use composer_api::{ErrorBody, Explain, NodeWait};
use composer_core::machine::{RunStatus, TaskState};
use composer_store::runs::{self, RunFilter, RunRow, TaskRow};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::extract::{run_id, Path};
use crate::engine::Engine;
use composer_store::Pool;
use composer_stream::Streams;

/// Most PENDING tasks a queue's backlog counts.
const BACKLOG_CAP: i64 = 100_000;

/// Explain why a run waits.
///
/// For each open step of the run, what holds it.
#[utoipa::path(
    get, path = "/v1/runs/{id}/explain", operation_id = "explainRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "what each open step waits for", body = Explain),
              (status = 404, description = "no such run", body = ErrorBody))
)]
pub(crate) async fn explain(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(streams): State<Streams>,
    Path(id): Path<String>,
) -> ApiResult<Json<Explain>> {
    Ok(Json(explain_run(&pool, &engine, &streams, run_id(&id)?).await?))
}

/// What each open step of a run waits for (the API's and the run page's).
pub async fn explain_run(pool: &Pool, engine: &Engine, streams: &Streams, run_id: uuid::Uuid) -> ApiResult<Explain> {
    let mut client = composer_store::client(pool).await?;
    let (run, tasks) =
        runs::get(&client, run_id).await?.ok_or_else(|| ApiError::not_found(format!("run {run_id} not found")))?;
    let mut nodes = Vec::new();
    if run.status == RunStatus::Queued {
        let (open, ahead) = runs::queue_position(&client, &run).await?;
        let key = run.concurrency_key.clone().unwrap_or_default();
        let reason = format!(
            "queued by its workflow's concurrency limit (key {key:?}): {open} of its runs are open, {ahead} queued before it \
             (at priority {}, where fairness keys take turns)",
            run.priority
        );
        return Ok(Explain {
            run_id,
            status: run.status,
            summary: reason.clone(),
            nodes,
            detail: json!({"concurrency_key": key, "open": open, "queued_before": ahead, "priority": run.priority}),
        });
    }
    let children =
        runs::list(&mut client, &RunFilter { parent: Some(run_id), ..Default::default() }, None, 100).await?;
    let held = match tasks.iter().any(|t| t.state == TaskState::Pending && t.limit_keys.is_some()) {
        true => composer_store::limits::held_in_run(&client, run_id).await?,
        false => Default::default(),
    };
    for t in tasks.iter().filter(|t| !t.state.is_terminal()) {
        nodes.push(node_wait(engine, streams, &client, &run, t, &children, held.get(&t.id)).await?);
    }
    if run.status.is_terminal() {
        let (summary, detail) = why_it_ended(&run, &tasks);
        return Ok(Explain { run_id, status: run.status, summary, nodes, detail });
    }
    let summary = match (run.status, nodes.len()) {
        (RunStatus::Paused, _) => "paused: steps already running finish, nothing new starts until it is resumed".into(),
        (_, 0) => "nothing waits: the run is about to end".into(),
        (_, 1) => format!("waiting on 1 step: {}", nodes[0].reason),
        (_, n) => format!("waiting on {n} steps"),
    };
    Ok(Explain { run_id, status: run.status, summary, nodes, detail: Value::Null })
}

/// Why an ended run ended: the error that decided it (for a failed run, it
/// names the step), and the steps that failed, each with its last
/// attempt's error and code.
fn why_it_ended(run: &RunRow, tasks: &[TaskRow]) -> (String, Value) {
    let failed: Vec<Value> = tasks
        .iter()
        .filter(|t| t.state == TaskState::Failed && t.item_index.is_none())
        .map(|t| {
            let code = t.error_info.as_ref().and_then(|i| i.get("code")).cloned();
            json!({"node_id": t.node_id, "attempt": t.attempt, "error": t.error, "code": code})
        })
        .collect();
    let summary = match &run.error {
        Some(error) => format!("the run {}: {error}", run.status),
        None => format!("the run {}: nothing waits", run.status),
    };
    (summary, json!({"error": run.error, "failed_steps": failed}))
}

async fn node_wait(
    engine: &Engine,
    streams: &Streams,
    client: &composer_store::Client,
    run: &RunRow,
    t: &TaskRow,
    children: &[RunRow],
    held: Option<&composer_store::limits::Held>,
) -> ApiResult<NodeWait> {
    let now = Now(crate::clock::now());
    let paused = run.status == RunStatus::Paused;
    let (waiting_for, reason, detail) = match (t.state, t.node_type.as_str()) {
        (TaskState::Pending, _) => match held {
            Some(h) => held_by_limit(h, t, now),
            None => waiting_for_worker(engine, streams, client, run, t, now).await?,
        },
        (TaskState::Running, "SUB_WORKFLOW" | "LOOP") => waiting_for_child(children, t),
        (TaskState::Running, "MAP") => waiting_for_items(t),
        (TaskState::Running, _) => running(t, now),
        (TaskState::Waiting, "WAIT_FOR_EVENT") => waiting_for_event(client, t).await?,
        (TaskState::Waiting, _) => waiting_for_time(t, paused),
        (TaskState::InDoubt, _) => (
            "operator",
            format!(
                "in doubt ({}): say how it ended with `composer run resolve {} {} --outcome completed|failed|retry` \
                 (POST /v1/runs/{}/tasks/{}/resolve)",
                t.error.as_deref().unwrap_or_default(),
                run.id,
                t.node_id,
                run.id,
                t.node_id
            ),
            json!({"attempt": t.attempt}),
        ),
        (state, _) => ("engine", format!("{state}"), json!({})),
    };
    let reason = if paused && waiting_for != "paused" { format!("{reason} (the run is paused)") } else { reason };
    Ok(NodeWait { node_id: t.node_id.clone(), state: t.state, waiting_for: waiting_for.to_string(), reason, detail })
}

/// What a step waits for: its kind (`waiting_for`), the sentence that says
/// so, and the detail behind it.
type Wait = (&'static str, String, Value);

/// The time an explanation is given at.
#[derive(Clone, Copy)]
struct Now(chrono::DateTime<Utc>);

impl Now {
    /// Seconds since `at`.
    fn since(self, at: chrono::DateTime<Utc>) -> f64 {
        (self.0 - at).num_milliseconds().max(0) as f64 / 1000.0
    }

    /// Seconds until `at` (negative when past).
    fn until(self, at: chrono::DateTime<Utc>) -> f64 {
        (at - self.0).num_milliseconds() as f64 / 1000.0
    }
}

/// A pending step its limit holds back.
fn held_by_limit(h: &composer_store::limits::Held, t: &TaskRow, now: Now) -> Wait {
    let when = h.until.map(|at| format!(" (for {:.1} s more)", now.until(at).max(0.0))).unwrap_or_default();
    let why = match h.reason {
        "rate" => format!("its rate is used up until its next token{when}"),
        "concurrency" => "every slot of its concurrency is taken: it goes when one of its steps ends".into(),
        "retry_after" => format!("a target answered 429 and asked for a pause{when}"),
        _ => "its turn comes at the limiter's next pass".into(),
    };
    let reason = format!("held by its limit {:?}: {why}", h.key);
    (
        "limit",
        reason,
        json!({"key": h.key, "reason": h.reason, "until": h.until, "held_for_s": now.since(t.updated_at)}),
    )
}

/// A pending step waiting for a worker to read its queue: the queue's
/// backlog and the workers that read it last.
async fn waiting_for_worker(
    engine: &Engine,
    streams: &Streams,
    client: &composer_store::Client,
    run: &RunRow,
    t: &TaskRow,
    now: Now,
) -> ApiResult<Wait> {
    let queue = t.queue.clone().unwrap_or_default();
    let (backlog, oldest) = runs::queue_backlog(client, &queue, BACKLOG_CAP).await?;
    let mut readers = Vec::new();
    for shard in 0..engine.shards().max(1) as u32 {
        let stream = streams.keys().stream(&queue, run.priority, shard);
        for (name, idle_ms, pending) in streams.consumers(&stream).await.unwrap_or_default() {
            readers.push(json!({"worker": name, "stream": stream, "idle_ms": idle_ms, "pending": pending}));
        }
    }
    let last_read = readers.iter().filter_map(|r| r["idle_ms"].as_u64()).min();
    let waited = now.since(t.updated_at);
    let who = match last_read {
        None => "no worker has read this queue".to_string(),
        Some(ms) if ms > 60_000 => format!("no worker has read it for {} min", ms / 60_000),
        Some(ms) => format!("a worker read it {:.1} s ago", ms as f64 / 1000.0),
    };
    let reason =
        format!("waiting for a worker on queue {queue:?} for {waited:.1} s: {backlog} task(s) wait there; {who}");
    Ok((
        "worker",
        reason,
        json!({"queue": queue, "backlog": backlog, "oldest_pending_since": oldest, "pending_for_s": waited,
               "last_read_ms_ago": last_read, "readers": readers}),
    ))
}

/// A running SUB_WORKFLOW or LOOP: its child run.
fn waiting_for_child(children: &[RunRow], t: &TaskRow) -> Wait {
    let child = children.iter().find(|c| c.parent.is_some_and(|p| p.task_id == t.id && p.attempt == t.attempt));
    match child {
        Some(c) => (
            "child_run",
            format!("waiting for its child run {} ({}, workflow {})", c.id, c.status, c.workflow_name),
            json!({"child_run_id": c.id, "child_status": c.status, "iteration": t.iteration}),
        ),
        None => ("child_run", "its child run is being started".to_string(), json!({"iteration": t.iteration})),
    }
}

/// A running MAP: its items.
fn waiting_for_items(t: &TaskRow) -> Wait {
    let p = t.map_progress().unwrap_or_default();
    let max = t.input["max_concurrency"].as_u64();
    (
        "items",
        format!(
            "{} of {} items done, {} running{}, {} to start",
            p.completed + p.failed,
            p.total,
            p.open,
            max.map(|m| format!(" (at most {m} at once)")).unwrap_or_default(),
            p.queued
        ),
        json!({"progress": p, "max_concurrency": max}),
    )
}

/// A step running on a worker, under its lease.
fn running(t: &TaskRow, now: Now) -> Wait {
    let owner = t.lease_owner.clone().unwrap_or_default();
    let expires = t.lease_expires_at;
    (
        "worker",
        format!(
            "running on worker {owner:?} for {:.1} s{}",
            t.started_at.map(|at| now.since(at)).unwrap_or_default(),
            expires.map(|e| format!(", its lease ends in {:.1} s", now.until(e))).unwrap_or_default()
        ),
        json!({"worker": owner, "lease_expires_at": expires, "started_at": t.started_at}),
    )
}

/// A WAIT_FOR_EVENT: the event's name and key, and whether one waits
/// buffered.
async fn waiting_for_event(client: &composer_store::Client, t: &TaskRow) -> ApiResult<Wait> {
    let (name, key) = (t.event_name.clone().unwrap_or_default(), t.event_key.clone().unwrap_or_default());
    let buffered = composer_store::events::is_buffered(client, &name, &key).await?;
    let until = t.wake_at.map(|w| format!(", timing out at {w}")).unwrap_or_default();
    Ok((
        "event",
        format!("waiting for event {name:?} with key {key:?}{until}"),
        json!({"event": name, "key": key, "timeout_at": t.wake_at, "buffered": buffered}),
    ))
}

/// Any other waiting step: held by a pause, a retry's backoff, or a timer.
fn waiting_for_time(t: &TaskRow, paused: bool) -> Wait {
    if t.wake_at.is_none() && paused {
        return ("paused", "held by the pause: it starts when the run resumes".to_string(), json!({}));
    }
    if t.error.is_some() {
        return (
            "retry",
            format!(
                "attempt {} failed ({}); the next starts at {}",
                t.attempt,
                t.error.as_deref().unwrap_or_default(),
                t.wake_at.map(|w| w.to_rfc3339()).unwrap_or_else(|| "the resume".into())
            ),
            json!({"retry_at": t.wake_at, "attempt": t.attempt, "error": t.error}),
        );
    }
    (
        "timer",
        format!("a timer, due at {}", t.wake_at.map(|w| w.to_rfc3339()).unwrap_or_else(|| "never".into())),
        json!({"wake_at": t.wake_at}),
    )
}
