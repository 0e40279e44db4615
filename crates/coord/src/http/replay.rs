//! `/v1/events/replay` and `/v1/events/replay/{id}`: the triggers of
//! recorded events run again, worked through by a job (`crate::replay`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use composer_api::{ErrorBody, ReplayDryRun, ReplayFilter, ReplayRequest, ReplayView};
use composer_store::replays::{self, NewReplay, ReplayRow};
use composer_store::Pool;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::events::{MAX_EVENT_KEY, MAX_EVENT_NAME};
use super::extract::{Body, Path};
use crate::access::Principal;
use crate::config::Config;
use crate::engine::Engine;
use crate::shared::Wakes;

/// Most events a dry run counts.
pub(crate) const COUNT_CAP: i64 = 1_000_000;

/// Replay recorded events.
///
/// Runs the triggers of the recorded events the filter matches again, as their workflows' latest
/// versions have them: once per event and trigger that has no run yet (one that failed, or a trigger
/// added since), in a commit of its own, recorded on the event (`replayed_by`) and in the run's
/// `trigger` (`replay`). Waiting steps are not sent the events again. A dry run counts the events
/// and shows what the first 20 would start. The event log keeps events for
/// `COMPOSER_EVENT_LOG_KEPT` (7 days by default): none received before `kept_since` is left to replay.
#[utoipa::path(
    post, path = "/v1/events/replay", operation_id = "replayEvents", tag = "events",
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "a dry run: how many events match, and what the first would start", body = ReplayDryRun),
        (status = 202, description = "the replay, started", body = ReplayView),
    )
)]
pub(crate) async fn create(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(wakes): State<Arc<Wakes>>,
    Extension(by): Extension<Principal>,
    Body(req): Body<ReplayRequest>,
) -> ApiResult<Response> {
    let replay = Replay { config: &config, pool: &pool, engine: &engine, wakes: &wakes };
    Ok(match replay.start(&by.name, req).await? {
        Started::DryRun(d) => (StatusCode::OK, Json(d)).into_response(),
        Started::Job(row) => (StatusCode::ACCEPTED, Json(view(&row)?)).into_response(),
    })
}

/// What a checked replay request did.
pub enum Started {
    DryRun(ReplayDryRun),
    Job(Box<ReplayRow>),
}

/// What starting a replay needs (the API's and the UI's).
pub struct Replay<'a> {
    pub config: &'a Config,
    pub pool: &'a Pool,
    pub engine: &'a Arc<Engine>,
    pub wakes: &'a Wakes,
}

impl Replay<'_> {
    /// Checks a replay request and starts its job, or answers its dry run.
    /// `actor`: who asked, as the replay names them.
    pub async fn start(&self, actor: &str, req: ReplayRequest) -> ApiResult<Started> {
        check(&req.filter)?;
        let reason = super::control::reason(req.reason)?;
        let filter = crate::replay::event_filter(&req.filter);
        if req.dry_run {
            let matched = {
                let client = composer_store::client(self.pool).await?;
                replays::count(&client, &filter, COUNT_CAP).await?
            };
            let preview = crate::replay::preview(self.pool, self.engine, &req.filter).await?;
            let kept_since = crate::triggers::kept_since(self.config);
            return Ok(Started::DryRun(ReplayDryRun { matched, preview, kept_since }));
        }
        let stored = serde_json::to_value(&req.filter).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let client = composer_store::client(self.pool).await?;
        let new = NewReplay { filter: &stored, actor, reason: reason.as_deref() };
        let row = replays::create(&client, &filter, &new, COUNT_CAP).await?;
        self.wakes.bulk.notify_one();
        Ok(Started::Job(Box::new(row)))
    }
}

/// A filter's name and key within an event's limits, and a time range
/// that holds something.
pub(crate) fn check(f: &ReplayFilter) -> ApiResult<()> {
    if f.name.as_ref().is_some_and(|n| n.is_empty() || n.chars().count() > MAX_EVENT_NAME) {
        return Err(ApiError::bad_request(format!("filter.name must be 1 to {MAX_EVENT_NAME} characters")));
    }
    if f.key.as_ref().is_some_and(|k| k.chars().count() > MAX_EVENT_KEY) {
        return Err(ApiError::bad_request(format!("filter.key must be at most {MAX_EVENT_KEY} characters")));
    }
    for (what, t) in [("from", f.from), ("to", f.to)] {
        if !(1970..=9999).contains(&chrono::Datelike::year(&t)) {
            return Err(ApiError::bad_request(format!("filter.{what} must be in the years 1970 to 9999")));
        }
    }
    if f.from >= f.to {
        return Err(ApiError::bad_request("filter: from must be before to"));
    }
    Ok(())
}

/// Get a replay.
///
/// A replay and how far it got: the events it matched and looked at, the runs it started and the
/// triggers that failed again.
#[utoipa::path(
    get, path = "/v1/events/replay/{id}", operation_id = "getReplay", tag = "events",
    params(("id" = Uuid, Path, description = "the replay")),
    responses((status = 200, description = "the replay", body = ReplayView), (status = 404, description = "no such replay", body = ErrorBody))
)]
pub(crate) async fn get(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<ReplayView>> {
    let id = replay_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let row = replays::get(&client, id).await?.ok_or_else(|| not_found(id))?;
    Ok(Json(view(&row)?))
}

/// Cancel a replay.
///
/// Stops a replay: the runs it started go on.
#[utoipa::path(
    post, path = "/v1/events/replay/{id}/cancel", operation_id = "cancelReplay", tag = "events",
    params(("id" = Uuid, Path, description = "the replay")),
    responses((status = 200, description = "the replay, stopped (or ended already)", body = ReplayView), (status = 404, description = "no such replay", body = ErrorBody))
)]
pub(crate) async fn cancel(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<ReplayView>> {
    let id = replay_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let row = replays::cancel(&client, id).await?.ok_or_else(|| not_found(id))?;
    Ok(Json(view(&row)?))
}

fn not_found(id: Uuid) -> ApiError {
    ApiError::not_found(format!("replay {id} not found"))
}

pub(crate) fn replay_id(id: &str) -> ApiResult<Uuid> {
    id.parse().map_err(|_| ApiError::bad_request(format!("invalid replay id {id:?}: expected a UUID")))
}

pub(crate) fn view(r: &ReplayRow) -> ApiResult<ReplayView> {
    let filter: ReplayFilter = serde_json::from_value(r.filter.clone())
        .map_err(|e| ApiError::from(composer_store::Error::Corrupt(format!("replay filter: {e}"))))?;
    Ok(ReplayView {
        id: r.id,
        filter,
        status: r.status.clone(),
        actor: r.actor.clone(),
        reason: r.reason.clone(),
        matched: r.matched,
        looked_at: r.looked_at,
        started: r.started,
        failed: r.failed,
        last_error: r.last_error.clone(),
        created_at: r.created_at,
        updated_at: r.updated_at,
        finished_at: r.finished_at,
    })
}
