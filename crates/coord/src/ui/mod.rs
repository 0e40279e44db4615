//! The web UI at `/ui`: server-rendered pages over the same store and engine
//! as the REST API, no JavaScript build step (one small script refreshes what
//! is live). With an API token set, a person logs in with it and gets a
//! session: a random id in an HttpOnly, SameSite=Strict cookie, which
//! expires (`COMPOSER_UI_SESSION_TTL`) and which logout revokes. Wrong
//! tokens are throttled; forms that change something also check the
//! request's Origin. No page is cached: they show inputs, outputs and errors.
//!
//! This file is the route table. The pages, one file each as `http/` has
//! one per resource:
//! - `runs`: the runs list and its act form; `bulk`: a bulk job's progress.
//! - `archived`: a run read back from the archive, read-only.
//! - `run`: one run's page; `steps`: its steps table and a MAP's items;
//!   `logs`: a step's log; `control`: the buttons and forms that change a
//!   run, and their answers.
//! - `workflows`, `schedules` (with backfill), `events`, `limits`, `audit`
//!   (the audit log); `migrate`: a version's open runs moved to another,
//!   the dry run's verdicts first; `replay`: the events page's replay
//!   form, and a replay's progress; `approvals`: the approvals inbox, one
//!   approval and the form that decides it.
//! - `namespaces`: the cluster's namespaces, and which one the other pages
//!   show (every page but this one, login and the static files is a
//!   namespace's, chosen by a cookie the door reads).
//! - `ops`: the overview and the queues.
//! - `login`: log in and out; `sso`: sign in with the identity provider.
//!
//! What the pages share:
//! - `html`: the one way HTML is made (`html::Html`, escaped by default),
//!   and the page's frame.
//! - `dag`: the graph drawn as SVG; `timeline`: a run's steps as bars over
//!   time (SVG).
//! - `guard`: the session check, the refusal of other sites' forms, the
//!   headers of every answer; `session`: session ids, their cookie, and the
//!   login throttle.
//! - `error`: a page that could not be made; `extract`: what pages read from
//!   queries and forms; `notices`: the fixed texts shown after a form.

mod approvals;
mod archived;
mod audit;
mod bulk;
mod control;
mod dag;
mod error;
mod events;
mod extract;
mod guard;
mod html;
mod limits;
mod login;
mod logs;
mod migrate;
mod namespaces;
mod notices;
mod ops;
mod replay;
mod run;
mod runs;
mod schedules;
mod session;
mod sso;
mod steps;
mod timeline;
mod workflows;

use axum::http::header;
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::shared::AppState;

/// The UI's routes; `state` is the router's, which its guards read.
pub fn router(state: AppState) -> Router<AppState> {
    use axum::extract::FromRef;
    let audit_state =
        (std::sync::Arc::<crate::config::Config>::from_ref(&state), composer_store::Pool::from_ref(&state));
    let pages = Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/runs") }))
        .route("/ui/runs", get(runs::runs_page))
        .route("/ui/runs/act", post(runs::runs_act))
        .route("/ui/runs/{id}", get(run::run_page))
        .route("/ui/runs/{id}/items", get(steps::items_page))
        .route("/ui/archive/runs/{id}", get(archived::archived_page))
        .route("/ui/runs/{id}/logs", get(logs::logs_page))
        .route("/ui/runs/{id}/rerun", post(control::rerun_action))
        .route("/ui/runs/{id}/priority", post(control::priority_action))
        .route("/ui/runs/{id}/{action}", post(control::run_action))
        .route("/ui/runs/{id}/tasks/{node}/resolve", post(control::resolve_action))
        .route("/ui/runs/{id}/tasks/{node}/complete", post(control::complete_action))
        .route("/ui/bulk/{id}", get(bulk::bulk_page))
        .route("/ui/bulk/{id}/cancel", post(bulk::bulk_cancel))
        .route("/ui/overview", get(ops::overview_page))
        .route("/ui/queues", get(ops::queues_page))
        .route("/ui/workflows", get(workflows::workflows_page))
        .route("/ui/workflows/{name}", get(workflows::workflow_page))
        .route("/ui/workflows/{name}/migrate", get(migrate::migrate_page).post(migrate::migrate_action))
        .route("/ui/schedules", get(schedules::schedules_page))
        .route("/ui/schedules/{id}/backfill", post(schedules::backfill_action))
        .route("/ui/events", get(events::events_page))
        .route("/ui/approvals", get(approvals::inbox_page))
        .route("/ui/approvals/{id}/{node}", get(approvals::approval_page))
        .route("/ui/approvals/{id}/{node}/decide", post(approvals::decide_action))
        .route("/ui/events/replay", post(replay::replay_action))
        .route("/ui/replays/{id}", get(replay::replay_page))
        .route("/ui/replays/{id}/cancel", post(replay::replay_cancel))
        .route("/ui/limits", get(limits::limits_page).post(limits::limit_action))
        .route("/ui/audit", get(audit::audit_page))
        .route("/ui/namespaces", get(namespaces::namespaces_page).post(namespaces::create))
        .route("/ui/namespaces/switch", post(namespaces::switch))
        .route("/ui/namespaces/{name}/delete", post(namespaces::delete))
        // Innermost: a form that changes something is in the audit log, as the API's are.
        .route_layer(middleware::from_fn_with_state(audit_state, crate::http::authorize::audit))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard::refuse_other_sites))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard::require_login));
    // Another site's page may not sign the user out either.
    let logout = Router::new()
        .route("/ui/logout", post(login::logout))
        .route_layer(middleware::from_fn_with_state(state, guard::refuse_other_sites));
    Router::new()
        .merge(pages)
        .merge(logout)
        .route("/ui/login", get(login::login_page).post(login::login))
        .route("/ui/sso", get(sso::begin))
        .route("/ui/sso/callback", get(sso::callback))
        .route("/ui/static/app.css", get(|| async { static_file("text/css", include_str!("app.css")) }))
        .route("/ui/static/app.js", get(|| async { static_file("text/javascript", include_str!("app.js")) }))
        .layer(Extension(login::throttle()))
        .layer(Extension(std::sync::Arc::new(crate::oidc::Provider::default())))
        .layer(Extension(ops::OverviewCache::default()))
        .layer(middleware::from_fn(guard::page_headers))
}

/// What the store keeps of the UI session a request's cookie names, if it names one.
pub fn session_of(headers: &axum::http::HeaderMap) -> Option<Vec<u8>> {
    session::from_cookie(headers).map(|id| session::hash(&id))
}

pub use guard::{refused_in, to_login};

fn static_file(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "max-age=300")], body).into_response()
}
