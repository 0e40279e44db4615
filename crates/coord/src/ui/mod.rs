//! The web UI at `/ui`: server-rendered pages over the same store and engine
//! as the REST API, no JavaScript build step (one small script refreshes what
//! is live). With an API token set, a person logs in with it and gets a
//! session: a random id in an HttpOnly, SameSite=Strict cookie, which
//! expires (`COMPOSER_UI_SESSION_TTL`) and which logout revokes. Wrong
//! tokens are throttled; forms that change a run also check the request's
//! Origin. No page is cached: they show inputs, outputs and errors.
//!
//! - `html`: escaping and the page frame; `dag`: the graph drawn as SVG.
//! - `timeline`: a run's steps as bars over time (SVG).
//! - `ops`: the overview and queues pages, from what the handlers read.
//! - `session`: session ids, their cookie, and the login throttle.

mod dag;
mod html;
mod ops;
mod session;
mod timeline;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use chrono::{DateTime, Utc};
use composer_core::machine::{Event, Resolution, RunStatus, TaskState};
use composer_core::schedule::BackfillOverlap;
use composer_store::runs::{self, RunFilter, RunRow, TaskRow};
use serde::Deserialize;
use uuid::Uuid;

use self::html::{badge, clip, esc, json_details, page, url_enc};
use self::session::LoginThrottle;
use crate::engine::{By, Control, EventRequest};
use crate::shared::Shared;
use composer_config::auth::tokens_match;

/// What the UI of one coordinator keeps in memory.
struct UiState {
    throttle: std::sync::Mutex<LoginThrottle>,
    /// The overview as last made, and when: made at most once per
    /// [`OVERVIEW_TTL`] however many pages are open (it counts a day of runs).
    overview: tokio::sync::Mutex<Option<(Instant, String)>>,
}

/// How long one coordinator shows the same overview.
const OVERVIEW_TTL: Duration = Duration::from_secs(10);

/// Runs on one page of the list.
const PAGE: i64 = 50;

/// History lines shown on a run's page.
const HISTORY_SHOWN: i64 = 500;

pub fn router(shared: Arc<Shared>) -> Router<Arc<Shared>> {
    let pages = Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/runs") }))
        .route("/ui/runs", get(runs_page))
        .route("/ui/runs/act", post(runs_act))
        .route("/ui/runs/{id}", get(run_page))
        .route("/ui/runs/{id}/items", get(items_page))
        .route("/ui/runs/{id}/logs", get(logs_page))
        .route("/ui/runs/{id}/rerun", post(rerun_action))
        .route("/ui/runs/{id}/priority", post(priority_action))
        .route("/ui/runs/{id}/{action}", post(run_action))
        .route("/ui/runs/{id}/tasks/{node}/resolve", post(resolve_action))
        .route("/ui/runs/{id}/tasks/{node}/complete", post(complete_action))
        .route("/ui/bulk/{id}", get(bulk_page))
        .route("/ui/bulk/{id}/cancel", post(bulk_cancel))
        .route("/ui/overview", get(overview_page))
        .route("/ui/queues", get(queues_page))
        .route("/ui/workflows", get(workflows_page))
        .route("/ui/workflows/{name}", get(workflow_page))
        .route("/ui/schedules", get(schedules_page))
        .route("/ui/schedules/{id}/backfill", post(backfill_action))
        .route("/ui/events", get(events_page))
        .route("/ui/limits", get(limits_page).post(limit_action))
        .route_layer(middleware::from_fn_with_state(shared.clone(), require_login));
    Router::new()
        .merge(pages)
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/static/app.css", get(|| async { static_file("text/css", include_str!("app.css")) }))
        .route("/ui/static/app.js", get(|| async { static_file("text/javascript", include_str!("app.js")) }))
        .layer(Extension(Arc::new(UiState {
            throttle: std::sync::Mutex::new(LoginThrottle::new(Instant::now())),
            overview: tokio::sync::Mutex::new(None),
        })))
        .layer(middleware::from_fn(page_headers))
}

fn static_file(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "max-age=300")], body).into_response()
}

/// What every UI response carries: no framing by other sites, no inline
/// script beyond our own file, no sniffing, and no copy in any cache (but
/// the static files, which say otherwise).
async fn page_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("same-origin"));
    resp
}

/// Pages need a live session when a token is set.
async fn require_login(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if s.config.api_token.is_some() {
        let ok = match session::from_cookie(req.headers()) {
            None => false,
            Some(id) => match composer_store::client(&s.pool).await {
                Ok(client) => match composer_store::sessions::live(&client, &session::hash(&id)).await {
                    Ok(live) => live,
                    Err(e) => return UiError::from(e).into_response(),
                },
                Err(e) => return UiError::from(e).into_response(),
            },
        };
        if !ok {
            let next_page = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/ui/runs");
            return Redirect::to(&format!("/ui/login?next={}", url_enc(next_page))).into_response();
        }
    }
    next.run(req).await
}

/// A form that changes something (a POST) must come from our own pages.
fn same_origin(s: &Shared, headers: &HeaderMap) -> bool {
    crate::http::guard::origin_allowed(s, &axum::http::Method::POST, headers)
}

/// Where to go after logging in: one of our pages, never another site, and
/// nothing that is not a path of visible ASCII (a CR or LF would end the
/// `Location` header and start another).
fn safe_next(next: Option<&String>) -> String {
    match next {
        Some(n) if is_ui_path(n) => n.clone(),
        _ => "/ui/runs".to_string(),
    }
}

fn is_ui_path(n: &str) -> bool {
    (n == "/ui" || n.starts_with("/ui/") || n.starts_with("/ui?"))
        && n.bytes().all(|b| b.is_ascii_graphic())
        && !n.contains("//")
        && !n.contains('\\')
        && !n.contains("..")
}

/// What a run's page says after one of its buttons, by the code in its
/// `?msg=`: fixed texts, so a link cannot put its own words on our page.
const NOTICES: &[(&str, &str)] = &[
    ("retry-done", "retry: done"),
    ("retry-refused", "retry refused: the run's status does not allow it"),
    ("pause-done", "pause: done"),
    ("pause-refused", "pause refused: the run's status does not allow it"),
    ("resume-done", "resume: done"),
    ("resume-refused", "resume refused: the run's status does not allow it"),
    ("cancel-done", "cancel: done"),
    ("cancel-refused", "cancel refused: the run's status does not allow it"),
    ("resolve-done", "resolve: done"),
    ("resolve-refused", "resolve refused: the step is not IN_DOUBT"),
    ("resolve-invalid", "resolve refused: a completed step needs its output as JSON, a failed one an error"),
    ("rerun-done", "rerun: done, the run goes on from those steps"),
    (
        "rerun-refused",
        "rerun refused: the run's status does not allow it (a SUCCEEDED run needs \"also if it succeeded\")",
    ),
    ("rerun-invalid", "rerun refused: name 1 to 100 steps the run has reached, and any new input as a JSON value"),
    ("complete-done", "complete: done, the run goes on"),
    ("complete-refused", "complete refused: the step has ended already, or its run has"),
    ("complete-invalid", "complete refused: the output must be JSON"),
    ("reason-invalid", "refused: a reason is at most 1,024 characters"),
    ("priority-done", "priority: changed; its steps not started yet are served at it"),
    ("priority-refused", "priority refused: the run has ended"),
    ("priority-invalid", "priority refused: choose 1 (served first) to 5 (last)"),
    (
        "backfill-done",
        "backfill: queued; the timer loop starts the runs (fire times asked for before are not queued again)",
    ),
    ("limit-done", "limit: saved; waiting steps go as soon as it lets them"),
    ("limit-deleted", "limit: deleted; the key goes back to what its definitions say"),
    ("limit-invalid", "limit refused: a key of 1 to 256 bytes; rate as N/period (25/1s); burst and concurrency from 1"),
    (
        "backfill-invalid",
        "backfill refused: give from and to (UTC) with from before to, to not in the future, at most 10,000 fire times",
    ),
];

fn notice(code: &str) -> Option<&'static str> {
    NOTICES.iter().find(|(c, _)| *c == code).map(|(_, text)| *text)
}

async fn login_page(Query(q): Query<HashMap<String, String>>) -> Html<String> {
    Html(login_form(&safe_next(q.get("next")), None))
}

