//! The HTTP interface: the REST API (`/v1`), the workers' routes, the
//! operator's endpoints and the UI, all on one listener. Each route is
//! registered once, in [`routes`], with the `#[utoipa::path]` of its handler
//! that documents it, so the router and `/openapi.json` cannot disagree.
//!
//! - [`error`]: [`ApiError`], the one error type, mapped to status and code.
//! - [`extract`]: the JSON body, typed queries, ids, names and page limits.
//! - [`guard`]: tokens, other sites' pages, URI length, the error log.
//! - [`doc`]: the OpenAPI document and the rules it applies to every operation.
//! - [`workflows`], [`runs`], [`events`], [`schedules`], [`tasks`],
//!   [`internal`], [`ops`]: one file per resource.

pub mod doc;
pub mod error;
pub mod events;
pub mod extract;
pub mod guard;
pub mod internal;
pub mod ops;
pub mod runs;
pub mod schedules;
pub mod tasks;
pub mod workflows;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, ApiResult};
pub use guard::MAX_URI_BYTES;

use crate::Shared;

/// The documented routes, once each, in the groups their guards apply to.
struct Groups {
    /// `/v1` for people and programs: the API token.
    public: OpenApiRouter<Arc<Shared>>,
    /// What workers call: the worker token.
    workers: OpenApiRouter<Arc<Shared>>,
    /// Health, readiness, metrics and the document: no token.
    operations: OpenApiRouter<Arc<Shared>>,
}

fn groups() -> Groups {
    let public = OpenApiRouter::new()
        .routes(routes!(workflows::register_workflow, workflows::list_workflows))
        .routes(routes!(workflows::get_workflow))
        .routes(routes!(workflows::get_workflow_version))
        .routes(routes!(runs::start_run, runs::list_runs))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::run_events))
        .routes(routes!(runs::run_items))
        .routes(routes!(runs::cancel_run))
        .routes(routes!(runs::retry_run))
        .routes(routes!(runs::pause_run))
        .routes(routes!(runs::resume_run))
        .routes(routes!(events::send_event))
        .routes(routes!(schedules::create, schedules::list))
        .routes(routes!(schedules::get, schedules::delete))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::resume))
        .routes(routes!(schedules::trigger));
    let workers = OpenApiRouter::new()
        .routes(routes!(internal::report))
        .routes(routes!(tasks::poll))
        .routes(routes!(tasks::heartbeat))
        .routes(routes!(tasks::complete))
        .routes(routes!(tasks::fail));
    let operations = OpenApiRouter::new()
        .routes(routes!(ops::health))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi_json));
    Groups { public, workers, operations }
}

/// Every documented route, for the document.
pub(crate) fn routes() -> OpenApiRouter<Arc<Shared>> {
    let Groups { public, workers, operations } = groups();
    OpenApiRouter::with_openapi(doc::frame()).merge(public).merge(workers).merge(operations)
}

/// The whole HTTP interface of a coordinator.
pub fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.config.max_payload + 64 * 1024;
    let guarded = |router: OpenApiRouter<Arc<Shared>>, token: guard::Token| {
        router
            .route_layer(middleware::from_fn_with_state((shared.clone(), token), guard::require_token))
            .route_layer(middleware::from_fn_with_state(shared.clone(), guard::refuse_foreign_pages))
    };
    let Groups { public, workers, operations } = groups();
    let (api, _) = OpenApiRouter::new()
        .merge(guarded(public, guard::Token::Api))
        .merge(guarded(workers, guard::Token::Worker))
        .merge(operations)
        .split_for_parts();
    api.merge(crate::ui::router(shared.clone()))
        .fallback(|| async { ApiError::NoSuchEndpoint })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(guard::refuse_long_uris))
        .layer(middleware::from_fn(guard::observe_errors))
        .with_state(shared)
}
