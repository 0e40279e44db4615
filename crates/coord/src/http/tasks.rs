//! The task API's routes: poll, heartbeat, logs, complete, fail (how the
//! coordinator leases for a worker is in `crate::tasks`).

use composer_api::wire::StageTimes;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Extension, Json};
use composer_api::wire::{EagerOffer, PRIORITY_HEADER};
use composer_api::{
    CompleteTask, ErrorBody, FailTask, LeaseExtended, LeasedTask, LogsAccepted, PollTasks, ReportAck, TakeNext,
    TaskBatch, TaskHeartbeat, TaskLogs,
};
use composer_core::machine::Event;
use composer_store::leases::LeaseManager;
use composer_store::transitions::EagerLease;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{name_param, task_id, Body, Path};
use crate::access::Principal;
use crate::engine::{EventRequest, Report};
use crate::shared::TaskApi;
use crate::tasks::{ensure_groups, lease, streams_by_priority, LeaseError, Leased, IDLE_READ_EVERY};

/// Most tasks one poll may lease (`max`).
pub const MAX_POLL_TASKS: u32 = 100;
pub use composer_api::{MAX_ERROR_CHARS, MAX_LOG_LINES, MAX_LOG_LINE_BYTES, MAX_POLL_QUEUES};

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> ApiError {
        match e {
            LeaseError::Store(e) => e.into(),
            e @ LeaseError::Redis(_) => ApiError::Unavailable(e.to_string()),
        }
    }
}

fn check_worker(worker_id: &str) -> ApiResult<()> {
    name_param("worker_id", worker_id)
}

/// 1 to [`MAX_POLL_QUEUES`] queue names, each a name; `field` names them in
/// the error.
fn check_queues(field: &str, queues: &[String]) -> ApiResult<()> {
    if queues.is_empty() || queues.len() > MAX_POLL_QUEUES {
        return Err(ApiError::bad_request(format!("{field}: name 1 to {MAX_POLL_QUEUES} queues")));
    }
    queues.iter().try_for_each(|q| name_param(field, q))
}

/// A count of `field` from 1 to `most`, 1 when absent.
fn check_max(field: &str, max: Option<u32>, most: u32) -> ApiResult<u32> {
    let max = max.unwrap_or(1);
    if !(1..=most).contains(&max) {
        return Err(ApiError::bad_request(format!("{field}: expected 1 to {most}, got {max}")));
    }
    Ok(max)
}

/// Most tasks one result may take with its answer (`next.max`).
pub const MAX_NEXT_TASKS: u32 = composer_api::wire::MAX_EAGER_SLOTS;

/// Who runs the tasks a poll or a result's `next` takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Executor {
    /// A worker: any task of its queues.
    Worker,
    /// This coordinator's own HTTP executor: only HTTP calls that read no
    /// secret, and only those a batch hands it (it reads no stream).
    Coordinator,
}

/// What a result's `next` asks for, checked, as the engine takes it; made
/// at the priority the result's `composer-priority` names.
fn offer_of(s: &TaskApi, next: Option<TakeNext>, priority: u8, by: Executor) -> ApiResult<Option<EagerOffer>> {
    let Some(next) = next else { return Ok(None) };
    check_queues("next.queues", &next.queues)?;
    let max = check_max("next.max", next.max, MAX_NEXT_TASKS)?;
    let coordinator = by == Executor::Coordinator;
    Ok(Some(EagerOffer { slots: max, lease: s.config.lease_ttl, queues: next.queues, priority, coordinator }))
}

/// Lease tasks.
///
/// Leases up to `max` tasks of the given queues to `worker_id`. Answers as soon as at least one
/// task is leased, or after `wait` with none. Each task comes with its lease's length: heartbeat
/// within it.
#[utoipa::path(
    post, path = "/v1/tasks/poll", operation_id = "pollTasks", tag = "workers",
    request_body = PollTasks,
    responses((status = 200, description = "the tasks leased (none when none came within `wait`)", body = TaskBatch))
)]
pub(crate) async fn poll(
    State(s): State<Arc<TaskApi>>,
    Extension(by): Extension<Principal>,
    Body(req): Body<PollTasks>,
) -> ApiResult<Json<TaskBatch>> {
    may_work(&by, &req.queues)?;
    poll_tasks(&s, req).await.map(Json)
}