fn login_form(next: &str, error: Option<&str>) -> String {
    let error = error.map(|e| format!("<p class=\"error\">{}</p>", esc(e))).unwrap_or_default();
    page(
        "Log in",
        &format!(
            "<h1>Log in</h1>{error}<form method=\"post\" action=\"/ui/login\" class=\"login\">\
             <input type=\"hidden\" name=\"next\" value=\"{}\"><label>API token \
             <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label>\
             <button type=\"submit\">Log in</button></form>",
            esc(next)
        ),
    )
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

/// The client's address, for the login throttle (behind a proxy, the
/// proxy's: then the limit per address is one for all).
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

fn address(peer: &Peer) -> IpAddr {
    peer.as_ref().map_or(IpAddr::from([0, 0, 0, 0]), |Extension(ConnectInfo(a))| a.ip())
}

/// Checks the token (unless this address, or everyone, sent too many wrong
/// ones this minute: 429 with Retry-After, the token unchecked), then
/// starts a session.
async fn login(
    State(s): State<Arc<Shared>>,
    Extension(ui): Extension<Arc<UiState>>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let next = safe_next(f.next.as_ref());
    if !same_origin(&s, &headers) {
        return (StatusCode::FORBIDDEN, Html(login_form(&next, Some("a login from another site is refused"))))
            .into_response();
    }
    let Some(expected) = s.config.api_token.as_deref() else { return Redirect::to(&next).into_response() };
    let addr = address(&peer);
    let wait = ui.throttle.lock().unwrap_or_else(|p| p.into_inner()).wait(Instant::now(), addr);
    if let Some(wait) = wait {
        let message = "too many wrong tokens: wait a minute (LOGIN_FAILURES_PER_ADDRESS, LOGIN_FAILURES_PER_MINUTE)";
        let retry_after = (header::RETRY_AFTER, wait.as_secs().to_string());
        return (StatusCode::TOO_MANY_REQUESTS, [retry_after], Html(login_form(&next, Some(message)))).into_response();
    }
    if !tokens_match(f.token.as_bytes(), expected.as_bytes()) {
        ui.throttle.lock().unwrap_or_else(|p| p.into_inner()).failed(Instant::now(), addr);
        return (StatusCode::UNAUTHORIZED, Html(login_form(&next, Some("wrong token")))).into_response();
    }
    let Some(id) = session::new_id() else {
        return UiError(StatusCode::SERVICE_UNAVAILABLE, "no random numbers for a session id".into()).into_response();
    };
    let ttl = s.config.ui_session_ttl;
    let created = match composer_store::client(&s.pool).await {
        Ok(client) => composer_store::sessions::create(&client, &session::hash(&id), ttl).await,
        Err(e) => Err(e),
    };
    if let Err(e) = created {
        return UiError::from(e).into_response();
    }
    let cookie = session::set_cookie(Some(&id), ttl, session::over_https(&headers));
    ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
}

/// Ends the session: revoked in the store, so its cookie is worth nothing
/// even if the browser kept a copy.
async fn logout(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(id) = session::from_cookie(&headers) {
        let revoked = match composer_store::client(&s.pool).await {
            Ok(client) => composer_store::sessions::revoke(&client, &session::hash(&id)).await,
            Err(e) => Err(e),
        };
        if let Err(e) = revoked {
            return UiError::from(e).into_response();
        }
    }
    let cookie = session::set_cookie(None, Duration::ZERO, session::over_https(&headers));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response()
}

/// A page that could not be made: the status and the reason, in the frame.
pub struct UiError(StatusCode, String);

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let body = page("Error", &format!("<h1>{}</h1><p class=\"error\">{}</p>", self.0, esc(&self.1)));
        (self.0, Html(body)).into_response()
    }
}

impl From<composer_store::Error> for UiError {
    fn from(e: composer_store::Error) -> UiError {
        tracing::warn!(error = %e, "ui: database error");
        UiError(StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable; retry shortly".into())
    }
}

impl From<crate::http::error::ApiError> for UiError {
    fn from(e: crate::http::error::ApiError) -> UiError {
        let (status, _) = e.status_and_code();
        if status.is_server_error() {
            tracing::warn!(error = %e, "ui: request failed");
        }
        UiError(status, e.to_string())
    }
}

impl From<crate::engine::EngineError> for UiError {
    fn from(e: crate::engine::EngineError) -> UiError {
        UiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

type Page = Result<Response, UiError>;

fn not_found(what: &str) -> UiError {
    UiError(StatusCode::NOT_FOUND, format!("{what} not found"))
}

fn bad(message: impl Into<String>) -> UiError {
    UiError(StatusCode::BAD_REQUEST, message.into())
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()).unwrap_or_default()
}

/// The smallest UUIDv7 of a moment: run ids sort by creation, so a time
/// range is an id range.
fn id_at(t: DateTime<Utc>) -> Uuid {
    Uuid::from_u128((t.timestamp_millis().max(0) as u128) << 80)
}

/// `2026-11-29T18:30` (a `datetime-local` input), read as UTC.
fn parse_local(v: &str) -> Result<Option<DateTime<Utc>>, UiError> {
    if v.is_empty() {
        return Ok(None);
    }
    chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S"))
        .map(|t| Some(t.and_utc()))
        .map_err(|_| bad(format!("{v:?} is not a time such as 2026-11-29T18:30")))
}

fn text<'a>(q: &'a HashMap<String, String>, key: &str) -> Result<&'a str, UiError> {
    let v = q.get(key).map(String::as_str).unwrap_or("").trim();
    composer_core::storable::check_text(v, key).map_err(bad)?;
    Ok(v)
}

/// `tag` of the runs list: `customer=42, region=eu`, as the filter's
/// `{key: value}`.
fn parse_tags(v: &str) -> Result<Option<serde_json::Value>, UiError> {
    let mut tags = serde_json::Map::new();
    for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, val) = pair.split_once('=').ok_or_else(|| bad(format!("tag {pair:?}: write key=value")))?;
        let (k, val) = (k.trim(), val.trim());
        if !composer_core::definition::is_tag_key(k) {
            return Err(bad(format!("tag {k:?}: a key is 1 to 64 of A-Z a-z 0-9 _ . -")));
        }
        tags.insert(k.to_string(), serde_json::Value::String(val.to_string()));
    }
    if tags.len() > composer_core::definition::MAX_TAGS {
        return Err(bad(format!("tag: at most {} pairs", composer_core::definition::MAX_TAGS)));
    }
    Ok((!tags.is_empty()).then_some(serde_json::Value::Object(tags)))
}

/// The runs list's filter, read from its query (or the act form's fields).
struct ListFilter {
    workflow: String,
    status: Option<RunStatus>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    tags: Option<serde_json::Value>,
}

impl ListFilter {
    fn read(q: &HashMap<String, String>) -> Result<ListFilter, UiError> {
        let status = match text(q, "status")? {
            "" => None,
            s => Some(RunStatus::parse(s).ok_or_else(|| bad(format!("unknown status {s:?}")))?),
        };
        Ok(ListFilter {
            workflow: text(q, "workflow")?.to_string(),
            status,
            since: parse_local(text(q, "since")?)?,
            until: parse_local(text(q, "until")?)?,
            tags: parse_tags(text(q, "tag")?)?,
        })
    }

    fn runs(&self) -> RunFilter<'_> {
        RunFilter {
            workflow: (!self.workflow.is_empty()).then_some(self.workflow.as_str()),
            status: self.status,
            parent: None,
            since: self.since.map(id_at),
            until: self.until.map(id_at),
            tags: self.tags.as_ref(),
        }
    }

    fn is_empty(&self) -> bool {
        self.workflow.is_empty()
            && self.status.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.tags.is_none()
    }
}

/// Actions the runs list offers on selected runs and on every run its filter matches.
const LIST_ACTIONS: [&str; 5] = ["cancel", "retry", "pause", "resume", "rerun"];

/// `/ui/runs`: filters (workflow, status, time range, tags), newest first,
/// keyset pages, a box per run to act on the chosen ones, or a bulk job over
/// every run the filter matches; the table refreshes itself while the page
/// is open and nothing in it is chosen.
async fn runs_page(State(s): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Page {
    let filter = ListFilter::read(&q)?;
    let cursor = match text(&q, "cursor")? {
        "" => None,
        c => Some(c.parse::<Uuid>().map_err(|_| bad("cursor: not a run id"))?),
    };
    let mut client = composer_store::client(&s.pool).await?;
    let rows = runs::list(&mut client, &filter.runs(), cursor, PAGE).await?;
    let mut body = String::new();
    for r in &rows {
        let tags = r.tags.as_ref().and_then(|t| t.as_object()).map(tag_links).unwrap_or_default();
        let _ = write!(
            body,
            "<tr data-status=\"{}\"><td><input type=\"checkbox\" name=\"run\" value=\"{}\" form=\"act\" \
             aria-label=\"choose run {}\"></td><td><a href=\"/ui/runs/{}\">{}</a></td>\
             <td><a href=\"/ui/workflows/{}\">{}</a> v{}</td><td>{}</td><td>{tags}</td><td>{}</td><td>{}</td>\
             <td class=\"error\">{}</td></tr>",
            r.status,
            r.id,
            r.id,
            r.id,
            short(&r.id),
            url_enc(&r.workflow_name),
            esc(&r.workflow_name),
            r.workflow_version,
            badge(r.status.as_str()),
            time(Some(r.created_at)),
            time(r.finished_at),
            esc(&clip(r.error.as_deref().unwrap_or(""), 120)),
        );
    }
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"8\" class=\"empty\">No runs match.</td></tr>");
    }
    if q.contains_key("fragment") {
        return Ok(Html(body).into_response());
    }
    let keep = |k: &str| q.get(k).map(|v| format!("&{k}={}", url_enc(v))).unwrap_or_default();
    let filters = format!("{}{}{}{}{}", keep("workflow"), keep("status"), keep("since"), keep("until"), keep("tag"));
    let next = match rows.last() {
        Some(last) if rows.len() as i64 == PAGE => {
            format!("<a class=\"next\" href=\"/ui/runs?cursor={}{}\">Older runs →</a>", last.id, esc(&filters))
        }
        _ => String::new(),
    };
    let options: String = std::iter::once(("", "any status"))
        .chain(RunStatus::ALL.iter().map(|s| (s.as_str(), s.as_str())))
        .map(|(v, label)| {
            let selected = if q.get("status").map(String::as_str) == Some(v) { " selected" } else { "" };
            format!("<option value=\"{v}\"{selected}>{label}</option>")
        })
        .collect();
    let field = |k: &str| esc(q.get(k).map(String::as_str).unwrap_or(""));
    let live_src = format!("/ui/runs?fragment=1{filters}{}", keep("cursor"));
    let actions: String = LIST_ACTIONS.iter().map(|a| format!("<option value=\"{a}\">{a}</option>")).collect();
    let hidden: String = ["workflow", "status", "since", "until", "tag"]
        .iter()
        .map(|k| format!("<input type=\"hidden\" name=\"f_{k}\" value=\"{}\">", field(k)))
        .collect();
    let every = if filter.is_empty() {
        "<span class=\"hint\">Filter the list to act on every run that matches.</span>".to_string()
    } else {
        "<button type=\"submit\" name=\"scope\" value=\"filter\" class=\"bulk\">Every run that matches (a bulk job)</button>\
         <button type=\"submit\" name=\"scope\" value=\"count\">How many match?</button>"
            .to_string()
    };
    let acted = acted_notice(&q);
    let html = format!(
        "<h1>Runs</h1>{acted}<form class=\"filters\" method=\"get\" action=\"/ui/runs\">\
         <label>Workflow <input name=\"workflow\" value=\"{}\"></label>\
         <label>Status <select name=\"status\">{options}</select></label>\
         <label>Tags <input name=\"tag\" value=\"{}\" placeholder=\"customer=42, region=eu\"></label>\
         <label>From (UTC) <input type=\"datetime-local\" name=\"since\" value=\"{}\"></label>\
         <label>To (UTC) <input type=\"datetime-local\" name=\"until\" value=\"{}\"></label>\
         <button type=\"submit\">Filter</button> <a href=\"/ui/runs\">Clear</a></form>\
         <form id=\"act\" class=\"act\" method=\"post\" action=\"/ui/runs/act\">{hidden}\
         <label>Action <select name=\"action\">{actions}</select></label>\
         <label>From steps (rerun) <input name=\"from\" placeholder=\"charge, ship\"></label>\
         <label>Reason <input name=\"reason\" maxlength=\"1024\"></label>\
         <button type=\"submit\" name=\"scope\" value=\"selected\">The chosen runs</button>{every}</form>\
         <table class=\"runs\"><thead><tr><th></th><th>Run</th><th>Workflow</th><th>Status</th><th>Tags</th><th>Started</th>\
         <th>Finished</th><th>Error</th></tr></thead><tbody data-live=\"{}\">{body}</tbody></table>{next}",
        field("workflow"),
        field("tag"),
        field("since"),
        field("until"),
        esc(&live_src),
    );
    Ok(Html(page("Runs", &html)).into_response())
}

