//! What every request passes through before (and after) its handler: the
//! Host allow-list (the bearer tokens and scopes are `authorize`'s), the refusal of other sites' pages,
//! the URI length limit, the count and log of error answers, and the
//! version header every answer carries.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use composer_api::ErrorDetail;

use super::error::{ApiError, ErrorCause};
use crate::config::Config;

/// Paths any `Host` may ask for: probes come with the pod's address or a
/// name nobody configured, and the answers carry no data.
pub(super) const ANY_HOST_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Whether a `Host` (or a URI's authority) names this coordinator: an IP
/// address (a browser sends one only to a page loaded from that address,
/// so it cannot be a rebound name), `localhost`, or one of
/// `COMPOSER_ALLOWED_HOSTS` (`name` for any port, `name:port` for one).
pub fn host_allowed(allowed: &[String], host: &str) -> bool {
    let Ok(authority) = host.parse::<axum::http::uri::Authority>() else { return false };
    if authority.as_str().contains('@') {
        return false;
    }
    let name = authority.host().trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let with_port = authority.port_u16().map(|p| format!("{name}:{p}"));
    allowed.iter().any(|a| a == "*" || *a == name || Some(a) == with_port.as_ref())
}

/// The hosts a request names: its `Host` header and, in the absolute form,
/// its URI's authority (which wins over `Host`). A request without either
/// (not a browser's) names none.
fn named_hosts(req: &Request) -> impl Iterator<Item = &str> {
    let header = req.headers().get(header::HOST).map(|h| h.to_str().unwrap_or(""));
    header.into_iter().chain(req.uri().authority().map(|a| a.as_str()))
}

/// A request to another name than this coordinator's is refused (421)
/// before anything else: a page of another site whose name was rebound to
/// this address (DNS rebinding) would otherwise be same-origin with the
/// API, past the Origin check. `ANY_HOST_PATHS` are open to any name.
pub(super) async fn refuse_unknown_hosts(State(config): State<Arc<Config>>, req: Request, next: Next) -> Response {
    if !ANY_HOST_PATHS.contains(&req.uri().path()) {
        if let Some(host) = named_hosts(&req).find(|h| !host_allowed(&config.allowed_hosts, h)) {
            return ApiError::HostNotAllowed(host.to_string()).into_response();
        }
    }
    next.run(req).await
}

/// Whether `headers` come from a page of this coordinator's own origin, or
/// of one of `COMPOSER_ALLOWED_ORIGINS`. Its own origin is the `Host` the
/// request was sent to, and only when that host is allowed (a rebound
/// name's page is same-origin with whatever it sends).
///
/// A browser that leaves `Origin` out of a request that changes something
/// (some send a form's POST without it) still says where it came from:
/// `Sec-Fetch-Site` other than `same-origin` or `none` (typed by the user),
/// or a `Referer` of another origin, is refused as such a page would be.
/// A request with none of the three (curl, the SDKs) is not a web page's;
/// a GET or HEAD without `Origin` (a link followed) changes nothing and
/// passes.
pub fn origin_allowed(config: &Config, method: &axum::http::Method, headers: &axum::http::HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let allowed = |origin: &str| {
        let origin = origin.trim_end_matches('/');
        let own = !host.is_empty()
            && host_allowed(&config.allowed_hosts, host)
            && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        own || config.allowed_origins.iter().any(|o| o == origin)
    };
    if let Some(origin) = headers.get(header::ORIGIN) {
        return allowed(origin.to_str().unwrap_or_default());
    }
    if matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD) {
        return true;
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.to_str().unwrap_or_default(), "same-origin" | "none") {
            return false;
        }
    }
    match headers.get(header::REFERER) {
        Some(referer) => referer_origin(referer.to_str().unwrap_or_default()).is_some_and(|o| allowed(&o)),
        None => true,
    }
}

/// The origin (`scheme://host[:port]`) of a `Referer`; `None` when it has none.
fn referer_origin(referer: &str) -> Option<String> {
    let (scheme, rest) = referer.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty() && matches!(scheme, "http" | "https")).then(|| format!("{scheme}://{authority}"))
}

/// Answers of `/v1` carry runs' inputs, outputs and
/// errors: no browser or proxy cache may keep them.
pub(super) async fn no_store(mut resp: Response) -> Response {
    resp.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    resp
}

/// The header every answer carries, with this coordinator's version: how a
/// client (`composer_client`, the CLI) tells a coordinator from another
/// server on the port it was given.
pub const VERSION_HEADER: &str = "composer-version";

/// Marks an answer as a coordinator's: [`VERSION_HEADER`].
pub(super) async fn identify(mut resp: Response) -> Response {
    resp.headers_mut().insert(
        header::HeaderName::from_static(VERSION_HEADER),
        header::HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
    );
    resp
}

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

/// The route an answer came from (its pattern), which [`note_route`] puts
/// on the answer for [`observe_errors`]: that one runs before any route is
/// matched (it sees the door's refusals too), so the request cannot tell it.
#[derive(Clone)]
struct RouteOf(axum::extract::MatchedPath);

/// Puts the matched route's pattern on the answer (a layer on the routes).
pub(super) async fn note_route(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<axum::extract::MatchedPath>().cloned().map(RouteOf);
    let mut resp = next.run(req).await;
    if let Some(route) = route {
        resp.extensions_mut().insert(route);
    }
    resp
}

