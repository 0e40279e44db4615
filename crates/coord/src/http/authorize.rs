//! The one door of every guarded route: who is calling ([`Principal`]),
//! whether they hold the scope the route needs, and the audit log of what
//! they change.
//!
//! A route's scope comes from its method and path by [`required_scope`],
//! which answers for any route (one it does not know needs `admin`), so a
//! new route is closed until it is given a scope; the document names each
//! operation's scope from the same function (`x-composer-scope`).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::payloads::AnswerNames;
use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use composer_api::Scope;
use composer_store::Pool;
use serde_json::{json, Value};
use uuid::Uuid;

use super::error::ApiError;
use crate::access::{InNamespace, Keys, Principal};
use crate::config::Config;

/// The scope a call of `method` on `route` (the router's pattern, as
/// `/v1/schedules/{id}`) needs.
pub fn required_scope(method: &Method, route: &str) -> Scope {
    let under = |prefix: &str| route == prefix || route.strip_prefix(prefix).is_some_and(|r| r.starts_with('/'));
    let read = matches!(*method, Method::GET | Method::HEAD);
    if route == "/metrics" {
        Scope::MetricsRead
    } else if under("/v1/tasks") {
        Scope::TasksWork
    } else if under("/v1/keys") || under("/v1/audit") || !route.starts_with("/v1/") {
        Scope::Admin
    } else if read {
        Scope::Read
    } else if route == "/v1/workflows/{name}/migrate" {
        // It changes runs, not definitions.
        Scope::RunsControl
    } else if under("/v1/workflows") {
        Scope::WorkflowsWrite
    } else if under("/v1/runs") || under("/v1/bulk") || under("/v1/events/replay") {
        // A replay starts runs as a bulk job acts on them.
        Scope::RunsControl
    } else if route == "/v1/events" {
        Scope::EventsSend
    } else if under("/v1/schedules") {
        Scope::SchedulesWrite
    } else if under("/v1/webhooks") {
        Scope::WebhooksWrite
    } else if under("/v1/limits") {
        Scope::LimitsWrite
    } else if under("/v1/approvals") {
        Scope::ApprovalsDecide
    } else {
        Scope::Admin
    }
}

/// Whether a call of `method` on `route` changes the cluster's namespaces
/// (creates or deletes one, or sets its quotas): a key of every namespace's
/// alone may, whatever scopes a bound key holds.
pub fn cluster_only(method: &Method, route: &str) -> bool {
    route.starts_with("/v1/namespaces") && !matches!(*method, Method::GET | Method::HEAD)
}

/// Whether a call of `method` on `route` is a change the audit log
/// records: every one but reads, the work that runs' own history records
/// (starting runs, sending events, a worker's calls) and logging in or out.
pub fn audited(method: &Method, route: &str) -> bool {
    let data = matches!((method.as_str(), route), ("POST", "/v1/runs") | ("POST", "/v1/events"));
    let session = matches!(route, "/ui/login" | "/ui/logout");
    !matches!(*method, Method::GET | Method::HEAD) && !data && !session && !route.starts_with("/v1/tasks/")
}

/// Whether routes needing `scope` are open on this coordinator: no token
/// for them is set (`composer dev` on loopback). The workers' routes take
/// the worker token, else the API token; `/metrics` the metrics token,
/// else the API token.
fn open(config: &Config, scope: Scope) -> bool {
    match scope {
        Scope::TasksWork => config.worker_token.is_none() && config.api_token.is_none(),
        Scope::MetricsRead => config.metrics_token.is_none() && config.api_token.is_none(),
        _ => config.api_token.is_none(),
    }
}

fn route_of(req: &Request) -> String {
    req.extensions().get::<MatchedPath>().map_or_else(|| req.uri().path().to_string(), |m| m.as_str().to_string())
}

