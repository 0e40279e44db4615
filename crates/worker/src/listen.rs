//! The worker's own HTTP endpoint (`COMPOSER_WORKER_LISTEN`): `/metrics` for
//! a scraper (behind `COMPOSER_METRICS_TOKEN` when it is set) and `/healthz`
//! for a liveness probe. Off unless configured.

use std::net::SocketAddr;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// Binds `addr` (so a bad address fails the start) and serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    worker: String,
    token: Option<String>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Listen { addr, source })?;
    // A coordinator in this process then leaves them out of its own.
    composer_metrics::worker_serves_its_own();
    let metrics = move |headers: HeaderMap| async move {
        if let Some(expected) = token.as_deref().filter(|t| !t.is_empty()) {
            let given = headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
            if !composer_config::auth::bearer_matches(given, expected) {
                let body = serde_json::json!({"error": {"code": "unauthorized",
                    "message": "/metrics needs the bearer token COMPOSER_METRICS_TOKEN"}});
                return (StatusCode::UNAUTHORIZED, Json(body)).into_response();
            }
        }
        ([(header::CONTENT_TYPE, composer_metrics::CONTENT_TYPE)], composer_metrics::WORKER.render()).into_response()
    };
    let app = Router::new().route("/metrics", get(metrics)).route(
        "/healthz",
        get(move || async move { Json(serde_json::json!({"status": "ok", "worker": worker})).into_response() }),
    );
    tracing::info!(%addr, "worker serving /metrics and /healthz");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
            tracing::error!(error = %e, "the worker's HTTP endpoint failed");
        }
    });
    Ok(())
}
