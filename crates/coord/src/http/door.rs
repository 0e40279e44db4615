//! The door: every request is given its namespace here, before any route.
//! It is named by the `Composer-Namespace` header or the `namespace` query
//! parameter (for callers that cannot set a header, such as a webhook's
//! sender), and is `default` when neither is given. A request for another
//! namespace is handed, whole, to that namespace's routes, whose state
//! reaches that namespace's data alone; what is cluster-wide (keys,
//! namespaces, health, the document, `/metrics`, the UI) is served by the
//! default namespace's routes whatever the request names. The namespace
//! goes with the request ([`InNamespace`]) so that `authorize` can refuse a
//! key bound to another.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use composer_store::namespaces::{NamespaceRow, Quotas, Usage, DEFAULT};
use futures_util::future::BoxFuture;

use super::error::ApiError;

/// The header naming a request's namespace.
pub const NAMESPACE_HEADER: &str = "composer-namespace";

/// The query parameter naming it, for callers that cannot set a header.
pub const NAMESPACE_PARAM: &str = "namespace";

pub use crate::access::InNamespace;

/// `default`, made once: most requests are in it.
fn default_name() -> Arc<str> {
    static NAME: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| Arc::from(DEFAULT)).clone()
}

/// What the door finds for a namespace.
pub enum Found {
    /// Its routes.
    Routes(axum::Router),
    Missing,
    Deleting,
}

/// What creating a namespace came to.
pub enum Created {
    New(NamespaceRow),
    Exists(NamespaceRow),
    Deleting,
    /// There are `max_namespaces` already.
    TooMany,
}

/// The namespaces of a coordinator, as the door and `/v1/namespaces` use them.
pub trait Namespaces: Send + Sync {
    fn find<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Found, ApiError>>;
    fn create<'a>(
        &'a self,
        name: &'a str,
        description: &'a str,
        actor: &'a str,
    ) -> BoxFuture<'a, Result<Created, ApiError>>;
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NamespaceRow>, ApiError>>;
    /// Sets its quotas; `None` when there is no such namespace (or it is being deleted).
    fn set_quotas<'a>(&'a self, name: &'a str, quotas: Quotas)
        -> BoxFuture<'a, Result<Option<NamespaceRow>, ApiError>>;
    /// What it uses of its quotas, read in its schema; `None` when it is not served.
    fn usage<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Usage>, ApiError>>;
}

/// What the door holds: the namespaces, and what it needs to tell a known
/// caller from a stranger (the environment's tokens, the keys, the UI's
/// sessions), so that a stranger learns nothing of which namespaces exist.
pub struct Door {
    namespaces: Arc<dyn Namespaces>,
    config: Arc<crate::config::Config>,
    keys: Arc<crate::access::Keys>,
    cluster: composer_store::Pool,
    ui: UiAnswers,
}

/// What the door takes of the UI (which is behind it): how a session is
/// found, and how its refusals look.
#[derive(Clone, Copy)]
pub struct UiAnswers {
    /// What the store keeps of the session a request's cookie names.
    pub session_of: fn(&axum::http::HeaderMap) -> Option<Vec<u8>>,
    /// The login page, which comes back to this page.
    pub to_login: fn(&axum::http::Uri) -> Response,
    /// A person holds no scope in a namespace: (their name, the namespace).
    pub refused_in: fn(&str, &str) -> Response,
}

impl Door {
    pub fn new(default: &crate::shared::Shared, namespaces: Arc<dyn Namespaces>, ui: UiAnswers) -> Door {
        let (config, keys, cluster) = (default.config.clone(), default.keys.clone(), default.cluster.0.clone());
        Door { namespaces, config, keys, cluster, ui }
    }

    /// Who `headers` say the caller is, as far as the door needs to know:
    /// a token of the environment's or a live key; on a UI page, a live
    /// session; anyone, when the API is open (no API token: `GET
    /// /v1/namespaces` is open too).
    async fn caller(&self, headers: &axum::http::HeaderMap, ui: bool) -> Result<Caller, ApiError> {
        if self.config.api_token.is_none() {
            return Ok(Caller::Anyone);
        }
        if let Some(p) = crate::access::caller(&self.config, &self.keys, headers).await? {
            return Ok(Caller::Key(p));
        }
        let Some(session) = (self.ui.session_of)(headers).filter(|_| ui) else { return Ok(Caller::Stranger) };
        let client = composer_store::client(&self.cluster).await?;
        Ok(match composer_store::sessions::live(&client, &session).await? {
            Some(Some(person)) => Caller::Person(person),
            Some(None) => Caller::Anyone,
            None => Caller::Stranger,
        })
    }
}

