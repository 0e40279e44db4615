//! Namespaces (`/v1/namespaces`): created, listed, described and deleted.
//! Reading needs `read`; creating and deleting, `admin` of every
//! namespace (a key bound to one may do neither). A caller bound to a
//! namespace sees that namespace only.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use composer_api::{CreateNamespace, NamespaceList, NamespaceQuotas, NamespaceUsage, NamespaceView};
use composer_store::namespaces::{NamespaceRow, Quotas, DEFAULT};

use super::door::{valid_name, Created, Namespaces};
use super::error::{ApiError, ApiResult};
use super::extract::{text_param, Body, Path};
use crate::access::Principal;

/// The largest value a quota may be given.
pub const MAX_QUOTA: i64 = 1_000_000_000_000_000;

/// Longest description a namespace may have, in characters.
pub const MAX_NAMESPACE_DESCRIPTION: usize = 1000;

fn view(row: &NamespaceRow) -> NamespaceView {
    let q = row.quotas;
    NamespaceView {
        name: row.name.clone(),
        description: row.description.clone(),
        state: row.state.clone(),
        created_by: row.created_by.clone(),
        created_at: row.created_at,
        quotas: NamespaceQuotas {
            open_runs: q.open_runs,
            starts_per_second: q.starts_per_second,
            schedules: q.schedules,
            limits: q.limits,
            stored_bytes: q.stored_bytes,
        },
        usage: None,
    }
}

fn checked_name(name: &str) -> ApiResult<()> {
    match valid_name(name) {
        true => Ok(()),
        false => Err(ApiError::bad_request(format!(
            "name: 1 to 63 lowercase letters, digits and '-', starting with a letter; got {:?}",
            name.chars().take(80).collect::<String>()
        ))),
    }
}

/// Create a namespace.
///
/// A namespace has its own workflows, runs, schedules, webhooks, triggers, limits, events, bulk
/// jobs, queues and audit log: a call names it with the `Composer-Namespace` header (or the
/// `namespace` query parameter), and reaches nothing of another. Creating one that exists answers
/// it (200). Needs `admin` of every namespace.
#[utoipa::path(
    post, path = "/v1/namespaces", operation_id = "createNamespace", tag = "access",
    request_body = CreateNamespace,
    responses(
        (status = 201, description = "created", body = NamespaceView),
        (status = 200, description = "it exists already", body = NamespaceView),
        (status = 409, description = "it is being deleted, or there are COMPOSER_MAX_NAMESPACES already", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn create(
    State(config): State<Arc<crate::config::Config>>,
    Extension(namespaces): Extension<Arc<dyn Namespaces>>,
    Extension(by): Extension<Principal>,
    Body(req): Body<CreateNamespace>,
) -> ApiResult<(StatusCode, Json<NamespaceView>)> {
    checked_name(&req.name)?;
    text_param(&req.description, "description")?;
    if req.description.chars().count() > MAX_NAMESPACE_DESCRIPTION {
        return Err(ApiError::bad_request(format!("description: at most {MAX_NAMESPACE_DESCRIPTION} characters")));
    }
    match namespaces.create(&req.name, &req.description, &by.name).await? {
        Created::New(row) => {
            tracing::info!(namespace = %row.name, by = %by.name, "namespace created");
            Ok((StatusCode::CREATED, Json(view(&row))))
        }
        Created::Exists(row) => Ok((StatusCode::OK, Json(view(&row)))),
        Created::Deleting => Err(ApiError::Conflict(format!("namespace {:?} is being deleted; try again", req.name))),
        Created::TooMany => Err(ApiError::Conflict(format!(
            "there are {} namespaces already, the most this cluster may have (COMPOSER_MAX_NAMESPACES)",
            config.max_namespaces
        ))),
    }
}

/// List namespaces.
///
/// `default` first, then by name, those being deleted too. A caller bound to a namespace sees
/// that one only.
#[utoipa::path(
    get, path = "/v1/namespaces", operation_id = "listNamespaces", tag = "access",
    responses((status = 200, description = "the namespaces", body = NamespaceList))
)]
pub(crate) async fn list(
    State(pool): State<composer_store::Pool>,
    State(config): State<Arc<crate::config::Config>>,
    Extension(by): Extension<Principal>,
) -> ApiResult<Json<NamespaceList>> {
    let client = composer_store::client(&pool).await?;
    let rows = composer_store::namespaces::list(&client, config.max_namespaces).await?;
    let namespaces = rows.iter().filter(|r| by.may_enter(&r.name)).map(view).collect();
    Ok(Json(NamespaceList { namespaces }))
}