/// Tags as links to the runs that carry each.
fn tag_links(tags: &serde_json::Map<String, serde_json::Value>) -> String {
    tags.iter()
        .map(|(k, v)| {
            let v = v.as_str().unwrap_or_default();
            format!(
                "<a class=\"tag\" href=\"/ui/runs?tag={}\">{}={}</a>",
                url_enc(&format!("{k}={v}")),
                esc(k),
                esc(&clip(v, 40))
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the act form did to the chosen runs, from numbers and a known
/// action in the query (nothing else of a link reaches the page).
fn acted_notice(q: &HashMap<String, String>) -> String {
    let n = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    let action = q.get("action").and_then(|a| LIST_ACTIONS.iter().find(|x| **x == a.as_str()));
    match (action, n("acted"), n("refused"), n("matched")) {
        (Some(a), Some(acted), Some(refused), _) => {
            format!("<p class=\"notice\">{a}: {acted} run(s) acted on, {refused} refused by their status</p>")
        }
        (Some(a), _, _, Some(m)) => format!("<p class=\"notice\">{a}: {m} run(s) match the filter now</p>"),
        _ => String::new(),
    }
}

/// Most runs the act form takes at once (a page of the list).
const MAX_CHOSEN: usize = PAGE as usize;

/// The runs list's act form: the action on each chosen run now, or a bulk
/// job (or its dry run) over the filter the list shows.
async fn runs_act(State(s): State<Arc<Shared>>, headers: HeaderMap, body: axum::body::Bytes) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).map_err(|e| bad(format!("form: {e}")))?;
    let one = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str()).unwrap_or("");
    let action =
        LIST_ACTIONS.iter().find(|a| **a == one("action")).ok_or_else(|| bad("action: not one the list offers"))?;
    let reason = form_reason(one("reason"))?;
    let from: Vec<String> = one("from").split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
    if *action == "rerun" && (from.is_empty() || from.len() > 100) {
        return Err(bad("from: a rerun names 1 to 100 steps (charge, ship)"));
    }
    match one("scope") {
        "selected" => {
            let chosen: Vec<Uuid> =
                fields.iter().filter(|(k, _)| k == "run").map(|(_, v)| parse_id(v)).collect::<Result<_, _>>()?;
            if chosen.is_empty() || chosen.len() > MAX_CHOSEN {
                return Err(bad(format!("choose 1 to {MAX_CHOSEN} runs")));
            }
            let control = Control { actor: crate::http::runs::actor(&s), reason };
            let (mut acted, mut refused) = (0, 0);
            let client = composer_store::client(&s.pool).await?;
            for run in chosen {
                let Some(event) = crate::bulk::event(&client, action, &from, run).await? else {
                    refused += 1;
                    continue;
                };
                match s.engine.handle(EventRequest::new(run, event).by(By::Operator(control.clone()))).await {
                    Ok(h) if h.ignored.is_none() => acted += 1,
                    Ok(_) | Err(crate::engine::EngineError::RunNotFound(_)) => refused += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(Redirect::to(&format!("/ui/runs?action={action}&acted={acted}&refused={refused}")).into_response())
        }
        scope @ ("filter" | "count") => {
            let q: HashMap<String, String> = ["workflow", "status", "since", "until", "tag"]
                .iter()
                .map(|k| (k.to_string(), one(&format!("f_{k}")).to_string()))
                .collect();
            let f = ListFilter::read(&q)?;
            if f.is_empty() {
                return Err(bad("a bulk job needs a filter: a workflow, a status, tags or a time range"));
            }
            let req = composer_api::BulkRequest {
                filter: composer_api::BulkFilter {
                    workflow: (!f.workflow.is_empty()).then(|| f.workflow.clone()),
                    status: f.status,
                    tags: f.tags.clone(),
                    created_after: f.since,
                    created_before: f.until,
                },
                action: serde_json::from_value(serde_json::Value::String(action.to_string()))
                    .map_err(|e| bad(e.to_string()))?,
                from: (*action == "rerun").then_some(from),
                reason,
                dry_run: scope == "count",
            };
            match crate::http::bulk::start(&s, req).await? {
                crate::http::bulk::Started::DryRun(matched) => {
                    let back = format!("/ui/runs?action={action}&matched={matched}");
                    Ok(Redirect::to(&back).into_response())
                }
                crate::http::bulk::Started::Job(job) => {
                    Ok(Redirect::to(&format!("/ui/bulk/{}", job.id)).into_response())
                }
            }
        }
        _ => Err(bad("scope: the chosen runs, or every run that matches")),
    }
}

/// A reason typed in a form: at most `MAX_REASON_CHARS`, blank for none.
fn form_reason(r: &str) -> Result<Option<String>, UiError> {
    let r = r.trim();
    if r.chars().count() > crate::http::runs::MAX_REASON_CHARS {
        return Err(bad("reason: at most 1,024 characters"));
    }
    composer_core::storable::check_text(r, "reason").map_err(bad)?;
    Ok((!r.is_empty()).then(|| r.to_string()))
}

/// `/ui/bulk/{id}`: a bulk job's progress, and a button to stop it.
async fn bulk_page(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Page {
    let id: Uuid = id.parse().map_err(|_| bad(format!("{id:?} is not a bulk job id")))?;
    let client = composer_store::client(&s.pool).await?;
    let job = composer_store::bulk::get(&client, id).await?.ok_or_else(|| not_found("bulk job"))?;
    let running = job.status == "RUNNING";
    let pct = if job.matched > 0 { (job.looked_at as f64 / job.matched as f64 * 100.0).min(100.0) } else { 100.0 };
    let mut live = format!(
        "<p class=\"status\">{} · {} of {} looked at ({pct:.0}%) · {} acted on · {} refused by their status</p>\
         <progress max=\"100\" value=\"{pct:.0}\"></progress>",
        badge(&job.status),
        job.looked_at,
        job.matched,
        job.acted_on,
        job.refused
    );
    if let Some(e) = &job.last_error {
        let _ = write!(live, "<p class=\"error\">last error: {}</p>", esc(e));
    }
    if running {
        let _ = write!(
            live,
            "<form method=\"post\" action=\"/ui/bulk/{id}/cancel\"><button type=\"submit\" class=\"cancel\">Stop the job</button></form>"
        );
    }
    if q.contains_key("fragment") {
        return Ok(Html(live).into_response());
    }
    let live_attr = if running { format!(" data-live=\"/ui/bulk/{id}?fragment=1\"") } else { String::new() };
    let filter = serde_json::to_string(&job.filter).unwrap_or_default();
    let html = format!(
        "<h1>Bulk job <code>{id}</code></h1><p class=\"meta\">{} · by {}{} · started {} · ended {}</p>\
         <p>Filter <code>{}</code>{}</p><div{live_attr}>{live}</div><p><a href=\"/ui/runs\">← runs</a></p>",
        esc(&job.action),
        esc(&job.actor),
        job.reason.as_deref().map(|r| format!(" ({})", esc(r))).unwrap_or_default(),
        time(Some(job.created_at)),
        time(job.finished_at),
        esc(&filter),
        job.rerun_from.as_ref().map(|f| format!(" · from {}", esc(&f.join(", ")))).unwrap_or_default(),
    );
    Ok(Html(page("Bulk job", &html)).into_response())
}

async fn bulk_cancel(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let id: Uuid = id.parse().map_err(|_| bad(format!("{id:?} is not a bulk job id")))?;
    let client = composer_store::client(&s.pool).await?;
    composer_store::bulk::cancel(&client, id).await?.ok_or_else(|| not_found("bulk job"))?;
    Ok(Redirect::to(&format!("/ui/bulk/{id}")).into_response())
}

fn short(id: &Uuid) -> String {
    let s = id.to_string();
    format!("<code title=\"{s}\">{}</code>", &s[s.len() - 12..])
}

fn parse_id(id: &str) -> Result<Uuid, UiError> {
    id.parse().map_err(|_| bad(format!("{id:?} is not a run id")))
}

/// `/ui/runs/{id}`: the run, its graph, its tasks, its children and its
/// history, with the buttons its status allows.
async fn run_page(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Page {
    let run_id = parse_id(&id)?;
    let mut client = composer_store::client(&s.pool).await?;
    let (run, tasks) = runs::get(&client, run_id).await?.ok_or_else(|| not_found("run"))?;
    let children =
        runs::list(&mut client, &RunFilter { parent: Some(run_id), ..Default::default() }, None, 1000).await?;
    let live = live_part(&s, &client, &run, &tasks, &children).await?;
    if q.contains_key("fragment") {
        return Ok(Html(live).into_response());
    }
    let mut html = String::new();
    let _ = write!(
        html,
        "<h1>Run <code>{}</code></h1><p class=\"meta\">Workflow <a href=\"/ui/workflows/{}\">{}</a> v{}",
        run.id,
        url_enc(&run.workflow_name),
        esc(&run.workflow_name),
        run.workflow_version
    );
    if let Some(p) = run.parent {
        let _ = write!(html, " · child of <a href=\"/ui/runs/{}\">{}</a>", p.run_id, short(&p.run_id));
    }
    if let Some(t) = run.trigger.as_ref().and_then(|t| t["schedule"].as_str()) {
        let _ = write!(html, " · started by schedule <a href=\"/ui/schedules\">{}</a>", esc(t));
        if run.trigger.as_ref().is_some_and(|t| t["backfill"] == true) {
            html.push_str(" (backfill)");
        }
    }
    if let Some(ev) = run.trigger.as_ref().and_then(|t| t["event"].as_str()) {
        let _ = write!(html, " · started by event <a href=\"/ui/events?name={}\">{}</a>", url_enc(ev), esc(ev));
    }
    if let Some(failed) = run.handles_run_id {
        let _ = write!(html, " · failure handler of <a href=\"/ui/runs/{failed}\">{}</a>", short(&failed));
    }
    for handler in runs::handlers_of(&client, run_id).await? {
        let _ = write!(html, " · its failure handler: <a href=\"/ui/runs/{handler}\">{}</a>", short(&handler));
    }
    if let Some(tags) = run.tags.as_ref().and_then(|t| t.as_object()).filter(|t| !t.is_empty()) {
        let _ = write!(html, " · tags {}", tag_links(tags));
    }
    let _ = write!(html, " · priority <span class=\"priority\">{}</span>", run.priority);
    if let Some(key) = &run.fairness_key {
        let _ = write!(html, " · fairness key <code class=\"fairness\">{}</code>", esc(&clip(key, 100)));
    }
    let trace = composer_core::trace::RunTrace::of(run.id, run.traceparent.as_deref());
    let _ = write!(html, " · trace <code class=\"trace\">{}</code>", trace.trace_id_hex());
    html.push_str("</p>");
    if let Some(text) = q.get("msg").and_then(|m| notice(m)) {
        let _ = write!(html, "<p class=\"notice\">{}</p>", esc(text));
    }
    let open = !run.status.is_terminal();
    let live_src = format!("/ui/runs/{}?fragment=1", run.id);
    let live_attr = if open { format!(" data-live=\"{}\"", esc(&live_src)) } else { String::new() };
    let _ = write!(html, "<div{live_attr}>{live}</div>");
    html.push_str(&json_details("Input", &run.input));
    let history = runs::history(&client, run_id, 0, HISTORY_SHOWN).await?;
    html.push_str(
        "<h2>History</h2><table class=\"history\"><thead><tr><th>#</th><th>When</th><th>What</th><th>By</th>\
         <th>Why</th><th></th></tr></thead><tbody>",
    );
    for h in &history {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"actor\">{}</td><td class=\"reason\">{}</td><td>{}</td></tr>",
            h.seq,
            time(Some(h.created_at)),
            esc(h.kind.as_str()),
            esc(h.payload["actor"].as_str().unwrap_or("")),
            esc(&clip(h.payload["reason"].as_str().unwrap_or(""), 200)),
            json_details("details", &h.payload)
        );
    }
    html.push_str("</tbody></table>");
    if history.len() as i64 == HISTORY_SHOWN {
        let _ = write!(
            html,
            "<p>The first {HISTORY_SHOWN} lines; the rest at <code>/v1/runs/{}/events?after={}</code>.</p>",
            run.id,
            history.last().map(|h| h.seq).unwrap_or(0)
        );
    }
    Ok(Html(page(&format!("Run {}", run.id), &html)).into_response())
}

/// The part of a run's page that changes while it runs: status, graph, tasks.
async fn live_part(
    s: &Shared,
    client: &composer_store::Client,
    run: &RunRow,
    tasks: &[TaskRow],
    children: &[RunRow],
) -> Result<String, UiError> {
    let mut html = String::from("<form class=\"actions\" method=\"post\">");
    let mut any = false;
    for (action, label, shown) in [
        ("retry", "Retry", run.status == RunStatus::Failed),
        ("pause", "Pause", run.status == RunStatus::Running),
        ("resume", "Resume", run.status == RunStatus::Paused),
        ("cancel", "Cancel", !run.status.is_terminal()),
    ] {
        if shown {
            any = true;
            let _ = write!(
                html,
                "<button type=\"submit\" formaction=\"/ui/runs/{}/{action}\" class=\"{action}\">{label}</button>",
                run.id
            );
        }
    }
    if any {
        html.push_str("<input name=\"reason\" maxlength=\"1024\" placeholder=\"why (optional, kept in the history)\">");
    }
    html.push_str("</form>");
    if !run.status.is_terminal() {
        let _ = write!(html, "<form class=\"priority\" method=\"post\" action=\"/ui/runs/{}/priority\">", run.id);
        html.push_str("<label>Priority <select name=\"priority\">");
        for p in composer_core::priority::levels() {
            let selected = if p == run.priority { " selected" } else { "" };
            let _ = write!(html, "<option value=\"{p}\"{selected}>{p}</option>");
        }
        html.push_str("</select></label><button type=\"submit\">Set</button></form>");
    }
    let _ = write!(
        html,
        "<p class=\"status\">{} · started {} · finished {}</p>",
        badge(run.status.as_str()),
        time(Some(run.created_at)),
        time(run.finished_at)
    );
    if let Some(e) = &run.error {
        let _ = write!(html, "<p class=\"error run-error\">{}</p>", esc(e));
    }
    if let Some(out) = &run.output {
        html.push_str(&json_details("Output", out));
    }
    if !run.status.is_terminal() {
        let why = crate::http::explain::explain_run(s, run.id).await?;
        let _ = write!(
            html,
            "<section class=\"explain\"><h2>Why it waits</h2><p class=\"summary\">{}</p>",
            esc(&why.summary)
        );
        if !why.nodes.is_empty() {
            html.push_str("<ul>");
            for n in &why.nodes {
                let _ = write!(
                    html,
                    "<li data-node=\"{}\"><code>{}</code> {} {}{}</li>",
                    esc(&n.node_id),
                    esc(&n.node_id),
                    badge(n.state.as_str()),
                    esc(&n.reason),
                    json_details("as data", &n.detail)
                );
            }
            html.push_str("</ul>");
        }
        html.push_str("</section>");
    }
    let child_of: HashMap<Uuid, &RunRow> =
        children.iter().filter_map(|c| c.parent.map(|p| (p.task_id, c))).rev().collect();
    if let Some(def) = composer_store::definitions::by_id(client, run.workflow_definition_id).await? {
        if let Ok(wf) = s.engine.compile(&def) {
            let held = match tasks.iter().any(|t| t.state == TaskState::Pending && t.limit_keys.is_some()) {
                true => composer_store::limits::held_in_run(client, run.id).await?,
                false => HashMap::new(),
            };
            let mut states = HashMap::new();
            for t in tasks {
                let mut state = dag::NodeState { state: t.state.as_str().to_string(), ..Default::default() };
                let node = wf.node_index(&t.node_id).map(|n| &wf.nodes[n].kind);
                if let Some(h) = held.get(&t.id) {
                    state.note = Some(format!("held: {} ({})", h.key, h.reason));
                } else if let Some(p) = t.map_progress() {
                    state.note = Some(format!("{}/{} done", p.completed + p.failed, p.total));
                } else if node.is_some_and(|k| k.traits().has_child) {
                    state.link = child_of.get(&t.id).map(|c| format!("/ui/runs/{}", c.id));
                    state.note = t.iteration.map(|i| format!("iteration {}", i + 1));
                } else if t.attempt > 1 {
                    state.note = Some(format!("attempt {}", t.attempt));
                }
                states.insert(t.node_id.clone(), state);
            }
            // The edges the engine took, as the history records them, of
            // the tasks the run has now (a reset task's are gone).
            let current: std::collections::HashSet<Uuid> = tasks.iter().map(|t| t.id).collect();
            let taken = runs::taken_edges(client, run.id)
                .await?
                .into_iter()
                .filter(|(task, _, _)| current.contains(task))
                .map(|(_, from, to)| (from, to))
                .collect();
            let _ = write!(html, "<div class=\"graph\">{}</div>", dag::svg(&wf, &states, &taken));
        }
    }
    html.push_str(
        "<h2>Steps</h2><table class=\"tasks\"><thead><tr><th>Node</th><th>Type</th><th>State</th><th>Attempt</th>\
         <th>Started</th><th>Finished</th><th>Error</th><th>Data</th></tr></thead><tbody>",
    );
    let ids: Vec<uuid::Uuid> = tasks.iter().map(|t| t.id).collect();
    let log_lines = composer_store::logs::counts(client, &ids).await?;
    for t in tasks {
        let mut extra = String::new();
        if let Some(n) = log_lines.get(&t.id) {
            let _ = write!(
                extra,
                "<div class=\"logs\"><a href=\"/ui/runs/{}/logs?node={}\">logs</a> ({})</div>",
                run.id,
                url_enc(&t.node_id),
                lines_count(*n)
            );
        }
        if let Some(p) = t.map_progress() {
            let _ = write!(
                extra,
                "<div class=\"items\">{} items: {} done, {} failed, {} running, {} queued · \
                 <a href=\"/ui/runs/{}/items?node={}\">items</a></div>",
                p.total,
                p.completed,
                p.failed,
                p.open,
                p.queued,
                run.id,
                url_enc(&t.node_id)
            );
        }
        if let Some(c) = child_of.get(&t.id) {
            let _ = write!(
                extra,
                "<div>child run <a href=\"/ui/runs/{}\">{}</a> {}</div>",
                c.id,
                short(&c.id),
                badge(c.status.as_str())
            );
        }
        if t.state == TaskState::InDoubt {
            extra.push_str(&resolve_forms(run.id, &t.node_id));
        }
        let completable = !run.status.is_terminal() || run.status == RunStatus::Failed;
        if completable && (!t.state.is_terminal() || t.state == TaskState::Failed) {
            extra.push_str(&complete_form(run.id, &t.node_id));
        }
        let _ = write!(
            html,
            "<tr class=\"task {}\" data-node=\"{}\"><td>{}{extra}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"error\">{}</td><td>{}{}</td></tr>",
            html::state_class(t.state.as_str()),
            esc(&t.node_id),
            esc(&t.node_id),
            esc(&t.node_type),
            badge(t.state.as_str()),
            t.attempt,
            time(t.started_at),
            time(t.finished_at),
            esc(t.error.as_deref().unwrap_or("")),
            json_details("input", &t.input),
            t.output.as_ref().map(|o| json_details("output", o)).unwrap_or_default(),
        );
    }
    html.push_str("</tbody></table>");
    let history = runs::history(client, run.id, 0, TIMELINE_HISTORY).await?;
    let bars = timeline_bars(tasks, &history);
    if !bars.is_empty() {
        let _ = write!(
            html,
            "<h2>Timeline</h2><p class=\"hint\">From {} (UTC). A bar per attempt, from when it was sent to when it \
             ended, in the colour of how it ended (grey: retried), the last one lighter while it waited for a \
             worker. Hover a bar for its times.</p><div class=\"graph\">{}</div>",
            time(Some(run.created_at)),
            timeline::svg(run.created_at, run.finished_at, &bars, Utc::now())
        );
    }
    if run.status != RunStatus::Queued && !tasks.is_empty() {
        html.push_str(&rerun_form(run, tasks));
    }
    if !children.is_empty() {
        html.push_str("<h2>Child runs</h2><ul class=\"children\">");
        for c in children {
            let _ = write!(
                html,
                "<li><a href=\"/ui/runs/{}\">{}</a> {} {}</li>",
                c.id,
                short(&c.id),
                esc(&c.workflow_name),
                badge(c.status.as_str())
            );
        }
        html.push_str("</ul>");
    }
    Ok(html)
}

/// `/ui/runs/{id}/items?node=`: a MAP's items by index.
async fn items_page(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Page {
    let run_id = parse_id(&id)?;
    let node = text(&q, "node")?;
    let after: i32 = text(&q, "after")?.parse().unwrap_or(-1);
    let client = composer_store::client(&s.pool).await?;
    let (_, tasks) = runs::get(&client, run_id).await?.ok_or_else(|| not_found("run"))?;
    let map = tasks.iter().find(|t| t.node_id == node && t.progress.is_some()).ok_or_else(|| not_found("MAP node"))?;
    let items = runs::items(&client, run_id, map.id, after, 200).await?;
    let ids: Vec<uuid::Uuid> = items.iter().map(|t| t.id).collect();
    let log_lines = composer_store::logs::counts(&client, &ids).await?;
    let mut html = format!(
        "<h1>Items of <code>{}</code></h1><p><a href=\"/ui/runs/{run_id}\">← run</a></p><table class=\"tasks\"><thead>\
         <tr><th>Item</th><th>State</th><th>Attempt</th><th>Finished</th><th>Error</th><th>Data</th></tr></thead><tbody>",
        esc(node)
    );
    for t in &items {
        let logs = log_lines.get(&t.id).map_or(String::new(), |n| {
            format!(
                "<div class=\"logs\"><a href=\"/ui/runs/{run_id}/logs?node={}\">logs</a> ({})</div>",
                url_enc(&t.node_id),
                lines_count(*n)
            )
        });
        let _ = write!(
            html,
            "<tr><td>{}{logs}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"error\">{}</td><td>{}{}</td></tr>",
            esc(&t.node_id),
            badge(t.state.as_str()),
            t.attempt,
            time(t.finished_at),
            esc(t.error.as_deref().unwrap_or("")),
            json_details("input", &t.input),
            t.output.as_ref().map(|o| json_details("output", o)).unwrap_or_default()
        );
    }
    html.push_str("</tbody></table>");
    if let (200, Some(last)) = (items.len(), items.last().and_then(|t| t.item_index)) {
        let _ = write!(
            html,
            "<a class=\"next\" href=\"/ui/runs/{run_id}/items?node={}&after={last}\">More →</a>",
            url_enc(node)
        );
    }
    Ok(Html(page("Items", &html)).into_response())
}

/// `/ui/runs/{id}/logs?node=&attempt=&after=`: a step's log, one attempt
/// at a time (its current one unless `attempt` says).
async fn logs_page(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Page {
    const PAGE: i64 = 1000;
    let run_id = parse_id(&id)?;
    let node = text(&q, "node")?;
    let client = composer_store::client(&s.pool).await?;
    let task = runs::task_of_node(&client, run_id, node).await?.ok_or_else(|| not_found("step"))?;
    let attempt: i32 = q.get("attempt").and_then(|a| a.parse().ok()).unwrap_or(task.attempt.max(1));
    let after: i32 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    let attempts = composer_store::logs::attempts(&client, task.id).await?;
    let lines = composer_store::logs::read(&client, task.id, attempt, after, PAGE).await?;
    let mut html = format!(
        "<h1>Logs of <code>{}</code></h1><p><a href=\"/ui/runs/{run_id}\">← run</a> · what its worker sent \
         (times are when the coordinator stored each line, UTC)</p><p class=\"attempts\">",
        esc(node)
    );
    for (a, n) in &attempts {
        if *a == attempt {
            let _ = write!(html, "<strong>attempt {a}</strong> ({}) ", lines_count(*n));
        } else {
            let _ = write!(
                html,
                "<a href=\"/ui/runs/{run_id}/logs?node={}&attempt={a}\">attempt {a}</a> ({}) ",
                url_enc(node),
                lines_count(*n)
            );
        }
    }
    html.push_str("</p>");
    if lines.is_empty() {
        let _ = write!(html, "<p class=\"hint\">Attempt {attempt} has no lines.</p>");
    } else {
        // A line per item: one that holds a newline stays one entry, and
        // control characters (terminal escapes, bidi overrides) are shown
        // as what they are instead of acting on the page.
        html.push_str("<ol class=\"log\">");
        for l in &lines {
            let _ = write!(
                html,
                "<li><span class=\"at\" title=\"{}\">{}</span><span class=\"line\">{}</span></li>",
                esc(&l.worker_id),
                l.at.format("%H:%M:%S%.3f"),
                esc(&visible_controls(&l.line))
            );
        }
        html.push_str("</ol>");
    }
    if let (true, Some(last)) = (lines.len() as i64 == PAGE, lines.last()) {
        let _ = write!(
            html,
            "<a class=\"next\" href=\"/ui/runs/{run_id}/logs?node={}&attempt={attempt}&after={}\">More →</a>",
            url_enc(node),
            last.seq
        );
    }
    Ok(Html(page("Logs", &html)).into_response())
}

/// "1 line", "2 lines".
fn lines_count(n: i64) -> String {
    if n == 1 {
        "1 line".to_string()
    } else {
        format!("{n} lines")
    }
}

/// A log line with its control characters spelled out (`\u{1b}`), but for
/// tabs and newlines, and the bidirectional overrides and isolates that
/// would reorder what follows them.
fn visible_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        let bidi = matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}');
        if (c.is_control() && c != '\n' && c != '\t') || bidi {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// The buttons of a run's page: the same events as the API's.
async fn run_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let run_id = parse_id(&id)?;
    let form: HashMap<String, String> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let Ok(reason) = form_reason(form.get("reason").map(String::as_str).unwrap_or("")) else {
        return Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=reason-invalid")).into_response());
    };
    let control = Control { actor: crate::http::runs::actor(&s), reason };
    let event = match action.as_str() {
        "cancel" => Event::CancelRun,
        "retry" => Event::RetryRun,
        "pause" => Event::PauseRun,
        "resume" => Event::ResumeRun,
        _ => return Err(not_found("action")),
    };
    apply_control(&s, run_id, event, control, &action).await
}

/// The priority form's answer: the same change as the API's.
async fn priority_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let run_id = parse_id(&id)?;
    let priority = form.get("priority").and_then(|p| p.parse::<u8>().ok());
    let Some(priority) = priority.filter(|&p| composer_core::priority::is_level(p.into())) else {
        return Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=priority-invalid")).into_response());
    };
    let outcome = match crate::http::runs::change_priority(&s, run_id, priority).await? {
        runs::PriorityChange::NotFound => return Err(not_found("run")),
        runs::PriorityChange::Ended(_) => "refused",
        runs::PriorityChange::Changed { .. } => "done",
    };
    Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=priority-{outcome}")).into_response())
}

/// The three ways to resolve an IN_DOUBT step, as forms.
fn resolve_forms(run: Uuid, node: &str) -> String {
    let action = format!("/ui/runs/{run}/tasks/{}/resolve", url_enc(node));
    format!(
        "<div class=\"resolve\"><p>Did this attempt take effect? It will not be sent again by itself.</p>\
         <form method=\"post\" action=\"{a}\"><input type=\"hidden\" name=\"outcome\" value=\"completed\">\
         <label>Output (JSON) <textarea name=\"output\" rows=\"2\">{{}}</textarea></label>\
         <button type=\"submit\" class=\"resolve-completed\">It did: complete the step</button></form>\
         <form method=\"post\" action=\"{a}\"><input type=\"hidden\" name=\"outcome\" value=\"failed\">\
         <label>Error <input name=\"error\" required></label>\
         <button type=\"submit\" class=\"resolve-failed\">It did not: fail the step</button></form>\
         <form method=\"post\" action=\"{a}\"><input type=\"hidden\" name=\"outcome\" value=\"retry\">\
         <button type=\"submit\" class=\"resolve-retry\">Send it again</button></form></div>",
        a = esc(&action)
    )
}

/// Most history lines the timeline reads (a run with more shows its later
/// attempts from the task rows alone).
const TIMELINE_HISTORY: i64 = 2_000;

/// Most attempts of one step the timeline draws (its last ones).
const TIMELINE_ATTEMPTS: i32 = 20;

/// The run's steps and their attempts, from the task rows and the history:
/// when each attempt was sent (`TaskDispatched`) and how it ended.
fn timeline_bars(tasks: &[TaskRow], history: &[runs::HistoryRow]) -> Vec<timeline::Bar> {
    use composer_core::machine::HistoryKind as K;
    let mut sent: HashMap<(Uuid, i64), DateTime<Utc>> = HashMap::new();
    let mut ended: HashMap<(Uuid, i64), (DateTime<Utc>, &'static str)> = HashMap::new();
    for h in history {
        let task = h.payload["task_id"].as_str().and_then(|t| t.parse::<Uuid>().ok());
        let (Some(task), Some(attempt)) = (task, h.payload["attempt"].as_i64()) else { continue };
        let how = match h.kind {
            K::TaskDispatched => {
                sent.entry((task, attempt)).or_insert(h.created_at);
                continue;
            }
            K::TaskRetryScheduled => "RETRIED",
            K::TaskCompleted => "COMPLETED",
            K::TaskFailed => "FAILED",
            K::TaskCancelled => "CANCELLED",
            K::TaskSkipped => "SKIPPED",
            K::TaskInDoubt => "IN_DOUBT",
            _ => continue,
        };
        ended.insert((task, attempt), (h.created_at, how));
    }
    tasks
        .iter()
        .map(|t| {
            let first = (t.attempt - TIMELINE_ATTEMPTS + 1).max(1);
            let attempts = (first..=t.attempt)
                .map(|n| {
                    let key = (t.id, n as i64);
                    let from = if n == 1 { t.created_at } else { sent.get(&key).copied().unwrap_or(t.created_at) };
                    if n == t.attempt {
                        timeline::Attempt {
                            number: n,
                            from,
                            started: t.started_at,
                            to: t.finished_at,
                            state: t.state.as_str().to_string(),
                        }
                    } else {
                        let (to, how) = match ended.get(&key) {
                            Some((at, how)) => (Some(*at), *how),
                            None => (sent.get(&(t.id, n as i64 + 1)).copied(), "RETRIED"),
                        };
                        timeline::Attempt { number: n, from, started: None, to, state: how.to_string() }
                    }
                })
                .collect();
            timeline::Bar { node_id: t.node_id.clone(), attempts }
        })
        .collect()
}

/// Ending a step by hand with an output, as a form.
fn complete_form(run: Uuid, node: &str) -> String {
    format!(
        "<details class=\"complete\"><summary>Complete by hand…</summary>\
         <form method=\"post\" action=\"/ui/runs/{run}/tasks/{}/complete\">\
         <label>Output (JSON) <textarea name=\"output\" rows=\"2\">{{}}</textarea></label>\
         <label>Why <input name=\"reason\" maxlength=\"1024\"></label>\
         <button type=\"submit\" class=\"complete\">Complete the step: the run goes on</button></form></details>",
        url_enc(node)
    )
}

/// Running a run again from steps it reached, as a form.
fn rerun_form(run: &RunRow, tasks: &[TaskRow]) -> String {
    let boxes: String = tasks
        .iter()
        .map(|t| {
            format!(
                "<label class=\"step\"><input type=\"checkbox\" name=\"from\" value=\"{}\"> {}</label>",
                esc(&t.node_id),
                esc(&t.node_id)
            )
        })
        .collect();
    let succeeded = if run.status == RunStatus::Succeeded {
        "<label><input type=\"checkbox\" name=\"allow_completed\" value=\"1\"> also if it succeeded</label>"
    } else {
        ""
    };
    format!(
        "<details class=\"rerun\"><summary>Rerun from steps…</summary>\
         <form method=\"post\" action=\"/ui/runs/{}/rerun\"><p>Each chosen step and everything after it runs \
         again (what is open there is cancelled); the history stays.</p><div class=\"steps\">{boxes}</div>\
         <label>New input (JSON; blank keeps the run's) <textarea name=\"input\" rows=\"3\"></textarea></label>\
         <label>Why <input name=\"reason\" maxlength=\"1024\"></label>{succeeded}\
         <button type=\"submit\" class=\"rerun\">Rerun</button></form></details>",
        run.id
    )
}

/// The rerun form's answer: the same event as the API's.
async fn rerun_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let run_id = parse_id(&id)?;
    let invalid = || Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=rerun-invalid")).into_response());
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let one = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str()).unwrap_or("");
    let from: Vec<&str> = fields.iter().filter(|(k, _)| k == "from").map(|(_, v)| v.as_str()).collect();
    if from.is_empty() || from.len() > 100 {
        return invalid();
    }
    let input = match one("input").trim() {
        "" => None,
        text => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if composer_core::storable::check(&v, "input", s.config.max_payload).is_ok() => Some(v),
            _ => return invalid(),
        },
    };
    let Ok(reason) = form_reason(one("reason")) else {
        return Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=reason-invalid")).into_response());
    };
    let client = composer_store::client(&s.pool).await?;
    let mut tasks = Vec::with_capacity(from.len());
    for node in from {
        match runs::task_of_node(&client, run_id, node).await? {
            Some(t) => tasks.push(t.id),
            None => return invalid(),
        }
    }
    drop(client);
    let event = Event::RerunFrom { tasks, input, allow_completed: one("allow_completed") == "1" };
    let control = Control { actor: crate::http::runs::actor(&s), reason };
    apply_control(&s, run_id, event, control, "rerun").await
}

/// The complete form's answer: the same event as the API's.
async fn complete_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, node)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let run_id = parse_id(&id)?;
    let form: HashMap<String, String> = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    let output = match serde_json::from_str::<serde_json::Value>(form.get("output").map(String::as_str).unwrap_or("")) {
        Ok(v) if composer_core::storable::check(&v, "output", s.config.max_payload).is_ok() => v,
        _ => return Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=complete-invalid")).into_response()),
    };
    let Ok(reason) = form_reason(form.get("reason").map(String::as_str).unwrap_or("")) else {
        return Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=reason-invalid")).into_response());
    };
    let client = composer_store::client(&s.pool).await?;
    let task = runs::task_of_node(&client, run_id, &node).await?.ok_or_else(|| not_found("step"))?;
    drop(client);
    let control = Control { actor: crate::http::runs::actor(&s), reason };
    apply_control(&s, run_id, Event::CompleteTask { task_id: task.id, output }, control, "complete").await
}

