//! Schedules: the REST API (`/v1/schedules`) and the pass of the timer loop
//! that fires them. Every coordinator runs the pass; a schedule is handled
//! under its row lock (`FOR UPDATE SKIP LOCKED`), and the runs it starts
//! commit with the move of its `next_fire_at`, so each fire time starts one
//! run however many coordinators there are.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use composer_api::schema::Name;
use composer_api::{ErrorBody, RunView, SchedulePage, ScheduleView};
use composer_core::schedule::{Overlap, Schedule, ScheduleSpec};
use composer_store::schedules::{self, ScheduleRow, Upsert};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::api::{page_limit, run_view, text_param, ApiError, ApiResult, Body};
use crate::engine::{EngineError, Started};
use crate::openapi::Deleted;
use crate::Shared;

/// Fire times this many past are forgotten by the fires table (the key
/// there only guards fire times still being handled).
const FIRES_KEPT: chrono::Duration = chrono::Duration::days(7);

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
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

/// Create or replace a schedule.
#[utoipa::path(
    post, path = "/v1/schedules", operation_id = "createSchedule", tag = "schedules",
    request_body = ScheduleSpec,
    responses(
        (status = 201, description = "created", body = ScheduleView),
        (status = 200, description = "unchanged, or replaced", body = ScheduleView),
    )
)]
pub async fn create(State(s): State<Arc<Shared>>, Body(spec): Body<Value>) -> ApiResult<Response> {
    let schedule = Schedule::parse(&spec)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_schedule", e.to_string()))?;
    let mut client = composer_store::client(&s.pool).await?;
    let wf = &schedule.spec.workflow;
    if composer_store::definitions::by_name(&client, wf, schedule.spec.version).await?.is_none() {
        let which = schedule.spec.version.map(|v| format!(" version {v}")).unwrap_or_default();
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_schedule",
            format!("workflow: {wf:?}{which} is not registered"),
        ));
    }
    let normalized = serde_json::to_value(&schedule.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let paused = schedule.spec.paused.unwrap_or(false);
    let next = schedule.next_after(Utc::now());
    let (row, what) = schedules::upsert(&mut client, &schedule.spec.id, &normalized, wf, paused, next).await?;
    let status = if what == Upsert::Created { StatusCode::CREATED } else { StatusCode::OK };
    tracing::info!(schedule = %row.id, workflow = %row.workflow, ?what, "schedule saved");
    Ok((status, Json(view(&row)?)).into_response())
}

/// Schedules by id.
#[utoipa::path(
    get, path = "/v1/schedules", operation_id = "listSchedules", tag = "schedules",
    params(
        ("after" = Option<Name>, Query, description = "the previous page's next_after"),
        ("limit" = Option<i32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000 (default 50)"),
    ),
    responses((status = 200, description = "a page of schedules, by id", body = SchedulePage))
)]
pub async fn list(
    State(s): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<SchedulePage>> {
    let limit = page_limit(q.get("limit"), 50)?;
    if let Some(a) = q.get("after") {
        composer_core::definition::check_name("after", a).map_err(ApiError::bad_request)?;
    }
    let client = composer_store::client(&s.pool).await?;
    let rows = schedules::list(&client, q.get("after").map(String::as_str), limit).await?;
    let next = if rows.len() as i64 == limit { rows.last().map(|r| r.id.clone()) } else { None };
    let views = rows.iter().map(view).collect::<ApiResult<Vec<_>>>()?;
    Ok(Json(SchedulePage { schedules: views, next_after: next }))
}

async fn found(s: &Shared, id: &str) -> ApiResult<ScheduleRow> {
    text_param(id, "schedule id")?;
    let client = composer_store::client(&s.pool).await?;
    schedules::get(&client, id).await?.ok_or_else(|| ApiError::not_found(format!("schedule {id:?} not found")))
}

/// A schedule with its next fire times.
#[utoipa::path(
    get, path = "/v1/schedules/{id}", operation_id = "getSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "the schedule with its next fire times", body = ScheduleView))
)]
pub async fn get(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<ScheduleView>> {
    Ok(Json(view(&found(&s, &id).await?)?))
}

/// Delete a schedule; its runs stay.
#[utoipa::path(
    delete, path = "/v1/schedules/{id}", operation_id = "deleteSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "deleted (its runs stay)", body = Deleted))
)]
pub async fn delete(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    text_param(&id, "schedule id")?;
    let client = composer_store::client(&s.pool).await?;
    if !schedules::delete(&client, &id).await? {
        return Err(ApiError::not_found(format!("schedule {id:?} not found")));
    }
    Ok(Json(json!({"deleted": id})))
}

