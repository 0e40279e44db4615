//! The outbox enqueuer: moves committed dispatches from PostgreSQL to Redis.
//!
//! Woken by the engine in this process and by NOTIFY from others, with a poll
//! as the fallback (a notification can be lost while the listener
//! reconnects). Every coordinator runs one; `FOR UPDATE SKIP LOCKED` gives
//! each a disjoint batch.

use std::sync::Arc;
use std::time::Duration;

use composer_api::wire::Dispatch;
use composer_store::outbox;
use composer_stream::Keys;
use tokio_util::sync::CancellationToken;

use crate::shared::Shared;

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
            _ = shared.wakes.outbox.notified() => {}
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
pub async fn drain(shared: &Shared, published: &mut Vec<i64>) -> Result<usize, Error> {
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
        let messages = messages(shared.streams.keys(), &rows)?;
        let batch: Vec<(&str, &str)> = messages.iter().map(|(s, p)| (s.as_str(), p.as_str())).collect();
        match shared.streams.publish(&batch).await {
            Ok(()) => {
                total += batch.len();
                crate::metrics::inc(composer_metrics::DISPATCHES, &[], batch.len() as u64);
                // Task-API long-polls on this coordinator read at once.
                shared.wakes.published.notify_waiters();
                *published = ids;
                if (rows.len() as i64) < cfg.outbox_batch {
                    return Ok(total);
                }
            }
            Err(e) => {
                crate::metrics::inc(composer_metrics::OUTBOX_PUBLISH_FAILURES, &[], 1);
                outbox::retry_later(&client, &ids, MAX_RETRY_BACKOFF).await?;
                return Err(e.into());
            }
        }
    }
}

/// The stream and JSON message of each claimed row whose task still exists.
pub fn messages(keys: &Keys, rows: &[outbox::Claimed]) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(dispatch) = &row.dispatch else { continue };
        let stream = keys.stream(&row.queue, row.priority, row.shard as u32);
        let dispatch = Dispatch { published_at_us: Some(composer_api::wire::now_us()), ..dispatch.clone() };
        out.push((stream, serde_json::to_string(&dispatch)?));
    }
    Ok(out)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error(transparent)]
    Stream(#[from] composer_stream::Error),
    #[error("cannot serialize a dispatch: {0}")]
    Serialize(#[from] serde_json::Error),
}
