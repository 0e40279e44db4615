//! `/v1/runs/bulk` and `/v1/bulk/{id}`: an action over every run a filter
//! matches, worked through by a job (`crate::bulk`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use composer_api::{BulkAction, BulkDryRun, BulkFilter, BulkJobView, BulkRequest, ErrorBody};
use composer_store::bulk::{self, JobRow, NewJob};
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{name_param, text_param, Body, Path};
use crate::access::Principal;
use crate::shared::Wakes;
use composer_store::Pool;

/// Most runs a dry run counts.
pub(crate) const COUNT_CAP: i64 = 1_000_000;

/// Act on many runs.
///
/// Acts on every run a filter matches: a dry run says how many; otherwise a job works through them,
/// oldest first, a batch at a time (it survives a coordinator's crash and acts on each run once),
/// and `GET /v1/bulk/{id}` shows how far it got.
#[utoipa::path(
    post, path = "/v1/runs/bulk", operation_id = "bulkRuns", tag = "runs",
    request_body = BulkRequest,
    responses(
        (status = 200, description = "a dry run: how many runs match", body = BulkDryRun),
        (status = 202, description = "the job, started", body = BulkJobView),
    )
)]
pub(crate) async fn create(
    State(pool): State<Pool>,
    State(wakes): State<Arc<Wakes>>,
    Extension(by): Extension<Principal>,
    Body(req): Body<BulkRequest>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    Ok(match start(&pool, &wakes, &by.name, req).await? {
        Started::DryRun(matched) => (StatusCode::OK, Json(BulkDryRun { matched })).into_response(),
        Started::Job(row) => (StatusCode::ACCEPTED, Json(view(&row)?)).into_response(),
    })
}

/// What a checked bulk request did.
pub enum Started {
    /// A dry run: how many runs match.
    DryRun(i64),
    Job(Box<JobRow>),
}

/// Checks a bulk request and starts its job (the API's and the UI's).
/// `actor`: who asked, as the job and the runs' history name them.
pub async fn start(pool: &Pool, wakes: &Wakes, actor: &str, req: BulkRequest) -> ApiResult<Started> {
    let f = &req.filter;
    if f.workflow.is_none()
        && f.status.is_none()
        && f.tags.is_none()
        && f.created_after.is_none()
        && f.created_before.is_none()
    {
        return Err(ApiError::bad_request(
            "filter: name at least one of workflow, status, tags, created_after, created_before",
        ));
    }
    check_fields(f)?;
    let from = match (req.action, &req.from) {
        (BulkAction::Migrate, _) => {
            return Err(ApiError::bad_request(
                "action: runs move to another version through POST /v1/workflows/{name}/migrate",
            ))
        }
        (BulkAction::Rerun, Some(from)) if !from.is_empty() && from.len() <= 100 => {
            for node in from {
                text_param(node, "from")?;
            }
            Some(from.clone())
        }
        (BulkAction::Rerun, _) => return Err(ApiError::bad_request("from: a rerun names 1 to 100 steps")),
        (_, Some(_)) => return Err(ApiError::bad_request("from: only a rerun takes from")),
        (_, None) => None,
    };
    let reason = match req.reason {
        Some(r) if r.chars().count() > super::control::MAX_REASON_CHARS => {
            return Err(ApiError::bad_request("reason: at most 1024 characters"))
        }
        r => r,
    };
    let mut client = composer_store::client(pool).await?;
    let run_filter = crate::bulk::run_filter(f, None);
    let matched = composer_store::runs::count_matching(&mut client, &run_filter, COUNT_CAP).await?;
    if let Some(from) = &from {
        steps_exist(&mut client, &run_filter, from).await?;
    }
    if req.dry_run {
        return Ok(Started::DryRun(matched));
    }
    let filter = serde_json::to_value(f).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let job = NewJob {
        filter: &filter,
        action: req.action.as_str(),
        rerun_from: from.as_deref(),
        migrate: None,
        actor,
        reason: reason.as_deref(),
        matched,
    };
    let row = bulk::create(&client, &job).await?;
    wakes.bulk.notify_one();
    Ok(Started::Job(Box::new(row)))
}

