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
    // Rows published but not yet deleted: their DELETE rides on the next
    // claim (at the latest one poll interval later, well inside the claim
    // timeout after which they would be published again).
    let mut published = Vec::new();
    loop {
        if let Err(e) = drain(&shared, &mut published).await {
            tracing::warn!(error = %e, "outbox: publishing failed; will retry");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = shared.outbox_wake.notified() => {}
            _ = tokio::time::sleep(cfg.outbox_poll_interval) => {}
        }
    }
    if !published.is_empty() {
        if let Ok(client) = composer_store::client(&shared.pool).await {
            let _ = outbox::delete(&client, &published).await;
        }
    }
}

/// Publishes due rows until none are left; returns how many went out. Each
/// batch's DELETE rides on the next claim, so a busy outbox costs one commit
/// per batch.
pub async fn drain(shared: &Shared, published: &mut Vec<i64>) -> anyhow::Result<usize> {
    let cfg = &shared.config;
    let mut total = 0;
    let client = composer_store::client(&shared.pool).await?;
    loop {
        let rows = outbox::claim(&client, cfg.outbox_batch, cfg.outbox_claim_timeout, published).await?;
        published.clear();
        if rows.is_empty() {
            return Ok(total);
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let batch: Vec<(&str, &str)> = rows.iter().map(|r| (r.stream.as_str(), r.payload.as_str())).collect();
        match shared.streams.publish(&batch).await {
            Ok(()) => {
                total += rows.len();
                composer_metrics::inc("composer_dispatches_total", &[], rows.len() as u64);
                *published = ids;
                if (rows.len() as i64) < cfg.outbox_batch {
                    return Ok(total);
                }
            }
            Err(e) => {
                composer_metrics::inc("composer_outbox_publish_failures_total", &[], 1);
                outbox::retry_later(&client, &ids, MAX_RETRY_BACKOFF).await?;
                return Err(e.into());
            }
        }
    }
}
