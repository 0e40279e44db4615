//! Schedules: create, read, pause, resume, delete, trigger one run now,
//! and backfill the fire times of a past range.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use composer_api::schema::Name;
use composer_api::{BackfillQueued, BackfillRequest, ErrorBody, RunView, SchedulePage, ScheduleView};
use composer_core::schedule::{Schedule, ScheduleSpec};
use composer_store::schedules::{self, ScheduleRow, Upsert};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::IntoParams;

use super::doc::Deleted;
use super::error::{ApiError, ApiResult};
use super::extract::{name_param, text_param, Body, Limit, Path, Query};
use super::runs::run_view;
use crate::engine::Engine;
use composer_store::Pool;

/// `GET /v1/schedules`'s query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// The previous page's next_after.
    #[param(value_type = Option<Name>)]
    after: Option<String>,
    /// 1 to 1000 (default 50).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
}

fn view(row: &ScheduleRow) -> ApiResult<ScheduleView> {
    let schedule = Schedule::parse(&row.spec)
        .map_err(|e| ApiError::bad_request(format!("stored schedule {} is invalid: {e}", row.id)))?;
    let next_fire_times = match (row.paused, row.next_fire_at) {
        (false, Some(next)) => {
            let mut times = vec![next];
            times.extend(schedule.upcoming(next, 4));
            times
        }
        _ => Vec::new(),
    };
    let mut spec = schedule.spec;
    spec.paused = None;
    Ok(ScheduleView {
        spec,
        paused: row.paused,
        next_fire_times,
        last_run_id: row.last_run_id,
        last_fire_error: row.last_fire_error.clone(),
        backfill_queued: row.backfill_queued,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

/// Create or replace a schedule.
///
/// A schedule starts runs of a workflow at the fire times of a cron expression, in a time zone.
/// Creating one with an existing id replaces it. 404 when the workflow (or its version) is not
/// registered.
#[utoipa::path(
    post, path = "/v1/schedules", operation_id = "createSchedule", tag = "schedules",
    request_body = ScheduleSpec,
    responses(
        (status = 201, description = "created", body = ScheduleView),
        (status = 200, description = "unchanged, or replaced", body = ScheduleView),
        (status = 404, description = "the workflow (or its version) is not registered", body = ErrorBody),
        (status = 429, description = "over a quota of the namespace (the message names it; see Retry-After)", body = ErrorBody),
    )
)]
pub(crate) async fn create(
    State(pool): State<Pool>,
    State(quotas): State<Arc<crate::quotas::QuotaState>>,
    Body(spec): Body<Value>,
) -> ApiResult<Response> {
    let schedule = Schedule::parse(&spec).map_err(|e| ApiError::InvalidSchedule(e.to_string()))?;
    // A cron that never fires (30 February) is refused, not stored without a next fire time.
    let next = schedule.first_fire(crate::clock::now()).map_err(|e| ApiError::InvalidSchedule(e.to_string()))?;
    let mut client = composer_store::client(&pool).await?;
    let wf = &schedule.spec.workflow;
    if composer_store::definitions::by_name(&client, wf, schedule.spec.version).await?.is_none() {
        let which = schedule.spec.version.map(|v| format!(" version {v}")).unwrap_or_default();
        // Like a run of it: what the request names does not exist.
        return Err(ApiError::not_found(format!("workflow: {wf:?}{which} is not registered")));
    }
    if let Some(count) = composer_store::namespaces::schedules_but(&client, &schedule.spec.id).await? {
        quotas.may_add_schedule(count)?;
    }
    let normalized = serde_json::to_value(&schedule.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let paused = schedule.spec.paused.unwrap_or(false);
    let (row, what) = schedules::upsert(&mut client, &schedule.spec.id, &normalized, wf, paused, Some(next)).await?;
    let status = if what == Upsert::Created { StatusCode::CREATED } else { StatusCode::OK };
    tracing::info!(schedule = %row.id, workflow = %row.workflow, ?what, "schedule saved");
    Ok((status, Json(view(&row)?)).into_response())
}

/// List schedules.
///
/// Schedules by id, paged: pass the answer's `next_after` as `?after=` for the next page.
#[utoipa::path(
    get, path = "/v1/schedules", operation_id = "listSchedules", tag = "schedules",
    params(
        ListQuery,
    ),
    responses((status = 200, description = "a page of schedules, by id", body = SchedulePage))
)]
pub(crate) async fn list(State(pool): State<Pool>, Query(q): Query<ListQuery>) -> ApiResult<Json<SchedulePage>> {
    let limit = Limit::or(q.limit, 50);
    if let Some(a) = &q.after {
        name_param("after", a)?;
    }
    let client = composer_store::client(&pool).await?;
    let rows = schedules::list(&client, q.after.as_deref(), limit).await?;
    let next = if rows.len() as i64 == limit { rows.last().map(|r| r.id.clone()) } else { None };
    let views = rows.iter().map(view).collect::<ApiResult<Vec<_>>>()?;
    Ok(Json(SchedulePage { schedules: views, next_after: next }))
}

async fn found(pool: &Pool, id: &str) -> ApiResult<ScheduleRow> {
    text_param(id, "schedule id")?;
    let client = composer_store::client(pool).await?;
    schedules::get(&client, id).await?.ok_or_else(|| ApiError::not_found(format!("schedule {id:?} not found")))
}

