//! The task API: workers in any language, with only a URL and the worker
//! token, lease tasks of custom node types over HTTP.
//!
//! The coordinator does for them what the Rust worker does for itself: it
//! reads the queue's streams in the workers' consumer group, takes the
//! leases in PostgreSQL (one statement for a batch, owner = the polling
//! worker's id), and acknowledges the messages, so from then on the lease
//! is the only record of who runs a task. A worker that stops heartbeating
//! loses the task to the next poller once the lease expires: polls take
//! over expired leases of their queues first, before they read new
//! messages. Each takeover counts as a recovery of the attempt, so an
//! attempt that keeps killing workers is failed by the recovery sweep
//! (`COMPOSER_MAX_DISPATCHES`) instead of going round for ever.
//!
//! Crashes: a coordinator that dies after reading and before leasing
//! leaves the task PENDING with its message unacknowledged, and the lost
//! dispatch sweep sends it again; one that dies after leasing leaves a
//! lease nobody heartbeats, taken over as above. A complete or fail is
//! applied only while the worker still holds the lease (409 otherwise): a
//! worker that lost its task cannot overwrite the result of the one that
//! took it over.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use composer_api::wire::{Dispatch, ReportAck};
use composer_api::{CompleteTask, ErrorBody, FailTask, LeaseExtended, LeasedTask, PollTasks, TaskBatch, TaskHeartbeat};
use composer_core::machine::Event;
use composer_store::leases::LeaseManager;
use uuid::Uuid;

use crate::api::{ApiError, ApiResult, Body};
use crate::Shared;

/// Most tasks one poll may lease (`max`).
pub const MAX_POLL_TASKS: u32 = 100;
/// Most queues one poll may name.
pub const MAX_POLL_QUEUES: usize = 32;
/// Longest time between two reads of an idle long-poll (another
/// coordinator's publishes are seen by reading; this one's wake it).
const IDLE_READ_EVERY: Duration = Duration::from_millis(200);

fn lease_lost(task_id: Uuid) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "lease_lost",
        format!(
            "task {task_id}: this worker no longer holds its lease (it expired and was taken over, or the task ended)"
        ),
    )
}

fn task_id(id: &str) -> ApiResult<Uuid> {
    id.parse().map_err(|_| ApiError::bad_request(format!("invalid task id {id:?}: expected a UUID")))
}

fn check_worker(worker_id: &str) -> ApiResult<()> {
    composer_core::definition::check_name("worker_id", worker_id).map_err(ApiError::bad_request)
}

/// Lease tasks of the given queues.
///
/// Answers as soon as at least one task is leased, or after `wait` with
/// none. Each task comes with its lease's length: heartbeat within it.
#[utoipa::path(
    post, path = "/v1/tasks/poll", operation_id = "pollTasks", tag = "workers",
    request_body = PollTasks,
    responses((status = 200, description = "the tasks leased (none when none came within `wait`)", body = TaskBatch))
)]
pub(crate) async fn poll(State(s): State<Arc<Shared>>, Body(req): Body<PollTasks>) -> ApiResult<Json<TaskBatch>> {
    check_worker(&req.worker_id)?;
    if req.queues.is_empty() || req.queues.len() > MAX_POLL_QUEUES {
        return Err(ApiError::bad_request(format!("queues: name 1 to {MAX_POLL_QUEUES} queues")));
    }
    for q in &req.queues {
        composer_core::definition::check_name("queues", q).map_err(ApiError::bad_request)?;
    }
    let max = req.max.unwrap_or(1);
    if !(1..=MAX_POLL_TASKS).contains(&max) {
        return Err(ApiError::bad_request(format!("max: expected 1 to {MAX_POLL_TASKS}, got {max}")));
    }
    // Longer waits are cut to the limit, as `?wait=` on a run is.
    let wait = match &req.wait {
        Some(w) => composer_core::duration::parse(w).map_err(|e| ApiError::bad_request(format!("wait: {e}")))?,
        None => Duration::ZERO,
    }
    .min(s.config.task_poll_max_wait);
    let mut queues = req.queues.clone();
    queues.sort();
    queues.dedup();
    let streams: Vec<String> = queues
        .iter()
        .flat_map(|q| (0..s.config.stream_shards).map(move |shard| (q, shard)))
        .map(|(q, shard)| s.streams.keys().stream(q, shard))
        .collect();
    ensure_groups(&s, &streams).await?;

    let deadline = tokio::time::Instant::now() + wait;
    let mut idle = Duration::from_millis(5);
    // Where the next read starts, so no shard is always read last.
    let mut start = 0usize;
    loop {
        // Registered before reading, so a publish during the read is not missed.
        let published = s.published.notified();
        tokio::pin!(published);
        published.as_mut().enable();
        let tasks = lease(&s, &req.worker_id, &queues, &streams, start, max as usize).await?;
        start = start.wrapping_add(1);
        if !tasks.is_empty() || tokio::time::Instant::now() >= deadline || s.draining.is_cancelled() {
            if !tasks.is_empty() {
                composer_metrics::inc(composer_metrics::TASK_API_LEASED, &[], tasks.len() as u64);
            }
            return Ok(Json(TaskBatch { tasks }));
        }
        let nap = idle.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        tokio::select! {
            _ = s.draining.cancelled() => {}
            _ = &mut published => {}
            _ = tokio::time::sleep(nap) => {}
        }
        idle = (idle * 2).min(IDLE_READ_EVERY);
    }
}

