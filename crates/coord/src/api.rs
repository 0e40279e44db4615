//! The HTTP interface (documented in docs/architecture.md and `/openapi.json`). Every error is JSON
//! `{"error": {"code", "message"}}` with a status that says whose fault it
//! is: 4xx for the caller's input (naming the field), 503 when a dependency
//! is down, 500 only for our own bugs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use composer_api::schema::Name;
use composer_api::wire::{ReportAck, ReportStatus, TaskReport};
use composer_api::{
    DefinitionView, ErrorBody, ErrorDetail, EventSent, HistoryEntryView, HistoryPage, ItemPage, RunPage, RunView,
    SendEvent, StartRun, TaskView, WorkflowList,
};
use composer_core::definition::{Workflow, WorkflowSpec};
use composer_core::duration;
use composer_core::machine::{Event, RunStatus};
use composer_store::definitions::{self, DefinitionRow, Registered};
use composer_store::runs::{self, RunRow, TaskRow};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::bearer_matches;
use crate::engine::EngineError;
use crate::openapi::Status;
use crate::{schedules, Shared};

/// Longest request URI (path and query) answered; longer is a 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Longest `?wait=` a caller may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);
const MAX_PAGE: i64 = 1000;

/// The error code of a 404 that means the run is gone.
pub use composer_api::RUN_NOT_FOUND;

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds for a `Retry-After` header (503s the caller should retry).
    retry_after: Option<u64>,
    /// What went wrong underneath, for the log (never in the response).
    cause: Option<String>,
}

/// The cause of an error response, for `observe_errors` to log.
#[derive(Clone)]
struct ErrorCause(String);

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), retry_after: None, cause: None }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    fn internal(cause: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error");
        e.cause = Some(cause.into());
        e
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    fn too_large(what: &str, limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("{what} exceeds the limit of {limit} bytes (COMPOSER_MAX_PAYLOAD)"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let detail = ErrorDetail { code: self.code.to_string(), message: self.message };
        let mut resp = (self.status, Json(ErrorBody { error: detail.clone() })).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        // For the log of errors (`observe_errors`).
        resp.extensions_mut().insert(detail);
        if let Some(cause) = self.cause {
            resp.extensions_mut().insert(ErrorCause(cause));
        }
        resp
    }
}

impl From<composer_store::Error> for ApiError {
    fn from(e: composer_store::Error) -> ApiError {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the database is unavailable; retry later")
        } else {
            ApiError::internal(format!("database error: {e}"))
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            // A distinct code: a worker drops its report only on this one,
            // never on a 404 from a proxy or a wrong path.
            EngineError::RunNotFound(id) => {
                ApiError::new(StatusCode::NOT_FOUND, RUN_NOT_FOUND, format!("run {id} not found"))
            }
            EngineError::Store(e) => e.into(),
            EngineError::Stopped => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the coordinator is shutting down")
            }
            EngineError::Busy => {
                let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "the engine is busy; retry shortly");
                e.retry_after = Some(1);
                e
            }
            EngineError::Rejected(message) => ApiError::bad_request(message),
            e @ EngineError::Fault { .. } => {
                let mut err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "engine_fault", e.to_string());
                err.cause = Some(e.to_string());
                err
            }
        }
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// A JSON body (its Content-Type is checked by `refuse_foreign_pages`), with
/// errors in our format. A
/// string with a NUL character (which PostgreSQL cannot store) is a 400
/// naming its field, unless `NUL_OK` (a worker's report, whose output the
/// handler turns into a failed attempt instead).
pub struct Body<T, const NUL_OK: bool = false>(pub T);