/// A key limited to some queues asks for those only.
fn may_work(by: &Principal, queues: &[String]) -> ApiResult<()> {
    match queues.iter().find(|q| !by.may_work(q)) {
        Some(q) => Err(ApiError::Forbidden(format!("{} may not work the queue {q:?}", by.name))),
        None => Ok(()),
    }
}

/// A key limited to some queues reports on their tasks only: the task's
/// queue is read (one query, for such a key only; a task that is not
/// there is left to the report's own answer, a lost lease).
async fn may_report(s: &TaskApi, by: &Principal, run_id: Uuid, id: &str) -> ApiResult<()> {
    if by.queues().is_none() {
        return Ok(());
    }
    let client = composer_store::client(&s.pool).await?;
    match composer_store::leases::queue_of(&client, run_id, task_id(id)?).await? {
        Some(queue) => may_work(by, &[queue]),
        None => Ok(()),
    }
}

/// [`poll`], for the route and for a worker in this process alike.
pub(crate) async fn poll_tasks(s: &TaskApi, req: PollTasks) -> ApiResult<TaskBatch> {
    check_worker(&req.worker_id)?;
    check_queues("queues", &req.queues)?;
    let max = check_max("max", req.max, MAX_POLL_TASKS)?;
    let (wait, at_most) = wait_and_priority(s, &req)?;
    let mut queues = req.queues.clone();
    queues.sort();
    queues.dedup();
    let mut streams = streams_by_priority(s, &queues);
    // Levels past `at_most` have no streams here: the read sees no work there.
    for level in &mut streams[usize::from(at_most - composer_core::priority::HIGHEST) + 1..] {
        level.clear();
    }
    let every_priority = at_most == composer_core::priority::LOWEST;
    ensure_groups(s, streams.iter().flatten()).await?;

    let deadline = tokio::time::Instant::now() + wait;
    let mut idle = Duration::from_millis(5);
    // Where the next read starts, so no shard is always read last.
    let mut start = 0usize;
    loop {
        // Registered before reading, so a publish during the read is not missed.
        let published = s.published.notified();
        tokio::pin!(published);
        published.as_mut().enable();
        let Leased { mut tasks, waiting } =
            lease(s, &req.worker_id, &queues, &streams, every_priority, start, max as usize).await?;
        for t in &mut tasks {
            crate::payloads::resolve(s.engine.payloads(), &mut t.input).await?;
        }
        start = start.wrapping_add(1);
        if !tasks.is_empty() || tokio::time::Instant::now() >= deadline || s.draining.has_begun() {
            if !tasks.is_empty() {
                crate::metrics::inc(composer_metrics::TASK_API_LEASED, &[], tasks.len() as u64);
            }
            return Ok(TaskBatch { tasks, waiting });
        }
        let nap = idle.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        // Waits where this coordinator's batches see it: a task one makes
        // ready of these queues is leased to this worker in its commit and
        // comes here, through no stream.
        let offer = EagerOffer {
            slots: max,
            lease: s.config.lease_ttl,
            queues: queues.clone(),
            priority: at_most,
            coordinator: false,
        };
        let given = park(s, &req.worker_id, offer, published.as_mut(), nap).await;
        if let Some(given) = given.filter(|g| !g.is_empty()) {
            let tasks: Vec<LeasedTask> = leased_views(s, given).await?;
            crate::metrics::inc(composer_metrics::TASK_API_LEASED, &[], tasks.len() as u64);
            crate::metrics::inc(composer_metrics::IDLE_POLL_DISPATCHES, &[], tasks.len() as u64);
            // What waits is what the read before the wait saw.
            return Ok(TaskBatch { tasks, waiting });
        }
        idle = (idle * 2).min(IDLE_READ_EVERY);
    }
}

