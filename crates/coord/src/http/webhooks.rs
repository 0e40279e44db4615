//! Webhooks: configure them (the API token), and receive their deliveries
//! (`POST /v1/webhooks/{name}`, no token: the signature is the proof).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use composer_api::schema::Name;
use composer_api::{ErrorBody, EventSent, WebhookList, WebhookSpec, WebhookView};
use composer_store::webhooks::{self, WebhookRow};
use serde_json::{json, Map, Value};

use super::doc::Deleted;
use super::door::InNamespace;
use super::error::{ApiError, ApiResult};
use super::extract::{name_param, stored_name_param, Body, Path};
use composer_store::Pool;

use crate::config::Config;
use crate::engine::Engine;
use crate::shared::ClusterPool;
use crate::triggers::Incoming;
use crate::webhooks::{Webhook, MAX_HEADERS, MAX_HEADER_VALUE};

/// The webhook as the API shows it: its delivery URL names its namespace
/// but in `default` (its sender cannot set a header).
fn view(row: &WebhookRow, ns: &str) -> ApiResult<WebhookView> {
    let spec: WebhookSpec = serde_json::from_value(row.spec.clone())
        .map_err(|e| ApiError::bad_request(format!("stored webhook {} is invalid: {e}", row.name)))?;
    let secret_set = std::env::var_os(crate::webhooks::secret_var(&spec.secret)).is_some_and(|v| !v.is_empty());
    Ok(WebhookView {
        url: match ns == composer_store::namespaces::DEFAULT {
            true => format!("/v1/webhooks/{}", row.name),
            false => format!("/v1/webhooks/{}?namespace={ns}", row.name),
        },
        spec,
        secret_set,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

/// Create or replace a webhook.
///
/// A webhook turns each signed delivery to `POST /v1/webhooks/{name}` into an event. It names its
/// signing secret, which each coordinator reads from `COMPOSER_WEBHOOK_SECRET_<secret>`: the
/// secret itself is never sent, stored or shown.
#[utoipa::path(
    post, path = "/v1/webhooks", operation_id = "createWebhook", tag = "events",
    request_body = WebhookSpec,
    responses(
        (status = 201, description = "created", body = WebhookView),
        (status = 200, description = "replaced", body = WebhookView),
    )
)]
pub(crate) async fn create(
    State(pool): State<Pool>,
    State(cluster): State<ClusterPool>,
    Extension(InNamespace(ns)): Extension<InNamespace>,
    Body(spec): Body<WebhookSpec>,
) -> ApiResult<Response> {
    let hook = crate::webhooks::parse(spec, &ns).map_err(ApiError::bad_request)?;
    let stored = serde_json::to_value(&hook.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let client = composer_store::client(&pool).await?;
    let (row, created) = webhooks::upsert(&client, &hook.spec.name, &stored).await?;
    lift_quarantine(&cluster, &ns, &row.name).await?;
    tracing::info!(webhook = %row.name, created, "webhook saved");
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view(&row, &ns)?)).into_response())
}

/// List webhooks.
///
/// Every webhook by name, each with its delivery URL and whether this coordinator has its secret.
#[utoipa::path(
    get, path = "/v1/webhooks", operation_id = "listWebhooks", tag = "events",
    responses((status = 200, description = "every webhook, by name", body = WebhookList))
)]
pub(crate) async fn list(
    State(pool): State<Pool>,
    Extension(InNamespace(ns)): Extension<InNamespace>,
) -> ApiResult<Json<WebhookList>> {
    let client = composer_store::client(&pool).await?;
    let rows = webhooks::list(&client, super::extract::MAX_PAGE).await?;
    Ok(Json(WebhookList { webhooks: rows.iter().map(|r| view(r, &ns)).collect::<ApiResult<_>>()? }))
}

