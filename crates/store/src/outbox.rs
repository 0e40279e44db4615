//! The transactional outbox: rows committed with the state change that
//! dispatched them, published to Redis afterwards.
//!
//! Claiming uses `FOR UPDATE SKIP LOCKED`, so enqueuers on many coordinators
//! take disjoint rows. A claim does not delete: it moves `next_attempt_at`
//! forward by the claim timeout, so a row whose publisher crashed between
//! XADD and DELETE is claimed and published again later (the duplicate
//! message is harmless: the lease admits one execution).

use std::time::Duration;

use crate::{Client, Result};

#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub stream: String,
    pub payload: String,
    pub attempts: i32,
}

/// Claims up to `limit` due rows for `claim_timeout`, deleting in the same
/// commit the rows of the previous batch that were published (`published`).
pub async fn claim(client: &Client, limit: i64, claim_timeout: Duration, published: &[i64]) -> Result<Vec<OutboxRow>> {
    let stmt = client
        .prepare_cached(
            "WITH published AS (DELETE FROM outbox WHERE id = ANY($3))
             UPDATE outbox o
                SET status = 'CLAIMED', claimed_at = now(), attempts = o.attempts + 1,
                    next_attempt_at = now() + make_interval(secs => $2)
              WHERE o.id IN (SELECT id FROM outbox WHERE next_attempt_at <= now() AND NOT (id = ANY($3))
                              ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
          RETURNING o.id, o.stream, o.payload::text, o.attempts",
        )
        .await?;
    let rows = client.query(&stmt, &[&limit, &claim_timeout.as_secs_f64(), &published]).await?;
    Ok(rows
        .iter()
        .map(|r| OutboxRow { id: r.get(0), stream: r.get(1), payload: r.get(2), attempts: r.get(3) })
        .collect())
}

/// Deletes rows whose messages are on their streams.
pub async fn delete(client: &Client, ids: &[i64]) -> Result<u64> {
    let stmt = client.prepare_cached("DELETE FROM outbox WHERE id = ANY($1)").await?;
    Ok(client.execute(&stmt, &[&ids]).await?)
}

/// Puts rows whose publish failed into RETRY with exponential backoff
/// (0.5 s doubling per attempt, at most `max_backoff`).
pub async fn retry_later(client: &Client, ids: &[i64], max_backoff: Duration) -> Result<u64> {
    let stmt = client
        .prepare_cached(
            "UPDATE outbox
                SET status = 'RETRY', claimed_at = NULL,
                    next_attempt_at = now() + make_interval(secs => least(0.5 * power(2, least(attempts, 20) - 1), $2))
              WHERE id = ANY($1)",
        )
        .await?;
    Ok(client.execute(&stmt, &[&ids, &max_backoff.as_secs_f64()]).await?)
}