/// Names the caller, refuses one without the route's scope (401 without a
/// known token or key, 403 naming the scope), and hands the [`Principal`]
/// to the handler as a request extension.
pub(super) async fn authorize(
    State((config, keys)): State<(Arc<Config>, Arc<Keys>)>,
    mut req: Request,
    next: Next,
) -> Response {
    let route = route_of(&req);
    let scope = required_scope(req.method(), &route);
    let principal = if open(&config, scope) {
        Principal::anonymous(&config)
    } else {
        match crate::access::caller(&config, &keys, req.headers()).await {
            Ok(Some(p)) => p,
            Ok(None) => return ApiError::Unauthorized.into_response(),
            Err(e) => return ApiError::from(e).into_response(),
        }
    };
    // The door names every request's namespace; a request that did not pass
    // it (none does) is refused rather than taken as `default`.
    let Some(InNamespace(namespace)) = req.extensions().get::<InNamespace>() else {
        return ApiError::internal("a request reached a route without passing the door").into_response();
    };
    if !principal.may_enter(namespace) {
        return ApiError::Forbidden(principal.bound_elsewhere(namespace)).into_response();
    }
    if !principal.may(scope) {
        let why = format!("{} lacks the scope {scope}, which {} {route} needs", principal.name, req.method());
        return ApiError::Forbidden(why).into_response();
    }
    if let Some(bound) = principal.namespace().filter(|_| cluster_only(req.method(), &route)) {
        let why = format!(
            "{} is bound to namespace {bound}; only a key of every namespace may create or delete one, or set its quotas",
            principal.name
        );
        return ApiError::Forbidden(why).into_response();
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// Most of a request's or an answer's body the audit log keeps, as JSON;
/// past it, only its size and SHA-256.
pub const MAX_AUDIT_BODY: usize = 64 * 1024;

/// A body's size and SHA-256, which say what it was without keeping it.
fn digest_of(bytes: &[u8]) -> Value {
    let hash = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = hash.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    json!({"bytes": bytes.len(), "sha256": hex})
}

/// `v` with each NUL (which PostgreSQL's `jsonb` cannot hold) replaced by
/// U+FFFD, in keys and strings.
fn without_nuls(v: Value) -> Value {
    let clean = |s: String| if s.contains('\0') { s.replace('\0', "\u{FFFD}") } else { s };
    match v {
        Value::String(s) => Value::String(clean(s)),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nuls).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (clean(k), without_nuls(v))).collect()),
        other => other,
    }
}

/// What the audit log keeps of a body: its JSON (or a form's fields), or
/// [`digest_of`] it when it is not JSON or its JSON (written compactly,
/// so spaces cannot push it out) is larger than [`MAX_AUDIT_BODY`].
fn recorded(content_type: Option<&str>, bytes: &[u8]) -> Option<Value> {
    if bytes.is_empty() {
        return None;
    }
    let form = content_type.is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    let parsed = match form {
        true => serde_urlencoded::from_bytes::<Vec<(String, String)>>(bytes)
            .ok()
            .map(|fields| Value::Object(fields.into_iter().map(|(k, v)| (k, Value::String(v))).collect())),
        false => serde_json::from_slice::<Value>(bytes).ok(),
    };
    match parsed.map(without_nuls) {
        Some(v) if v.to_string().len() <= MAX_AUDIT_BODY => Some(v),
        _ => Some(digest_of(bytes)),
    }
}

/// Whether a route acts on runs, whose inputs and outputs are run data:
/// the audit log, kept longer than runs, keeps only their digests.
fn run_data(route: &str) -> bool {
    ["/v1/runs", "/v1/bulk", "/ui/runs", "/ui/bulk"].iter().any(|p| route.starts_with(p))
}

/// What the audit log keeps of what was asked: on a run, its inputs and
/// outputs as digests.
fn kept_request(route: &str, asked: Value) -> Value {
    let Value::Object(mut o) = asked else { return asked };
    if run_data(route) {
        for field in ["input", "output"] {
            if let Some(v) = o.get_mut(field) {
                *v = digest_of(v.to_string().as_bytes());
            }
        }
    }
    Value::Object(o)
}

