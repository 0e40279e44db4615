//! The demo target: the services the examples call, served under `/demo` by
//! `composer dev` (never by `composer coordinator`), so that every example in
//! `examples/` runs on one machine with nothing else installed.
//!
//! - `/demo/echo[/…]`: any method; answers what it was sent.
//! - `/demo/status/{code}`: answers with that status (`?retry_after=S` adds
//!   a `Retry-After`).
//! - `/demo/delay/{duration}`: waits (at most [`MAX_DELAY`]), then echoes.
//! - `/demo/flaky/{key}?fail=N`: the first N calls with a key answer 503 (or
//!   `?status=`), the next ones 200.
//! - `/demo/pay/charge`, `/demo/pay/refund`: a payments service. A charge
//!   sent again with the same `Idempotency-Key` gets the first answer again
//!   (`idempotent-replayed: true`); an amount over [`DECLINE_ABOVE`] is
//!   declined with a 402.
//! - `/demo/exports`: `POST` starts an export (a `day` that is not
//!   `YYYY-MM-DD` is a 422); `GET /demo/exports/{id}` says `pending` for its
//!   first [`EXPORT_CHECKS`] checks, then `done`.
//!
//! - `/demo/invoices/{id}`: an invoice whose amount is its id when the id
//!   is a number (else 10); an id starting `missing` is a 404.
//!
//! What it remembers (counts, charges, checks) is in memory, at most
//! [`MAX_KEYS`] keys of each kind; past that it forgets the oldest half. A
//! key longer than [`MAX_KEY_BYTES`] is a 400 and a charge larger than
//! [`MAX_CHARGE_BYTES`] a 413, so that memory stays small.
//! It holds no secret and calls nothing: open to whoever reaches the
//! listener, as the examples' own targets would be.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// The longest `/demo/delay` waits.
pub const MAX_DELAY: Duration = Duration::from_secs(60);
/// Charges of a larger amount are declined (402).
pub const DECLINE_ABOVE: f64 = 1000.0;
/// Checks of an export that say `pending` before it is `done`.
pub const EXPORT_CHECKS: u64 = 2;
/// Keys of each kind the demo target remembers.
pub const MAX_KEYS: usize = 10_000;
/// The longest key it remembers (an `Idempotency-Key`, a flaky key, an
/// export's id), in bytes: longer ones are a 400, so what it remembers
/// stays small (a header may be hundreds of KiB).
pub const MAX_KEY_BYTES: usize = 255;
/// The largest charge it takes, in bytes (413 past it): a charge with a key
/// is remembered with its `order`, up to [`MAX_KEYS`] of them.
pub const MAX_CHARGE_BYTES: usize = 4096;

/// The `/demo` routes, with their own memory.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/demo/echo", any(echo))
        .route("/demo/echo/{*rest}", any(echo))
        .route("/demo/status/{code}", any(status))
        .route("/demo/delay/{duration}", any(delay))
        .route("/demo/flaky/{key}", any(flaky))
        .route("/demo/pay/charge", post(charge))
        .route("/demo/pay/refund", post(refund))
        .route("/demo/exports", post(start_export))
        .route("/demo/exports/{id}", get(check_export))
        .route("/demo/invoices/{id}", get(invoice))
        .with_state(Arc::new(Memory::default()))
}

/// A map that forgets its oldest half when full.
struct Bounded<V> {
    values: HashMap<String, V>,
    order: VecDeque<String>,
}

impl<V> Default for Bounded<V> {
    fn default() -> Self {
        Bounded { values: HashMap::new(), order: VecDeque::new() }
    }
}

impl<V> Bounded<V> {
    fn entry(&mut self, key: &str, new: impl FnOnce() -> V) -> &mut V {
        if !self.values.contains_key(key) && self.values.len() >= MAX_KEYS {
            for old in self.order.drain(..MAX_KEYS / 2) {
                self.values.remove(&old);
            }
        }
        match self.values.entry(key.to_string()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                self.order.push_back(key.to_string());
                e.insert(new())
            }
        }
    }
}

#[derive(Default)]
struct Memory {
    flaky: Mutex<Bounded<u64>>,
    charges: Mutex<Bounded<Value>>,
    exports: Mutex<Bounded<u64>>,
    next_id: Mutex<u64>,
}