/// Describe a namespace.
///
/// Its name, description, state, who created it, its quotas and what it uses of them. A caller
/// bound to another namespace gets a 404, as for one that does not exist, and so does one being
/// deleted.
#[utoipa::path(
    get, path = "/v1/namespaces/{name}", operation_id = "getNamespace", tag = "access",
    params(("name" = composer_api::schema::NamespaceName, Path, description = "the namespace")),
    responses((status = 200, description = "the namespace", body = NamespaceView))
)]
pub(crate) async fn get(
    State(pool): State<composer_store::Pool>,
    Extension(namespaces): Extension<Arc<dyn Namespaces>>,
    Extension(by): Extension<Principal>,
    Path(name): Path<String>,
) -> ApiResult<Json<NamespaceView>> {
    checked_name(&name)?;
    let client = composer_store::client(&pool).await?;
    // One being deleted is gone to its callers (its data goes in the background).
    let row = composer_store::namespaces::get(&client, &name).await?;
    let row = row.filter(|r| by.may_enter(&r.name) && r.state != "deleting");
    let row = row.ok_or_else(|| ApiError::not_found(format!("namespace {name:?} not found")))?;
    let mut answer = view(&row);
    answer.usage = namespaces.usage(&name).await?.map(|u| NamespaceUsage {
        open_runs: u.open_runs,
        schedules: u.schedules,
        limits: u.limits,
        stored_bytes: u.stored_bytes,
    });
    Ok(Json(answer))
}

/// Set a namespace's quotas.
///
/// Every quota at once: one left out is none. A start past `open_runs` or `stored_bytes`, or a new
/// schedule or limit past its quota, is then a 429 naming the quota, with `Retry-After`. Applies at
/// once on this coordinator and within 5 s on the others; the checks are made before each change,
/// so changes made at the same moment may go past a quota by as many. Needs `admin` of every
/// namespace.
#[utoipa::path(
    put, path = "/v1/namespaces/{name}/quotas", operation_id = "setNamespaceQuotas", tag = "access",
    params(("name" = composer_api::schema::NamespaceName, Path, description = "the namespace")),
    request_body = NamespaceQuotas,
    responses((status = 200, description = "the namespace with its quotas", body = NamespaceView))
)]
pub(crate) async fn set_quotas(
    Extension(namespaces): Extension<Arc<dyn Namespaces>>,
    Extension(by): Extension<Principal>,
    Path(name): Path<String>,
    Body(q): Body<NamespaceQuotas>,
) -> ApiResult<Json<NamespaceView>> {
    checked_name(&name)?;
    for (field, value, least) in [
        ("open_runs", q.open_runs, 1),
        ("starts_per_second", q.starts_per_second, 1),
        ("schedules", q.schedules, 0),
        ("limits", q.limits, 0),
        ("stored_bytes", q.stored_bytes, 1),
    ] {
        if value.is_some_and(|v| v < least || v > MAX_QUOTA) {
            return Err(ApiError::bad_request(format!("{field}: {least} to {MAX_QUOTA}")));
        }
    }
    let quotas = Quotas {
        open_runs: q.open_runs,
        starts_per_second: q.starts_per_second,
        schedules: q.schedules,
        limits: q.limits,
        stored_bytes: q.stored_bytes,
    };
    let row = namespaces.set_quotas(&name, quotas).await?;
    let row = row.ok_or_else(|| ApiError::not_found(format!("namespace {name:?} not found")))?;
    tracing::info!(namespace = %row.name, by = %by.name, ?quotas, "namespace quotas set");
    Ok(Json(view(&row)))
}

/// Delete a namespace with its data.
///
/// A job: the namespace stops being served at once (calls naming it are a 409), and some 15 s
/// later, once every coordinator has stopped serving it, its workflows, runs and everything else
/// it holds are dropped. Its keys stay, refused. `default` cannot be deleted. Needs `admin` of
/// every namespace.
#[utoipa::path(
    delete, path = "/v1/namespaces/{name}", operation_id = "deleteNamespace", tag = "access",
    params(("name" = composer_api::schema::NamespaceName, Path, description = "the namespace")),
    responses(
        (status = 202, description = "being deleted", body = NamespaceView),
        (status = 409, description = "the default namespace, which cannot be deleted", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn delete(
    Extension(namespaces): Extension<Arc<dyn Namespaces>>,
    Extension(by): Extension<Principal>,
    Path(name): Path<String>,
) -> ApiResult<(StatusCode, Json<NamespaceView>)> {
    checked_name(&name)?;
    if name == DEFAULT {
        return Err(ApiError::Conflict("the default namespace cannot be deleted".into()));
    }
    let row =
        namespaces.delete(&name).await?.ok_or_else(|| ApiError::not_found(format!("namespace {name:?} not found")))?;
    tracing::info!(namespace = %row.name, by = %by.name, "namespace being deleted");
    Ok((StatusCode::ACCEPTED, Json(view(&row))))
}