/// A webhook created again (or deleted) is no longer refused for a
/// transform that killed a coordinator: its transform is new. The
/// quarantine is kept once for every namespace (a webhook's name with it).
async fn lift_quarantine(cluster: &ClusterPool, ns: &str, name: &str) -> ApiResult<()> {
    let client = &composer_store::client(&cluster.0).await?;
    let subject = crate::webhooks::subject(ns, name);
    composer_store::quarantine::lift(client, subject.kind(), &subject.key()).await?;
    crate::engine::evaluator::refresh_quarantine(client).await?;
    Ok(())
}

async fn found(pool: &Pool, name: &str) -> ApiResult<WebhookRow> {
    stored_name_param("webhook", name)?;
    let client = composer_store::client(pool).await?;
    webhooks::get(&client, name).await?.ok_or_else(|| ApiError::not_found(format!("webhook {name:?} not found")))
}

/// Get a webhook.
///
/// The webhook's spec (the secret's name, never its value), its delivery URL, and whether this
/// coordinator has the secret set.
#[utoipa::path(
    get, path = "/v1/webhooks/{name}", operation_id = "getWebhook", tag = "events",
    params(("name" = Name, Path, description = "the webhook")),
    responses((status = 200, description = "the webhook, and whether this coordinator has its secret", body = WebhookView))
)]
pub(crate) async fn get(
    State(pool): State<Pool>,
    Extension(InNamespace(ns)): Extension<InNamespace>,
    Path(name): Path<String>,
) -> ApiResult<Json<WebhookView>> {
    Ok(Json(view(&found(&pool, &name).await?, &ns)?))
}

/// Delete a webhook.
///
/// Deliveries to it are refused from now on (401, as to any name no webhook has); the events it
/// sent stay in the log.
#[utoipa::path(
    delete, path = "/v1/webhooks/{name}", operation_id = "deleteWebhook", tag = "events",
    params(("name" = Name, Path, description = "the webhook")),
    responses((status = 200, description = "deleted: its deliveries are refused from now on", body = Deleted))
)]
pub(crate) async fn delete(
    State(pool): State<Pool>,
    State(cluster): State<ClusterPool>,
    Extension(InNamespace(ns)): Extension<InNamespace>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    stored_name_param("webhook", &name)?;
    let client = composer_store::client(&pool).await?;
    if !webhooks::delete(&client, &name).await? {
        return Err(ApiError::not_found(format!("webhook {name:?} not found")));
    }
    lift_quarantine(&cluster, &ns, &name).await?;
    Ok(Json(json!({"deleted": name})))
}

