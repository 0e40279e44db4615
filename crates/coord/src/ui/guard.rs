//! What every UI request passes through: a live session for the pages when
//! a token is set, the refusal of a form posted from another site, and the
//! headers every answer carries.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::error::{other_site, UiError};
use super::html::url_enc;
use super::session;
use crate::config::Config;
use composer_store::Pool;

/// Pages need a live session when a token is set; without one, the login
/// page, which comes back here after. With one, the page is made
/// [`session::in_session`] (its frame offers Log out).
pub async fn require_login(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    req: Request,
    next: Next,
) -> Response {
    if config.api_token.is_none() {
        return next.run(req).await;
    }
    match live_session(&pool, req.headers()).await {
        Ok(true) => session::in_session(next.run(req)).await,
        Ok(false) => {
            let here = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/ui/runs");
            Redirect::to(&format!("/ui/login?next={}", url_enc(here))).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Whether the request's cookie names a session that is live in the store.
async fn live_session(pool: &Pool, headers: &axum::http::HeaderMap) -> Result<bool, UiError> {
    let Some(id) = session::from_cookie(headers) else { return Ok(false) };
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
