//! External events for WAIT_FOR_EVENT.
//!
//! Sender and waiter meet under one advisory lock per `(name, key)`: the
//! sender takes it, finds the tasks waiting, and buffers the event when there
//! are none; a transaction that creates a waiting task takes it too and
//! consumes a buffered event. Whichever commits first, the other sees it, so
//! an event sent just before its waiter exists is not lost.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended('composer_event:' || $1 || chr(31) || $2, 0))";

/// A task waiting for an event.
#[derive(Debug, Clone, Copy)]
pub struct Waiter {
    pub run_id: Uuid,
    pub task_id: Uuid,
}

/// Finds the tasks waiting for `(name, key)`, or — when there are none —
/// keeps the event for `retention` so that a waiter created later gets it.
pub async fn deliver_or_buffer(
    client: &mut Client,
    name: &str,
    key: &str,
    payload: &Value,
    retention: Duration,
) -> Result<Vec<Waiter>> {
    let tx = client.transaction().await?;
    tx.execute(LOCK, &[&name, &key]).await?;
    let waiters: Vec<Waiter> = tx
        .query(
            "SELECT run_id, id FROM task_instances
              WHERE state = 'WAITING' AND event_name = $1 AND event_key = $2",
            &[&name, &key],
        )
        .await?
        .iter()
        .map(|r| Waiter { run_id: r.get(0), task_id: r.get(1) })
        .collect();
    if waiters.is_empty() {
        tx.execute(
            "INSERT INTO events (name, key, payload, expires_at) VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
            &[&name, &key, payload, &retention.as_secs_f64()],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(waiters)
}

/// Inside the transaction creating a waiting task: consumes the oldest
/// buffered, unexpired event for `(name, key)` on behalf of `task_id`.
pub async fn consume_buffered(tx: &Transaction<'_>, name: &str, key: &str, task_id: Uuid) -> Result<Option<Value>> {
    let lock = tx.prepare_cached(LOCK).await?;
    tx.execute(&lock, &[&name, &key]).await?;
    let stmt = tx
        .prepare_cached(
            "UPDATE events SET consumed_by = $3
              WHERE id = (SELECT id FROM events
                           WHERE name = $1 AND key = $2 AND consumed_by IS NULL AND expires_at > now()
                           ORDER BY id LIMIT 1 FOR UPDATE)
          RETURNING payload",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&name, &key, &task_id]).await?.map(|r| r.get(0)))
}

/// Deletes expired and consumed events; returns how many.
pub async fn cleanup(client: &Client) -> Result<u64> {
    Ok(client.execute("DELETE FROM events WHERE expires_at < now() OR consumed_by IS NOT NULL", &[]).await?)
}
