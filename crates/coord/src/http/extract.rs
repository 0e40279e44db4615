//! What handlers take from a request, with errors in the API's format: a
//! JSON body ([`Body`]), a typed query ([`Query`]), path parameters
//! ([`Path`]), a W3C trace context ([`Traceparent`]), and the values a path or query carries (ids, names,
//! page limits), each checked in one place.

use std::fmt;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};

/// The request's W3C `traceparent` header, as Composer writes it again:
/// `None` without one, or with one that does not read (the W3C rule: an
/// invalid header is ignored and a new trace begins, never an error).
pub struct Traceparent(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Traceparent {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get("traceparent").and_then(|v| v.to_str().ok());
        let read = header.map(composer_core::trace::TraceContext::parse);
        if let Some(Err(e)) = &read {
            tracing::debug!(error = %e, "ignoring the request's traceparent");
        }
        Ok(Traceparent(read.and_then(Result::ok).map(|c| c.header())))
    }
}

impl Traceparent {
    /// The header, unless it names the trace Composer made for a run (a run
    /// started without a `traceparent` has its id as its trace id): a start
    /// or an event continues its caller's trace, and may not join a run's
    /// and put spans of its own under that run's. Such a header is ignored,
    /// as an invalid one is.
    pub async fn of_caller(self, pool: &composer_store::Pool) -> ApiResult<Option<String>> {
        let Some(header) = self.0 else { return Ok(None) };
        let Ok(context) = composer_core::trace::TraceContext::parse(&header) else { return Ok(None) };
        let id = Uuid::from_bytes(context.trace_id);
        // Only a trace id shaped as a run's (a UUIDv7) can be one: most of
        // a caller's random ones are not, and cost no query.
        if id.get_version_num() != 7 || id.get_variant() != uuid::Variant::RFC4122 {
            return Ok(Some(header));
        }
        let client = composer_store::client(pool).await?;
        if composer_store::runs::exists(&client, id).await? {
            tracing::info!(run = %id, "ignoring a traceparent that names a run's own trace");
            return Ok(None);
        }
        Ok(Some(header))
    }
}

/// Most items one page of a list may hold (`limit`).
pub const MAX_PAGE: i64 = 1000;

/// A JSON object as the body (its Content-Type is checked by
/// `guard::refuse_foreign_pages`).
/// A string with a NUL character (which PostgreSQL cannot store) is a 400
/// naming its field, unless `NUL_OK` (a worker's completion, whose output
/// the handler turns into a failed attempt instead).
pub struct Body<T, const NUL_OK: bool = false>(pub T);

impl<S: Send + Sync, T: DeserializeOwned, const NUL_OK: bool> FromRequest<S> for Body<T, NUL_OK> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::BodyTooLarge
            } else {
                ApiError::bad_request(rejection.body_text())
            }
        })?;
        if bytes.is_empty() {
            return Err(ApiError::bad_request("request body is empty; expected JSON"));
        }
        // Every body is an object: serde would read a list (`[null]`) as a
        // struct's fields in order.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::bad_request("invalid JSON body: expected a JSON object"));
        }
        if !NUL_OK && has_nul_escape(&bytes) {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                if let Some(path) = nul_path(&value, String::new()) {
                    return Err(ApiError::bad_request(format!(
                        "{} contains a NUL character (\\u0000), which cannot be stored",
                        if path.is_empty() { "the body".to_string() } else { format!("field {path}") }
                    )));
                }
            }
        }
        from_json(&bytes).map(Body).map_err(ApiError::bad_request)
    }
}

/// Reads a JSON body as `T`. A value of the wrong type or range names the
/// field it is in (`limits[0].rate: invalid type: ...`), which serde_json's
/// own message (a line and column) does not; a syntax error is as serde_json
/// says it. The path is looked for only once the body was refused: keeping
/// it while reading costs every report (an output's every key) a string.
fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).or_else(|_| with_path(bytes))
}

/// [`from_json`] again, tracking where in the body it is: in words by the
/// reader definitions use (`priority: expected an integer from 0 to 255, got
/// "high"`), else as serde says it with its path.
fn with_path<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
        if let Err(e) = composer_core::definition::located::from_value::<T>(&value) {
            return Err(format!("invalid JSON body: {e}"));
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let error = e.into_inner();
        match error.classify() {
            serde_json::error::Category::Data if path != "." => format!("invalid JSON body: {path}: {error}"),
            _ => format!("invalid JSON body: {error}"),
        }
    })?;
    // What serde_json::from_slice also checks: nothing after the value.
    de.end().map_err(|e| format!("invalid JSON body: {e}"))?;
    Ok(value)
}

/// A JSON body that may be left out (an empty body is `None`).
pub struct OptionalBody<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let empty = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() == "0")
            || (req.headers().get(axum::http::header::CONTENT_LENGTH).is_none()
                && req.headers().get(axum::http::header::TRANSFER_ENCODING).is_none());
        if empty {
            return Ok(OptionalBody(None));
        }
        match Body::<T>::from_request(req, state).await {
            Ok(Body(v)) => Ok(OptionalBody(Some(v))),
            Err(ApiError::BadRequest(m)) if m.starts_with("request body is empty") => Ok(OptionalBody(None)),
            Err(e) => Err(e),
        }
    }
}