impl<S: Send + Sync, T: DeserializeOwned, const NUL_OK: bool> FromRequest<S> for Body<T, NUL_OK> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(status, "payload_too_large", "request body too large (COMPOSER_MAX_PAYLOAD)")
            } else {
                ApiError::new(status, "invalid_request", rejection.body_text())
            }
        })?;
        if bytes.is_empty() {
            return Err(ApiError::bad_request("request body is empty; expected JSON"));
        }
        if !NUL_OK && has_nul_escape(&bytes) {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                if let Some(path) = nul_path(&value, String::new()) {
                    return Err(ApiError::bad_request(format!(
                        "{} contains a NUL character (\\u0000), which cannot be stored",
                        if path.is_empty() { "the body".to_string() } else { format!("field {path}") }
                    )));
                }
            }
        }
        serde_json::from_slice(&bytes).map(Body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// Whether JSON text may hold a NUL character: a `\u0000` escape (an odd
/// number of backslashes before the `u`). Cheap enough for every request;
/// the exact field is found only when it says yes.
fn has_nul_escape(json: &[u8]) -> bool {
    json.windows(6)
        .enumerate()
        .any(|(i, w)| w == b"\\u0000" && json[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0)
}

/// The path of the first string or key with a NUL in `v`.
fn nul_path(v: &Value, at: String) -> Option<String> {
    match v {
        Value::String(s) => s.contains('\0').then_some(at),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_path(v, format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(format!("{at}.{}", k.replace('\0', "\\u0000")))
            } else {
                nul_path(v, format!("{at}.{k}"))
            }
        }),
        _ => None,
    }
}

/// A name from a path or query string, refused when PostgreSQL could not
/// compare it (a NUL character).
pub(crate) fn text_param<'a>(value: &'a str, what: &str) -> ApiResult<&'a str> {
    composer_core::storable::check_text(value, what).map_err(ApiError::bad_request)?;
    Ok(value)
}

pub fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.config.max_payload + 64 * 1024;
    let public = Router::new()
        .route("/v1/workflows", post(register_workflow).get(list_workflows))
        .route("/v1/workflows/{name}", get(get_workflow))
        .route("/v1/workflows/{name}/versions/{version}", get(get_workflow_version))
        .route("/v1/runs", post(start_run).get(list_runs))
        .route("/v1/events", post(send_event))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/runs/{id}/events", get(run_events))
        .route("/v1/runs/{id}/items", get(run_items))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/runs/{id}/retry", post(retry_run))
        .route("/v1/runs/{id}/pause", post(pause_run))
        .route("/v1/runs/{id}/resume", post(resume_run))
        .route("/v1/schedules", post(schedules::create).get(schedules::list))
        .route("/v1/schedules/{id}", get(schedules::get).delete(schedules::delete))
        .route("/v1/schedules/{id}/pause", post(schedules::pause))
        .route("/v1/schedules/{id}/resume", post(schedules::resume))
        .route("/v1/schedules/{id}/trigger", post(schedules::trigger))
        .route_layer(middleware::from_fn_with_state(shared.clone(), require_api_token));
    let internal = Router::new()
        .route("/internal/v1/tasks/{id}/result", post(report))
        .route("/v1/tasks/poll", post(crate::tasks::poll))
        .route("/v1/tasks/{id}/heartbeat", post(crate::tasks::heartbeat))
        .route("/v1/tasks/{id}/complete", post(crate::tasks::complete))
        .route("/v1/tasks/{id}/fail", post(crate::tasks::fail))
        .route_layer(middleware::from_fn_with_state(shared.clone(), require_worker_token));
    let public = public.route_layer(middleware::from_fn_with_state(shared.clone(), refuse_foreign_pages));
    let internal = internal.route_layer(middleware::from_fn_with_state(shared.clone(), refuse_foreign_pages));
    Router::new()
        .merge(public)
        .merge(internal)
        .merge(crate::ui::router(shared.clone()))
        .route("/healthz", get(health))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this endpoint")
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(refuse_long_uris))
        .layer(middleware::from_fn(observe_errors))
        .with_state(shared)
}

/// A URI over `MAX_URI_BYTES` is a 414 with a JSON body. (Past 64 KiB the
/// HTTP parser itself answers 414, without a body, before any handler.)
async fn refuse_long_uris(req: Request, next: Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if len > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the URI is {len} bytes, over the limit of {MAX_URI_BYTES}"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Liveness: the process answers.
#[utoipa::path(
    get, path = "/healthz", operation_id = "health", tag = "operations",
    responses((status = 200, description = "alive", body = Status))
)]
pub(crate) async fn health() -> Json<Status> {
    Json(Status { status: "ok".into() })
}

/// This document: the API in OpenAPI 3.1.
#[utoipa::path(
    get, path = "/openapi.json", operation_id = "openapi", tag = "operations",
    responses((status = 200, description = "the OpenAPI document", body = Object))
)]
pub(crate) async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], crate::openapi::json()).into_response()
}

async fn require_api_token(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    check_token(s.config.api_token.as_deref(), req, next).await
}

