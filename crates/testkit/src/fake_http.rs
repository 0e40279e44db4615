//! A fake HTTP service that records every call. Paths say how it behaves:
//!
//! | path | answers |
//! |---|---|
//! | `/ok/{name}` | 200 `{"path", "call"}` |
//! | `/echo/{name}` | 200 `{"body", "call"}` with the request body |
//! | `/headers/{name}` | 200 `{"headers"}` with the request headers |
//! | `/fail/{name}` | 500 |
//! | `/bad/{name}` | 400 |
//! | `/status/{code}/{name}` | `code` `{"path", "call"}` |
//! | `/flaky/{n}/{name}` | 503 for the first `n` calls, then 200 |
//! | `/slow/{ms}/{name}` | 200 after `ms` milliseconds |
//! | `/busy/{n}/{secs}/{name}` | 429 with `Retry-After: secs` for the first `n` calls, then 200 |
//! | `/redirect/{name}?to=URL` | 302 to URL |
//! | `/moved/{status}/{name}?to=URL` | `status` (301, 307, …) to URL |
//! | `/nul/{name}` | 200 with a JSON body PostgreSQL cannot store (a NUL in a string) |
//! | `/mirror/{name}` | 400 `{"method", "uri", "headers", "body", "shout"}`: the request as received, its body as text and in capitals |

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{json, Value};

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub method: String,
    pub idempotency_key: Option<String>,
    pub headers: HashMap<String, String>,
    pub body: Value,
    pub at: Instant,
}

#[derive(Default)]
struct Calls {
    log: Mutex<Vec<Recorded>>,
    /// Per path: calls being answered now, and the most there ever were.
    in_flight: Mutex<HashMap<String, (usize, usize)>>,
}

/// Counts a call as in flight on its path until dropped.
struct InFlight<'a>(&'a Calls, String);

impl<'a> InFlight<'a> {
    fn enter(calls: &'a Calls, path: &str) -> InFlight<'a> {
        let mut m = calls.in_flight.lock().unwrap();
        let e = m.entry(path.to_string()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
        InFlight(calls, path.to_string())
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.0.in_flight.lock().unwrap().get_mut(&self.1) {
            e.0 -= 1;
        }
    }
}

pub struct FakeHttp {
    addr: SocketAddr,
    calls: Arc<Calls>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeHttp {
    pub async fn start() -> FakeHttp {
        FakeHttp::start_on(std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// On a port of `ip` (an address other hosts reach, for processes in
    /// network namespaces of their own).
    pub async fn start_on(ip: std::net::IpAddr) -> FakeHttp {
        let calls = Arc::new(Calls::default());
        let app = Router::new().fallback(handle).with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("binding the fake HTTP service");
        let addr = listener.local_addr().expect("fake HTTP address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeHttp { addr, calls, server }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many calls `path` received.
    pub fn calls(&self, path: &str) -> usize {
        self.calls.log.lock().unwrap().iter().filter(|r| r.path == path).count()
    }

    /// Calls to every path under `prefix`.
    pub fn calls_prefix(&self, prefix: &str) -> usize {
        self.calls.log.lock().unwrap().iter().filter(|r| r.path.starts_with(prefix)).count()
    }

    /// The most calls to `path` that were ever answered at once.
    pub fn max_in_flight(&self, path: &str) -> usize {
        self.calls.in_flight.lock().unwrap().get(path).map_or(0, |e| e.1)
    }

    /// Every call to `path`, oldest first.
    pub fn requests(&self, path: &str) -> Vec<Recorded> {
        self.calls.log.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }

    pub fn all(&self) -> Vec<Recorded> {
        self.calls.log.lock().unwrap().clone()
    }
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn handle(State(calls): State<Arc<Calls>>, req: Request) -> Response {
    let received = Received::read(req).await;
    let call = calls.record(&received);
    let _in_flight = InFlight::enter(&calls, &received.path);
    answer(&received, call).await
}

/// A call as it came in.
struct Received {
    path: String,
    query: String,
    uri: String,
    method: String,
    headers: HashMap<String, String>,
    bytes: Bytes,
    /// The body as JSON (null when it is not JSON).
    body: Value,
}

impl Received {
    async fn read(req: Request) -> Received {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let method = req.method().to_string();
        let headers: HashMap<String, String> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let uri = req.uri().to_string();
        let bytes = axum::body::to_bytes(req.into_body(), 16 * 1024 * 1024).await.unwrap_or_else(|_| Bytes::new());
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Received { path, query, uri, method, headers, bytes, body }
    }
}

impl Calls {
    /// Logs the call; returns how many calls its path has had, this one included.
    fn record(&self, r: &Received) -> usize {
        let mut log = self.log.lock().unwrap();
        log.push(Recorded {
            path: r.path.clone(),
            method: r.method.clone(),
            idempotency_key: r.headers.get("idempotency-key").cloned(),
            headers: r.headers.clone(),
            body: r.body.clone(),
            at: Instant::now(),
        });
        log.iter().filter(|c| c.path == r.path).count()
    }
}

/// The answer the path asks for (see the table at the top), to the
/// path's `call`-th call.
async fn answer(r: &Received, call: usize) -> Response {
    let ok = || Json(json!({"path": r.path, "call": call})).into_response();
    let parts: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["ok", ..] => ok(),
        ["echo", ..] => Json(json!({"body": r.body, "call": call})).into_response(),
        // This request's own headers (not the last logged call's: under
        // concurrent calls that may be another's).
        ["headers", ..] => Json(json!({"headers": r.headers})).into_response(),
        ["fail", ..] => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        // `/redirect?to=URL`: a 302 to URL.
        ["redirect", ..] => {
            let to = r.query.strip_prefix("to=").unwrap_or_default().to_string();
            (StatusCode::FOUND, [(axum::http::header::LOCATION, to)]).into_response()
        }
        // A body PostgreSQL cannot store: a NUL character in a string.
        ["nul", ..] => {
            ([(axum::http::header::CONTENT_TYPE, "application/json")], r#"{"v": "a\u0000b"}"#).into_response()
        }
        ["moved", status, ..] => {
            let to = r.query.strip_prefix("to=").unwrap_or_default().to_string();
            let status = status.parse().ok().and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::FOUND);
            (status, [(axum::http::header::LOCATION, to)]).into_response()
        }
        ["mirror", ..] => {
            let text = String::from_utf8_lossy(&r.bytes).into_owned();
            let answer = json!({"method": r.method, "uri": r.uri,
                "headers": r.headers, "shout": text.to_uppercase(), "body": text});
            (StatusCode::BAD_REQUEST, Json(answer)).into_response()
        }
        ["bad", ..] => (StatusCode::BAD_REQUEST, Json(json!({"error": "bad request"}))).into_response(),
        ["status", code, ..] => {
            let status = code.parse().ok().and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK);
            (status, Json(json!({"path": r.path, "call": call}))).into_response()
        }
        ["flaky", n, ..] => {
            let n: usize = n.parse().unwrap_or(0);
            if call <= n {
                (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response()
            } else {
                ok()
            }
        }
        ["busy", n, secs, ..] => {
            if call <= n.parse().unwrap_or(0) {
                (StatusCode::TOO_MANY_REQUESTS, [(axum::http::header::RETRY_AFTER, secs.to_string())], "slow down")
                    .into_response()
            } else {
                ok()
            }
        }
        ["slow", ms, ..] => {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
            ok()
        }
        _ => (StatusCode::NOT_FOUND, "no such fake").into_response(),
    }
}
