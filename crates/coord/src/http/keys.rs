//! API keys (`/v1/keys`) and the audit log (`/v1/audit`): both `admin`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use composer_api::{AuditEntry, AuditPage, CreateKey, KeyCreated, KeyList, KeyView, Scope};
use composer_store::keys::{KeyRow, NewKey};
use composer_store::Pool;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::{name_param, Body, Limit, Path, Query};
use crate::access::{Keys, Principal};

/// Longest life a key may be given (`expires_in`): ten years.
pub const MAX_KEY_LIFE_DAYS: u64 = 3650;

fn view(row: &KeyRow) -> KeyView {
    KeyView {
        id: row.id,
        name: row.name.clone(),
        scopes: row.scopes.iter().filter_map(|s| serde_json::from_value(serde_json::json!(s)).ok()).collect(),
        queues: row.queues.clone(),
        created_at: row.created_at,
        created_by: row.created_by.clone(),
        expires_at: row.expires_at,
        revoked_at: row.revoked_at,
        namespace: row.namespace.clone(),
    }
}

/// `expires_in` in seconds: a whole number and one unit, at most ten years.
fn lifetime(text: &str) -> ApiResult<f64> {
    let bad =
        || ApiError::bad_request(format!("expires_in: a number and one unit (s, m, h, d), as \"90d\"; got {text:?}"));
    let unit = text.chars().last().ok_or_else(bad)?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let secs = match unit {
        's' => n,
        'm' => n.saturating_mul(60),
        'h' => n.saturating_mul(3600),
        'd' => n.saturating_mul(86_400),
        _ => return Err(bad()),
    };
    if secs == 0 || secs > MAX_KEY_LIFE_DAYS * 86_400 {
        return Err(ApiError::bad_request(format!("expires_in: more than 0 and at most {MAX_KEY_LIFE_DAYS}d")));
    }
    Ok(secs as f64)
}

/// Create an API key.
///
/// A key with a name (the actor runs' history and the audit log name), scopes, optionally the
/// only queues it may work and an expiry. The answer shows the key this once: only its hash is
/// kept. A key may hold only scopes its creator holds (the API token may create any, workers' and
/// metrics readers' keys included). To rotate a key, create its successor, move its users, then
/// revoke it: both work until then.
#[utoipa::path(
    post, path = "/v1/keys", operation_id = "createKey", tag = "access",
    request_body = CreateKey,
    responses((status = 201, description = "created: the key is shown only now", body = KeyCreated))
)]
pub(crate) async fn create(
    State(pool): State<Pool>,
    State(config): State<Arc<crate::config::Config>>,
    Extension(by): Extension<Principal>,
    Body(req): Body<CreateKey>,
) -> ApiResult<(StatusCode, Json<KeyCreated>)> {
    name_param("name", &req.name)?;
    if crate::access::RESERVED_NAMES.contains(&req.name.as_str()) || req.name == config.api_token_name {
        return Err(ApiError::bad_request(format!("name: {:?} is an environment token's; choose another", req.name)));
    }
    if req.scopes.is_empty() || req.scopes.len() > Scope::ALL.len() {
        return Err(ApiError::bad_request(format!("scopes: 1 to {} of them", Scope::ALL.len())));
    }
    if let Some(scope) = req.scopes.iter().find(|s| !by.may_grant(**s)) {
        let why = format!("{} may not create a key with the scope {scope}, which it does not hold", by.name);
        return Err(ApiError::Forbidden(why));
    }
    for q in req.queues.iter().flatten() {
        name_param("queues", q)?;
    }
    if req.queues.is_some() && !req.scopes.contains(&Scope::TasksWork) {
        return Err(ApiError::bad_request("queues: only a key with tasks:work works queues"));
    }
    if req.queues.as_ref().is_some_and(|q| q.is_empty() || q.len() > 32) {
        return Err(ApiError::bad_request("queues: 1 to 32 names"));
    }
    let expires_in_secs = req.expires_in.as_deref().map(lifetime).transpose()?;
    let client = composer_store::client(&pool).await?;
    let namespace = match (&req.namespace, by.namespace()) {
        (Some(n), Some(own)) if n != own => {
            let why = format!("{} is bound to namespace {own} and may create keys of that namespace only", by.name);
            return Err(ApiError::Forbidden(why));
        }
        (None, Some(own)) => Some(own.to_string()),
        (n, _) => n.clone(),
    };
    if let Some(n) = &namespace {
        let live = composer_store::namespaces::get(&client, n).await?.is_some_and(|r| r.state != "deleting");
        if !live {
            return Err(ApiError::bad_request(format!("namespace: there is no namespace {n:?}")));
        }
    }
    let (id, key, hash) = crate::access::mint().ok_or_else(|| ApiError::internal("no random bytes for a key"))?;
    let mut scopes: Vec<String> = req.scopes.iter().map(|s| s.name().to_string()).collect();
    scopes.sort();
    scopes.dedup();
    let new = NewKey {
        id,
        name: &req.name,
        secret_hash: &hash,
        scopes: &scopes,
        queues: req.queues.as_deref(),
        created_by: &by.name,
        expires_in_secs,
        namespace: namespace.as_deref(),
    };
    let row = composer_store::keys::create(&client, &new).await?;
    tracing::info!(key = %row.id, name = %row.name, by = %by.name, "API key created");
    Ok((StatusCode::CREATED, Json(KeyCreated { view: view(&row), key })))
}

