//! The operator's actions on a run: cancel, retry, pause, resume, rerun,
//! its priority, completing a step by hand and resolving one IN_DOUBT; each
//! is recorded with who took it and why.
use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use composer_api::{CompleteStep, ControlRun, ErrorBody, RerunRun, ResolveOutcome, ResolveTask, RunView, SetPriority};
use composer_core::machine::{Event, Resolution};
use composer_store::runs;
use serde_json::Value;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{run_id, text_param, Body, OptionalBody, Path};
use crate::access::Principal;
use crate::engine::{By, Control, EventRequest};
use crate::shared::RunControl;

/// A reason given with a control action: at most 1,024 characters.
pub(super) fn reason(r: Option<String>) -> ApiResult<Option<String>> {
    match r {
        Some(r) if r.chars().count() > MAX_REASON_CHARS => {
            Err(ApiError::bad_request(format!("reason: at most {MAX_REASON_CHARS} characters")))
        }
        Some(r) if r.trim().is_empty() => Ok(None),
        other => Ok(other),
    }
}

/// Longest reason a control action records (`max_reason_chars`).
pub const MAX_REASON_CHARS: usize = 1024;

async fn control(c: &RunControl, by: &Principal, id: &str, event: Event, why: Option<String>) -> ApiResult<Response> {
    let run_id = run_id(id)?;
    let by = Control { actor: by.name.clone(), reason: reason(why)? };
    let handled = c.engine.handle(EventRequest::new(run_id, event).by(By::Operator(by))).await?;
    if let Some(reason) = handled.ignored {
        return Err(ApiError::Conflict(reason));
    }
    let client = composer_store::client(&c.pool).await?;
    let (run, tasks) =
        runs::get(&client, run_id).await?.ok_or_else(|| ApiError::not_found(format!("run {run_id} not found")))?;
    super::runs::full_answer(&client, c.engine.payloads(), &run, &tasks).await
}

/// Change a run's priority.
///
/// Gives an open run (QUEUED, RUNNING or PAUSED), and the open runs under it, a priority from 1
/// (served first) to 5 (last): its queued start and its steps not started yet are served at the
/// new priority, steps already dispatched included. 409 for a run that has ended.
#[utoipa::path(
    put, path = "/v1/runs/{id}/priority", operation_id = "setRunPriority", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    request_body = SetPriority,
    responses((status = 200, description = "the run with its new priority", body = RunView), (status = 409, description = "the run has ended", body = ErrorBody))
)]
pub(crate) async fn set_run_priority(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    Body(req): Body<SetPriority>,
) -> ApiResult<Response> {
    let run_id = run_id(&id)?;
    let priority = super::runs::priority_of(req.priority)?;
    match change_priority(&c, &by.name, run_id, priority).await? {
        runs::PriorityChange::NotFound => return Err(ApiError::not_found(format!("run {run_id} not found"))),
        runs::PriorityChange::Ended(status) => {
            return Err(ApiError::Conflict(format!("the run has ended ({status}): it has no work left to order")))
        }
        runs::PriorityChange::Changed { from, runs, moved } => {
            tracing::info!(%run_id, priority, from, runs, moved, "run priority changed");
        }
    }
    let client = composer_store::client(&c.pool).await?;
    let (run, tasks) =
        runs::get(&client, run_id).await?.ok_or_else(|| ApiError::not_found(format!("run {run_id} not found")))?;
    super::runs::full_answer(&client, c.engine.payloads(), &run, &tasks).await
}

/// [`runs::set_priority`] in a transaction of its own, by this request's
/// actor; tried again (three times in all) when PostgreSQL breaks a
/// deadlock by aborting it.
pub(crate) async fn change_priority(
    c: &RunControl,
    actor: &str,
    run_id: Uuid,
    priority: u8,
) -> Result<runs::PriorityChange, composer_store::Error> {
    let mut tries = 0;
    loop {
        let attempt = async {
            let mut client = composer_store::client(&c.pool).await?;
            let tx = composer_store::begin(&mut client).await?;
            let changed = runs::set_priority(&tx, run_id, priority, c.config.stream_shards as i32, actor).await?;
            tx.commit().await?;
            Ok::<_, composer_store::Error>(changed)
        };
        match attempt.await {
            Err(e) if e.is_conflict() && tries < 2 => tries += 1,
            other => return other,
        }
    }
}

