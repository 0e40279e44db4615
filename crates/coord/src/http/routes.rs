//! Every documented route, registered once: the handler and its
//! `#[utoipa::path]` give both the router's route and the document's
//! operation.

use utoipa::Modify;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{approvals, ops, replay, runs, schedules, tasks, updates, webhooks, workflows};
use super::{archive, bulk, control, doc, events, explain, keys, limits, migrate, namespaces};
use crate::shared::AppState;

/// The documented routes, once each, in the groups their guards apply to.
pub(super) struct Groups {
    /// `/v1` for people and programs: a key (or the API token) with the
    /// route's scope.
    pub(super) public: OpenApiRouter<AppState>,
    /// What workers call: `tasks:work` (the worker token).
    pub(super) workers: OpenApiRouter<AppState>,
    /// `/metrics`: `metrics:read` (the metrics token).
    pub(super) metrics: OpenApiRouter<AppState>,
    /// Health, readiness and the document: no token.
    pub(super) operations: OpenApiRouter<AppState>,
    /// Webhook deliveries: no token, their signature instead.
    pub(super) signed: OpenApiRouter<AppState>,
}

pub(super) fn groups() -> Groups {
    let public = OpenApiRouter::new()
        .routes(routes!(workflows::register_workflow, workflows::list_workflows))
        .routes(routes!(workflows::get_workflow))
        .routes(routes!(workflows::get_workflow_version))
        .routes(routes!(migrate::migrate_runs))
        .routes(routes!(runs::start_run, runs::list_runs))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::run_events))
        .routes(routes!(runs::run_items))
        .routes(routes!(control::cancel_run))
        .routes(routes!(control::retry_run))
        .routes(routes!(control::pause_run))
        .routes(routes!(control::resume_run))
        .routes(routes!(control::set_run_priority))
        .routes(routes!(control::resolve_task))
        .routes(routes!(control::rerun_run))
        .routes(routes!(control::complete_step))
        .routes(routes!(runs::step_logs))
        .routes(routes!(archive::export_runs))
        .routes(routes!(archive::get_archived_run))
        .routes(routes!(archive::get_archived_run_items))
        .routes(routes!(archive::get_run_value))
        .routes(routes!(explain::explain))
        .routes(routes!(updates::update_run))
        .routes(routes!(approvals::list_approvals))
        .routes(routes!(approvals::get_approval))
        .routes(routes!(approvals::decide_approval))
        .routes(routes!(bulk::create))
        .routes(routes!(bulk::get))
        .routes(routes!(bulk::cancel))
        .routes(routes!(events::send_event, events::list_events))
        .routes(routes!(replay::create))
        .routes(routes!(replay::get))
        .routes(routes!(replay::cancel))
        .routes(routes!(webhooks::create, webhooks::list))
        .routes(routes!(webhooks::get, webhooks::delete))
        .routes(routes!(schedules::create, schedules::list))
        .routes(routes!(schedules::get, schedules::delete))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::resume))
        .routes(routes!(schedules::trigger))
        .routes(routes!(schedules::backfill))
        .routes(routes!(limits::list))
        .routes(routes!(limits::get, limits::set, limits::delete))
        .routes(routes!(keys::create, keys::list))
        .routes(routes!(keys::revoke))
        .routes(routes!(keys::audit_log))
        .routes(routes!(namespaces::create, namespaces::list))
        .routes(routes!(namespaces::get, namespaces::delete))
        .routes(routes!(namespaces::set_quotas));
    let workers = OpenApiRouter::new()
        .routes(routes!(tasks::poll))
        .routes(routes!(tasks::heartbeat))
        .routes(routes!(tasks::logs))
        .routes(routes!(tasks::complete))
        .routes(routes!(tasks::fail));
    let operations = OpenApiRouter::new()
        .routes(routes!(ops::health))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::openapi_json));
    let metrics = OpenApiRouter::new().routes(routes!(ops::metrics));
    let signed = OpenApiRouter::new().routes(routes!(webhooks::deliver));
    Groups { public, workers, metrics, operations, signed }
}

/// The whole document: every route's operation, then the rules.
pub fn document() -> utoipa::openapi::OpenApi {
    let Groups { public, workers, metrics, operations, signed } = groups();
    let mut doc = OpenApiRouter::with_openapi(doc::frame())
        .merge(public)
        .merge(workers)
        .merge(metrics)
        .merge(operations)
        .merge(signed)
        .into_openapi();
    doc::Rules.modify(&mut doc);
    doc
}