/// Stop a schedule firing.
#[utoipa::path(
    post, path = "/v1/schedules/{id}/pause", operation_id = "pauseSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "paused: it fires no more until resumed", body = ScheduleView))
)]
pub async fn pause(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<ScheduleView>> {
    set_paused(&s, &id, true).await
}

/// Resuming starts from the next fire time: what fell due while paused is
/// not caught up.
#[utoipa::path(
    post, path = "/v1/schedules/{id}/resume", operation_id = "resumeSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses((status = 200, description = "firing again from its next fire time", body = ScheduleView))
)]
pub async fn resume(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<ScheduleView>> {
    set_paused(&s, &id, false).await
}

async fn set_paused(s: &Shared, id: &str, paused: bool) -> ApiResult<Json<ScheduleView>> {
    let row = found(s, id).await?;
    let schedule = Schedule::parse(&row.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let client = composer_store::client(&s.pool).await?;
    let row = schedules::set_paused(&client, id, paused, schedule.next_after(Utc::now()))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("schedule {id:?} not found")))?;
    Ok(Json(view(&row)?))
}

/// `POST /v1/schedules/{id}/trigger`: one run now, whatever the overlap
/// policy (a person asked for it); 201 with the run.
#[utoipa::path(
    post, path = "/v1/schedules/{id}/trigger", operation_id = "triggerSchedule", tag = "schedules",
    params(("id" = Name, Path, description = "the schedule")),
    responses(
        (status = 201, description = "the run it started", body = RunView),
        (status = 409, description = "its workflow is no longer registered", body = ErrorBody),
    )
)]
pub async fn trigger(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Response> {
    text_param(&id, "schedule id")?;
    let mut client = composer_store::client(&s.pool).await?;
    let tx = client.transaction().await.map_err(composer_store::Error::from)?;
    let row =
        schedules::lock(&tx, &id).await?.ok_or_else(|| ApiError::not_found(format!("schedule {id:?} not found")))?;
    let schedule = Schedule::parse(&row.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let now = Utc::now();
    let def = definition(&tx, &schedule).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("workflow {:?} is not registered", schedule.spec.workflow),
        )
    })?;
    schedules::record_fire(&tx, &id, now, "triggered", None).await?;
    let trigger = json!({"schedule": id, "fire_time": now, "manual": true});
    let input = schedule.spec.input.clone().unwrap_or_else(|| json!({}));
    let started = s.engine.start_run_in(&tx, &def, &input, None, Some(&trigger)).await?;
    schedules::set_fire_run(&tx, &id, now, started.row.id).await?;
    schedules::advance(&tx, &id, row.next_fire_at, row.buffered_fire_at, Some(started.row.id)).await?;
    tx.commit().await.map_err(composer_store::Error::from)?;
    let (run, _) = s.engine.started(started);
    composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "started")], 1);
    Ok((StatusCode::CREATED, Json(run_view(&run, None))).into_response())
}

async fn definition(
    tx: &composer_store::Transaction<'_>,
    schedule: &Schedule,
) -> Result<Option<composer_store::definitions::DefinitionRow>, composer_store::Error> {
    composer_store::definitions::by_name(tx, &schedule.spec.workflow, schedule.spec.version).await
}

/// Handles every schedule with work to do, one transaction each; returns
/// how many runs were started.
pub async fn fire_due(shared: &Shared) -> Result<usize, EngineError> {
    let mut started = 0;
    for _ in 0..shared.config.timer_batch.max(1) {
        match fire_one(shared).await? {
            Some(n) => started += n,
            None => break,
        }
    }
    Ok(started)
}