/// Counts error responses by status, and logs every 5xx with its method,
/// path and cause.
async fn observe_errors(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    // The route's pattern, not the path: a run id must not become a label.
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let status = resp.status();
    let class = match status.as_u16() / 100 {
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    };
    composer_metrics::observe(
        composer_metrics::API_REQUEST_DURATION,
        &[("method", method.as_str()), ("route", &route), ("status", class)],
        started.elapsed(),
    );
    if status.is_client_error() || status.is_server_error() {
        composer_metrics::inc(composer_metrics::API_ERRORS, &[("status", status.as_str())], 1);
    }
    if status.is_server_error() {
        let message = resp.extensions().get::<ErrorDetail>().map(|d| d.message.clone()).unwrap_or_default();
        let cause = resp.extensions().get::<ErrorCause>().map(|c| c.0.clone()).unwrap_or_default();
        tracing::error!(%method, %path, status = status.as_u16(), %message, %cause, "request failed");
    }
    resp
}

/// `/internal` is closed whenever any token is set: with only an API token,
/// it takes that token (a worker in `composer dev` is given one).
async fn require_worker_token(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    check_token(s.config.worker_token.as_deref().or(s.config.api_token.as_deref()), req, next).await
}

/// Browsers cannot drive the API behind the user's back: a request from a
/// web page of another origin (its `Origin` header) is refused unless that
/// origin is allowed (`COMPOSER_ALLOWED_ORIGINS`), and a body a page can
/// send without a CORS preflight (a form, `text/plain`) is refused as not
/// JSON. Without a token, the API on loopback would otherwise be open to
/// any page the user visits.
async fn refuse_foreign_pages(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default().trim_end_matches('/');
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        let own = !host.is_empty() && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        if !own && !s.config.allowed_origins.iter().any(|o| o == origin) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!("requests from web pages of {origin:?} are not allowed (COMPOSER_ALLOWED_ORIGINS)"),
            )
            .into_response();
        }
    }
    if let Some(kind) = req.headers().get(header::CONTENT_TYPE) {
        let kind = kind.to_str().unwrap_or_default().to_ascii_lowercase();
        let essence = kind.split(';').next().unwrap_or_default().trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("request bodies must be application/json, got {essence:?}"),
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn check_token(expected: Option<&str>, req: Request, next: Next) -> Response {
    if let Some(expected) = expected {
        let header = req.headers().get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
        if !bearer_matches(header, expected) {
            return ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token")
                .into_response();
        }
    }
    next.run(req).await
}

/// Prometheus metrics; unauthenticated like `/healthz` (counts, no data).
#[utoipa::path(
    get, path = "/metrics", operation_id = "metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain"))
)]
pub(crate) async fn metrics() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], composer_metrics::render())
}

/// Readiness: answers 503 while a dependency is down or the coordinator drains.
#[utoipa::path(
    get, path = "/readyz", operation_id = "readiness", tag = "operations",
    responses(
        (status = 200, description = "PostgreSQL, Redis and every engine loop are up", body = Status),
        (status = 503, description = "not ready, or draining to stop", body = ErrorBody),
    )
)]
pub(crate) async fn readyz(State(s): State<Arc<Shared>>) -> ApiResult<Json<Value>> {
    if s.draining.is_cancelled() {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "draining", "the coordinator is shutting down"));
    }
    let live = s.engine.live_loops();
    if live < s.config.engine_workers {
        let message = format!("{live} of {} engine loops are running", s.config.engine_workers);
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message));
    }
    if let Err(e) = tokio::time::timeout(Duration::from_secs(2), composer_store::ping(&s.pool))
        .await
        .unwrap_or_else(|_| Err(composer_store::Error::Config("timed out".into())))
    {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("PostgreSQL: {e}")));
    }
    if let Err(e) = s.streams.ping().await {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("Redis: {e}")));
    }
    Ok(Json(json!({"status": "ready"})))
}

fn definition_view(d: &DefinitionRow, with_spec: bool) -> DefinitionView {
    DefinitionView {
        id: d.id,
        name: d.name.clone(),
        version: d.version,
        created_at: d.created_at,
        spec: with_spec.then(|| d.spec.clone()),
        versions: None,
        versions_next: None,
    }
}