/// Get a schedule.
///
/// A schedule with its next five fire times (none while paused) and its last run.
#[utoipa::path(
    get, path = "/v1/schedules/{id}", operation_id = "getSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "the schedule with its next fire times", body = ScheduleView))
)]
pub(crate) async fn get(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<ScheduleView>> {
    Ok(Json(view(&found(&pool, &id).await?)?))
}

/// Delete a schedule.
///
/// The schedule stops firing and is gone; the runs it started stay.
#[utoipa::path(
    delete, path = "/v1/schedules/{id}", operation_id = "deleteSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "deleted (its runs stay)", body = Deleted))
)]
pub(crate) async fn delete(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    text_param(&id, "schedule id")?;
    let client = composer_store::client(&pool).await?;
    if !schedules::delete(&client, &id).await? {
        return Err(ApiError::not_found(format!("schedule {id:?} not found")));
    }
    Ok(Json(json!({"deleted": id})))
}

/// Pause a schedule.
///
/// The schedule stops firing until it is resumed.
#[utoipa::path(
    post, path = "/v1/schedules/{id}/pause", operation_id = "pauseSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "paused: it fires no more until resumed", body = ScheduleView))
)]
pub(crate) async fn pause(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<ScheduleView>> {
    set_paused(&pool, &id, true).await
}

/// Resume a schedule.
///
/// The schedule fires again from its next fire time: what fell due while it was paused is not
/// caught up.
#[utoipa::path(
    post, path = "/v1/schedules/{id}/resume", operation_id = "resumeSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "firing again from its next fire time", body = ScheduleView))
)]
pub(crate) async fn resume(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<ScheduleView>> {
    set_paused(&pool, &id, false).await
}

async fn set_paused(pool: &Pool, id: &str, paused: bool) -> ApiResult<Json<ScheduleView>> {
    let row = found(pool, id).await?;
    let schedule = Schedule::parse(&row.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let client = composer_store::client(pool).await?;
    let row = schedules::set_paused(&client, id, paused, schedule.next_after(crate::clock::now()))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("schedule {id:?} not found")))?;
    Ok(Json(view(&row)?))
}

/// Trigger a schedule now.
///
/// Starts one run of the schedule now, whatever its overlap policy (a person asked for it), and
/// answers the run (201). The run is held to the namespace's quotas, as a schedule's fire times
/// are (one past them starts nothing, and the schedule's `last_fire_error` says why).
#[utoipa::path(
    post, path = "/v1/schedules/{id}/trigger", operation_id = "triggerSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses(
        (status = 201, description = "the run it started", body = RunView),
        (status = 409, description = "its workflow is no longer registered", body = ErrorBody),
        (status = 429, description = "over a quota of the namespace (the message names it; see Retry-After)", body = ErrorBody),
    )
)]
pub(crate) async fn trigger(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    text_param(&id, "schedule id")?;
    let mut client = composer_store::client(&pool).await?;
    let tx = composer_store::begin(&mut client).await?;
    let row =
        schedules::lock(&tx, &id).await?.ok_or_else(|| ApiError::not_found(format!("schedule {id:?} not found")))?;
    let schedule = Schedule::parse(&row.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let now = crate::clock::now();
    let def = crate::schedules::definition(&tx, &schedule)
        .await?
        .ok_or_else(|| ApiError::Conflict(format!("workflow {:?} is not registered", schedule.spec.workflow)))?;
    schedules::record_fire(&tx, &id, now, "triggered", None).await?;
    let trigger = json!({"schedule": id, "fire_time": now, "manual": true});
    let input = schedule.spec.input.clone().unwrap_or_else(|| json!({}));
    let opts = crate::engine::starts::StartOptions { trigger: Some(&trigger), ..Default::default() };
    let started = engine.start_run_in(&tx, &def, &input, opts).await?;
    schedules::set_fire_run(&tx, &id, now, started.row.id).await?;
    schedules::advance(&tx, &id, row.next_fire_at, row.buffered_fire_at, Some(started.row.id)).await?;
    tx.commit().await?;
    let (run, _) = engine.started(started);
    crate::metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "started")], 1);
    Ok((StatusCode::CREATED, Json(run_view(&run, None))).into_response())
}

/// Backfill a schedule.
///
/// Queues the fire times of the schedule's cron in `[from, to)` (at most now, at most 10,000 of
/// them) and answers 202; the timer loop starts each one's run, with its fire time as
/// `trigger.fire_time`, under `overlap`: `allow` (all at once, the default), `skip` (a fire time
/// that finds a run of the schedule open starts none) or `buffer_all` (one at a time, oldest
/// first). A fire time already started, queued or buffered is not queued again, so asking twice
/// starts each run once; one that was skipped is queued again. A paused schedule holds its
/// queued fire times until it is resumed.
#[utoipa::path(
    post, path = "/v1/schedules/{id}/backfill", operation_id = "backfillSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    request_body = BackfillRequest,
    responses(
        (status = 202, description = "queued: the timer loop starts the runs", body = BackfillQueued),
        (status = 400, description = "`to` is not after `from`, is in the future, or the range holds too many fire times", body = ErrorBody),
    )
)]
pub(crate) async fn backfill(
    State(pool): State<Pool>,
    Path(id): Path<String>,
    Body(ask): Body<BackfillRequest>,
) -> ApiResult<Response> {
    use crate::schedules::BackfillError;
    text_param(&id, "schedule id")?;
    let overlap = ask.overlap.unwrap_or_default();
    let done = crate::schedules::backfill(&pool, &id, ask.from, ask.to, overlap).await.map_err(|e| match e {
        BackfillError::NotFound => ApiError::not_found(format!("schedule {id:?} not found")),
        BackfillError::Invalid(why) => ApiError::InvalidSchedule(why),
        BackfillError::Store(e) => e.into(),
    })?;
    let answer = BackfillQueued {
        schedule: id,
        fire_times: done.fires.len() as u64,
        queued: done.queued,
        already: done.fires.len() as u64 - done.queued,
        first_fire_time: done.fires.first().copied(),
        last_fire_time: done.fires.last().copied(),
        overlap,
        paused: done.paused,
    };
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}
