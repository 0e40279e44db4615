//! The one error type of the API. Each variant says whose fault it is;
//! [`ApiError::status`] and [`ApiError::code`] map it to the HTTP status and
//! the stable code in one place. Every error leaves as JSON
//! `{"error": {"code", "message"}}`; a 5xx also carries its cause to the
//! log (never to the caller).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use composer_api::{ErrorBody, ErrorDetail, LEASE_LOST, RUN_NOT_FOUND};
use uuid::Uuid;

use crate::engine::{EngineError, Rejection};

pub type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is invalid; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// A workflow definition was refused by the validator.
    #[error("{0}")]
    InvalidDefinition(String),
    /// A schedule was refused by the validator.
    #[error("{0}")]
    InvalidSchedule(String),
    /// The request names something that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The run (and so its task) does not exist: a distinct code, since a
    /// worker drops a report only on this one, never on a proxy's 404.
    #[error("run {0} not found")]
    RunNotFound(Uuid),
    /// Not possible in the current state; the message says why.
    #[error("{0}")]
    Conflict(String),
    /// An idempotency key sent again with another input: a mistake to
    /// report, not the first run to return.
    #[error("idempotency_key {key:?} was used for run {run} with another input; use a new key for a new run")]
    IdempotencyKeyReused { key: String, run: Uuid },
    /// An event id sent again with another key or payload.
    #[error("event id {id:?} was recorded for an event with another key or payload; use a new id for a new event")]
    EventIdReused { id: String },
    /// An update id sent again with another name or payload.
    #[error("update id {id:?} was used for an update with another name or payload; use a new id for a new update")]
    UpdateIdReused { id: String },
    /// No step of the run took the update: none accepts it, or none did
    /// before the request's timeout.
    #[error("{0}")]
    UpdateNotAccepted(String),
    /// A vote an approval refuses as given: its data does not match the
    /// form, or its comment is too long.
    #[error("{0}")]
    VoteRefused(String),
    /// A worker's lease on the task is gone: it must stop and drop its result.
    #[error("task {0}: this worker no longer holds its lease (it expired and was taken over, or the task ended)")]
    LeaseLost(Uuid),
    /// A body or value over `COMPOSER_MAX_PAYLOAD`.
    #[error("{what} exceeds the limit of {limit} bytes (COMPOSER_MAX_PAYLOAD)")]
    TooLarge { what: String, limit: usize },
    /// The body is over the layer's limit (`COMPOSER_MAX_PAYLOAD` and room
    /// for the rest of the request).
    #[error("request body too large (COMPOSER_MAX_PAYLOAD)")]
    BodyTooLarge,
    #[error("the URI is {len} bytes, over the limit of {limit}")]
    UriTooLong { len: usize, limit: usize },
    #[error("request bodies must be application/json, got {0:?}")]
    UnsupportedMediaType(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// The caller's key lacks the scope the route needs, or names queues
    /// that do not include the one asked for.
    #[error("{0}")]
    Forbidden(String),
    /// A webhook delivery whose signature does not hold, or to a webhook
    /// that does not exist: the same answer, so that names cannot be found
    /// out without a secret (why is in the log). Nothing was recorded.
    #[error(
        "the delivery's signature does not verify for a webhook of this name; nothing was recorded \
         (the coordinator's log says why)"
    )]
    BadSignature,
    /// A `Host` that is not this coordinator's: maybe a rebound DNS name.
    #[error("this coordinator does not answer to the host {0:?} (COMPOSER_ALLOWED_HOSTS)")]
    HostNotAllowed(String),
    #[error("requests from web pages of {0:?} are not allowed (COMPOSER_ALLOWED_ORIGINS)")]
    OriginNotAllowed(String),
    #[error("no such endpoint")]
    NoSuchEndpoint,
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    /// PostgreSQL or Redis is down, or a loop is not running: retry later.
    #[error("{0}")]
    Unavailable(String),
    /// The coordinator is stopping: go to another.
    #[error("the coordinator is shutting down")]
    Draining,
    /// Past one of the namespace's quotas (`crate::quotas`): 429, naming it,
    /// with a `Retry-After`.
    #[error("{message}")]
    OverQuota { quota: &'static str, message: String, retry_after: u64 },
    /// The engine's queue is full (`COMPOSER_ENGINE_QUEUE`).
    #[error("the engine is busy; retry shortly")]
    Busy,
    /// Applying an event panicked: a bug, contained to that event.
    #[error("{0}")]
    EngineFault(String),
    /// Our own bug; the cause goes to the log, not to the caller.
    #[error("internal error")]
    Internal { cause: String },
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest(message.into())
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::NotFound(message.into())
    }

    pub fn internal(cause: impl Into<String>) -> ApiError {
        ApiError::Internal { cause: cause.into() }
    }

    pub fn too_large(what: impl Into<String>, limit: usize) -> ApiError {
        ApiError::TooLarge { what: what.into(), limit }
    }

    /// The HTTP status and the stable code of each error: the one place.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::InvalidDefinition(_) => (StatusCode::BAD_REQUEST, "invalid_definition"),
            ApiError::InvalidSchedule(_) => (StatusCode::BAD_REQUEST, "invalid_schedule"),
            ApiError::NotFound(_) | ApiError::NoSuchEndpoint => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::RunNotFound(_) => (StatusCode::NOT_FOUND, RUN_NOT_FOUND),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::LeaseLost(_) => (StatusCode::CONFLICT, LEASE_LOST),
            ApiError::IdempotencyKeyReused { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
            ApiError::EventIdReused { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "event_id_reused"),
            ApiError::UpdateIdReused { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "update_id_reused"),
            ApiError::UpdateNotAccepted(_) => (StatusCode::CONFLICT, "update_not_accepted"),
            ApiError::VoteRefused(_) => (StatusCode::UNPROCESSABLE_ENTITY, "vote_refused"),
            ApiError::TooLarge { .. } | ApiError::BodyTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UriTooLong { .. } => (StatusCode::URI_TOO_LONG, "uri_too_long"),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::BadSignature => (StatusCode::UNAUTHORIZED, "bad_signature"),
            ApiError::HostNotAllowed(_) => (StatusCode::MISDIRECTED_REQUEST, "host_not_allowed"),
            ApiError::OriginNotAllowed(_) => (StatusCode::FORBIDDEN, "origin_not_allowed"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Draining => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
            ApiError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            ApiError::OverQuota { .. } => (StatusCode::TOO_MANY_REQUESTS, "over_quota"),
            ApiError::EngineFault(_) => (StatusCode::INTERNAL_SERVER_ERROR, "engine_fault"),
            ApiError::Internal { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// The cause of a 5xx, for the error log (`guard::observe_errors`).
#[derive(Clone)]
pub(super) struct ErrorCause(pub String);

impl From<crate::quotas::QuotaError> for ApiError {
    fn from(e: crate::quotas::QuotaError) -> ApiError {
        use crate::quotas::QuotaError;
        match e {
            QuotaError::Over { quota, message, retry_after } => ApiError::OverQuota { quota, message, retry_after },
            QuotaError::Store(e) => ApiError::from(e),
            QuotaError::Redis(why) => ApiError::Unavailable(why),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let detail = ErrorDetail { code: code.to_string(), message: self.to_string() };
        let mut resp = (status, Json(ErrorBody { error: detail.clone() })).into_response();
        match &self {
            ApiError::Busy => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
            }
            ApiError::OverQuota { retry_after, .. } => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            _ => {}
        }
        resp.extensions_mut().insert(detail);
        match self {
            ApiError::Internal { cause } => {
                resp.extensions_mut().insert(ErrorCause(cause));
            }
            ApiError::EngineFault(message) => {
                resp.extensions_mut().insert(ErrorCause(message));
            }
            _ => {}
        }
        resp
    }
}

impl From<composer_store::Error> for ApiError {
    fn from(e: composer_store::Error) -> ApiError {
        if matches!(e, composer_store::Error::Moved) {
            return ApiError::Busy;
        }
        if let Some(why) = e.unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            ApiError::Unavailable(format!("{why}; retry later"))
        } else {
            ApiError::internal(format!("database error: {e}"))
        }
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(e: tokio_postgres::Error) -> ApiError {
        composer_store::Error::from(e).into()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::RunNotFound(id) => ApiError::RunNotFound(id),
            EngineError::LeaseLost(id) => ApiError::LeaseLost(id),
            EngineError::Store(e) => e.into(),
            EngineError::Stopped => ApiError::Unavailable("the coordinator is shutting down".into()),
            EngineError::Busy | EngineError::BudgetRace { .. } | EngineError::MovedWithOthers { .. } => ApiError::Busy,
            EngineError::AlreadyDone => ApiError::Conflict("the bulk job already acted on this run".into()),
            EngineError::Rejected(Rejection::OverQuota { quota, message, retry_after }) => {
                ApiError::OverQuota { quota, message, retry_after }
            }
            EngineError::Rejected(why) => ApiError::BadRequest(why.to_string()),
            EngineError::Unavailable(why) => ApiError::Unavailable(why),
            e @ EngineError::Fault { .. } => ApiError::EngineFault(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_json_body_with_its_code_and_5xx_only_for_our_faults() {
        let id = Uuid::nil();
        let errors = [
            ApiError::bad_request("x"),
            ApiError::InvalidDefinition("x".into()),
            ApiError::InvalidSchedule("x".into()),
            ApiError::not_found("x"),
            ApiError::RunNotFound(id),
            ApiError::Conflict("x".into()),
            ApiError::LeaseLost(id),
            ApiError::IdempotencyKeyReused { key: "k".into(), run: id },
            ApiError::EventIdReused { id: "e".into() },
            ApiError::UpdateIdReused { id: "u".into() },
            ApiError::UpdateNotAccepted("x".into()),
            ApiError::VoteRefused("x".into()),
            ApiError::too_large("body", 1),
            ApiError::BodyTooLarge,
            ApiError::UriTooLong { len: 2, limit: 1 },
            ApiError::UnsupportedMediaType("text/plain".into()),
            ApiError::Unauthorized,
            ApiError::Forbidden("x".into()),
            ApiError::BadSignature,
            ApiError::HostNotAllowed("evil.example".into()),
            ApiError::OriginNotAllowed("http://evil".into()),
            ApiError::NoSuchEndpoint,
            ApiError::MethodNotAllowed,
            ApiError::Unavailable("x".into()),
            ApiError::Draining,
            ApiError::Busy,
            ApiError::OverQuota { quota: "open_runs", message: "x".into(), retry_after: 1 },
            ApiError::EngineFault("x".into()),
            ApiError::internal("secret cause"),
        ];
        let counted = composer_metrics::API_ERRORS.labels[0].1;
        for e in errors {
            let (status, code) = e.status_and_code();
            assert!(counted.contains(&status.as_str()), "{status}: composer_api_errors_total starts it at zero");
            let server = matches!(e, ApiError::EngineFault(_) | ApiError::Internal { .. });
            assert_eq!(status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE, server, "{e:?}");
            let resp = e.into_response();
            assert_eq!(resp.status(), status);
            let detail = resp.extensions().get::<ErrorDetail>().unwrap();
            assert_eq!(detail.code, code);
            assert!(!detail.message.contains("secret cause"), "a cause is for the log only");
        }
    }
}