/// Whether JSON text may hold a NUL character: a `\u0000` escape (an odd
/// number of backslashes before the `u`). Cheap enough for every request;
/// the exact field is found only when it says yes.
fn has_nul_escape(json: &[u8]) -> bool {
    json.windows(6)
        .enumerate()
        .any(|(i, w)| w == b"\\u0000" && json[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0)
}

/// The path of the first string or key with a NUL in `v`.
fn nul_path(v: &Value, at: String) -> Option<String> {
    match v {
        Value::String(s) => s.contains('\0').then_some(at),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_path(v, format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(format!("{at}.{}", k.replace('\0', "\\u0000")))
            } else {
                nul_path(v, format!("{at}.{k}"))
            }
        }),
        _ => None,
    }
}

/// A query string read into `T` (a struct that says which parameters it
/// takes, refusing others), or a 400 that names the parameter at fault.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        from_query(parts.uri.query().unwrap_or_default()).map(Query)
    }
}

/// A query string read into `T`, or a 400 naming the parameter at fault
/// (`query: from: "yesterday": …`).
pub fn from_query<T: DeserializeOwned>(query: &str) -> ApiResult<T> {
    let pairs = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(pairs).map_err(|e| {
        let at = e.path().to_string();
        match at.as_str() {
            "." | "" => ApiError::bad_request(format!("query: {}", e.inner())),
            _ => ApiError::bad_request(format!("query: {at}: {}", e.inner())),
        }
    })
}

/// Path parameters read into `T`, or a 400 in the API's format (a segment
/// that is not UTF-8 once percent-decoded, such as `%FF`, included).
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::bad_request(format!("path: {}", rejection.body_text()))),
        }
    }
}

/// `limit`: how many items a page holds, 1 to [`MAX_PAGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub i64);

impl Limit {
    /// The limit asked for, or `default`.
    pub fn or(limit: Option<Limit>, default: i64) -> i64 {
        limit.map_or(default, |l| l.0)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Limit, D::Error> {
        let text = String::deserialize(d)?;
        text.parse::<i64>()
            .ok()
            .filter(|l| (1..=MAX_PAGE).contains(l))
            .map(Limit)
            .ok_or_else(|| serde::de::Error::custom(format!("expected 1..={MAX_PAGE}, got {text:?}")))
    }
}

/// A value parsed from its text in a query (`after=12`), the error naming it.
pub fn parsed<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
}

/// A run id from a path.
pub fn run_id(id: &str) -> ApiResult<Uuid> {
    id.parse().map_err(|_| ApiError::bad_request(format!("invalid run id {id:?}: expected a UUID")))
}

/// A task id from a path.
pub fn task_id(id: &str) -> ApiResult<Uuid> {
    id.parse().map_err(|_| ApiError::bad_request(format!("invalid task id {id:?}: expected a UUID")))
}

/// A name from a path or query string, refused when PostgreSQL could not
/// compare it (a NUL character).
pub fn text_param<'a>(value: &'a str, what: &str) -> ApiResult<&'a str> {
    composer_core::storable::check_text(value, what).map_err(ApiError::bad_request)?;
    Ok(value)
}

/// A name that could name something (a workflow, queue, worker, schedule).
pub fn name_param(what: &str, value: &str) -> ApiResult<()> {
    composer_core::definition::check_name(what, value).map_err(ApiError::bad_request)
}

/// The name in the path of a read or a delete: as [`name_param`], but `.`
/// and `..` pass. Refused since, they may name something stored before,
/// which a client that sends the dots as written (curl, with `%2E%2E`) can
/// still read and delete.
pub fn stored_name_param(what: &str, value: &str) -> ApiResult<()> {
    match composer_core::definition::check_path_segment(value) {
        Ok(()) => name_param(what, value),
        Err(_) => Ok(()),
    }
}

/// The size of a value as JSON text.
pub fn json_size(v: &Value) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::from_json;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Poll {
        #[serde(default, deserialize_with = "composer_core::whole::opt_int")]
        priority_at_most: Option<u8>,
        limits: Option<Vec<Limit>>,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Limit {
        rate: Option<String>,
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_field() {
        let e = from_json::<Poll>(br#"{"priority_at_most": "1"}"#).unwrap_err();
        assert!(e.starts_with("invalid JSON body: priority_at_most: expected "), "{e}");
        assert!(e.contains("got \"1\"") && !e.contains("invalid type"), "in words: {e}");
        let e = from_json::<Poll>(br#"{"priority_at_most": 300}"#).unwrap_err();
        assert!(e.starts_with("invalid JSON body: priority_at_most: "), "{e}");
        let e = from_json::<Poll>(br#"{"limits": [{"rate": "1/s"}, {"rate": 5}]}"#).unwrap_err();
        assert_eq!(e, "invalid JSON body: limits[1].rate: expected a string, got 5");
    }

    #[test]
    fn syntax_errors_and_trailing_text_are_as_serde_json_says() {
        let e = from_json::<Poll>(br#"{"limits": ["#).unwrap_err();
        assert!(e.starts_with("invalid JSON body: EOF while parsing"), "{e}");
        let e = from_json::<Poll>(br#"{} {}"#).unwrap_err();
        assert!(e.starts_with("invalid JSON body: trailing characters"), "{e}");
        let e = from_json::<Poll>(br#"{"surprise": 1}"#).unwrap_err();
        assert_eq!(e, "invalid JSON body: surprise: unknown field (expected priority_at_most, limits)");
        assert!(from_json::<Poll>(br#"{"priority_at_most": 2.0} "#).is_ok());
    }
}
