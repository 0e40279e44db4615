//! The HTTP interface: the REST API (`/v1`), the workers' routes, the
//! operator's endpoints and the UI, all on one listener. Each route is
//! registered once, in `routes`, with the `#[utoipa::path]` of its handler
//! that documents it, so the router and `/openapi.json` cannot disagree.
//!
//! - [`error`]: [`ApiError`], the one error type, mapped to status and code.
//! - [`extract`]: the JSON body, typed queries, ids, names and page limits.
//! - [`authorize`]: the caller, the scope each route needs, the audit log.
//! - [`door`]: the namespace each request is in, and the hand-over to
//!   that namespace's routes.
//! - [`guard`]: allowed hosts, other sites' pages, URI length, the
//!   error log, the `composer-version` header of every answer.
//! - [`doc`]: the OpenAPI document and the rules it applies to every operation.
//! - [`workflows`], [`runs`], [`control`] (the operator's actions on a run), [`explain`], [`bulk`],
//!   [`migrate`] (runs moved to another version), [`events`], [`replay`] (events' triggers run
//!   again), [`schedules`], [`tasks`],
//!   [`updates`] (a request to a waiting step), [`approvals`] (steps waiting for people), [`webhooks`], [`limits`], [`keys`] (and the audit log), [`namespaces`], [`archive`] (export and
//!   archived runs), [`ops`]: one file per resource.

pub mod approvals;
pub mod archive;
pub mod authorize;
pub mod bulk;
pub mod control;
pub mod doc;
pub mod door;
pub mod error;
pub mod events;
pub mod explain;
pub mod extract;
pub mod guard;
pub mod keys;
pub mod limits;
pub mod migrate;
pub mod namespaces;
pub mod ops;
pub mod replay;
mod routes;
pub mod runs;
pub mod schedules;
pub mod tasks;
pub mod updates;
pub mod webhooks;
pub mod workflows;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::Router;
use utoipa_axum::router::OpenApiRouter;

pub use error::{ApiError, ApiResult};
pub use guard::{MAX_URI_BYTES, VERSION_HEADER};
pub use routes::document;

use routes::Groups;

use crate::shared::{AppState, Shared};

/// The whole HTTP interface of a coordinator: the door, in front of the
/// default namespace's routes, hands a request for another namespace to
/// that namespace's ([`routes`] on its state, from `namespaces`).
pub fn router(shared: Arc<Shared>, namespaces: Arc<dyn door::Namespaces>) -> Router {
    let limit = shared.config.max_value() + 64 * 1024;
    let config = shared.config.clone();
    // The default namespace's routes as the fallback of a router with none:
    // the door runs before any route is matched (a layer on routes would
    // run after, with the path's parameters already taken out).
    let ui = door::UiAnswers {
        session_of: crate::ui::session_of,
        to_login: crate::ui::to_login,
        refused_in: crate::ui::refused_in,
    };
    let door = Arc::new(door::Door::new(&shared, namespaces, ui));
    Router::new()
        .fallback_service(routes(shared))
        .layer(middleware::from_fn_with_state(door, door::door))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(guard::refuse_long_uris))
        .layer(middleware::from_fn_with_state(config, guard::refuse_unknown_hosts))
        .layer(middleware::from_fn(guard::observe_errors))
        // Outermost: every answer, a refusal or the fallback's 404 too.
        .layer(middleware::map_response(guard::identify))
}

/// Every route, on one namespace's state (`shared`).
pub fn routes(shared: Arc<Shared>) -> Router {
    let config = shared.config.clone();
    let Groups { public, workers, metrics, operations, signed } = routes::groups();
    let guarded = |router: OpenApiRouter<AppState>| {
        router
            .route_layer(middleware::from_fn_with_state((config.clone(), shared.keys.clone()), authorize::authorize))
            .route_layer(middleware::from_fn_with_state(config.clone(), guard::refuse_foreign_pages))
            .route_layer(middleware::map_response(guard::no_store))
    };
    // Innermost on the API's routes: a change is recorded once its caller is
    // known (the workers' calls are the runs' own history, not changes).
    let audited =
        public.route_layer(middleware::from_fn_with_state((config.clone(), shared.pool.clone()), authorize::audit));
    doc::publish(json());
    let (api, _) =
        OpenApiRouter::new()
            .merge(guarded(audited))
            .merge(guarded(workers))
            .merge(metrics.route_layer(middleware::from_fn_with_state(
                (config.clone(), shared.keys.clone()),
                authorize::authorize,
            )))
            .merge(operations)
            .merge(signed.route_layer(middleware::map_response(guard::no_store)))
            .split_for_parts();
    let demo = match config.demo_target {
        true => crate::demo::router(),
        false => Router::new(),
    };
    // The demo target answers without a token: it holds nothing.
    api.merge(crate::ui::router(AppState::new(shared.clone())))
        .merge(demo)
        .fallback(|| async { ApiError::NoSuchEndpoint })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // Before any route's own: a body is read no further than its route takes.
        .layer(middleware::from_fn_with_state(config, guard::limit_body))
        .layer(middleware::from_fn(guard::note_route))
        .with_state(AppState::new(shared))
}

/// The document as JSON, built once.
pub fn json() -> &'static str {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOC.get_or_init(|| document().to_pretty_json().expect("the OpenAPI document serializes"))
}