/// Register a definition: a new version when it changed.
#[utoipa::path(
    post, path = "/v1/workflows", operation_id = "registerWorkflow", tag = "workflows",
    request_body = WorkflowSpec,
    responses(
        (status = 201, description = "a new version", body = DefinitionView),
        (status = 200, description = "identical to the latest version", body = DefinitionView),
    )
)]
pub(crate) async fn register_workflow(State(s): State<Arc<Shared>>, Body(spec): Body<Value>) -> ApiResult<Response> {
    // Compiling a definition's expressions is CPU work: off the async runtime.
    let wf = tokio::task::spawn_blocking(move || Workflow::parse(&spec))
        .await
        .map_err(|e| ApiError::internal(format!("definition compiler stopped: {e}")))?
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_definition", e.to_string()))?;
    let normalized = serde_json::to_value(&wf.spec).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut client = composer_store::client(&s.pool).await?;
    let (status, row) = match definitions::register(&mut client, &wf.spec.name, &normalized).await? {
        Registered::Created(row) => (StatusCode::CREATED, row),
        Registered::Unchanged(row) => (StatusCode::OK, row),
    };
    tracing::info!(workflow = %row.name, version = row.version, created = status == StatusCode::CREATED, "workflow registered");
    Ok((status, Json(definition_view(&row, false))).into_response())
}

/// The latest version of every workflow.
#[utoipa::path(
    get, path = "/v1/workflows", operation_id = "listWorkflows", tag = "workflows",
    responses((status = 200, description = "the latest version of each workflow", body = WorkflowList))
)]
pub(crate) async fn list_workflows(State(s): State<Arc<Shared>>) -> ApiResult<Json<WorkflowList>> {
    let client = composer_store::client(&s.pool).await?;
    let rows = definitions::latest_of_each(&client, MAX_PAGE).await?;
    Ok(Json(WorkflowList { workflows: rows.iter().map(|d| definition_view(d, false)).collect() }))
}

/// The latest version with its spec, and a page of versions (metadata only;
/// `?limit=`, `?before=`).
#[utoipa::path(
    get, path = "/v1/workflows/{name}", operation_id = "getWorkflow", tag = "workflows",
    params(
        ("name" = Name, Path, description = "the workflow"),
        ("limit" = Option<i32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000 (default 50)"),
        ("before" = Option<i32>, Query, description = "versions older than this one (the previous page's versions_next)"),
    ),
    responses((status = 200, description = "the latest version with its spec, and a page of versions", body = DefinitionView))
)]
pub(crate) async fn get_workflow(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<DefinitionView>> {
    text_param(&name, "workflow name")?;
    let limit = page_limit(q.get("limit"), 50)?;
    let before = match q.get("before") {
        Some(b) => Some(
            b.parse::<i32>().map_err(|_| ApiError::bad_request(format!("before: expected a version, got {b:?}")))?,
        ),
        None => None,
    };
    let client = composer_store::client(&s.pool).await?;
    let Some(latest) = definitions::by_name(&client, &name, None).await? else {
        return Err(ApiError::not_found(format!("workflow {name:?} not found")));
    };
    let versions = definitions::versions(&client, &name, before, limit).await?;
    let mut v = definition_view(&latest, true);
    v.versions_next = if versions.len() as i64 == limit { versions.last().map(|d| d.version) } else { None };
    v.versions = Some(versions.iter().map(|d| definition_view(d, false)).collect());
    Ok(Json(v))
}

#[utoipa::path(
    get, path = "/v1/workflows/{name}/versions/{version}", operation_id = "getWorkflowVersion", tag = "workflows",
    params(
        ("name" = Name, Path, description = "the workflow"),
        ("version" = i32, Path, minimum = 1, description = "the version"),
    ),
    responses((status = 200, description = "the version with its spec", body = DefinitionView))
)]
pub(crate) async fn get_workflow_version(
    State(s): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult<Json<DefinitionView>> {
    let version: i32 = version
        .parse()
        .map_err(|_| ApiError::bad_request(format!("version must be a positive integer, got {version:?}")))?;
    text_param(&name, "workflow name")?;
    let client = composer_store::client(&s.pool).await?;
    match definitions::by_name(&client, &name, Some(version)).await? {
        Some(d) => Ok(Json(definition_view(&d, true))),
        None => Err(ApiError::not_found(format!("workflow {name:?} version {version} not found"))),
    }
}

/// Start a run of a workflow.
#[utoipa::path(
    post, path = "/v1/runs", operation_id = "startRun", tag = "runs",
    request_body = StartRun,
    responses(
        (status = 201, description = "started", body = RunView),
        (status = 200, description = "the run already started with this idempotency key", body = RunView),
    )
)]
pub(crate) async fn start_run(State(s): State<Arc<Shared>>, Body(req): Body<StartRun>) -> ApiResult<Response> {
    let input = req.input.unwrap_or_else(|| json!({}));
    if json_size(&input) > s.config.max_payload {
        return Err(ApiError::too_large("run input", s.config.max_payload));
    }
    composer_core::storable::check(&input, "input", s.config.max_payload).map_err(ApiError::bad_request)?;
    let def = {
        let client = composer_store::client(&s.pool).await?;
        definitions::by_name(&client, &req.workflow, req.version).await?
    };
    let def = def.ok_or_else(|| match req.version {
        Some(v) => ApiError::not_found(format!("workflow {:?} version {v} not found", req.workflow)),
        None => ApiError::not_found(format!("workflow {:?} not found", req.workflow)),
    })?;
    if let Some(key) = &req.idempotency_key {
        if key.is_empty() || key.chars().count() > 256 {
            return Err(ApiError::bad_request("idempotency_key must be 1 to 256 characters"));
        }
    }
    let (row, created) = s.engine.start_run(&def, &input, req.idempotency_key.as_deref()).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(run_view(&row, None))).into_response())
}

