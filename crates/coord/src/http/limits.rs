//! Limits on steps across runs, as operators see and set them: each key's
//! values, who set them, and its use now (`/v1/limits`).

use axum::extract::State;
use axum::Json;
use composer_api::schema::LimitKey;
use composer_api::{LimitPage, LimitView};
use composer_core::definition::check_path_segment;
use composer_core::definition::limit::{LimitValues, LimitValuesSpec, MAX_LIMIT_KEY};
use composer_store::limits::{self, LimitRow};
use serde_json::{json, Value};

use super::doc::Deleted;
use super::error::{ApiError, ApiResult};
use super::extract::{Body, Limit, Path, Query};
use composer_store::Pool;

pub(crate) fn view(row: &LimitRow) -> LimitView {
    let rate = row.values.rate;
    LimitView {
        key: row.key.clone(),
        rate: rate.map(|r| r.text()),
        burst: rate.map(|r| r.burst),
        concurrency: row.values.concurrency,
        set_by: row.set_by.clone(),
        tokens: row.tokens.map(|t| (t * 1000.0).floor() / 1000.0),
        in_use: row.in_use,
        waiting: row.waiting,
        held_until: row.held_until,
        updated_at: row.updated_at,
    }
}

/// A key to read or delete: `.` and `..` pass, which a key may have been
/// given before they were refused (see [`set`]).
fn key_param(key: &str) -> ApiResult<()> {
    if key.is_empty() || key.len() > MAX_LIMIT_KEY || key.contains('\0') {
        return Err(ApiError::bad_request(format!("key: 1 to {MAX_LIMIT_KEY} bytes, without NUL")));
    }
    Ok(())
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// The previous page's next_after (no NUL, as a key).
    #[param(max_length = 256, pattern = "^[^\\u0000]*$")]
    after: Option<String>,
    /// 1 to 1000 (default 100).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
}

/// List limits.
///
/// Every limit key a step has waited for or an operator set, in key order, with its values, who
/// set them (`definition` or `api`), the tokens in its bucket, its steps in flight and waiting,
/// and a target's `Retry-After` that holds it.
#[utoipa::path(
    get, path = "/v1/limits", operation_id = "listLimits", tag = "limits",
    params(ListQuery),
    responses((status = 200, description = "a page of limits, in key order", body = LimitPage))
)]
pub(crate) async fn list(State(pool): State<Pool>, Query(q): Query<ListQuery>) -> ApiResult<Json<LimitPage>> {
    let limit = Limit::or(q.limit, 100);
    // An empty `after` is the first page, as none.
    let after = q.after.as_deref().filter(|a| !a.is_empty());
    if let Some(after) = after {
        key_param(after)?;
    }
    let client = composer_store::client(&pool).await?;
    let rows = limits::list(&client, after, limit).await?;
    let next_after = if rows.len() as i64 == limit { rows.last().map(|r| r.key.clone()) } else { None };
    Ok(Json(LimitPage { limits: rows.iter().map(view).collect(), next_after }))
}

/// Get a limit.
///
/// The key's values, who set them, the tokens in its bucket now, its steps in flight and waiting,
/// and a target's `Retry-After` that holds it.
#[utoipa::path(
    get, path = "/v1/limits/{key}", operation_id = "getLimit", tag = "limits",
    params(("key" = String, Path, description = "the limit key (URL-encoded)")),
    responses((status = 200, description = "the limit and its use now", body = LimitView))
)]
pub(crate) async fn get(State(pool): State<Pool>, Path(key): Path<String>) -> ApiResult<Json<LimitView>> {
    key_param(&key)?;
    let client = composer_store::client(&pool).await?;
    let row =
        limits::get(&client, &key).await?.ok_or_else(|| ApiError::not_found(format!("limit {key:?} not found")))?;
    Ok(Json(view(&row)))
}

/// Set a limit.
///
/// Sets a key's `rate` (`"N/period"`, with `burst`) and `concurrency` at run time, across every
/// run, item and coordinator; a part left out is not limited. From now on the definitions that use
/// the key no longer change it (delete the limit to give it back to them). Steps waiting for it
/// go as soon as the new values let them.
#[utoipa::path(
    put, path = "/v1/limits/{key}", operation_id = "setLimit", tag = "limits",
    params(("key" = inline(LimitKey), Path, description = "the limit key (URL-encoded), not `.` or `..`")),
    request_body = LimitValuesSpec,
    responses(
        (status = 200, description = "the limit as set, and its use now", body = LimitView),
        (status = 429, description = "over a quota of the namespace (the message names it; see Retry-After)", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn set(
    State(pool): State<Pool>,
    State(quotas): State<std::sync::Arc<crate::quotas::QuotaState>>,
    Path(key): Path<String>,
    Body(spec): Body<LimitValuesSpec>,
) -> ApiResult<Json<LimitView>> {
    key_param(&key)?;
    check_path_segment(&key).map_err(|m| ApiError::bad_request(format!("key: {m}")))?;
    let values = LimitValues::parse("", &spec)
        .map_err(|e| ApiError::bad_request(format!("{}: {}", e.path.trim_start_matches('.'), e.message)))?;
    let client = composer_store::client(&pool).await?;
    if let Some(count) = composer_store::namespaces::limits_but(&client, &key).await? {
        quotas.may_add_limit(count)?;
    }
    let row = limits::set(&client, &key, &values).await?;
    tracing::info!(key = %key, rate = ?row.values.rate.map(|r| r.text()), concurrency = ?row.values.concurrency, "limit set");
    Ok(Json(view(&row)))
}

/// Delete a limit.
///
/// Forgets the values an operator set: the key goes back to what the definitions that use it say
/// (a key none of them gives values to is not limited).
#[utoipa::path(
    delete, path = "/v1/limits/{key}", operation_id = "deleteLimit", tag = "limits",
    params(("key" = String, Path, description = "the limit key (URL-encoded)")),
    responses((status = 200, description = "deleted", body = Deleted))
)]
pub(crate) async fn delete(State(pool): State<Pool>, Path(key): Path<String>) -> ApiResult<Json<Value>> {
    key_param(&key)?;
    let client = composer_store::client(&pool).await?;
    if !limits::delete(&client, &key).await? {
        return Err(ApiError::not_found(format!("limit {key:?} not found")));
    }
    Ok(Json(json!({"deleted": key})))
}
