//! The operator's endpoints: liveness, readiness, metrics and the API's
//! own document.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use composer_api::ErrorBody;
use serde_json::{json, Value};

use super::doc::Status;
use super::error::{ApiError, ApiResult};
use crate::config::Config;
use crate::engine::Engine;
use crate::shared::Draining;
use composer_store::Pool;
use composer_stream::Streams;

/// Liveness.
///
/// Answers while the process runs, whatever its dependencies: for a process supervisor's liveness
/// check.
#[utoipa::path(
    get, path = "/healthz", operation_id = "health", tag = "operations",
    responses((status = 200, description = "alive", body = Status))
)]
pub(crate) async fn health() -> Json<Status> {
    Json(Status { status: "ok".into() })
}

/// This document.
///
/// The API in OpenAPI 3.1, as the coordinator serves it.
#[utoipa::path(
    get, path = "/openapi.json", operation_id = "openapi", tag = "operations",
    responses((status = 200, description = "the OpenAPI document", body = Object))
)]
pub(crate) async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], super::doc::published()).into_response()
}

/// Prometheus metrics.
///
/// This coordinator's metrics in the Prometheus text format. They name workflows and queues, so
/// they take a token when the coordinator has one: a key with `metrics:read`, `COMPOSER_METRICS_TOKEN`,
/// else the API token; with neither token set, they are open.
#[utoipa::path(
    get, path = "/metrics", operation_id = "metrics", tag = "operations",
    security((), ("metricsToken" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain"),
        (status = 401, description = "the bearer token is missing or wrong", body = ErrorBody),
    )
)]
pub(crate) async fn metrics(axum::Extension(by): axum::Extension<crate::access::Principal>) -> Response {
    let text = match by.namespace() {
        None => composer_metrics::render(),
        Some(ns) => of_namespace(&composer_metrics::render(), ns),
    };
    ([(header::CONTENT_TYPE, composer_metrics::CONTENT_TYPE)], text).into_response()
}

/// The series of namespace `ns` in a metrics text (those labelled with it;
/// in `default`, those without the label), for a caller bound to it. Label
/// values are names, which hold no quote: a label cannot pass for another.
fn of_namespace(text: &str, ns: &str) -> String {
    let label = format!("{}=\"{ns}\"", crate::metrics::LABEL);
    let any = format!("{}=\"", crate::metrics::LABEL);
    let mine = |line: &str| match ns == composer_store::namespaces::DEFAULT {
        true => !line.contains(&any),
        false => line.contains(&label),
    };
    text.lines().filter(|l| l.starts_with('#') || mine(l)).flat_map(|l| [l, "\n"]).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_namespace_s_metrics_are_its_series_alone() {
        let text = "# HELP m h\nm{queue=\"q\"} 1\nm{queue=\"q\",namespace=\"a\"} 2\nm{namespace=\"ab\"} 3\n";
        assert_eq!(super::of_namespace(text, "a"), "# HELP m h\nm{queue=\"q\",namespace=\"a\"} 2\n");
        assert_eq!(super::of_namespace(text, "default"), "# HELP m h\nm{queue=\"q\"} 1\n");
    }
}

/// Readiness.
///
/// Answers 200 while PostgreSQL, Redis and every engine loop are up, and 503 while a dependency is
/// down or the coordinator drains to stop: for a load balancer's check.
#[utoipa::path(
    get, path = "/readyz", operation_id = "readiness", tag = "operations",
    responses(
        (status = 200, description = "PostgreSQL, Redis and every engine loop are up", body = Status),
        (status = 503, description = "not ready, or draining to stop", body = ErrorBody),
    )
)]
pub(crate) async fn readyz(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    State(streams): State<Streams>,
    State(draining): State<Draining>,
) -> ApiResult<Json<Value>> {
    if draining.has_begun() {
        return Err(ApiError::Draining);
    }
    let live = engine.live_loops();
    let wanted = config.engine_workers + crate::engine::URGENT_LOOPS;
    if live < wanted {
        let message = format!("{live} of {wanted} engine loops are running");
        return Err(ApiError::Unavailable(message));
    }
    match tokio::time::timeout(Duration::from_secs(2), composer_store::ping(&pool)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ApiError::Unavailable(format!("PostgreSQL: {e}"))),
        Err(_) => return Err(ApiError::Unavailable("PostgreSQL: no answer within 2 s".into())),
    }
    match tokio::time::timeout(Duration::from_secs(2), streams.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ApiError::Unavailable(format!("Redis: {e}"))),
        Err(_) => return Err(ApiError::Unavailable("Redis: no answer within 2 s".into())),
    }
    Ok(Json(json!({"status": "ready"})))
}