/// Runs, newest first, keyset-paginated.
#[utoipa::path(
    get, path = "/v1/runs", operation_id = "listRuns", tag = "runs",
    params(
        ("workflow" = Option<Name>, Query, description = "only runs of this workflow"),
        ("status" = Option<RunStatus>, Query, description = "only runs in this status"),
        ("limit" = Option<i32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000 (default 50)"),
        ("cursor" = Option<Uuid>, Query, description = "the previous page's next_cursor"),
        ("parent_run_id" = Option<Uuid>, Query, description = "only the child runs of this run"),
    ),
    responses((status = 200, description = "a page of runs, newest first", body = RunPage))
)]
pub(crate) async fn list_runs(
    State(s): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<RunPage>> {
    for key in q.keys() {
        if !matches!(key.as_str(), "workflow" | "status" | "parent_run_id" | "limit" | "cursor") {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?} (workflow, status, parent_run_id, limit, cursor)"
            )));
        }
    }
    let status = match q.get("status") {
        Some(v) => Some(RunStatus::parse(&v.to_ascii_uppercase()).ok_or_else(|| {
            ApiError::bad_request(format!(
                "status: expected QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED, got {v:?}"
            ))
        })?),
        None => None,
    };
    let limit = page_limit(q.get("limit"), 50)?;
    if let Some(w) = q.get("workflow") {
        composer_core::definition::check_name("workflow", w).map_err(ApiError::bad_request)?;
    }
    let cursor = match q.get("cursor") {
        Some(c) => Some(c.parse::<Uuid>().map_err(|_| ApiError::bad_request(format!("cursor: invalid cursor {c:?}")))?),
        None => None,
    };
    let parent = match q.get("parent_run_id") {
        Some(p) => {
            Some(p.parse::<Uuid>().map_err(|_| ApiError::bad_request(format!("parent_run_id: {p:?} is not a UUID")))?)
        }
        None => None,
    };
    let client = composer_store::client(&s.pool).await?;
    let filter =
        runs::RunFilter { workflow: q.get("workflow").map(String::as_str), status, parent, ..Default::default() };
    let rows = runs::list(&client, &filter, cursor, limit).await?;
    let next = if rows.len() as i64 == limit { rows.last().map(|r| r.id.to_string()) } else { None };
    Ok(Json(RunPage { runs: rows.iter().map(|r| run_view(r, None)).collect(), next_cursor: next }))
}

pub(crate) fn page_limit(raw: Option<&String>, default: i64) -> ApiResult<i64> {
    match raw {
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=MAX_PAGE).contains(l))
            .ok_or_else(|| ApiError::bad_request(format!("limit: expected 1..={MAX_PAGE}, got {l:?}"))),
        None => Ok(default),
    }
}