/// A poll of this coordinator's own HTTP executor: it reads no stream and
/// waits, before every worker's poll, for what this coordinator's batches
/// hand it in their commits (HTTP calls that read no secret). What no
/// batch hands it goes through the streams to workers, as without it.
pub(crate) async fn take_handed(s: &TaskApi, req: PollTasks) -> ApiResult<TaskBatch> {
    check_worker(&req.worker_id)?;
    check_queues("queues", &req.queues)?;
    let max = check_max("max", req.max, MAX_POLL_TASKS)?;
    let (wait, at_most) = wait_and_priority(s, &req)?;
    let offer =
        EagerOffer { slots: max, lease: s.config.lease_ttl, queues: req.queues, priority: at_most, coordinator: true };
    let Some(mut parked) = s.engine.idle_polls().park(&req.worker_id, offer) else {
        // As many polls wait as may: this one waits out its time.
        tokio::time::sleep(wait).await;
        return Ok(TaskBatch { tasks: Vec::new(), waiting: None });
    };
    let taken = tokio::select! {
        _ = s.draining.begun() => None,
        _ = tokio::time::sleep(wait) => None,
        given = &mut parked.answer => given.ok(),
    };
    let given = match taken {
        Some(given) => given,
        None => parked.leave().await.unwrap_or_default(),
    };
    let tasks: Vec<LeasedTask> = leased_views(s, given).await?;
    crate::metrics::inc(composer_metrics::TASK_API_LEASED, &[], tasks.len() as u64);
    crate::metrics::inc(composer_metrics::IDLE_POLL_DISPATCHES, &[], tasks.len() as u64);
    Ok(TaskBatch { tasks, waiting: None })
}

/// The wait a poll asks for, cut to the limit as `?wait=` on a run is, and
/// the last priority it reads.
fn wait_and_priority(s: &TaskApi, req: &PollTasks) -> ApiResult<(Duration, u8)> {
    let wait = match &req.wait {
        Some(w) => composer_core::duration::parse(w).map_err(|e| ApiError::bad_request(format!("wait: {e}")))?,
        None => Duration::ZERO,
    }
    .min(s.config.task_poll_max_wait);
    let at_most = match req.priority_at_most {
        None => composer_core::priority::LOWEST,
        Some(p) if composer_core::priority::is_level(i64::from(p)) => p,
        Some(p) => {
            let (first, last) = (composer_core::priority::HIGHEST, composer_core::priority::LOWEST);
            return Err(ApiError::bad_request(format!("priority_at_most: expected {first} to {last}, got {p}")));
        }
    };
    Ok((wait, at_most))
}

/// Parks an idle poll for up to `nap`: what a batch leased to it in its
/// commit, or nothing when a publish, the stop or the nap came first (or
/// too many wait to park: then as before, woken by publishes).
async fn park(
    s: &TaskApi,
    worker: &str,
    offer: EagerOffer,
    published: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    nap: Duration,
) -> Option<Vec<EagerLease>> {
    let mut parked = s.engine.idle_polls().park(worker, offer);
    let handed = async {
        match parked.as_mut() {
            Some(p) => (&mut p.answer).await.ok(),
            None => std::future::pending().await,
        }
    };
    let taken = tokio::select! {
        _ = s.draining.begun() => None,
        _ = published => None,
        _ = tokio::time::sleep(nap) => None,
        given = handed => Some(given),
    };
    // A batch that took the poll meanwhile is waited for: what it
    // leased to this worker must reach it. Nothing (a rollback) reads again.
    match (taken, parked) {
        (Some(given), _) => given,
        (None, Some(parked)) => parked.leave().await,
        (None, None) => None,
    }
}

/// Leased tasks as their worker gets them: each input whole, read back
/// if it was offloaded.
async fn leased_views(s: &TaskApi, given: Vec<EagerLease>) -> ApiResult<Vec<LeasedTask>> {
    let mut views = Vec::with_capacity(given.len());
    for mut g in given {
        crate::payloads::resolve(s.engine.payloads(), &mut g.dispatch.input).await?;
        views.push(leased_view(g, s.config.lease_ttl));
    }
    Ok(views)
}

/// A task a batch leased to a worker in its commit, as the worker gets it.
fn leased_view(g: EagerLease, lease: Duration) -> LeasedTask {
    LeasedTask {
        id: g.dispatch.task_id,
        run_id: g.dispatch.run_id,
        attempt: g.dispatch.attempt,
        node_id: g.dispatch.node_id,
        node_type: g.dispatch.node_type,
        queue: g.queue,
        input: g.dispatch.input,
        lease_ttl_ms: lease.as_millis() as u64,
        traceparent: g.dispatch.traceparent,
        priority: g.priority,
        // Written and leased by one commit: its span shows that commit.
        stages: Some(StageTimes {
            dispatched_at_us: g.dispatch.dispatched_at_us,
            leased_at_us: Some(composer_api::wire::now_us()),
            ..StageTimes::default()
        }),
    }
}