/// A resolve form's answer: the same event as the API's.
async fn resolve_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path((id, node)): Path<(String, String)>,
    Form(form): Form<HashMap<String, String>>,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let run_id = parse_id(&id)?;
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    let resolution = match field("outcome") {
        "completed" => match serde_json::from_str::<serde_json::Value>(field("output")) {
            Ok(v) if composer_core::storable::check(&v, "output", s.config.max_payload).is_ok() => {
                Some(Resolution::Completed(v))
            }
            _ => None,
        },
        "failed" if !field("error").trim().is_empty() && field("error").len() <= 65_536 => {
            Some(Resolution::Failed(field("error").to_string()))
        }
        "retry" => Some(Resolution::Retry),
        _ => None,
    };
    let Some(resolution) = resolution else {
        return Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg=resolve-invalid")).into_response());
    };
    let client = composer_store::client(&s.pool).await?;
    let task = runs::task_of_node(&client, run_id, &node).await?.ok_or_else(|| not_found("step"))?;
    drop(client);
    let control = Control { actor: crate::http::runs::actor(&s), reason: form_reason(field("reason")).unwrap_or(None) };
    apply_control(&s, run_id, Event::ResolveTask { task_id: task.id, resolution }, control, "resolve").await
}

/// Applies a form's control event and goes back to the run's page, saying
/// `{action}-done` or `{action}-refused`.
async fn apply_control(s: &Shared, run_id: uuid::Uuid, event: Event, control: Control, action: &str) -> Page {
    let outcome = match s.engine.handle(EventRequest::new(run_id, event).by(By::Operator(control))).await {
        Ok(h) if h.ignored.is_some() => "refused",
        Ok(_) => "done",
        Err(crate::engine::EngineError::RunNotFound(_)) => return Err(not_found("run")),
        Err(e) => return Err(e.into()),
    };
    Ok(Redirect::to(&format!("/ui/runs/{run_id}?msg={action}-{outcome}")).into_response())
}

