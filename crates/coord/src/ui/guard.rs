//! What every UI request passes through: a live session for the pages when
//! a token is set, the refusal of a form posted from another site, and the
//! headers every answer carries.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::error::{other_site, UiError};
use super::html::url_enc;
use super::session;
use crate::access::Principal;
use crate::config::Config;
use composer_api::Scope;
use composer_store::namespaces::DEFAULT;
use composer_store::Pool;

use crate::access::InNamespace;
use crate::shared::ClusterPool;

/// Pages need a live session when a token is set or single sign-on is on;
/// without one, the login page, which comes back here after. With one, the
/// page is made [`session::in_session`] (its frame offers Log out), for its
/// caller ([`session::as_caller`]), and only when the caller holds the
/// scope it needs ([`ui_scope`]; 403 otherwise).
///
/// Sessions are the cluster's (kept in the default namespace's tables), and
/// a page is in the namespace the door gave it: a person's scopes are those
/// their groups give in it.
pub async fn require_login(
    State(config): State<Arc<Config>>,
    State(cluster): State<ClusterPool>,
    req: Request,
    next: Next,
) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("", |m| m.as_str()).to_string();
    let scope = ui_scope(req.method(), &route);
    let namespace = req.extensions().get::<InNamespace>().map_or_else(|| Arc::from(DEFAULT), |n| n.0.clone());
    // The cluster's pages (the namespaces) are in no namespace: there a
    // person holds only what their groups give in every namespace.
    let cluster_page = route == "/ui" || route.starts_with("/ui/namespaces");
    let shown = (!cluster_page).then(|| namespace.clone());
    let mut req = req;
    if config.api_token.is_none() && !config.oidc.enabled() {
        req.extensions_mut().insert(Principal::anonymous(&config));
        req.extensions_mut().insert(MayEnter(None));
        return session::as_caller(Principal::anonymous(&config), shown, next.run(req)).await;
    }
    let (who, may_enter) = match live_session(&cluster.0, req.headers()).await {
        // A login with the API token, while there is one.
        Ok(Some(None)) if config.api_token.is_some() => (Principal::api_token(&config), MayEnter(None)),
        Ok(Some(None)) => return to_login(req.uri()),
        Ok(Some(Some(person))) if !cluster_page && !Principal::person_may_enter(&person.scopes, &namespace) => {
            return refused_in(&person.actor, &namespace);
        }
        Ok(Some(Some(person))) => {
            let here = if cluster_page { "" } else { &namespace };
            let who = Principal::person(&person.actor, &person.scopes, here).in_groups(person.groups);
            (who, MayEnter(Some(person.scopes)))
        }
        Ok(None) => return to_login(req.uri()),
        Err(e) => return e.into_response(),
    };
    if let Some(scope) = scope.filter(|s| !who.may(*s)) {
        let place = if cluster_page { "every namespace".to_string() } else { format!("namespace {namespace}") };
        let why = format!("{} lacks the scope {scope} in {place}, which this page or form needs", who.name);
        return UiError(StatusCode::FORBIDDEN, why).into_response();
    }
    req.extensions_mut().insert(who.clone());
    req.extensions_mut().insert(may_enter);
    session::in_session(session::as_caller(who, shown, next.run(req))).await
}

/// The login page, which comes back to `uri` once a session is live.
pub fn to_login(uri: &axum::http::Uri) -> Response {
    let here = uri.path_and_query().map_or("/ui/runs", |p| p.as_str());
    Redirect::to(&format!("/ui/login?next={}", url_enc(here))).into_response()
}

/// The refusal of a person who holds no scope in `namespace`.
pub fn refused_in(actor: &str, namespace: &str) -> Response {
    let why = format!("{actor} holds no scope in namespace {namespace}: choose another");
    UiError(StatusCode::FORBIDDEN, why).into_response()
}

/// The namespaces the caller of a UI page may enter: every one (`None`),
/// or those a person's grants name (`access::Principal::person_may_enter`).
#[derive(Clone)]
pub struct MayEnter(pub Option<Vec<String>>);

impl MayEnter {
    pub fn may_enter(&self, namespace: &str) -> bool {
        self.0.as_ref().is_none_or(|grants| Principal::person_may_enter(grants, namespace))
    }
}

/// The scope a UI route needs: a page `read` (the audit log `admin`), a
/// form the scope of what it changes; a route this does not know, `admin`.
/// The namespaces page, and choosing one, need none: what it shows is
/// what the caller may enter.
pub fn ui_scope(method: &Method, route: &str) -> Option<Scope> {
    let read = matches!(*method, Method::GET | Method::HEAD);
    Some(match route {
        "/ui/namespaces" if read => return None,
        "/ui/namespaces/switch" => return None,
        "/ui/audit" => Scope::Admin,
        _ if read => Scope::Read,
        r if r.starts_with("/ui/runs") || r.starts_with("/ui/bulk/") || r.starts_with("/ui/replays/") => {
            Scope::RunsControl
        }
        "/ui/events/replay" => Scope::RunsControl,
        r if r.starts_with("/ui/approvals/") => Scope::ApprovalsDecide,
        "/ui/workflows/{name}/migrate" => Scope::RunsControl,
        "/ui/limits" => Scope::LimitsWrite,
        r if r.starts_with("/ui/schedules/") => Scope::SchedulesWrite,
        _ => Scope::Admin,
    })
}

/// The session the request's cookie names, if it is live in the store.
async fn live_session(
    pool: &Pool,
    headers: &axum::http::HeaderMap,
) -> Result<Option<Option<composer_store::sessions::Person>>, UiError> {
    let Some(id) = session::from_cookie(headers) else { return Ok(None) };
    let client = composer_store::client(pool).await?;
    Ok(composer_store::sessions::live(&client, &session::hash(&id)).await?)
}

/// A form that changes something (any method but GET and HEAD) must come
/// from our own pages: 403 otherwise, before the form is read.
pub async fn refuse_other_sites(State(config): State<Arc<Config>>, req: Request, next: Next) -> Response {
    if !matches!(*req.method(), Method::GET | Method::HEAD) && !from_our_pages(&config, req.headers()) {
        return other_site().into_response();
    }
    next.run(req).await
}

/// Whether a POST with `headers` comes from a page of ours.
pub fn from_our_pages(config: &Config, headers: &axum::http::HeaderMap) -> bool {
    crate::http::guard::origin_allowed(config, &Method::POST, headers)
}

/// What every UI response carries: no framing by other sites, no inline
/// script beyond our own file, no sniffing, and no copy in any cache (but
/// the static files, which say otherwise).
pub async fn page_headers(req: Request, next: Next) -> Response {
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