/// Completes every task waiting for `(name, key)` with the payload; with no
/// waiter, keeps the event for `COMPOSER_EVENT_RETENTION` for one to come.
#[utoipa::path(
    post, path = "/v1/events", operation_id = "sendEvent", tag = "runs",
    request_body = SendEvent,
    responses((status = 200, description = "delivered to the waiting steps, or kept for one to come", body = EventSent))
)]
pub(crate) async fn send_event(State(s): State<Arc<Shared>>, Body(ev): Body<SendEvent>) -> ApiResult<Json<EventSent>> {
    // Characters, as an OpenAPI maxLength counts them, not bytes.
    if ev.name.is_empty() || ev.name.chars().count() > 256 {
        return Err(ApiError::bad_request("name must be 1 to 256 characters"));
    }
    if ev.key.chars().count() > 1024 {
        return Err(ApiError::bad_request("key must be at most 1024 characters"));
    }
    if json_size(&ev.payload) > s.config.max_payload {
        return Err(ApiError::too_large("event payload", s.config.max_payload));
    }
    composer_core::storable::check(&ev.payload, "payload", s.config.max_payload).map_err(ApiError::bad_request)?;
    let mut client = composer_store::client(&s.pool).await?;
    let (event_id, waiters) =
        composer_store::events::record(&mut client, &ev.name, &ev.key, &ev.payload, s.config.event_retention).await?;
    // Recorded first: an error below leaves the event buffered, for the
    // recovery sweep to deliver to these waiters, or for a later waiter.
    // It is marked consumed only once every waiter has it.
    let mut taken_by = None;
    let mut matched = 0;
    for w in waiters {
        let event = Event::EventReceived { task_id: w.task_id, payload: ev.payload.clone() };
        if s.engine.handle(w.run_id, event).await?.ignored.is_none() {
            taken_by.get_or_insert(w.task_id);
            matched += 1;
        }
    }
    if let Some(task_id) = taken_by {
        composer_store::events::mark_consumed(&client, event_id, task_id).await?;
    }
    Ok(Json(EventSent { matched, buffered: matched == 0 }))
}

fn json_size(v: &Value) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

fn parse_run_id(id: &str) -> ApiResult<Uuid> {
    id.parse().map_err(|_| ApiError::bad_request(format!("invalid run id {id:?}: expected a UUID")))
}

/// A run as the API shows it; `tasks` is `None` in lists, which carry no
/// input or output either.
pub fn run_view(r: &RunRow, tasks: Option<&[TaskRow]>) -> RunView {
    let full = tasks.is_some();
    RunView {
        id: r.id,
        workflow: r.workflow_name.clone(),
        version: r.workflow_version,
        workflow_id: r.workflow_definition_id,
        status: r.status,
        input: full.then(|| r.input.clone()),
        output: if full { r.output.clone() } else { None },
        error: r.error.clone(),
        created_at: r.created_at,
        updated_at: r.updated_at,
        finished_at: r.finished_at,
        trigger: r.trigger.clone(),
        parent_run_id: r.parent.map(|p| p.run_id),
        parent_task_id: r.parent.map(|p| p.task_id),
        tasks: tasks.map(|tasks| tasks.iter().map(task_view).collect()),
    }
}

fn task_view(t: &TaskRow) -> TaskView {
    TaskView {
        id: t.id,
        node_id: t.node_id.clone(),
        node_type: t.node_type.clone(),
        state: t.state,
        attempt: t.attempt,
        input: t.input.clone(),
        output: t.output.clone(),
        error: t.error.clone(),
        wake_at: t.wake_at,
        started_at: t.started_at,
        finished_at: t.finished_at,
        parent_task_id: t.parent_task_id,
        item_index: t.item_index,
        progress: t.map_progress(),
    }
}