impl Memory {
    fn id(&self, prefix: &str) -> String {
        let mut n = lock(&self.next_id);
        *n += 1;
        format!("{prefix}_{n}")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn refuse(status: StatusCode, message: String) -> Response {
    answer(status, json!({"error": message}))
}

/// The 400 that refuses a key longer than [`MAX_KEY_BYTES`]; `None` for a
/// key the demo may remember.
fn too_long(what: &str, key: &str) -> Option<Response> {
    (key.len() > MAX_KEY_BYTES).then(|| {
        let message = format!("{what} is {} bytes; the demo remembers keys of at most {MAX_KEY_BYTES}", key.len());
        refuse(StatusCode::BAD_REQUEST, message)
    })
}

/// The body as JSON when it is JSON, else as text.
fn body_value(body: &Bytes) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

fn echoed(method: &Method, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Value {
    let headers: BTreeMap<&str, String> =
        headers.iter().map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    let query: BTreeMap<String, String> = uri
        .query()
        .map(|q| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (k.to_string(), v.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"method": method.as_str(), "path": uri.path(), "query": query, "headers": headers, "body": body_value(body)})
}

async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    answer(StatusCode::OK, echoed(&method, &uri, &headers, &body))
}

#[derive(serde::Deserialize)]
struct StatusQuery {
    retry_after: Option<u32>,
}

async fn status(Path(code): Path<String>, Query(q): Query<StatusQuery>) -> Response {
    let Some(code) = code.parse::<u16>().ok().and_then(|c| StatusCode::from_u16(c).ok()).filter(|c| c.as_u16() >= 200)
    else {
        return refuse(StatusCode::BAD_REQUEST, format!("{code:?} is not an HTTP status from 200 to 999"));
    };
    let mut response = answer(code, json!({"status": code.as_u16()}));
    if let Some(seconds) = q.retry_after {
        response.headers_mut().insert("retry-after", seconds.into());
    }
    response
}

async fn delay(Path(duration): Path<String>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let wait = match composer_core::duration::parse(&duration) {
        Ok(d) if d <= MAX_DELAY => d,
        Ok(_) => return refuse(StatusCode::BAD_REQUEST, format!("{duration} is longer than the demo's 60s")),
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("{duration:?} is not a duration: {e}")),
    };
    tokio::time::sleep(wait).await;
    answer(StatusCode::OK, echoed(&method, &uri, &headers, &body))
}

#[derive(serde::Deserialize)]
struct FlakyQuery {
    #[serde(default = "one")]
    fail: u64,
    status: Option<u16>,
}

fn one() -> u64 {
    1
}

async fn flaky(State(memory): State<Arc<Memory>>, Path(key): Path<String>, Query(q): Query<FlakyQuery>) -> Response {
    let failing = q.status.unwrap_or(503);
    let Some(failing) = StatusCode::from_u16(failing).ok().filter(|s| s.as_u16() >= 400) else {
        return refuse(StatusCode::BAD_REQUEST, format!("status {failing} is not an HTTP error status"));
    };
    if let Some(refused) = too_long("the key", &key) {
        return refused;
    }
    let call = {
        let mut counts = lock(&memory.flaky);
        let count = counts.entry(&key, || 0);
        *count += 1;
        *count
    };
    if call <= q.fail {
        answer(failing, json!({"key": key, "call": call, "failing_calls": q.fail}))
    } else {
        answer(StatusCode::OK, json!({"key": key, "call": call, "failing_calls": q.fail}))
    }
}

/// A charge: `{"amount": N, …}`; the same `Idempotency-Key` gets the same
/// answer, and only one charge is made for it.
async fn charge(State(memory): State<Arc<Memory>>, headers: HeaderMap, body: Bytes) -> Response {
    if body.len() > MAX_CHARGE_BYTES {
        let message = format!("a charge is at most {MAX_CHARGE_BYTES} bytes; this one is {}", body.len());
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, message);
    }
    let body = body_value(&body);
    let Some(amount) = body.get("amount").and_then(amount_of) else {
        return refuse(StatusCode::BAD_REQUEST, "a charge needs an \"amount\", a number above 0".into());
    };
    if amount > DECLINE_ABOVE {
        return answer(
            StatusCode::PAYMENT_REQUIRED,
            json!({"error": "card_declined", "message": format!("amounts above {DECLINE_ABOVE} are declined")}),
        );
    }
    let key = headers.get("idempotency-key").map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned());
    let made = |memory: &Memory| json!({"id": memory.id("ch"), "amount": amount, "order": body.get("order"), "status": "succeeded"});
    let Some(key) = key else {
        return answer(StatusCode::OK, made(&memory));
    };
    if let Some(refused) = too_long("the Idempotency-Key", &key) {
        return refused;
    }
    let (charge, replayed) = {
        let mut charges = lock(&memory.charges);
        let mut fresh = false;
        let charge = charges
            .entry(&key, || {
                fresh = true;
                made(&memory)
            })
            .clone();
        (charge, !fresh)
    };
    let mut response = answer(StatusCode::OK, charge);
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static(if replayed { "true" } else { "false" }));
    response
}