/// List API keys.
///
/// Every key, newest first, revoked and expired ones too; never a key itself. A caller bound to a
/// namespace sees that namespace's keys only.
#[utoipa::path(
    get, path = "/v1/keys", operation_id = "listKeys", tag = "access",
    responses((status = 200, description = "every key, newest first", body = KeyList))
)]
pub(crate) async fn list(State(pool): State<Pool>, Extension(by): Extension<Principal>) -> ApiResult<Json<KeyList>> {
    let client = composer_store::client(&pool).await?;
    let rows = composer_store::keys::list(&client, by.namespace(), super::extract::MAX_PAGE).await?;
    Ok(Json(KeyList { keys: rows.iter().map(view).collect() }))
}

/// Revoke an API key.
///
/// The key is refused from now on: at once by this coordinator, within 5 s by every other (each
/// trusts its copy of a key that long). Revoking a revoked key keeps its first time. A caller
/// bound to a namespace may revoke that namespace's keys only.
#[utoipa::path(
    delete, path = "/v1/keys/{id}", operation_id = "revokeKey", tag = "access",
    params(("id" = Uuid, Path, description = "the key's id")),
    responses((status = 200, description = "revoked", body = KeyView))
)]
pub(crate) async fn revoke(
    State(pool): State<Pool>,
    State(keys): State<Arc<Keys>>,
    Extension(by): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<KeyView>> {
    let id = Uuid::try_parse(&id).map_err(|_| ApiError::bad_request(format!("id: not a key id: {id:?}")))?;
    let client = composer_store::client(&pool).await?;
    if let Some(own) = by.namespace() {
        let theirs = composer_store::keys::get(&client, id).await?;
        if theirs.is_none_or(|k| k.namespace.as_deref() != Some(own)) {
            return Err(ApiError::not_found(format!("key {id} not found")));
        }
    }
    let row = composer_store::keys::revoke(&client, id).await?;
    keys.forget(id);
    let row = row.ok_or_else(|| ApiError::not_found(format!("key {id} not found")))?;
    tracing::info!(key = %row.id, name = %row.name, "API key revoked");
    Ok(Json(view(&row)))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// The previous page's `next`: entries older than it.
    #[param(minimum = 1)]
    before: Option<i64>,
    /// Only this actor's entries.
    #[param(max_length = 256, pattern = "^[^\\u0000]*$")]
    actor: Option<String>,
    /// 1 to 1000 (default 100).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 1000)]
    limit: Option<Limit>,
}

/// Read the audit log.
///
/// Every change made through the API or the UI — definitions, schedules, webhooks, limits, keys
/// and every action on runs — newest first: who (the key's name), from where, what was asked, and
/// the answer. Starting runs, sending events and workers' calls are in runs' own history instead.
#[utoipa::path(
    get, path = "/v1/audit", operation_id = "readAuditLog", tag = "access",
    params(AuditQuery),
    responses((status = 200, description = "a page of the log, newest first", body = AuditPage))
)]
pub(crate) async fn audit_log(State(pool): State<Pool>, Query(q): Query<AuditQuery>) -> ApiResult<Json<AuditPage>> {
    if let Some(actor) = &q.actor {
        super::extract::text_param(actor, "actor")?;
        if actor.chars().count() > 256 {
            return Err(ApiError::bad_request("actor: at most 256 characters"));
        }
    }
    if q.before.is_some_and(|b| b < 1) {
        return Err(ApiError::bad_request("before: an entry's id, 1 or more"));
    }
    let limit = Limit::or(q.limit, 100);
    let client = composer_store::client(&pool).await?;
    let rows = composer_store::audit::page(&client, q.before, q.actor.as_deref(), limit).await?;
    let next = (rows.len() as i64 == limit).then(|| rows.last().map(|r| r.id)).flatten();
    let entries = rows
        .into_iter()
        .map(|r| AuditEntry {
            id: r.id,
            at: r.at,
            actor: r.actor,
            key_id: r.key_id,
            source: r.source,
            method: r.method,
            route: r.route,
            path: r.path,
            request: r.request,
            status: r.status.and_then(|s| u16::try_from(s).ok()),
            result: r.result,
        })
        .collect();
    Ok(Json(AuditPage { entries, next }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_lives_a_number_and_one_unit_more_than_0_and_at_most_ten_years() {
        assert_eq!(lifetime("90d").unwrap(), 90.0 * 86_400.0);
        assert_eq!(lifetime("30s").unwrap(), 30.0);
        assert_eq!(lifetime("3650d").unwrap(), 3650.0 * 86_400.0);
        for bad in
            ["", "d", "0d", "3651d", "1w", "-1d", "+1d", "1.5h", "1h30m", "1000000s", "99999999999999999999d", "é"]
        {
            assert!(lifetime(bad).is_err(), "{bad}");
        }
    }
}