/// Counts error responses by status, and logs every 5xx with its method,
/// path and cause.
pub(super) async fn observe_errors(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    // The route's pattern, not the path: a run id must not become a label.
    let route = resp.extensions().get::<RouteOf>().map_or("unmatched", |r| r.0.as_str());
    let status = resp.status();
    let class = match status.as_u16() / 100 {
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    };
    crate::metrics::observe(
        composer_metrics::API_REQUEST_DURATION,
        &[("method", method.as_str()), ("route", route), ("status", class)],
        started.elapsed(),
    );
    if status.is_client_error() || status.is_server_error() {
        crate::metrics::inc(composer_metrics::API_ERRORS, &[("status", status.as_str())], 1);
    }
    if status.is_server_error() {
        let message = resp.extensions().get::<ErrorDetail>().map(|d| d.message.clone()).unwrap_or_default();
        let cause = resp.extensions().get::<ErrorCause>().map(|c| c.0.clone()).unwrap_or_default();
        tracing::error!(%method, %path, status = status.as_u16(), %message, %cause, "request failed");
    }
    resp
}

/// Browsers cannot drive the API behind the user's back: a request from a
/// web page of another origin (its `Origin` header) is refused unless that
/// origin is allowed (`COMPOSER_ALLOWED_ORIGINS`), and a body a page can
/// send without a CORS preflight (a form, `text/plain`) is refused as not
/// JSON. Without a token, the API on loopback would otherwise be open to
/// any page the user visits.
pub(super) async fn refuse_foreign_pages(State(config): State<Arc<Config>>, req: Request, next: Next) -> Response {
    if !origin_allowed(&config, req.method(), req.headers()) {
        let origin = req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()).unwrap_or_default();
        return ApiError::OriginNotAllowed(origin.to_string()).into_response();
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

/// Room in a body for what is not its value (a report's other fields).
const BODY_ROOM: usize = 64 * 1024;

/// Whether a route's body carries a run's or a step's value (a start's
/// input, a rerun's, a worker's output, a hand-completed one) or an event's
/// payload: with offloading it may be as large as `COMPOSER_MAX_OFFLOADED`.
pub(crate) fn carries_values(method: &axum::http::Method, route: &str) -> bool {
    method == axum::http::Method::POST
        && matches!(
            route,
            "/v1/runs"
                | "/v1/runs/{id}/rerun"
                | "/v1/runs/{id}/tasks/{node}/complete"
                | "/v1/tasks/{id}/complete"
                | "/v1/events"
        )
}

/// Bounds a request's body by its route: [`Config::max_value`] where it
/// carries a value ([`carries_values`]), `COMPOSER_MAX_PAYLOAD` elsewhere
/// (and room for the rest of the body) — read no further than that.
pub(crate) async fn limit_body(State(config): State<Arc<Config>>, req: Request, next: Next) -> Response {
    let matched = req.extensions().get::<axum::extract::MatchedPath>();
    let limit = match matched.map(|m| m.as_str()) {
        Some("/v1/events") if req.method() == axum::http::Method::POST => config.max_event(),
        Some(route) if carries_values(req.method(), route) => config.max_value(),
        _ => config.max_payload,
    } + BODY_ROOM;
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    match declared {
        Some(n) if n > limit => ApiError::BodyTooLarge.into_response(),
        // A body is as long as it declares (hyper holds it to that): nothing to wrap.
        Some(_) => next.run(req).await,
        None if req.method() == axum::http::Method::GET => next.run(req).await,
        None => next.run(req.map(|body| axum::body::Body::new(http_body_util::Limited::new(body, limit)))).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_referers_origin_is_its_scheme_and_authority() {
        assert_eq!(referer_origin("https://evil.example/form?x=1").as_deref(), Some("https://evil.example"));
        assert_eq!(referer_origin("http://127.0.0.1:8080/ui/runs").as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(referer_origin("http://h:1#f").as_deref(), Some("http://h:1"));
        assert_eq!(referer_origin("about:blank"), None);
        assert_eq!(referer_origin("ftp://h/x"), None);
    }

    #[test]
    fn ip_addresses_localhost_and_the_listed_names_are_allowed_hosts() {
        let allowed = ["composer.example".to_string(), "ops.example:8443".to_string()];
        for host in ["localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "LocalHost."] {
            assert!(host_allowed(&[], host), "{host}");
        }
        for host in ["composer.example", "Composer.Example:8080", "ops.example:8443"] {
            assert!(host_allowed(&allowed, host), "{host}");
        }
        for host in
            ["evil.example:18933", "ops.example:8080", "ops.example", "composer.example.evil", "a@localhost", ""]
        {
            assert!(!host_allowed(&allowed, host), "{host}");
        }
        assert!(host_allowed(&["*".to_string()], "evil.example"));
    }

    #[test]
    fn the_routes_that_carry_values_are_posts_of_the_document() {
        let doc = serde_json::to_value(crate::http::document()).unwrap();
        let carrying: Vec<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(path, ops)| ops.get("post").is_some() && carries_values(&axum::http::Method::POST, path))
            .map(|(path, _)| path.as_str())
            .collect();
        assert_eq!(carrying.len(), 5, "each route carries_values names is in the document: {carrying:?}");
        assert!(!carries_values(&axum::http::Method::GET, "/v1/runs"));
        assert!(!carries_values(&axum::http::Method::GET, "/v1/events"));
        assert!(!carries_values(&axum::http::Method::POST, "/v1/webhooks/{name}"));
    }
}