/// A run with its tasks; `?wait=` long-polls for its end.
#[utoipa::path(
    get, path = "/v1/runs/{id}", operation_id = "getRun", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("wait" = Option<String>, Query, pattern = "^[0-9]{1,3}(ms|s)$",
            description = "long-poll up to this long (e.g. 30s, at most 60s) for the run to end"),
    ),
    responses((status = 200, description = "the run with its tasks (a MAP's items: listMapItems)", body = RunView))
)]
pub(crate) async fn get_run(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<RunView>> {
    let run_id = parse_run_id(&id)?;
    let wait = match q.get("wait") {
        Some(w) => duration::parse(w).map_err(|e| ApiError::bad_request(format!("wait: {e}")))?.min(MAX_WAIT),
        None => Duration::ZERO,
    };
    // Subscribe before reading, so an end that commits in between is seen.
    let mut ended = s.runs.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let client = composer_store::client(&s.pool).await?;
        let Some((run, tasks)) = runs::get(&client, run_id).await? else {
            return Err(ApiError::not_found(format!("run {run_id} not found")));
        };
        drop(client);
        if run.status.is_terminal() || tokio::time::Instant::now() >= deadline || s.draining.is_cancelled() {
            return Ok(Json(run_view(&run, Some(&tasks))));
        }
        loop {
            let ended = tokio::select! {
                // Stopping: answer now with the run as it is.
                _ = s.draining.cancelled() => break,
                r = tokio::time::timeout_at(deadline, ended.recv()) => r,
            };
            match ended {
                Err(_) => break,
                Ok(Ok(id)) if id == run_id || id.is_nil() => break,
                Ok(Ok(_)) => continue,
                Ok(Err(_)) => break,
            }
        }
    }
}

/// A run's history, oldest first.
#[utoipa::path(
    get, path = "/v1/runs/{id}/events", operation_id = "getRunHistory", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("after" = Option<i64>, Query, description = "the seq to start after (the previous page's next_after)"),
        ("limit" = Option<i32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000 (default 100)"),
    ),
    responses((status = 200, description = "a page of the run's history, oldest first", body = HistoryPage))
)]
pub(crate) async fn run_events(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<HistoryPage>> {
    let run_id = parse_run_id(&id)?;
    let after: i64 = match q.get("after") {
        Some(a) => a.parse().map_err(|_| ApiError::bad_request("after: expected an integer"))?,
        None => 0,
    };
    let limit = page_limit(q.get("limit"), 100)?;
    let client = composer_store::client(&s.pool).await?;
    if runs::status(&client, run_id).await?.is_none() {
        return Err(ApiError::not_found(format!("run {run_id} not found")));
    }
    let events = runs::history(&client, run_id, after, limit).await?;
    let next = if events.len() as i64 == limit { events.last().map(|e| e.seq) } else { None };
    let events = events
        .into_iter()
        .map(|e| HistoryEntryView { seq: e.seq, kind: e.kind, payload: e.payload, created_at: e.created_at })
        .collect();
    Ok(Json(HistoryPage { events, next_after: next }))
}

/// `GET /v1/runs/{id}/items?node=ship_each&after=N&limit=M`: a MAP's items
/// by index (the run view lists node tasks only, so a MAP of 10,000 items
/// does not make every read of its run 10,000 tasks long).
#[utoipa::path(
    get, path = "/v1/runs/{id}/items", operation_id = "listMapItems", tag = "runs",
    params(
        ("id" = Uuid, Path, description = "the run"),
        ("node" = Name, Query, description = "the MAP node's id"),
        ("after" = Option<i32>, Query, minimum = -1, description = "the item index to start after"),
        ("limit" = Option<i32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000 (default 100)"),
    ),
    responses((status = 200, description = "a page of the MAP's items, by index", body = ItemPage))
)]
pub(crate) async fn run_items(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<ItemPage>> {
    let run_id = parse_run_id(&id)?;
    let node = q.get("node").ok_or_else(|| ApiError::bad_request("node: required (the MAP node's id)"))?;
    text_param(node, "node")?;
    let after: i32 = match q.get("after") {
        Some(a) => a.parse().map_err(|_| ApiError::bad_request("after: expected an item index"))?,
        None => -1,
    };
    let limit = page_limit(q.get("limit"), 100)?;
    let client = composer_store::client(&s.pool).await?;
    let (_, tasks) =
        runs::get(&client, run_id).await?.ok_or_else(|| ApiError::not_found(format!("run {run_id} not found")))?;
    let map = tasks
        .iter()
        .find(|t| &t.node_id == node)
        .ok_or_else(|| ApiError::not_found(format!("run {run_id} has no task for node {node:?} (yet)")))?;
    if map.progress.is_none() && map.node_type != "MAP" {
        // A node that is not a MAP has no items: nothing found here.
        return Err(ApiError::not_found(format!("node {node:?} is a {}, not a MAP: it has no items", map.node_type)));
    }
    let items = runs::items(&client, run_id, map.id, after, limit).await?;
    let next = if items.len() as i64 == limit { items.last().and_then(|t| t.item_index) } else { None };
    Ok(Json(ItemPage { items: items.iter().map(task_view).collect(), next_after: next }))
}

async fn control(s: &Shared, id: &str, event: Event) -> ApiResult<Json<RunView>> {
    let run_id = parse_run_id(id)?;
    let handled = s.engine.handle(run_id, event).await?;
    if let Some(reason) = handled.ignored {
        return Err(ApiError::new(StatusCode::CONFLICT, "conflict", reason));
    }
    let client = composer_store::client(&s.pool).await?;
    let (run, tasks) =
        runs::get(&client, run_id).await?.ok_or_else(|| ApiError::not_found(format!("run {run_id} not found")))?;
    Ok(Json(run_view(&run, Some(&tasks))))
}

/// Cancel an open run: its open steps are cancelled.
#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel", operation_id = "cancelRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "cancelled", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn cancel_run(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<RunView>> {
    control(&s, &id, Event::CancelRun).await
}