/// Receive a webhook delivery.
///
/// What another service sends: no bearer token, but a signature by the webhook's scheme over the
/// raw body (and, for `stripe`, a timestamp within the tolerance). A missing, malformed, stale or
/// wrong signature is a 401 and records nothing; so is a delivery to a name no webhook has, with
/// the same answer, so that names cannot be found out without a secret (the coordinator's log
/// says which it was). A delivery whose signature holds becomes an
/// event by the webhook's transform and is sent as `POST /v1/events` sends one (its source
/// `webhook:NAME`): a replayed delivery has the same id, so it is recorded once and answered
/// with `duplicate`.
#[utoipa::path(
    post, path = "/v1/webhooks/{name}", operation_id = "deliverWebhook", tag = "events",
    params(("name" = Name, Path, description = "the webhook")),
    request_body(content = composer_api::schema::JsonValue, description = "the delivery, as the other service signed it"),
    responses(
        (status = 200, description = "the event it became, and what that did", body = EventSent),
        (status = 401, description = "the signature is missing, malformed, stale or wrong, or no webhook has this name: nothing was recorded", body = ErrorBody),
        (status = 503, description = "this coordinator lacks the webhook's secret", body = ErrorBody),
    )
)]
pub(crate) async fn deliver(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Extension(InNamespace(ns)): Extension<InNamespace>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> ApiResult<Json<EventSent>> {
    // In the API's JSON error format, as every other body's limit.
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge,
        _ => ApiError::bad_request(rejection.body_text()),
    })?;
    name_param("webhook", &name)?;
    let client = composer_store::client(&pool).await?;
    let Some(row) = webhooks::get(&client, &name).await? else {
        tracing::info!(webhook = %name, "webhook delivery refused: no webhook of this name");
        return Err(ApiError::BadSignature);
    };
    drop(client);
    let spec: WebhookSpec = serde_json::from_value(row.spec.clone())
        .map_err(|e| ApiError::bad_request(format!("stored webhook {name} is invalid: {e}")))?;
    let tolerance = crate::webhooks::tolerance(&spec).map_err(ApiError::bad_request)?;
    let var = crate::webhooks::secret_var(&spec.secret);
    let secret = std::env::var(&var).ok().filter(|v| !v.is_empty()).ok_or_else(|| {
        ApiError::Unavailable(format!(
            "webhook {name:?}: this coordinator has no {var} set; the delivery was not recorded"
        ))
    })?;
    let header_text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    let sig = header_text(crate::webhooks::signature_header(spec.scheme));
    let now = crate::clock::now().timestamp();
    // Checked before anything else is done for the sender: its transform
    // is compiled only for a delivery whose signature holds.
    let signed_at =
        crate::webhooks::verify(spec.scheme, secret.as_bytes(), sig, &body, now, tolerance).map_err(|why| {
            tracing::info!(webhook = %name, %why, "webhook delivery refused");
            ApiError::BadSignature
        })?;
    let hook = crate::webhooks::parse(spec, &ns).map_err(ApiError::bad_request)?;
    let body_json = match serde_json::from_slice::<Value>(&body) {
        Ok(v) => v,
        Err(_) => Value::String(String::from_utf8_lossy(&body).into_owned()),
    };
    let id = crate::webhooks::delivery_id(hook.spec.scheme, &body_json, &body, signed_at);
    let ev = transform(hook, &ns, body_json, &headers, id).await?;
    super::events::check(&config, &ev.name, &ev.key, ev.id.as_deref(), &ev.payload)?;
    let source = format!("webhook:{name}");
    // A sender that traces its deliveries (a W3C `traceparent` header) is continued as an API call is.
    let traceparent = super::extract::Traceparent(
        header_text("traceparent").and_then(|t| composer_core::trace::TraceContext::parse(t).ok()).map(|c| c.header()),
    )
    .of_caller(&pool)
    .await?;
    let incoming = Incoming {
        name: &ev.name,
        key: &ev.key,
        id: ev.id.as_deref(),
        payload: &ev.payload,
        source: &source,
        traceparent: traceparent.as_deref(),
    };
    Ok(Json(super::events::answer(
        crate::triggers::send(&config, &pool, &engine, incoming).await?,
        &ev.key,
        &ev.payload,
    )?))
}

/// The event a verified delivery becomes, by the webhook's transform (on
/// the evaluation threads: someone wrote it), with `id` unless the
/// transform names one.
async fn transform(
    hook: Webhook,
    ns: &str,
    body: Value,
    headers: &HeaderMap,
    id: String,
) -> ApiResult<crate::webhooks::WebhookEvent> {
    let mut seen = Map::new();
    for (k, v) in headers.iter().take(MAX_HEADERS) {
        if let Ok(text) = v.to_str() {
            if text.len() <= MAX_HEADER_VALUE {
                seen.entry(k.as_str().to_string()).or_insert_with(|| Value::String(text.to_string()));
            }
        }
    }
    let headers = Value::Object(seen);
    let subject = crate::webhooks::subject(ns, &hook.spec.name);
    let simple = hook.event.as_ref().is_none_or(|t| t.is_simple());
    let input = (Arc::new(hook), body, headers, id);
    let result = crate::engine::evaluator::evaluate(subject, simple, input, |sb, (hook, body, headers, id)| {
        crate::webhooks::event_of(sb, &hook, &body, &headers, id)
    })
    .await
    .map_err(|lost| ApiError::bad_request(format!("webhook transform: {lost}")))?;
    result.map_err(|e| ApiError::bad_request(format!("webhook transform: {e}")))
}