/// The queues with open work and those the newest definitions send to
/// (at most [`MAX_QUEUES_SHOWN`]), each with the workers that read its
/// streams.
async fn queue_rows(s: &Shared, client: &composer_store::Client) -> Result<Vec<ops::QueueRow>, UiError> {
    let mut loads: std::collections::BTreeMap<String, composer_store::stats::QueueLoad> =
        composer_store::stats::queue_loads(client).await?.into_iter().map(|l| (l.queue.clone(), l)).collect();
    for def in composer_store::definitions::latest_of_each(client, MAX_QUEUES_SHOWN as i64).await? {
        let Ok(wf) = s.engine.compile(&def) else { continue };
        for q in wf.nodes.iter().filter_map(|n| n.queue.as_ref()) {
            loads.entry(q.clone()).or_insert_with(|| composer_store::stats::QueueLoad {
                queue: q.clone(),
                pending: 0,
                running: 0,
                oldest_pending_age: None,
            });
        }
    }
    let mut rows = Vec::with_capacity(loads.len().min(MAX_QUEUES_SHOWN));
    for l in loads.into_values().take(MAX_QUEUES_SHOWN) {
        let mut readers = Vec::new();
        for shard in 0..s.engine.shards().max(1) as u32 {
            // Workers read every priority's streams: the default's show them.
            let stream = s.streams.keys().stream(&l.queue, composer_core::priority::DEFAULT, shard);
            // Redis down: the queue is shown without its readers.
            for (name, idle_ms, pending) in s.streams.consumers(&stream).await.unwrap_or_default() {
                readers.push((name, idle_ms as f64 / 1000.0, pending));
            }
        }
        rows.push(ops::QueueRow {
            queue: l.queue,
            pending: l.pending,
            running: l.running,
            lag_s: l.oldest_pending_age,
            readers,
        });
    }
    Ok(rows)
}