/// A number above 0, or a string of one (expressions render strings).
fn amount_of(v: &Value) -> Option<f64> {
    let n = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (n > 0.0 && n.is_finite()).then_some(n)
}

async fn refund(State(memory): State<Arc<Memory>>, body: Bytes) -> Response {
    let body = body_value(&body);
    answer(
        StatusCode::OK,
        json!({"id": memory.id("re"), "charge": body.get("charge"), "order": body.get("order"), "status": "refunded"}),
    )
}

async fn start_export(State(memory): State<Arc<Memory>>, body: Bytes) -> Response {
    let body = body_value(&body);
    let day = body.get("day").and_then(Value::as_str).unwrap_or_default();
    if chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").is_err() {
        return refuse(StatusCode::UNPROCESSABLE_ENTITY, format!("{day:?} is not a day (YYYY-MM-DD)"));
    }
    answer(StatusCode::OK, json!({"id": memory.id("exp"), "day": day, "status": "started"}))
}

async fn check_export(State(memory): State<Arc<Memory>>, Path(id): Path<String>) -> Response {
    if let Some(refused) = too_long("the export's id", &id) {
        return refused;
    }
    let check = {
        let mut checks = lock(&memory.exports);
        let n = checks.entry(&id, || 0);
        *n += 1;
        *n
    };
    let status = if check > EXPORT_CHECKS { "done" } else { "pending" };
    answer(StatusCode::OK, json!({"id": id, "check": check, "status": status}))
}

async fn invoice(Path(id): Path<String>) -> Response {
    if id.starts_with("missing") {
        return refuse(StatusCode::NOT_FOUND, format!("no invoice {id}"));
    }
    let amount = id.parse::<f64>().ok().filter(|n| n.is_finite()).unwrap_or(10.0);
    answer(StatusCode::OK, json!({"id": id, "amount": amount}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_memory_forgets_its_oldest_half_and_keeps_counting_the_rest() {
        let mut m = Bounded::default();
        for i in 0..MAX_KEYS {
            *m.entry(&i.to_string(), || 0) += 1;
        }
        *m.entry("last", || 0) += 1;
        assert_eq!(m.values.len(), MAX_KEYS / 2 + 1);
        assert!(!m.values.contains_key("0"), "the oldest went");
        assert_eq!(*m.entry(&(MAX_KEYS - 1).to_string(), || 0), 1, "a recent key kept its count");
    }

    fn keyed(key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
        headers
    }

    /// Bytes the memory holds in keys and remembered charges.
    fn held(memory: &Memory) -> usize {
        let charges = lock(&memory.charges);
        let charged: usize = charges.values.iter().map(|(k, v)| 2 * k.len() + v.to_string().len()).sum();
        let keys = |m: &Mutex<Bounded<u64>>| lock(m).values.keys().map(|k| 2 * k.len()).sum::<usize>();
        charged + keys(&memory.flaky) + keys(&memory.exports)
    }

    #[tokio::test]
    async fn what_it_remembers_of_a_caller_is_small_whatever_the_caller_sends() {
        let memory = Arc::new(Memory::default());
        let big = "k".repeat(64 * 1024);
        let order = json!({"amount": 5, "order": "o".repeat(512 * 1024)}).to_string();
        let charged = charge(State(memory.clone()), keyed(&big), Bytes::from(r#"{"amount": 5}"#)).await;
        assert_eq!(charged.status(), StatusCode::BAD_REQUEST, "a 64 KiB Idempotency-Key");
        let charged = charge(State(memory.clone()), keyed("k1"), Bytes::from(order)).await;
        assert_eq!(charged.status(), StatusCode::PAYLOAD_TOO_LARGE, "a 512 KiB order");
        let flaky_query = Query(FlakyQuery { fail: 1, status: None });
        assert_eq!(
            flaky(State(memory.clone()), Path(big.clone()), flaky_query).await.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(check_export(State(memory.clone()), Path(big)).await.status(), StatusCode::BAD_REQUEST);
        assert_eq!(held(&memory), 0, "nothing of them was kept");
        let fine = json!({"amount": 5, "order": "o-1"}).to_string();
        let charged = charge(State(memory.clone()), keyed(&"k".repeat(MAX_KEY_BYTES)), Bytes::from(fine)).await;
        assert_eq!(charged.status(), StatusCode::OK);
        assert!(held(&memory) < 1024, "{} bytes for one charge", held(&memory));
    }

    #[test]
    fn an_amount_is_a_positive_finite_number_or_a_string_of_one() {
        assert_eq!(amount_of(&json!(30)), Some(30.0));
        assert_eq!(amount_of(&json!("12.5")), Some(12.5));
        for bad in [json!(0), json!(-1), json!("x"), json!(null), json!([1])] {
            assert_eq!(amount_of(&bad), None, "{bad}");
        }
    }
}