/// Cancel a run.
///
/// Cancels an open run (QUEUED, RUNNING or PAUSED): its open steps are cancelled and it ends
/// CANCELLED. 409 for a run that has already ended.
#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel", operation_id = "cancelRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "cancelled", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn cancel_run(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<ControlRun>,
) -> ApiResult<Response> {
    control(&c, &by, &id, Event::CancelRun, body.and_then(|b| b.reason)).await
}

/// Retry a run.
///
/// Runs a FAILED run again from its failed steps; completed steps keep their output. 409 for a
/// run in another state.
#[utoipa::path(
    post, path = "/v1/runs/{id}/retry", operation_id = "retryRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "running again from its failed steps", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn retry_run(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<ControlRun>,
) -> ApiResult<Response> {
    control(&c, &by, &id, Event::RetryRun, body.and_then(|b| b.reason)).await
}

/// Pause a run.
///
/// Pauses a RUNNING run: steps already started finish, and nothing new starts until it is resumed.
/// 409 for a run in another state.
#[utoipa::path(
    post, path = "/v1/runs/{id}/pause", operation_id = "pauseRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "paused", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn pause_run(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<ControlRun>,
) -> ApiResult<Response> {
    control(&c, &by, &id, Event::PauseRun, body.and_then(|b| b.reason)).await
}

/// Resume a run.
///
/// Resumes a PAUSED run: what was held back starts. 409 for a run in another state.
#[utoipa::path(
    post, path = "/v1/runs/{id}/resume", operation_id = "resumeRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "running again", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn resume_run(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<ControlRun>,
) -> ApiResult<Response> {
    control(&c, &by, &id, Event::ResumeRun, body.and_then(|b| b.reason)).await
}

/// Rerun a run from some of its steps.
///
/// Runs a run again from some of its steps: each and everything after it is reset (what is open
/// there is cancelled; the history stays) and runs again, with the run's input or the one given.
#[utoipa::path(
    post, path = "/v1/runs/{id}/rerun", operation_id = "rerunRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    request_body = RerunRun,
    responses(
        (status = 200, description = "running again from those steps", body = RunView),
        (status = 404, description = "no such run", body = ErrorBody),
        (status = 409, description = "not possible in the run's state, or a step it has not reached (the message says why)", body = ErrorBody),
    )
)]
pub(crate) async fn rerun_run(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
    Body(req): Body<RerunRun>,
) -> ApiResult<Response> {
    let run = run_id(&id)?;
    if req.from.is_empty() || req.from.len() > 100 {
        return Err(ApiError::bad_request("from: name 1 to 100 steps"));
    }
    if let Some(input) = &req.input {
        composer_core::storable::check(input, "input", c.config.max_value()).map_err(ApiError::bad_request)?;
    }
    let client = composer_store::client(&c.pool).await?;
    let mut tasks = Vec::with_capacity(req.from.len());
    for node in &req.from {
        text_param(node, "from")?;
        let Some(task) = runs::task_of_node(&client, run, node).await? else {
            // The run is the resource; a step it has not (yet) made is a
            // conflict with its state, not a missing resource.
            if runs::status(&client, run).await?.is_none() {
                return Err(ApiError::RunNotFound(run));
            }
            return Err(ApiError::Conflict(format!(
                "from: run {run} has no step {node:?} (not reached yet, or no such node in its workflow)"
            )));
        };
        tasks.push(task.id);
    }
    drop(client);
    let event = Event::RerunFrom { tasks, input: req.input, allow_completed: req.allow_completed };
    control(&c, &by, &id, event, req.reason).await
}