/// Who a request for a namespace other than `default` comes from.
enum Caller {
    /// No one the cluster knows.
    Stranger,
    /// Anyone may act in every namespace (an open API), or the holder of
    /// the API token signed in to the UI.
    Anyone,
    Key(crate::access::Principal),
    /// A person signed in to the UI with single sign-on.
    Person(composer_store::sessions::Person),
}

/// Whether `name` may name a namespace (`composer_api::schema::NAMESPACE_PATTERN`).
pub fn valid_name(name: &str) -> bool {
    composer_core::schema::is_namespace_name(name)
}

/// The cookie naming the namespace a browser's UI pages are in (set by the
/// UI's namespace page, `/ui/namespaces`), read for `/ui` pages when the
/// request names none.
pub const UI_COOKIE: &str = "composer_namespace";

/// Paths served by the default namespace's routes whatever the request
/// names. Of the UI, what is the cluster's: signing in and out, the static
/// files, the namespaces page; its other pages are a namespace's.
fn cluster_wide(path: &str) -> bool {
    const ROOTS: [&str; 12] = [
        "/v1/keys",
        "/v1/namespaces",
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/metrics",
        "/demo",
        "/ui/login",
        "/ui/logout",
        "/ui/sso",
        "/ui/static",
        "/ui/namespaces",
    ];
    path == "/ui"
        || ROOTS.iter().any(|root| path.strip_prefix(root).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

/// Whether `path` is a UI page, whose namespace may come from [`UI_COOKIE`].
fn ui_page(path: &str) -> bool {
    path.starts_with("/ui/")
}

/// The namespace [`UI_COOKIE`] names, if `headers` carry one that names
/// one: the first whose value is a name (one of another site's making,
/// say from a sibling domain, is passed over rather than trusted or
/// allowed to trap the browser).
pub fn ui_cookie(headers: &axum::http::HeaderMap) -> Option<String> {
    let cookies = headers.get_all(axum::http::header::COOKIE).iter().filter_map(|h| h.to_str().ok());
    cookies.flat_map(|h| h.split(';')).find_map(|c| {
        let (name, value) = c.trim().split_once('=')?;
        (name == UI_COOKIE && valid_name(value)).then(|| value.to_string())
    })
}

/// The namespace `req` names, the `namespace` parameter taken out of its
/// query (so that routes' strict queries do not see it).
fn named_in(req: &mut Request) -> Result<Option<String>, ApiError> {
    // One header: a proxy that adds its own must not leave the first to count.
    let mut given = req.headers().get_all(NAMESPACE_HEADER).iter();
    let header = match (given.next(), given.next()) {
        (Some(_), Some(_)) => return Err(ApiError::bad_request(format!("{NAMESPACE_HEADER}: given more than once"))),
        (Some(v), None) => {
            Some(v.to_str().map_err(|_| ApiError::bad_request(format!("{NAMESPACE_HEADER}: not text")))?.to_string())
        }
        _ => None,
    };
    let mut param = None;
    if let Some(query) = req.uri().query().filter(|q| q.contains(NAMESPACE_PARAM)) {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query).map_err(|e| ApiError::bad_request(format!("the query string: {e}")))?;
        if pairs.iter().any(|(k, _)| k == NAMESPACE_PARAM) {
            let mut rest = Vec::with_capacity(pairs.len());
            for (k, v) in pairs {
                match k == NAMESPACE_PARAM {
                    true if param.is_some() => {
                        return Err(ApiError::bad_request(format!("{NAMESPACE_PARAM}: given more than once")))
                    }
                    true => param = Some(v),
                    false => rest.push((k, v)),
                }
            }
            let rest = serde_urlencoded::to_string(&rest).map_err(|e| ApiError::internal(e.to_string()))?;
            let path = req.uri().path();
            let uri = if rest.is_empty() { path.to_string() } else { format!("{path}?{rest}") };
            *req.uri_mut() = uri.parse().map_err(|_| ApiError::bad_request("the query string"))?;
        }
    }
    let name = match (header, param) {
        (Some(h), Some(p)) if h != p => {
            return Err(ApiError::bad_request(format!(
                "the {NAMESPACE_HEADER} header names {h:?} and the {NAMESPACE_PARAM} parameter {p:?}: name one"
            )))
        }
        (Some(n), _) | (None, Some(n)) => Some(n),
        (None, None) => None,
    };
    Ok(name)
}

/// Where the namespace of a request came from.
#[derive(Debug, PartialEq)]
enum Named {
    /// Its header or query parameter (or neither: `default`).
    Request,
    /// The UI's cookie.
    Cookie,
}

/// The namespace `req` names ([`named_in`]), or, for a UI page that names
/// none, the one the UI's cookie names; `default` otherwise.
fn requested(req: &mut Request) -> Result<(String, Named), ApiError> {
    let path = req.uri().path();
    let cookie = (ui_page(path) && !cluster_wide(path)).then(|| ui_cookie(req.headers())).flatten();
    let (name, how) = match named_in(req)? {
        Some(named) => (named, Named::Request),
        None => match cookie {
            Some(cookie) => (cookie, Named::Cookie),
            None => (DEFAULT.to_string(), Named::Request),
        },
    };
    if !valid_name(&name) {
        let shown: String = name.chars().take(80).collect();
        return Err(ApiError::bad_request(format!(
            "namespace {shown:?}: 1 to 63 lowercase letters, digits and '-', starting with a letter"
        )));
    }
    Ok((name, how))
}

/// The middleware in front of every route (see the module's note). A
/// namespace that is not served is named as such (404, 409) only to a
/// caller the cluster knows; a stranger gets what it would get of one that
/// is (401, or the UI's login).
pub(super) async fn door(State(door): State<Arc<Door>>, mut req: Request, next: Next) -> Response {
    let namespaces = &door.namespaces;
    let (name, how) = match requested(&mut req) {
        Ok(named) => named,
        Err(e) => return e.into_response(),
    };
    let name: Arc<str> = if name == DEFAULT { default_name() } else { Arc::from(name) };
    req.extensions_mut().insert(InNamespace(name.clone()));
    req.extensions_mut().insert(namespaces.clone());
    if &*name == DEFAULT || cluster_wide(req.uri().path()) {
        return next.run(req).await;
    }
    // Boxed: the default namespace's requests, most of them, carry none of
    // its state (the caller's lookup) in their own future.
    Box::pin(into_namespace(door, req, name, how)).await
}

/// A request for namespace `name`, not `default`, past its caller's check.
async fn into_namespace(door: Arc<Door>, req: Request, name: Arc<str>, how: Named) -> Response {
    let found = door.namespaces.find(&name).await;
    let asked = (req.method().clone(), req.uri().clone());
    if let Some(refused) = refusal(&door, &asked, req.headers(), &name, &found).await {
        return refused;
    }
    match found {
        Ok(Found::Routes(mut routes)) => {
            // Counted in the namespace: every metric the request makes.
            let answered = tower_service::Service::call(&mut routes, req);
            match crate::metrics::in_namespace(Some(name.clone()), answered).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
        Ok(Found::Missing | Found::Deleting) if how == Named::Cookie => choose_again(),
        Ok(Found::Missing) => ApiError::not_found(format!("namespace {name:?} not found")).into_response(),
        Ok(Found::Deleting) => ApiError::Conflict(format!("namespace {name:?} is being deleted")).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The answer to a request for namespace `name` (not `default`) from a
/// caller who may not enter it, whether it exists or not, so that no
/// one learns which namespaces exist but from a namespace's own list: a
/// stranger gets the 401 (or the UI's login) any call would, a key bound
/// to another namespace its binding's 403, a person without a scope there
/// the UI's 403. A webhook's sender signs instead of naming itself: one
/// for a namespace not served is refused as an unknown webhook is.
async fn refusal(
    door: &Door,
    (method, uri): &(axum::http::Method, axum::http::Uri),
    headers: &axum::http::HeaderMap,
    name: &str,
    found: &Result<Found, ApiError>,
) -> Option<Response> {
    let path = uri.path();
    let webhook = method == axum::http::Method::POST && path.starts_with("/v1/webhooks/");
    let caller = match door.caller(headers, ui_page(path)).await {
        Ok(caller) => caller,
        Err(e) => return Some(e.into_response()),
    };
    match caller {
        Caller::Stranger if webhook => match found {
            Ok(Found::Routes(_)) => None,
            _ => Some(ApiError::BadSignature.into_response()),
        },
        Caller::Stranger if ui_page(path) => Some((door.ui.to_login)(uri)),
        Caller::Stranger => Some(ApiError::Unauthorized.into_response()),
        Caller::Key(p) if !p.may_enter(name) => Some(ApiError::Forbidden(p.bound_elsewhere(name)).into_response()),
        Caller::Person(p) if !crate::access::Principal::person_may_enter(&p.scopes, name) => {
            Some((door.ui.refused_in)(&p.actor, name))
        }
        _ => None,
    }
}

/// The UI's cookie names no namespace that is served (it was deleted, or
/// the cookie was not ours): the browser forgets it and goes to the
/// namespaces page.
fn choose_again() -> Response {
    let forget = format!("{UI_COOKIE}=; Path=/ui; SameSite=Strict; Max-Age=0");
    (
        axum::http::StatusCode::SEE_OTHER,
        [(axum::http::header::LOCATION, "/ui/namespaces".to_string()), (axum::http::header::SET_COOKIE, forget)],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(uri: &str, header: Option<&str>) -> Result<(String, String), String> {
        let mut req = Request::builder().uri(uri);
        if let Some(h) = header {
            req = req.header(NAMESPACE_HEADER, h);
        }
        let mut req = req.body(axum::body::Body::empty()).unwrap();
        requested(&mut req).map(|(n, _)| (n, req.uri().to_string())).map_err(|e| e.to_string())
    }

    #[test]
    fn a_request_names_its_namespace_by_header_or_parameter_and_default_otherwise() {
        assert_eq!(named("/v1/runs?limit=5", None).unwrap(), ("default".into(), "/v1/runs?limit=5".into()));
        assert_eq!(named("/v1/runs", Some("billing")).unwrap().0, "billing");
        assert_eq!(
            named("/v1/runs?namespace=billing&limit=5", None).unwrap(),
            ("billing".into(), "/v1/runs?limit=5".into())
        );
        assert_eq!(named("/v1/runs?namespace=billing", Some("billing")).unwrap().1, "/v1/runs");
        assert!(named("/v1/runs?namespace=a", Some("b")).unwrap_err().contains("name one"));
        assert!(named("/v1/runs?namespace=a&namespace=a", None).unwrap_err().contains("more than once"));
        let mut twice = Request::builder()
            .uri("/v1/runs")
            .header(NAMESPACE_HEADER, "a")
            .header(NAMESPACE_HEADER, "b")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(requested(&mut twice).unwrap_err().to_string().contains("more than once"));
        for bad in ["", "Billing", "1a", "a_b", "a/b", "../x", &"a".repeat(64)] {
            assert!(named("/v1/runs", Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_valid_name_is_what_the_document_s_pattern_says() {
        let pattern = regex::Regex::new(composer_api::schema::NAMESPACE_PATTERN).unwrap();
        let long = "a".repeat(63);
        let longer = "a".repeat(64);
        for name in ["a", "default", "team-a", "a1", &long, &longer, "", "A", "1a", "-a", "a_b", "a.b", "é", "a\n"] {
            assert_eq!(valid_name(name), pattern.is_match(name), "{name:?}");
        }
    }

    #[test]
    fn cluster_wide_paths_are_whole_segments() {
        assert!(cluster_wide("/v1/keys") && cluster_wide("/v1/keys/x") && cluster_wide("/ui/login"));
        assert!(cluster_wide("/ui") && cluster_wide("/ui/namespaces") && cluster_wide("/ui/static/app.css"));
        assert!(!cluster_wide("/v1/keysx") && !cluster_wide("/v1/runs") && !cluster_wide("/uix"));
        assert!(!cluster_wide("/ui/runs") && !cluster_wide("/ui/loginx") && !cluster_wide("/ui/audit"));
    }

    #[test]
    fn a_ui_page_is_in_the_namespace_of_its_cookie_unless_the_request_names_one() {
        let ask = |uri: &str, header: Option<&str>, cookie: &str| {
            let mut req = Request::builder().uri(uri).header(axum::http::header::COOKIE, cookie);
            if let Some(h) = header {
                req = req.header(NAMESPACE_HEADER, h);
            }
            requested(&mut req.body(axum::body::Body::empty()).unwrap()).map_err(|e| e.to_string())
        };
        let cookie = "composer_session=x; composer_namespace=billing";
        assert_eq!(ask("/ui/runs", None, cookie).unwrap(), ("billing".into(), Named::Cookie));
        assert_eq!(ask("/ui/runs?namespace=ops", None, cookie).unwrap(), ("ops".into(), Named::Request));
        assert_eq!(ask("/ui/runs", Some("ops"), cookie).unwrap(), ("ops".into(), Named::Request));
        assert_eq!(ask("/ui/runs?namespace=default", None, cookie).unwrap(), ("default".into(), Named::Request));
        assert_eq!(ask("/ui/login", None, cookie).unwrap(), ("default".into(), Named::Request));
        assert_eq!(
            ask("/v1/runs", None, cookie).unwrap(),
            ("default".into(), Named::Request),
            "the API reads no cookie"
        );
        let passed_over = "composer_namespace=../x; composer_namespace=Bad; composer_namespace=ops";
        assert_eq!(
            ask("/ui/runs", None, passed_over).unwrap(),
            ("ops".into(), Named::Cookie),
            "the first that is a name"
        );
        assert_eq!(ask("/ui/runs", None, "composer_namespace=../x").unwrap(), ("default".into(), Named::Request));
    }
}