/// Creates the consumer group of each stream once per coordinator (and
/// again after Redis lost it).
async fn ensure_groups(s: &Shared, streams: &[String]) -> ApiResult<()> {
    let missing: Vec<String> = {
        let known = s.task_api_groups.lock().unwrap_or_else(|p| p.into_inner());
        streams.iter().filter(|n| !known.contains(*n)).cloned().collect()
    };
    for name in missing {
        s.streams.ensure_group(&name).await.map_err(redis_down)?;
        s.task_api_groups.lock().unwrap_or_else(|p| p.into_inner()).insert(name);
    }
    Ok(())
}

fn redis_down(e: composer_stream::Error) -> ApiError {
    tracing::warn!(error = %e, "task API: Redis unavailable");
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Redis is unavailable; retry later")
}

/// One pass: expired leases first, then new messages, up to `max` tasks.
async fn lease(
    s: &Shared,
    worker: &str,
    queues: &[String],
    streams: &[String],
    start: usize,
    max: usize,
) -> ApiResult<Vec<LeasedTask>> {
    let leases = LeaseManager::new(s.pool.clone());
    let ttl = s.config.task_lease_ttl;
    let view = |d: Dispatch, queue: String| LeasedTask {
        id: d.task_id,
        run_id: d.run_id,
        attempt: d.attempt,
        node_id: d.node_id,
        node_type: d.node_type,
        queue,
        input: d.input,
        lease_ttl_ms: ttl.as_millis() as u64,
    };
    let mut out: Vec<LeasedTask> = leases
        .take_over_expired(queues, worker, ttl, max as i64, s.config.max_dispatches)
        .await?
        .into_iter()
        .map(|(d, q)| view(d, q))
        .collect();
    if !out.is_empty() {
        composer_metrics::inc(composer_metrics::LEASE_TAKEOVERS, &[], out.len() as u64);
    }
    // Stream by stream, never reading more than can be leased: a message
    // read and not leased would wait for the lost-dispatch sweep.
    let consumer = format!("api:{worker}");
    let mut read = Vec::new();
    for i in 0..streams.len() {
        let want = max - out.len() - read.len();
        if want == 0 {
            break;
        }
        let stream = &streams[(start + i) % streams.len()];
        match s.streams.read_now(&consumer, stream, want).await {
            Ok(messages) => read.extend(messages),
            Err(e) if e.is_no_group() => {
                // Redis lost the group (restarted without persistence): make it again next time.
                s.task_api_groups.lock().unwrap_or_else(|p| p.into_inner()).remove(stream);
            }
            Err(e) => return Err(redis_down(e)),
        }
    }
    if read.is_empty() {
        return Ok(out);
    }
    let mut wanted = Vec::new();
    for msg in &read {
        match serde_json::from_str::<Dispatch>(&msg.payload) {
            Ok(d) => wanted.push((d, s.streams.keys().queue_of(&msg.stream).unwrap_or_default().to_string())),
            Err(e) => tracing::error!(stream = %msg.stream, id = %msg.id, error = %e, "dropping a malformed message"),
        }
    }
    let requests: Vec<(Uuid, Uuid, i32)> = wanted.iter().map(|(d, _)| (d.run_id, d.task_id, d.attempt)).collect();
    let granted = leases.acquire_many(&requests, worker, ttl).await?;
    // Acknowledged whether leased or not: a lease is the record of who runs
    // a task, and a message whose lease was denied is for a task another
    // worker holds or that moved on.
    let acks: Vec<(&str, &str)> = read.iter().map(|m| (m.stream.as_str(), m.id.as_str())).collect();
    if let Err(e) = s.streams.ack_many(&acks).await {
        tracing::warn!(error = %e, "task API: ack failed; the messages may be delivered again (their leases refuse them)");
    }
    let mut seen = std::collections::HashSet::new();
    for (d, queue) in wanted {
        if granted.contains_key(&d.task_id) && seen.insert(d.task_id) {
            out.push(view(d, queue));
        }
    }
    Ok(out)
}