/// Extend a task's lease.
///
/// Extends the lease of a task this worker runs. 409 when the lease is lost: the worker must stop
/// and drop its result.
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
    State(s): State<Arc<TaskApi>>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    Body(req): Body<TaskHeartbeat>,
) -> ApiResult<Json<LeaseExtended>> {
    may_report(&s, &by, req.run_id, &id).await?;
    extend_lease(&s, task_id(&id)?, req).await.map(Json)
}

/// [`heartbeat`], for the route and for a worker in this process alike.
pub(crate) async fn extend_lease(s: &TaskApi, id: Uuid, req: TaskHeartbeat) -> ApiResult<LeaseExtended> {
    check_worker(&req.worker_id)?;
    let ttl = s.config.lease_ttl;
    let leases = LeaseManager::new(s.pool.clone());
    if !leases.renew(req.run_id, id, &req.worker_id, ttl, req.attempt).await? {
        return Err(ApiError::LeaseLost(id));
    }
    Ok(LeaseExtended { lease_ttl_ms: ttl.as_millis() as u64 })
}

/// Send log lines.
///
/// Appends lines to the log of the attempt this worker holds the lease of: the step's logs, kept
/// with the attempt (at most `COMPOSER_TASK_LOG_MAX_BYTES` of them; past it lines are dropped and
/// the log says so) and gone with the run. A worker scrubs secrets from them before it sends.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/logs", operation_id = "sendTaskLogs", tag = "workers",
    params(("id" = Uuid, Path, description = "the task")),
    request_body = TaskLogs,
    responses(
        (status = 200, description = "what was kept of them", body = LogsAccepted),
        (status = 409, description = "the lease is lost: nothing was kept", body = ErrorBody),
    )
)]
pub(crate) async fn logs(
    State(s): State<Arc<TaskApi>>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    Body(req): Body<TaskLogs>,
) -> ApiResult<Json<LogsAccepted>> {
    may_report(&s, &by, req.run_id, &id).await?;
    append_logs(&s, task_id(&id)?, req).await.map(Json)
}

/// [`logs`], for the route and for a worker in this process alike (whose
/// lines no body extractor has looked at for a NUL).
pub(crate) async fn append_logs(s: &TaskApi, id: Uuid, req: TaskLogs) -> ApiResult<LogsAccepted> {
    check_worker(&req.worker_id)?;
    if req.lines.is_empty() || req.lines.len() > MAX_LOG_LINES {
        return Err(ApiError::bad_request(format!("lines: send 1 to {MAX_LOG_LINES} lines")));
    }
    if let Some(at) = req.lines.iter().position(|l| l.contains('\0')) {
        return Err(ApiError::bad_request(format!(
            "field lines[{at}] contains a NUL character (\\u0000), which cannot be stored"
        )));
    }
    let lines: Vec<String> = req.lines.iter().map(|l| log_line(l)).collect();
    let mut client = composer_store::client(&s.pool).await?;
    let kept = composer_store::logs::append(
        &mut client,
        req.run_id,
        id,
        &req.worker_id,
        req.attempt,
        &lines,
        composer_store::logs::Budget { attempt: s.config.task_log_max_bytes, run: s.config.run_log_max_bytes },
    )
    .await?
    .ok_or(ApiError::LeaseLost(id))?;
    drop(client);
    if s.config.offloads_events_and_logs() {
        crate::step_logs::seal_if_due(s.engine.payloads(), &s.pool, req.run_id, id, req.attempt, kept.row_bytes);
    }
    Ok(LogsAccepted { accepted: kept.accepted as u32, dropped: kept.dropped as u32 })
}