/// What the audit log keeps of an answer: never the key `POST /v1/keys`
/// shows once; of a run (or a bulk job), only what names it and its status.
fn kept_answer(route: &str, answer: Value) -> Value {
    let Value::Object(mut o) = answer else { return answer };
    if route.starts_with("/v1/keys") {
        o.remove("key");
    }
    if run_data(route) {
        const NAMING: [&str; 7] = ["id", "status", "workflow", "version", "priority", "action", "matched"];
        o.retain(|k, _| NAMING.contains(&k.as_str()));
    }
    Value::Object(o)
}

/// Records each change ([`audited`]) before it is made, and its answer
/// after. A change whose record cannot be written is not made (503); an
/// answer whose record cannot be written is logged and still given. An
/// answer that names itself ([`AnswerNames`]) is passed on as it streams,
/// and the log keeps those names; any other is read whole first.
pub(crate) async fn audit(State((config, pool)): State<(Arc<Config>, Pool)>, req: Request, next: Next) -> Response {
    let route = route_of(&req);
    if !audited(req.method(), &route) {
        return next.run(req).await;
    }
    let principal = req.extensions().get::<Principal>().cloned().unwrap_or_else(|| Principal::operator(&config));
    let source = req.extensions().get::<ConnectInfo<SocketAddr>>().map_or_else(String::new, |c| c.0.ip().to_string());
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, config.max_value() + 64 * 1024).await else {
        return ApiError::BodyTooLarge.into_response();
    };
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|c| c.to_str().ok());
    let Some(request_id) = crate::access::random_id() else {
        return ApiError::internal("no random bytes for an audit entry").into_response();
    };
    let asked = recorded(content_type, &bytes).map(|v| kept_request(&route, v));
    let path = parts.uri.path().to_string();
    let entry = composer_store::audit::Requested {
        request_id,
        actor: &principal.name,
        key_id: principal.key_id,
        source: &source,
        method: parts.method.as_str(),
        route: &route,
        path: &path,
        body: asked.as_ref(),
    };
    if let Err(e) = write_requested(&pool, &entry).await {
        return e.into_response();
    }
    let resp = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if let Some(AnswerNames(names)) = resp.extensions().get::<AnswerNames>() {
        let result = resp.status().is_success().then(|| kept_answer(&route, names.clone()));
        if let Err(e) = write_answered(&pool, request_id, resp.status().as_u16(), result.as_ref()).await {
            tracing::error!(%route, %path, error = %e, "the audit log did not record an answer");
        }
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal("the answer's body could not be read for the audit log").into_response();
    };
    let result = match parts.status.is_success() {
        true => recorded(Some("application/json"), &bytes).map(|v| kept_answer(&route, v)),
        false => None,
    };
    if let Err(e) = write_answered(&pool, request_id, parts.status.as_u16(), result.as_ref()).await {
        tracing::error!(%route, %path, error = %e, "the audit log did not record an answer");
    }
    Response::from_parts(parts, Body::from(bytes))
}

async fn write_requested(pool: &Pool, entry: &composer_store::audit::Requested<'_>) -> Result<(), ApiError> {
    let client = composer_store::client(pool).await?;
    composer_store::audit::requested(&client, entry).await?;
    Ok(())
}

