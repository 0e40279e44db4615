//! What every request passes through before (and after) its handler: the
//! bearer tokens, the refusal of other sites' pages, the URI length limit,
//! and the count and log of error answers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use composer_api::ErrorDetail;

use super::error::{ApiError, ErrorCause};
use crate::auth::bearer_matches;
use crate::shared::Shared;

/// Longest request URI (path and query) answered; longer is a 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// A URI over `MAX_URI_BYTES` is a 414 with a JSON body. (Past 64 KiB the
/// HTTP parser itself answers 414, without a body, before any handler.)
pub(super) async fn refuse_long_uris(req: Request, next: Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if len > MAX_URI_BYTES {
        return ApiError::UriTooLong { len, limit: MAX_URI_BYTES }.into_response();
    }
    next.run(req).await
}

/// Counts error responses by status, and logs every 5xx with its method,
/// path and cause.
pub(super) async fn observe_errors(req: Request, next: Next) -> Response {
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

/// Which token a group of routes takes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Token {
    /// `COMPOSER_API_TOKEN`.
    Api,
    /// `COMPOSER_WORKER_TOKEN`. Workers' routes are closed whenever any
    /// token is set: with only an API token, they take that token (a worker
    /// in `composer dev` is given one).
    Worker,
}

pub(super) async fn require_token(
    State((s, token)): State<(Arc<Shared>, Token)>,
    req: Request,
    next: Next,
) -> Response {
    let expected = match token {
        Token::Api => s.config.api_token.as_deref(),
        Token::Worker => s.config.worker_token.as_deref().or(s.config.api_token.as_deref()),
    };
    check_token(expected, req, next).await
}

/// Browsers cannot drive the API behind the user's back: a request from a
/// web page of another origin (its `Origin` header) is refused unless that
/// origin is allowed (`COMPOSER_ALLOWED_ORIGINS`), and a body a page can
/// send without a CORS preflight (a form, `text/plain`) is refused as not
/// JSON. Without a token, the API on loopback would otherwise be open to
/// any page the user visits.
pub(super) async fn refuse_foreign_pages(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default().trim_end_matches('/');
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        let own = !host.is_empty() && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        if !own && !s.config.allowed_origins.iter().any(|o| o == origin) {
            return ApiError::OriginNotAllowed(origin.to_string()).into_response();
        }
    }
    if let Some(kind) = req.headers().get(header::CONTENT_TYPE) {
        let kind = kind.to_str().unwrap_or_default().to_ascii_lowercase();
        let essence = kind.split(';').next().unwrap_or_default().trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return ApiError::UnsupportedMediaType(essence.to_string()).into_response();
        }
    }
    next.run(req).await
}

async fn check_token(expected: Option<&str>, req: Request, next: Next) -> Response {
    if let Some(expected) = expected {
        let header = req.headers().get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
        if !bearer_matches(header, expected) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}
