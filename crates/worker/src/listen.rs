//! The worker's own HTTP endpoint (`COMPOSER_WORKER_LISTEN`): `/metrics` for
//! a scraper and `/healthz` for a liveness probe. Off unless configured.

use std::net::SocketAddr;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// Binds `addr` (so a bad address fails the start) and serves until `shutdown`.
pub async fn serve(addr: SocketAddr, worker: String, shutdown: CancellationToken) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Listen { addr, source })?;
    let app = Router::new()
        .route(
            "/metrics",
            get(|| async { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], composer_metrics::render()) }),
        )
        .route(
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