/// A line as it is kept: at most [`MAX_LOG_LINE_BYTES`] (cut on a
/// character boundary, and marked). A NUL never gets here: the body's
/// extractor refuses it by name, as PostgreSQL's text cannot hold one.
fn log_line(line: &str) -> String {
    const CUT: &str = " …[cut]";
    if line.len() <= MAX_LOG_LINE_BYTES {
        return line.to_string();
    }
    let mut end = MAX_LOG_LINE_BYTES - CUT.len();
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT}", &line[..end])
}

/// Complete a task.
///
/// Reports a leased attempt's output. Applied only while `worker_id` holds the lease of `attempt`;
/// a 409 means the lease is lost and the result was dropped. With `next`, the answer may carry tasks
/// the result made ready, leased to this worker in the same commit (eager dispatch).
#[utoipa::path(
    post, path = "/v1/tasks/{id}/complete", operation_id = "completeTask", tag = "workers",
    params(
        ("id" = Uuid, Path, description = "the task"),
        ("composer-priority" = Option<u8>, Header, description = "`1` to `5`, the leased task's `priority`: the result waits for the coordinator's batch at that priority; one that does not read is the default, 3"),
    ),
    request_body = CompleteTask,
    responses(
        (status = 200, description = "applied, or ignored with the reason", body = ReportAck),
        (status = 409, description = "the lease is lost: the result was dropped", body = ErrorBody),
    )
)]
pub(crate) async fn complete(
    State(s): State<Arc<TaskApi>>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(req): Body<CompleteTask, true>,
) -> ApiResult<Json<ReportAck>> {
    if let Some(next) = &req.next {
        may_work(&by, &next.queues)?;
    }
    may_report(&s, &by, req.run_id, &id).await?;
    complete_task(&s, task_id(&id)?, req, priority_of(&headers), Executor::Worker).await.map(Json)
}

/// [`complete`], for the route and for a worker in this process alike, at
/// the run's `priority` the result names, from `by`.
pub(crate) async fn complete_task(
    s: &TaskApi,
    id: Uuid,
    req: CompleteTask,
    priority: u8,
    by: Executor,
) -> ApiResult<ReportAck> {
    check_worker(&req.worker_id)?;
    let offer = offer_of(s, req.next, priority, by)?;
    let event = completed(id, req.attempt, req.output, s.config.max_value());
    finish(s, req.worker_id, req.run_id, event, offer, priority, req.stages).await
}

/// The level a result's `composer-priority` names, the default when it
/// names none: a hint, never a reason to refuse the result.
fn priority_of(headers: &HeaderMap) -> u8 {
    headers
        .get(PRIORITY_HEADER)
        .and_then(|v| composer_api::wire::priority_of_header(v.as_bytes()))
        .unwrap_or(composer_core::priority::DEFAULT)
}

/// Fail a task.
///
/// Reports a leased attempt's failure: retried under the node's policy when `retryable`, else the
/// step fails for good. `code` and `status` are what a failure edge can test (`.nodes.X.error`).
#[utoipa::path(
    post, path = "/v1/tasks/{id}/fail", operation_id = "failTask", tag = "workers",
    params(
        ("id" = Uuid, Path, description = "the task"),
        ("composer-priority" = Option<u8>, Header, description = "`1` to `5`, the leased task's `priority`: the result waits for the coordinator's batch at that priority; one that does not read is the default, 3"),
    ),
    request_body = FailTask,
    responses(
        (status = 200, description = "applied, or ignored with the reason", body = ReportAck),
        (status = 409, description = "the lease is lost: the failure was dropped", body = ErrorBody),
    )
)]
pub(crate) async fn fail(
    State(s): State<Arc<TaskApi>>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(req): Body<FailTask>,
) -> ApiResult<Json<ReportAck>> {
    if let Some(next) = &req.next {
        may_work(&by, &next.queues)?;
    }
    may_report(&s, &by, req.run_id, &id).await?;
    fail_task(&s, task_id(&id)?, req, priority_of(&headers), Executor::Worker).await.map(Json)
}

