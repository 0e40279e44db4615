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
use composer_store::Pool;

/// Pages need a live session when a token is set or single sign-on is on;
/// without one, the login page, which comes back here after. With one, the
/// page is made [`session::in_session`] (its frame offers Log out), for its
/// caller ([`session::as_caller`]), and only when the caller holds the
/// scope it needs ([`ui_scope`]; 403 otherwise).
pub async fn require_login(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    req: Request,
    next: Next,
) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("", |m| m.as_str()).to_string();
    let scope = ui_scope(req.method(), &route);
    if config.api_token.is_none() && !config.oidc.enabled() {
        let mut req = req;
        req.extensions_mut().insert(Principal::anonymous(&config));
        return session::as_caller(Principal::anonymous(&config), next.run(req)).await;
    }
    let who = match live_session(&pool, req.headers()).await {
        // A login with the API token, while there is one.
        Ok(Some(None)) if config.api_token.is_some() => Principal::api_token(&config),
        Ok(Some(None)) => {
            return Redirect::to(&format!("/ui/login?next={}", url_enc(req.uri().path()))).into_response();
        }
        Ok(Some(Some(person))) => Principal::person(&person.actor, &person.scopes),
        Ok(None) => {
            let here = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/ui/runs");
            return Redirect::to(&format!("/ui/login?next={}", url_enc(here))).into_response();
        }
        Err(e) => return e.into_response(),
    };
    if !who.may(scope) {
        let why = format!("{} lacks the scope {scope}, which this page or form needs", who.name);
        return UiError(StatusCode::FORBIDDEN, why).into_response();
    }
    let mut req = req;
    req.extensions_mut().insert(who.clone());
    session::in_session(session::as_caller(who, next.run(req))).await
}

/// The scope a UI route needs: a page `read` (the audit log `admin`), a
/// form the scope of what it changes; a route this does not know, `admin`.
pub fn ui_scope(method: &Method, route: &str) -> Scope {
    let read = matches!(*method, Method::GET | Method::HEAD);
    match route {
        "/ui/audit" => Scope::Admin,
        _ if read => Scope::Read,
        r if r.starts_with("/ui/runs") || r.starts_with("/ui/bulk/") => Scope::RunsControl,
        "/ui/limits" => Scope::LimitsWrite,
        r if r.starts_with("/ui/schedules/") => Scope::SchedulesWrite,
        _ => Scope::Admin,
    }
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