async fn write_answered(pool: &Pool, id: Uuid, status: u16, result: Option<&Value>) -> composer_store::Result<()> {
    let client = composer_store::client(pool).await?;
    composer_store::audit::answered(&client, id, status, result).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_one_scope_and_unknown_ones_need_admin() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(required_scope(&get, "/v1/runs/{id}"), Scope::Read);
        assert_eq!(required_scope(&post, "/v1/runs"), Scope::RunsControl);
        assert_eq!(required_scope(&post, "/v1/runs/bulk"), Scope::RunsControl);
        assert_eq!(required_scope(&post, "/v1/workflows"), Scope::WorkflowsWrite);
        assert_eq!(required_scope(&post, "/v1/workflows/{name}/migrate"), Scope::RunsControl);
        assert_eq!(required_scope(&Method::PUT, "/v1/limits/{key}"), Scope::LimitsWrite);
        assert_eq!(required_scope(&post, "/v1/tasks/poll"), Scope::TasksWork);
        assert_eq!(required_scope(&get, "/v1/keys"), Scope::Admin);
        assert_eq!(required_scope(&get, "/v1/audit"), Scope::Admin);
        assert_eq!(required_scope(&get, "/metrics"), Scope::MetricsRead);
        assert_eq!(required_scope(&post, "/v1/namespaces"), Scope::Admin, "a new resource is closed");
        assert_eq!(required_scope(&get, "/v1/runsx"), Scope::Read);
        assert_eq!(required_scope(&post, "/v1/runsx"), Scope::Admin, "a prefix is a whole segment");
    }

    #[test]
    fn changes_are_audited_and_reads_starts_events_and_workers_are_not() {
        assert!(audited(&Method::POST, "/v1/schedules"));
        assert!(audited(&Method::DELETE, "/v1/keys/{id}"));
        assert!(audited(&Method::POST, "/v1/runs/{id}/cancel"));
        assert!(audited(&Method::POST, "/ui/runs/{id}/{action}"));
        for (m, r) in [("GET", "/v1/runs"), ("POST", "/v1/runs"), ("POST", "/v1/events"), ("POST", "/v1/tasks/poll")] {
            assert!(!audited(&m.parse().unwrap(), r), "{m} {r}");
        }
        assert!(!audited(&Method::POST, "/ui/login"), "a login's form holds the token");
    }

    #[test]
    fn the_log_keeps_json_forms_and_only_the_digest_of_the_rest() {
        assert_eq!(recorded(None, br#"{"a":1}"#), Some(json!({"a": 1})));
        assert_eq!(recorded(Some("application/x-www-form-urlencoded"), b"a=1&b=x"), Some(json!({"a": "1", "b": "x"})));
        let digest = |b: &[u8]| recorded(None, b).unwrap();
        assert_eq!(digest(b"not json")["bytes"], 8);
        assert_eq!(digest(b"not json")["sha256"].as_str().unwrap().len(), 64);
        assert_eq!(recorded(None, br#"{"a":"x\u0000y"}"#), Some(json!({"a": "x\u{FFFD}y"})), "a NUL is replaced");
        assert_eq!(
            recorded(None, br#"{"a":"\\u0000"}"#),
            Some(json!({"a": "\\u0000"})),
            "an escaped backslash is text"
        );
        let padded = format!("{{\"concurrency\": 3{}}}", " ".repeat(MAX_AUDIT_BODY));
        assert_eq!(recorded(None, padded.as_bytes()), Some(json!({"concurrency": 3})), "spaces cannot hide a change");
        let big = json!({"a": "x".repeat(MAX_AUDIT_BODY)}).to_string();
        assert_eq!(digest(big.as_bytes())["bytes"], big.len());
        assert_eq!(recorded(None, b""), None);
    }

    #[test]
    fn the_log_keeps_no_key_and_no_run_data() {
        let shown = json!({"id": "x", "key": "cmp_secret"});
        assert_eq!(kept_answer("/v1/keys", shown.clone()), json!({"id": "x"}));
        assert_eq!(kept_answer("/v1/limits/{key}", shown.clone()), shown);
        let run = json!({"id": "r", "status": "CANCELLED", "input": {"card": "4242"}, "tasks": [{"output": 1}]});
        assert_eq!(kept_answer("/v1/runs/{id}/cancel", run), json!({"id": "r", "status": "CANCELLED"}));
        let asked =
            kept_request("/v1/runs/{id}/tasks/{node}/complete", json!({"output": {"card": "4242"}, "reason": "r"}));
        assert_eq!(asked["reason"], "r");
        assert!(asked["output"]["sha256"].is_string() && !asked.to_string().contains("4242"), "{asked}");
        assert_eq!(kept_request("/v1/workflows", json!({"input": 1})), json!({"input": 1}), "not run data");
    }
}