/// A filter's workflow is a name, and its tags at most 16 `{key: text}`.
pub(crate) fn check_fields(f: &BulkFilter) -> ApiResult<()> {
    if let Some(w) = &f.workflow {
        name_param("filter.workflow", w)?;
    }
    if let Some(tags) = &f.tags {
        let ok = tags.as_object().is_some_and(|t| {
            t.len() <= composer_core::definition::MAX_TAGS
                && t.iter().all(|(k, v)| composer_core::definition::is_tag_key(k) && v.is_string())
        });
        if !ok {
            return Err(ApiError::bad_request("filter.tags: at most 16 {key: text}, keys of A-Z a-z 0-9 _ . -"));
        }
    }
    Ok(())
}

/// A rerun's `from` names steps of the runs it matches: each must be a node
/// of at least one of their definitions, or the rerun (and its dry run,
/// which would otherwise count runs it could not rerun) is refused by name.
async fn steps_exist(
    client: &mut composer_store::Client,
    filter: &composer_store::runs::RunFilter<'_>,
    from: &[String],
) -> ApiResult<()> {
    let missing = composer_store::runs::nodes_missing(client, filter, COUNT_CAP, from).await?;
    match missing.first() {
        None => Ok(()),
        Some(node) => Err(ApiError::bad_request(format!(
            "from: no run the filter matches has a step {:?} (in any version of its workflow)",
            composer_core::clipped(node, 100)
        ))),
    }
}

/// Get a bulk job.
///
/// A bulk job and how far it got: the runs it matched, looked at, acted on and found in a state that
/// refused the action.
#[utoipa::path(
    get, path = "/v1/bulk/{id}", operation_id = "getBulkJob", tag = "runs",
    params(("id" = Uuid, Path, description = "the job")),
    responses((status = 200, description = "the job", body = BulkJobView), (status = 404, description = "no such job", body = ErrorBody))
)]
pub(crate) async fn get(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<BulkJobView>> {
    let id = job_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let row = bulk::get(&client, id).await?.ok_or_else(|| ApiError::not_found(format!("bulk job {id} not found")))?;
    Ok(Json(view(&row)?))
}

/// Cancel a bulk job.
///
/// Stops a bulk job: the runs it acted on stay as they are.
#[utoipa::path(
    post, path = "/v1/bulk/{id}/cancel", operation_id = "cancelBulkJob", tag = "runs",
    params(("id" = Uuid, Path, description = "the job")),
    responses((status = 200, description = "the job, stopped (or ended already)", body = BulkJobView), (status = 404, description = "no such job", body = ErrorBody))
)]
pub(crate) async fn cancel(State(pool): State<Pool>, Path(id): Path<String>) -> ApiResult<Json<BulkJobView>> {
    let id = job_id(&id)?;
    let client = composer_store::client(&pool).await?;
    let row =
        bulk::cancel(&client, id).await?.ok_or_else(|| ApiError::not_found(format!("bulk job {id} not found")))?;
    Ok(Json(view(&row)?))
}

fn job_id(id: &str) -> ApiResult<Uuid> {
    id.parse().map_err(|_| ApiError::bad_request(format!("invalid bulk job id {id:?}: expected a UUID")))
}

pub(crate) fn view(r: &JobRow) -> ApiResult<BulkJobView> {
    let corrupt = |e: String| ApiError::from(composer_store::Error::Corrupt(e));
    let filter: BulkFilter =
        serde_json::from_value(r.filter.clone()).map_err(|e| corrupt(format!("bulk filter: {e}")))?;
    let action = serde_json::from_value(serde_json::Value::String(r.action.clone()))
        .map_err(|e| corrupt(format!("bulk action: {e}")))?;
    Ok(BulkJobView {
        id: r.id,
        action,
        filter,
        from: r.rerun_from.clone(),
        migrate: r
            .migrate
            .as_ref()
            .map(|m| serde_json::from_value(m.clone()))
            .transpose()
            .map_err(|e| corrupt(format!("bulk migrate: {e}")))?,
        status: r.status.clone(),
        actor: r.actor.clone(),
        reason: r.reason.clone(),
        matched: r.matched,
        looked_at: r.looked_at,
        acted_on: r.acted_on,
        refused: r.refused,
        last_error: r.last_error.clone(),
        created_at: r.created_at,
        updated_at: r.updated_at,
        finished_at: r.finished_at,
    })
}
