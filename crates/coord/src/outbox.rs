//! The outbox enqueuer: moves committed dispatches from PostgreSQL to Redis.
//!
//! Woken by the engine in this process and by NOTIFY from others, with a poll
//! as the fallback (a notification can be lost while the listener
//! reconnects). Every coordinator runs one; `FOR UPDATE SKIP LOCKED` gives
//! each a disjoint batch.

use std::sync::Arc;
use std::time::Duration;

use composer_store::outbox;
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// Longest wait between publish retries of one row while Redis is down.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(30);

pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let cfg = &shared.config;
    loop {
        match drain(&shared).await {
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "outbox: publishing failed; will retry"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = shared.outbox_wake.notified() => {}
            _ = tokio::time::sleep(cfg.outbox_poll_interval) => {}
        }
    }
}

/// Publishes due rows until none are left; returns how many went out.
pub async fn drain(shared: &Shared) -> anyhow::Result<usize> {
    let cfg = &shared.config;
    let mut published = 0;
    loop {
        let client = composer_store::client(&shared.pool).await?;
        let rows = outbox::claim(&client, cfg.outbox_batch, cfg.outbox_claim_timeout).await?;
        if rows.is_empty() {
            return Ok(published);
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let batch: Vec<(&str, &str)> = rows.iter().map(|r| (r.stream.as_str(), r.payload.as_str())).collect();
        match shared.streams.publish(&batch).await {
            Ok(()) => {
                outbox::delete(&client, &ids).await?;
                published += rows.len();
                composer_metrics::inc("composer_dispatches_total", &[], rows.len() as u64);
            }
            Err(e) => {
                composer_metrics::inc("composer_outbox_publish_failures_total", &[], 1);
                outbox::retry_later(&client, &ids, MAX_RETRY_BACKOFF).await?;
                return Err(e.into());
            }
        }
        if (rows.len() as i64) < cfg.outbox_batch {
            return Ok(published);
        }
    }
}