/// One due schedule: a buffered fire whose blocking run ended, then the fire
/// times due (within the catch-up window, oldest first) under the overlap
/// policy; older ones are missed. `None` when no schedule was due.
async fn fire_one(shared: &Shared) -> Result<Option<usize>, EngineError> {
    let mut client = composer_store::client(&shared.pool).await?;
    let tx = client.transaction().await?;
    let Some(row) = schedules::lock_due(&tx).await? else { return Ok(None) };
    let schedule = match Schedule::parse(&row.spec) {
        Ok(s) => s,
        Err(e) => {
            // Stored by an older version with other rules: stop it firing.
            tracing::error!(schedule = %row.id, error = %e, "stored schedule is invalid; it will not fire");
            schedules::advance(&tx, &row.id, None, None, row.last_run_id).await?;
            tx.commit().await?;
            return Ok(Some(0));
        }
    };
    let now = Utc::now();
    let mut pass = Pass { shared, tx: &tx, schedule: &schedule, last: row.last_run_id, started: Vec::new() };
    let mut open = match row.last_run_id {
        Some(id) => schedules::run_is_open(&tx, id).await?,
        None => false,
    };
    let mut buffered = row.buffered_fire_at;
    if let (Some(t), false) = (buffered, open) {
        buffered = None;
        open = pass.start(t, true).await?;
    }
    let due = match row.next_fire_at {
        Some(from) if from <= now => schedule.due(from, now),
        next => composer_core::schedule::Due { fire: Vec::new(), missed: 0, next },
    };
    for t in due.fire {
        match (schedule.overlap, open) {
            (Overlap::Allow, _) | (_, false) => open = pass.start(t, false).await? || open,
            (Overlap::BufferOne, true) if buffered.is_none() => {
                schedules::record_fire(&tx, &row.id, t, "buffered", None).await?;
                composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "buffered")], 1);
                buffered = Some(t);
            }
            _ => {
                schedules::record_fire(&tx, &row.id, t, "skipped", None).await?;
                composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "skipped")], 1);
            }
        }
    }
    if due.missed > 0 {
        composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "missed")], due.missed);
        tracing::warn!(schedule = %row.id, missed = due.missed, "fire times older than the catch-up window were skipped");
    }
    let last = pass.last;
    let runs = std::mem::take(&mut pass.started);
    schedules::advance(&tx, &row.id, due.next, buffered, last).await?;
    tx.commit().await?;
    let n = runs.len();
    for s in runs {
        shared.engine.started(s);
    }
    composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "started")], n as u64);
    Ok(Some(n))
}

/// One schedule's pass of the timer loop, inside its transaction.
struct Pass<'a> {
    shared: &'a Shared,
    tx: &'a composer_store::Transaction<'a>,
    schedule: &'a Schedule,
    last: Option<Uuid>,
    started: Vec<Started>,
}

impl Pass<'_> {
    /// Starts the run of fire time `t` (`buffered`: recorded already);
    /// returns whether it is open. A fire time already recorded (handled by
    /// another pass) starts nothing.
    async fn start(&mut self, t: DateTime<Utc>, buffered: bool) -> Result<bool, EngineError> {
        let id = &self.schedule.spec.id;
        if !buffered && !schedules::record_fire(self.tx, id, t, "started", None).await? {
            return Ok(false);
        }
        let Some(def) = definition(self.tx, self.schedule).await? else {
            tracing::error!(schedule = %id, workflow = %self.schedule.spec.workflow, "schedule's workflow is not registered");
            composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "failed")], 1);
            return Ok(false);
        };
        let trigger = json!({"schedule": id, "fire_time": t});
        let input = self.schedule.spec.input.clone().unwrap_or_else(|| json!({}));
        match self.shared.engine.start_run_in(self.tx, &def, &input, None, Some(&trigger)).await {
            Ok(started) => {
                schedules::set_fire_run(self.tx, id, t, started.row.id).await?;
                self.last = Some(started.row.id);
                let open = !started.row.status.is_terminal();
                self.started.push(started);
                Ok(open)
            }
            Err(EngineError::Rejected(why)) => {
                tracing::error!(schedule = %id, error = %why, "schedule's run could not start");
                composer_metrics::inc(composer_metrics::SCHEDULE_FIRES, &[("outcome", "failed")], 1);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Forgets fires recorded more than a week ago.
pub async fn forget_old_fires(client: &composer_store::Client) -> Result<u64, composer_store::Error> {
    schedules::forget_fires(client, Utc::now() - FIRES_KEPT).await
}