/// Most queues the overview and queues pages list.
const MAX_QUEUES_SHOWN: usize = 200;

/// `/ui/overview`: runs by status over the last hour and day, runs ended
/// per minute, step latency, failures by workflow, queue backlogs.
async fn overview_page(
    State(s): State<Arc<Shared>>,
    Extension(ui): Extension<Arc<UiState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Page {
    // One request makes it while the others wait for its answer.
    let mut cached = ui.overview.lock().await;
    let body = match cached.as_ref() {
        Some((at, body)) if at.elapsed() < OVERVIEW_TTL => body.clone(),
        _ => {
            let body = overview_body(&s).await?;
            *cached = Some((Instant::now(), body.clone()));
            body
        }
    };
    drop(cached);
    if q.contains_key("fragment") {
        return Ok(Html(body).into_response());
    }
    Ok(Html(page("Overview", &format!("<div data-live=\"/ui/overview?fragment=1\">{body}</div>"))).into_response())
}

async fn overview_body(s: &Shared) -> Result<String, UiError> {
    let client = composer_store::client(&s.pool).await?;
    let now = Utc::now();
    let (hour, day) = (id_at(now - chrono::Duration::hours(1)), id_at(now - chrono::Duration::days(1)));
    let windows = [
        ops::StatusCounts { window: "hour", counts: composer_store::stats::runs_by_status(&client, hour).await? },
        ops::StatusCounts { window: "day", counts: composer_store::stats::runs_by_status(&client, day).await? },
    ];
    let per_minute: Vec<(String, i64)> =
        composer_store::stats::ended_per_minute(&client, id_at(now - chrono::Duration::hours(2)))
            .await?
            .into_iter()
            .map(|(m, n)| (m.format("%H:%M").to_string(), n))
            .collect();
    let latency = composer_store::stats::step_latency(&client, hour).await?;
    let failures = composer_store::stats::failures_by_workflow(&client, day).await?;
    let queues = queue_rows(s, &client).await?;
    Ok(ops::overview(
        &format!("as of {} UTC, made at most every {} s", now.format("%H:%M:%S"), OVERVIEW_TTL.as_secs()),
        &windows,
        &per_minute,
        &[("running time", latency.ran), ("wait to start", latency.waited)],
        &failures,
        &queues,
    ))
}

/// `/ui/queues`: each queue's backlog and lag, and the workers reading it.
async fn queues_page(State(s): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Page {
    let client = composer_store::client(&s.pool).await?;
    let body = ops::queues(&queue_rows(&s, &client).await?);
    if q.contains_key("fragment") {
        return Ok(Html(body).into_response());
    }
    Ok(Html(page("Queues", &format!("<div data-live=\"/ui/queues?fragment=1\">{body}</div>"))).into_response())
}

async fn workflows_page(State(s): State<Arc<Shared>>) -> Page {
    let client = composer_store::client(&s.pool).await?;
    let rows = composer_store::definitions::latest_of_each(&client, 1000).await?;
    let mut html = String::from(
        "<h1>Workflows</h1><table><thead><tr><th>Name</th><th>Latest version</th><th>Registered</th><th></th></tr></thead><tbody>",
    );
    for d in &rows {
        let _ = write!(
            html,
            "<tr><td><a href=\"/ui/workflows/{}\">{}</a></td><td>v{}</td><td>{}</td><td><a href=\"/ui/runs?workflow={}\">runs</a></td></tr>",
            url_enc(&d.name),
            esc(&d.name),
            d.version,
            time(Some(d.created_at)),
            url_enc(&d.name)
        );
    }
    html.push_str("</tbody></table>");
    Ok(Html(page("Workflows", &html)).into_response())
}

async fn workflow_page(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Page {
    composer_core::storable::check_text(&name, "workflow").map_err(bad)?;
    let version = match text(&q, "version")? {
        "" => None,
        v => Some(v.parse::<i32>().map_err(|_| bad("version: not a number"))?),
    };
    let client = composer_store::client(&s.pool).await?;
    let def =
        composer_store::definitions::by_name(&client, &name, version).await?.ok_or_else(|| not_found("workflow"))?;
    let versions = composer_store::definitions::versions(&client, &name, None, 100).await?;
    let mut html = format!(
        "<h1>{} <small>v{}</small></h1><p><a href=\"/ui/runs?workflow={}\">Its runs</a></p>",
        esc(&def.name),
        def.version,
        url_enc(&def.name)
    );
    if let Ok(wf) = s.engine.compile(&def) {
        let _ = write!(html, "<div class=\"graph\">{}</div>", dag::svg(&wf, &HashMap::new(), &Default::default()));
    }
    html.push_str("<h2>Versions</h2><ul class=\"versions\">");
    for v in &versions {
        let _ = write!(
            html,
            "<li><a href=\"/ui/workflows/{}?version={}\">v{}</a> {}</li>",
            url_enc(&v.name),
            v.version,
            v.version,
            time(Some(v.created_at))
        );
    }
    html.push_str("</ul>");
    let spec = serde_json::to_string_pretty(&def.spec).unwrap_or_default();
    let _ = write!(html, "<h2>Definition</h2><pre class=\"spec\">{}</pre>", esc(&spec));
    Ok(Html(page(&def.name, &html)).into_response())
}

async fn schedules_page(State(s): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Page {
    let client = composer_store::client(&s.pool).await?;
    let rows = composer_store::schedules::list(&client, None, 1000).await?;
    let mut html = String::from("<h1>Schedules</h1>");
    if let Some(text) = q.get("msg").and_then(|m| notice(m)) {
        let queued = q.get("queued").and_then(|n| n.parse::<u64>().ok());
        let count = queued.map(|n| format!(" ({n} queued)")).unwrap_or_default();
        let _ = write!(html, "<p class=\"notice\">{}{count}</p>", esc(text));
    }
    html.push_str(
        "<table><thead><tr><th>Id</th><th>Workflow</th><th>Cron</th><th>Time zone</th>\
         <th>Overlap</th><th>State</th><th>Next fire</th><th>Last run</th><th>Backfill</th></tr></thead><tbody>",
    );
    for r in &rows {
        let spec = &r.spec;
        let last = r.last_run_id.map(|id| format!("<a href=\"/ui/runs/{id}\">{}</a>", short(&id))).unwrap_or_default();
        let queued = if r.backfill_queued > 0 { format!("{} queued", r.backfill_queued) } else { String::new() };
        let _ = write!(
            html,
            "<tr><td>{}</td><td><a href=\"/ui/workflows/{}\">{}</a></td><td><code>{}</code></td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{last}</td><td>{queued}\
             <form method=\"post\" action=\"/ui/schedules/{}/backfill\" class=\"backfill\">\
             <label>from <input type=\"datetime-local\" name=\"from\" step=\"1\" required></label> \
             <label>to <input type=\"datetime-local\" name=\"to\" step=\"1\" required></label> (UTC) \
             <select name=\"overlap\"><option value=\"allow\">all at once</option>\
             <option value=\"buffer_all\">one at a time</option><option value=\"skip\">skip while one runs</option></select> \
             <button type=\"submit\">Backfill</button></form></td></tr>",
            esc(&r.id),
            url_enc(&r.workflow),
            esc(&r.workflow),
            esc(spec["cron"].as_str().unwrap_or("")),
            esc(spec["timezone"].as_str().unwrap_or("UTC")),
            esc(spec["overlap"].as_str().unwrap_or("skip")),
            if r.paused { "paused" } else { "active" },
            if r.paused { String::new() } else { time(r.next_fire_at) },
            url_enc(&r.id),
        );
    }
    if rows.is_empty() {
        html.push_str("<tr><td colspan=\"9\" class=\"empty\">No schedules.</td></tr>");
    }
    html.push_str("</tbody></table>");
    Ok(Html(page("Schedules", &html)).into_response())
}

/// `/ui/events`: the webhooks, and the latest events with the runs their
/// triggers started (`?name=` for one event name).
async fn events_page(State(s): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Page {
    let name = q.get("name").filter(|n| !n.is_empty() && n.chars().count() <= 256);
    let client = composer_store::client(&s.pool).await?;
    let hooks = composer_store::webhooks::list(&client, 1000).await?;
    let events = composer_store::triggers::recent(&client, name.map(String::as_str), None, None, 50).await?;
    let mut html = String::from(
        "<h1>Events</h1><h2>Webhooks</h2><table><thead><tr><th>Name</th><th>Scheme</th><th>Delivery URL</th>\
         <th>Secret</th><th>Tolerance</th></tr></thead><tbody>",
    );
    for h in &hooks {
        let secret = h.spec["secret"].as_str().unwrap_or("");
        let set = std::env::var_os(crate::webhooks::secret_var(secret)).is_some_and(|v| !v.is_empty());
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td><code>/v1/webhooks/{}</code></td><td><code>COMPOSER_WEBHOOK_SECRET_{}</code> {}</td><td>{}</td></tr>",
            esc(&h.name),
            esc(h.spec["scheme"].as_str().unwrap_or("")),
            esc(&h.name),
            esc(secret),
            if set { "set" } else { "<span class=\"error\">not set on this coordinator</span>" },
            esc(h.spec["tolerance"].as_str().unwrap_or("5m")),
        );
    }
    if hooks.is_empty() {
        html.push_str("<tr><td colspan=\"5\" class=\"empty\">No webhooks.</td></tr>");
    }
    html.push_str("</tbody></table>");
    let shown =
        name.map(|n| format!(" named <code>{}</code> (<a href=\"/ui/events\">all</a>)", esc(n))).unwrap_or_default();
    let _ = write!(
        html,
        "<h2>Recent events{shown}</h2><table><thead><tr><th>Received</th><th>Name</th><th>Id</th><th>Source</th>\
         <th>Key</th><th>Runs started</th><th>Waiting steps</th><th>Payload</th></tr></thead><tbody>"
    );
    for e in &events {
        let mut runs = String::new();
        for r in &e.runs {
            match (r.run_id, &r.error) {
                (Some(id), _) => {
                    let _ = write!(runs, "<a href=\"/ui/runs/{id}\">{}</a> {} ", short(&id), esc(&r.workflow));
                }
                (None, Some(err)) => {
                    let _ = write!(
                        runs,
                        "<span class=\"error\" title=\"{}\">{}: failed</span> ",
                        esc(&clip(err, 500)),
                        esc(&r.workflow)
                    );
                }
                (None, None) => {}
            }
        }
        let _ = write!(
            html,
            "<tr><td>{}</td><td><a href=\"/ui/events?name={}\">{}</a></td><td><code>{}</code></td><td>{}</td><td>{}</td>\
             <td>{runs}</td><td>{}</td><td>{}</td></tr>",
            time(Some(e.received_at)),
            url_enc(&e.name),
            esc(&e.name),
            esc(&clip(&e.event_id, 48)),
            esc(&e.source),
            esc(&clip(&e.key, 48)),
            e.delivered,
            match &e.payload {
                Some(p) => json_details("payload", p),
                None => format!("{} bytes, not shown", e.payload_bytes),
            },
        );
    }
    if events.is_empty() {
        html.push_str("<tr><td colspan=\"8\" class=\"empty\">No events in the last week.</td></tr>");
    }
    html.push_str("</tbody></table>");
    Ok(Html(page("Events", &html)).into_response())
}

/// Limits on steps across runs: each key's values and use now, and a form
/// to set (or delete) one as `PUT /v1/limits/{key}` does.
async fn limits_page(State(s): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Page {
    const PAGE: i64 = 500;
    let after = q.get("after").filter(|a| !a.is_empty() && a.len() <= composer_core::definition::limit::MAX_LIMIT_KEY);
    let client = composer_store::client(&s.pool).await?;
    let limits = composer_store::limits::list(&client, after.map(String::as_str), PAGE).await?;
    let mut html = String::from("<h1>Limits</h1>");
    if let Some(text) = q.get("msg").and_then(|m| notice(m)) {
        let _ = write!(html, "<p class=\"notice\">{}</p>", esc(text));
    }
    html.push_str(
        "<table class=\"limits\"><thead><tr><th>Key</th><th>Rate</th><th>Burst</th><th>Tokens</th><th>Concurrency</th>\
         <th>In use</th><th>Waiting</th><th>Held until</th><th>Set by</th><th></th></tr></thead><tbody>",
    );
    for l in &limits {
        let v = crate::http::limits::view(l);
        let opt = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_default();
        let _ = write!(
            html,
            "<tr data-key=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td><form method=\"post\" action=\"/ui/limits\"><input type=\"hidden\" name=\"key\" value=\"{}\">\
             <button type=\"submit\" name=\"delete\" value=\"1\">Delete</button></form></td></tr>",
            esc(&v.key),
            esc(&v.key),
            esc(v.rate.as_deref().unwrap_or("")),
            opt(v.burst),
            v.tokens.map(|t| format!("{t:.1}")).unwrap_or_default(),
            opt(v.concurrency),
            v.in_use,
            v.waiting,
            time(v.held_until),
            esc(&v.set_by),
            esc(&v.key),
        );
    }
    if limits.is_empty() {
        html.push_str("<tr><td colspan=\"10\" class=\"empty\">No limits yet: a node's limits appear once a step waits for them.</td></tr>");
    }
    html.push_str("</tbody></table>");
    if let Some(last) = limits.last().filter(|_| limits.len() as i64 == PAGE) {
        let _ =
            write!(html, "<p class=\"pager\"><a href=\"/ui/limits?after={}\">Next page</a></p>", url_enc(&last.key));
    }
    html.push_str(
        "<h2>Set a limit</h2><form class=\"set-limit\" method=\"post\" action=\"/ui/limits\">\
         <label>Key <input name=\"key\" required maxlength=\"256\" placeholder=\"stripe:acct_1\"></label>\
         <label>Rate <input name=\"rate\" placeholder=\"25/1s\"></label>\
         <label>Burst <input name=\"burst\" type=\"number\" min=\"1\"></label>\
         <label>Concurrency <input name=\"concurrency\" type=\"number\" min=\"1\"></label>\
         <button type=\"submit\">Save</button></form><p class=\"meta\">A limit set here wins over the definitions \
         that use its key until it is deleted. A part left empty is not limited.</p>",
    );
    Ok(Html(page("Limits", &html)).into_response())
}

/// The limits page's forms: set a key's values, or delete them.
async fn limit_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let invalid = || Ok(Redirect::to("/ui/limits?msg=limit-invalid").into_response());
    // As typed: a key may begin or end with a space.
    let key = form.get("key").map(String::as_str).unwrap_or_default();
    if key.is_empty() || key.len() > composer_core::definition::limit::MAX_LIMIT_KEY || key.contains('\0') {
        return invalid();
    }
    let client = composer_store::client(&s.pool).await?;
    if form.contains_key("delete") {
        composer_store::limits::delete(&client, key).await?;
        return Ok(Redirect::to("/ui/limits?msg=limit-deleted").into_response());
    }
    let field = |name: &str| form.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let number = |name: &str| field(name).map(|v| v.parse::<u32>().map_err(|_| ())).transpose();
    let (Ok(burst), Ok(concurrency)) = (number("burst"), number("concurrency")) else { return invalid() };
    let spec = composer_core::definition::limit::LimitValuesSpec {
        rate: field("rate").map(str::to_string),
        burst,
        concurrency,
    };
    let Ok(values) = composer_core::definition::limit::LimitValues::parse("", &spec) else { return invalid() };
    composer_store::limits::set(&client, key, &values).await?;
    Ok(Redirect::to("/ui/limits?msg=limit-done").into_response())
}

/// A schedule's backfill form: the API's backfill, with times in UTC as a
/// browser's `datetime-local` sends them.
async fn backfill_action(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Page {
    if !same_origin(&s, &headers) {
        return Err(UiError(StatusCode::FORBIDDEN, "a form from another site is refused".into()));
    }
    let invalid = || Ok(Redirect::to("/ui/schedules?msg=backfill-invalid").into_response());
    let (Some(from), Some(to)) = (form_time(form.get("from")), form_time(form.get("to"))) else { return invalid() };
    let overlap = form.get("overlap").map_or(Some(BackfillOverlap::Allow), |o| BackfillOverlap::parse(o));
    let Some(overlap) = overlap else { return invalid() };
    let queued = match crate::schedules::backfill(&s, &id, from, to, overlap).await {
        Ok(done) => done.queued,
        Err(crate::schedules::BackfillError::NotFound) => return Err(not_found("schedule")),
        Err(crate::schedules::BackfillError::Invalid(_)) => return invalid(),
        Err(crate::schedules::BackfillError::Store(e)) => return Err(e.into()),
    };
    Ok(Redirect::to(&format!("/ui/schedules?msg=backfill-done&queued={queued}")).into_response())
}

/// A `datetime-local` value (`2026-11-01T10:00` or with seconds), read as UTC.
fn form_time(value: Option<&String>) -> Option<DateTime<Utc>> {
    let v = value?.trim();
    ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(v, f).ok())
        .map(|t| t.and_utc())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_backfill_forms_time_is_read_as_utc_and_anything_else_is_refused() {
        let t = |v: &str| super::form_time(Some(&v.to_string())).map(|t| t.to_rfc3339());
        assert_eq!(t("2026-11-01T10:00"), Some("2026-11-01T10:00:00+00:00".into()));
        assert_eq!(t("2026-11-01T10:00:30"), Some("2026-11-01T10:00:30+00:00".into()));
        for bad in ["", "yesterday", "2026-11-01", "2026-13-01T10:00", "2026-11-01T10:00Z\u{0}"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_log_lines_escapes_and_overrides_are_spelled_out_and_its_newlines_kept() {
        assert_eq!(super::visible_controls("a\u{1b}[31mred\u{202e}x\ty\nz"), "a\\u{1b}[31mred\\u{202e}x\ty\nz");
        assert_eq!((super::lines_count(1), super::lines_count(2)), ("1 line".to_string(), "2 lines".to_string()));
    }

    use super::*;

    #[test]
    fn next_is_one_of_our_paths_in_visible_ascii() {
        for ok in ["/ui", "/ui/runs?status=FAILED", "/ui/runs/0193?msg=retry-done"] {
            assert_eq!(safe_next(Some(&ok.to_string())), ok);
        }
        for bad in [
            "/ui\r\nSet-Cookie:x=1",
            "/ui/runs\u{0}",
            "/ui/runs é",
            "//evil.example/ui",
            "/ui//evil.example",
            "/ui\\evil",
            "/ui/../v1/runs",
            "/uifoo",
            "https://evil.example/ui",
        ] {
            assert_eq!(safe_next(Some(&bad.to_string())), "/ui/runs", "{bad:?}");
        }
    }

    #[test]
    fn every_button_has_its_notices_and_nothing_else_is_shown() {
        for action in ["retry", "pause", "resume", "cancel"] {
            assert!(notice(&format!("{action}-done")).is_some() && notice(&format!("{action}-refused")).is_some());
        }
        assert_eq!(notice("Your account is locked: call +1 555"), None);
    }
}
