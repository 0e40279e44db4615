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

/// Records an event and finds the tasks waiting for `(name, key)`, inside
/// the caller's transaction, under the pair's lock. The event is always stored (as
/// buffered) before anyone is told: if delivering it to the waiters fails
/// half way, or every waiter timed out meanwhile, it is still there — for
/// [`stranded`] to deliver, or for a waiter created later — until
/// [`mark_consumed`] says a waiter took it, or it expires after `retention`.
/// `log_seq` is its entry in the event log, where a step that takes it
/// later is counted.
pub async fn record(
    tx: &Transaction<'_>,
    name: &str,
    key: &str,
    payload: &Value,
    retention: Duration,
    log_seq: i64,
) -> Result<(i64, Vec<Waiter>)> {
    tx.execute(LOCK, &[&name, &key]).await?;
    let waiters: Vec<Waiter> = tx
        .query(
            "SELECT run_id, id FROM task_instances
              WHERE state = 'WAITING' AND event_name = $1 AND event_key = $2",
            &[&name, &key],
        )
        .await?
        .iter()
        .map(|r| Ok(Waiter { run_id: r.try_get(0)?, task_id: r.try_get(1)? }))
        .collect::<Result<_>>()?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO events (name, key, payload, expires_at, log_seq)
             VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5)
             RETURNING id",
            &[&name, &key, payload, &retention.as_secs_f64(), &log_seq],
        )
        .await?
        .try_get(0)?;
    Ok((id, waiters))
}

/// Marks a recorded event as taken by `task_id`, so no later waiter gets it.
pub async fn mark_consumed(client: &Client, event_id: i64, task_id: Uuid) -> Result<()> {
    client
        .execute("UPDATE events SET consumed_by = $2 WHERE id = $1 AND consumed_by IS NULL", &[&event_id, &task_id])
        .await?;
    Ok(())
}

/// Counts on its event log entry one more step that the recorded event
/// `event_id` completed (the recovery sweep's delivery: its sender counted
/// the steps it completed itself). An increment, so counts made at once by
/// several coordinators add up.
pub async fn count_taken(client: &Client, event_id: i64) -> Result<()> {
    client
        .execute(
            "UPDATE event_log SET delivered = delivered + 1 WHERE seq = (SELECT log_seq FROM events WHERE id = $1)",
            &[&event_id],
        )
        .await?;
    Ok(())
}

/// A recorded event and a task that was waiting for it when it was last
/// looked at, but has not received it: its sender failed half way or died.
#[derive(Debug, Clone)]
pub struct Stranded {
    pub event_id: i64,
    pub waiter: Waiter,
    pub payload: Value,
}

/// Events older than `min_age`, neither consumed nor expired, that a task
/// is waiting for: what a sender that failed half way left undelivered.
pub async fn stranded(client: &Client, min_age: Duration, limit: i64) -> Result<Vec<Stranded>> {
    let rows = client
        .query(
            "SELECT e.id, t.run_id, t.id, e.payload
               FROM events e
               JOIN task_instances t ON t.state = 'WAITING' AND t.event_name = e.name AND t.event_key = e.key
              WHERE e.consumed_by IS NULL AND e.expires_at > now()
                AND e.created_at < now() - make_interval(secs => $1)
              ORDER BY e.id
              LIMIT $2",
            &[&min_age.as_secs_f64(), &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Stranded {
                event_id: r.try_get(0)?,
                waiter: Waiter { run_id: r.try_get(1)?, task_id: r.try_get(2)? },
                payload: r.try_get(3)?,
            })
        })
        .collect()
}

/// Inside the transaction creating a waiting task: consumes the oldest
/// buffered, unexpired event for `(name, key)` on behalf of `task_id`, and
/// counts the step on the event's log entry. Both in the caller's commit:
/// a rolled back batch neither takes the event nor counts it; the count is
/// an increment, which adds to its sender's and other takers' counts.
pub async fn consume_buffered(tx: &Transaction<'_>, name: &str, key: &str, task_id: Uuid) -> Result<Option<Value>> {
    let lock = tx.prepare_cached(LOCK).await?;
    tx.execute(&lock, &[&name, &key]).await?;
    let stmt = tx
        .prepare_cached(
            "WITH taken AS (
                 UPDATE events SET consumed_by = $3
                  WHERE id = (SELECT id FROM events
                               WHERE name = $1 AND key = $2 AND consumed_by IS NULL AND expires_at > now()
                               ORDER BY id LIMIT 1 FOR UPDATE)
              RETURNING payload, log_seq),
             counted AS (UPDATE event_log SET delivered = delivered + 1 WHERE seq = (SELECT log_seq FROM taken))
             SELECT payload FROM taken",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&name, &key, &task_id]).await?.map(|r| r.try_get(0)).transpose()?)
}

/// The objects the rows of the event log and of the buffer name for the
/// event payloads of `owner` (the owner made for an offloaded payload).
pub async fn named_objects(client: &Client, owner: Uuid) -> Result<std::collections::HashSet<String>> {
    // The key is written out so that the indexes on these expressions serve.
    let stmt = client
        .prepare_cached(
            "SELECT payload -> '$composer_offloaded' ->> 'object' FROM event_log
              WHERE payload ? '$composer_offloaded' AND payload -> '$composer_offloaded' ->> 'run' = $1
             UNION ALL
             SELECT payload -> '$composer_offloaded' ->> 'object' FROM events
              WHERE payload ? '$composer_offloaded' AND payload -> '$composer_offloaded' ->> 'run' = $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&owner.to_string()]).await?;
    rows.iter().map(|r| Ok(r.try_get::<_, Option<String>>(0)?.unwrap_or_default())).collect()
}

/// Deletes expired and consumed events; returns how many.
pub async fn cleanup(client: &Client) -> Result<u64> {
    Ok(client.execute("DELETE FROM events WHERE expires_at < now() OR consumed_by IS NOT NULL", &[]).await?)
}

/// Whether an event `(name, key)` is kept for a waiter to come (one that
/// arrived before it and was not consumed).
pub async fn is_buffered(client: &Client, name: &str, key: &str) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM events WHERE name = $1 AND key = $2 AND consumed_by IS NULL
                              AND expires_at > now())",
            &[&name, &key],
        )
        .await?;
    Ok(row.try_get(0)?)
}