/// Complete a step by hand.
///
/// Ends a step with an output, whatever it is doing (waiting, held, in doubt, running — its worker
/// loses the lease — or failed, in a failed run): the run goes on as if it had completed.
#[utoipa::path(
    post, path = "/v1/runs/{id}/tasks/{node}/complete", operation_id = "completeStep", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("node" = String, Path, description = "the step's node id (a MAP item: `ship_each[3]`)"),
    ),
    request_body = CompleteStep,
    responses(
        (status = 200, description = "completed: the run as it now stands", body = RunView),
        (status = 404, description = "no such run or step", body = ErrorBody),
        (status = 409, description = "the step has ended already", body = ErrorBody),
    )
)]
pub(crate) async fn complete_step(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path((id, node)): Path<(String, String)>,
    Body(req): Body<CompleteStep>,
) -> ApiResult<Response> {
    let run = run_id(&id)?;
    text_param(&node, "node")?;
    composer_core::storable::check(&req.output, "output", c.config.max_value()).map_err(ApiError::bad_request)?;
    let client = composer_store::client(&c.pool).await?;
    let task = runs::task_of_node(&client, run, &node)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {run} has no step {node:?}")))?;
    drop(client);
    control(&c, &by, &id, Event::CompleteTask { task_id: task.id, output: req.output }, req.reason).await
}

/// Resolve an IN_DOUBT step.
///
/// A step of an `at_most_once` node whose attempt may or may not have taken effect waits IN_DOUBT
/// for an operator: `completed` with its output, `failed` for good with an error, or `retry` to
/// send it again.
#[utoipa::path(
    post, path = "/v1/runs/{id}/tasks/{node}/resolve", operation_id = "resolveTask", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("node" = String, Path, description = "the step's node id (a MAP item: `ship_each[3]`)"),
    ),
    request_body = ResolveTask,
    responses(
        (status = 200, description = "resolved: the run as it now stands", body = RunView),
        (status = 404, description = "no such run or step", body = ErrorBody),
        (status = 409, description = "the step is not IN_DOUBT", body = ErrorBody),
    )
)]
pub(crate) async fn resolve_task(
    State(c): State<RunControl>,
    Extension(by): Extension<Principal>,
    Path((id, node)): Path<(String, String)>,
    Body(req): Body<ResolveTask>,
) -> ApiResult<Response> {
    let run = run_id(&id)?;
    text_param(&node, "node")?;
    let resolution = match (req.outcome, req.output.clone(), req.error.clone()) {
        (ResolveOutcome::Completed, output, None) => {
            let output = output.unwrap_or(Value::Null);
            composer_core::storable::check(&output, "output", c.config.max_payload).map_err(ApiError::bad_request)?;
            Resolution::Completed(output)
        }
        (ResolveOutcome::Failed, None, Some(error)) if !error.trim().is_empty() => {
            if error.chars().count() > super::tasks::MAX_ERROR_CHARS {
                return Err(ApiError::bad_request(format!(
                    "error: at most {} characters",
                    super::tasks::MAX_ERROR_CHARS
                )));
            }
            Resolution::Failed(error)
        }
        (ResolveOutcome::Retry, None, None) => Resolution::Retry,
        (ResolveOutcome::Completed, _, Some(_)) => {
            return Err(ApiError::bad_request("error: a completed step has an output, not an error"))
        }
        (ResolveOutcome::Failed, _, _) => {
            return Err(ApiError::bad_request("error: a failed step needs an error (and no output)"))
        }
        (ResolveOutcome::Retry, _, _) => {
            return Err(ApiError::bad_request("a retry takes neither an output nor an error"))
        }
    };
    let client = composer_store::client(&c.pool).await?;
    let task = runs::task_of_node(&client, run, &node)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {run} has no step {node:?}")))?;
    drop(client);
    control(&c, &by, &id, Event::ResolveTask { task_id: task.id, resolution }, req.reason).await
}