/// Extend the lease of a task this worker runs.
///
/// 409 when the lease is lost: the worker must stop and drop its result.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/heartbeat", operation_id = "heartbeatTask", tag = "workers",
    params(("id" = Uuid, Path, description = "the task")),
    request_body = TaskHeartbeat,
    responses(
        (status = 200, description = "the lease was extended", body = LeaseExtended),
        (status = 409, description = "the lease is lost: stop, and drop the result", body = ErrorBody),
    )
)]
pub(crate) async fn heartbeat(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(req): Body<TaskHeartbeat>,
) -> ApiResult<Json<LeaseExtended>> {
    let id = task_id(&id)?;
    check_worker(&req.worker_id)?;
    let ttl = s.config.task_lease_ttl;
    let leases = LeaseManager::new(s.pool.clone());
    if !leases.renew(req.run_id, id, &req.worker_id, ttl, req.attempt).await? {
        return Err(lease_lost(id));
    }
    Ok(Json(LeaseExtended { lease_ttl_ms: ttl.as_millis() as u64 }))
}

/// Complete a task with its output.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/complete", operation_id = "completeTask", tag = "workers",
    params(("id" = Uuid, Path, description = "the task")),
    request_body = CompleteTask,
    responses(
        (status = 200, description = "applied, or ignored with the reason", body = ReportAck),
        (status = 409, description = "the lease is lost: the result was dropped", body = ErrorBody),
    )
)]
pub(crate) async fn complete(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(req): Body<CompleteTask, true>,
) -> ApiResult<Json<ReportAck>> {
    let id = task_id(&id)?;
    check_worker(&req.worker_id)?;
    let event = crate::api::completed(id, req.attempt, req.output, s.config.max_payload);
    finish(&s, id, &req.worker_id, req.run_id, req.attempt, event).await
}

/// Fail a task's attempt: retried under the node's policy when `retryable`.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/fail", operation_id = "failTask", tag = "workers",
    params(("id" = Uuid, Path, description = "the task")),
    request_body = FailTask,
    responses(
        (status = 200, description = "applied, or ignored with the reason", body = ReportAck),
        (status = 409, description = "the lease is lost: the failure was dropped", body = ErrorBody),
    )
)]
pub(crate) async fn fail(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(req): Body<FailTask>,
) -> ApiResult<Json<ReportAck>> {
    let id = task_id(&id)?;
    check_worker(&req.worker_id)?;
    if req.error.chars().count() > 65_536 {
        return Err(ApiError::bad_request("error: at most 65536 characters"));
    }
    let event = Event::TaskFailed { task_id: id, attempt: req.attempt, error: req.error, retryable: req.retryable };
    finish(&s, id, &req.worker_id, req.run_id, req.attempt, event).await
}

/// Applies a result while `worker` holds the lease. (A takeover between the
/// check and the apply is possible; then both results reach the run and the
/// first applied wins, as with any worker: still one applied result.)
async fn finish(
    s: &Shared,
    id: Uuid,
    worker: &str,
    run_id: Uuid,
    attempt: i32,
    event: Event,
) -> ApiResult<Json<ReportAck>> {
    let leases = LeaseManager::new(s.pool.clone());
    if !leases.holds(run_id, id, worker, attempt).await? {
        return Err(lease_lost(id));
    }
    let handled = s.engine.handle(run_id, event).await?;
    Ok(Json(ReportAck { applied: handled.ignored.is_none(), ignored: handled.ignored }))
}