/// Retry a failed or cancelled run from its failed steps.
#[utoipa::path(
    post, path = "/v1/runs/{id}/retry", operation_id = "retryRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "running again from its failed steps", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn retry_run(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<RunView>> {
    control(&s, &id, Event::RetryRun).await
}

/// Pause a RUNNING run: steps already started finish, nothing new starts until it is resumed.
#[utoipa::path(
    post, path = "/v1/runs/{id}/pause", operation_id = "pauseRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "paused", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn pause_run(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<RunView>> {
    control(&s, &id, Event::PauseRun).await
}

/// Resume a PAUSED run.
#[utoipa::path(
    post, path = "/v1/runs/{id}/resume", operation_id = "resumeRun", tag = "runs",
    params(("id" = Uuid, Path, description = "the run")),
    responses((status = 200, description = "running again", body = RunView), (status = 409, description = "not possible in the run's state (the message says why)", body = ErrorBody))
)]
pub(crate) async fn resume_run(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> ApiResult<Json<RunView>> {
    control(&s, &id, Event::ResumeRun).await
}

/// The event of an attempt that completed with `output`: an output that
/// cannot be stored (too large, too deep, a NUL) fails the attempt for good,
/// naming why, since a retry would produce it again.
pub(crate) fn completed(task_id: Uuid, attempt: i32, output: Value, max_payload: usize) -> Event {
    match composer_core::storable::check(&output, "output", max_payload) {
        Ok(()) => Event::TaskCompleted { task_id, attempt, output },
        Err(error) => Event::TaskFailed { task_id, attempt, error, retryable: false },
    }
}

/// A worker's report of one attempt of a task.
#[utoipa::path(
    post, path = "/internal/v1/tasks/{id}/result", operation_id = "reportTaskResult", tag = "workers",
    params(("id" = Uuid, Path, description = "the task")),
    request_body = TaskReport,
    responses((status = 200, description = "applied, or ignored with the reason (a duplicate, late or stale report)", body = ReportAck))
)]
pub(crate) async fn report(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Body(r): Body<TaskReport, true>,
) -> ApiResult<Json<ReportAck>> {
    let started = std::time::Instant::now();
    let task_id: Uuid = id.parse().map_err(|_| ApiError::bad_request(format!("invalid task id {id:?}")))?;
    let event = match r.status {
        // An output that cannot be stored (too large, too deep, a NUL) ends
        // the attempt for good, naming why: retrying would get it again.
        ReportStatus::Completed => completed(task_id, r.attempt, r.output.unwrap_or(Value::Null), s.config.max_payload),
        ReportStatus::Failed => Event::TaskFailed {
            task_id,
            attempt: r.attempt,
            error: r.error.unwrap_or_else(|| "failed without an error message".into()).replace('\0', "\u{FFFD}"),
            retryable: r.retryable,
        },
    };
    let handled = s.engine.handle(r.run_id, event).await?;
    composer_metrics::observe(composer_metrics::REPORT_DURATION, &[], started.elapsed());
    composer_metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "report_to_commit")], started.elapsed());
    Ok(Json(ReportAck { applied: handled.ignored.is_none(), ignored: handled.ignored }))
}