/// [`fail`], for the route and for a worker in this process alike (whose
/// error no body extractor has looked at for a NUL).
pub(crate) async fn fail_task(
    s: &TaskApi,
    id: Uuid,
    req: FailTask,
    priority: u8,
    by: Executor,
) -> ApiResult<ReportAck> {
    check_worker(&req.worker_id)?;
    let offer = offer_of(s, req.next, priority, by)?;
    if req.error.contains('\0') {
        return Err(ApiError::bad_request("field error contains a NUL character (\\u0000), which cannot be stored"));
    }
    if req.error.chars().count() > MAX_ERROR_CHARS {
        return Err(ApiError::bad_request(format!("error: at most {MAX_ERROR_CHARS} characters")));
    }
    if let Some(code) = req.code.as_deref().filter(|c| !composer_core::definition::is_error_code(c)) {
        return Err(ApiError::bad_request(format!(
            "code: {code:?} is not an error code (1 to 64 of a-z, 0-9, '_', '.' and '-')"
        )));
    }
    if let Some(status) = req.status.filter(|s| !(100..=599).contains(s)) {
        return Err(ApiError::bad_request(format!("status: {status} is not an HTTP status (100-599)")));
    }
    let event = Event::TaskFailed {
        task_id: id,
        attempt: req.attempt,
        error: req.error,
        retryable: req.retryable,
        code: req.code,
        status: req.status,
        retry_after: req.retry_after_ms.map(std::time::Duration::from_millis),
    };
    finish(s, req.worker_id, req.run_id, event, offer, priority, req.stages).await
}

/// Applies a result only while `worker` holds the attempt's lease, as the
/// engine checks on the rows its transaction locks (no read of its own): a
/// 409 otherwise, also for a run that does not exist (no lease of it is
/// held). The tasks `offer` takes are of the same run, at its priority now
/// (`priority`, the report's word for it, orders the report), or of a run
/// the report's freed slot starts, no less urgent than either.
/// `stages` are the worker's word for its attempt's span (the trace keeps
/// only times within the run's life); the end is now when it gives none.
async fn finish(
    s: &TaskApi,
    worker: String,
    run_id: Uuid,
    event: Event,
    offer: Option<EagerOffer>,
    priority: u8,
    stages: Option<StageTimes>,
) -> ApiResult<ReportAck> {
    let started = std::time::Instant::now();
    let mut stages = stages.unwrap_or_default();
    stages.finished_at_us = stages.finished_at_us.or(Some(composer_api::wire::now_us()));
    let reported = Report { stages: Some(stages), offer, priority };
    let task = match &event {
        Event::TaskCompleted { task_id, .. } | Event::TaskFailed { task_id, .. } => *task_id,
        _ => Uuid::nil(),
    };
    let handled = match s.engine.handle(EventRequest::reported(run_id, event, worker, reported)).await {
        Err(crate::engine::EngineError::RunNotFound(_)) => return Err(ApiError::LeaseLost(task)),
        handled => handled?,
    };
    crate::metrics::observe(composer_metrics::REPORT_DURATION, &[], started.elapsed());
    crate::metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "report_to_commit")], started.elapsed());
    let next: Vec<LeasedTask> = leased_views(s, handled.next).await?;
    if !next.is_empty() {
        crate::metrics::inc(composer_metrics::TASK_API_LEASED, &[], next.len() as u64);
        crate::metrics::inc(composer_metrics::EAGER_DISPATCHES, &[], next.len() as u64);
    }
    Ok(ReportAck { applied: handled.ignored.is_none(), ignored: handled.ignored, next })
}

/// The event of an attempt that completed with `output`: an output that
/// cannot be stored (too large, too deep, a NUL) fails the attempt for good,
/// naming why, since a retry would produce it again.
pub(crate) fn completed(task_id: Uuid, attempt: i32, output: serde_json::Value, max_payload: usize) -> Event {
    match composer_core::storable::check(&output, "output", max_payload) {
        Ok(()) => Event::TaskCompleted { task_id, attempt, output },
        Err(error) => Event::TaskFailed {
            task_id,
            attempt,
            error,
            retryable: false,
            code: Some(composer_core::machine::codes::PAYLOAD.into()),
            status: None,
            retry_after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_LOG_LINE_BYTES);
        let cut = log_line(&long);
        assert!(cut.len() <= MAX_LOG_LINE_BYTES && cut.ends_with("…[cut]"), "{}", cut.len());
        assert_eq!(log_line(&"x".repeat(MAX_LOG_LINE_BYTES)).len(), MAX_LOG_LINE_BYTES);
    }
}
