//! What operators read and set: each limit's values, who set them and its
//! use now; setting and forgetting an operator's values; and why a run's
//! waiting steps wait.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use composer_core::definition::limit::LimitValues;
use composer_core::limiter::KeyState;
use tokio_postgres::Row;
use uuid::Uuid;

use super::pass::{values_of, LIMITS_CHANNEL};
use crate::{Client, Result};

/// A limit as operators see it: its values, who set them, and its use now.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitRow {
    pub key: String,
    pub values: LimitValues,
    pub set_by: String,
    /// Tokens in the bucket now (a rate only).
    pub tokens: Option<f64>,
    /// Admitted steps not finished.
    pub in_use: i64,
    /// Steps waiting for it.
    pub waiting: i64,
    /// A target's `Retry-After` that holds it.
    pub held_until: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

const LIMIT_QUERY: &str = "SELECT l.key, l.rate_count, l.rate_period_ms, l.burst, l.concurrency, l.set_by, l.tokens,
            l.refilled_at, l.updated_at, now() AS now,
            (SELECT count(*) FROM limit_waits w WHERE w.key = l.key AND w.admitted_at IS NOT NULL
                AND (w.linger_until IS NULL OR w.linger_until > now())) AS in_use,
            (SELECT count(*) FROM limit_waits w WHERE w.key = l.key AND w.admitted_at IS NULL) AS waiting,
            (SELECT h.until FROM limit_holds h WHERE h.key = l.key AND h.until > now()) AS held_until
       FROM step_limits l";

fn limit_row(r: &Row) -> Result<LimitRow> {
    let values = values_of(r)?;
    let tokens = match values.rate {
        None => None,
        Some(_) => {
            let mut s = KeyState::new(values.rate, None, r.try_get("tokens")?, r.try_get("refilled_at")?);
            s.refill(r.try_get("now")?);
            Some(s.tokens)
        }
    };
    Ok(LimitRow {
        key: r.try_get("key")?,
        values,
        set_by: r.try_get("set_by")?,
        tokens,
        in_use: r.try_get("in_use")?,
        waiting: r.try_get("waiting")?,
        held_until: r.try_get("held_until")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Limits in key order, from after `after`, at most `limit`.
pub async fn list(client: &Client, after: Option<&str>, limit: i64) -> Result<Vec<LimitRow>> {
    let rows = client
        .query(
            &format!("{LIMIT_QUERY} WHERE $1::text IS NULL OR l.key > $1 ORDER BY l.key LIMIT $2"),
            &[&after, &limit],
        )
        .await?;
    rows.iter().map(limit_row).collect()
}

pub async fn get(client: &Client, key: &str) -> Result<Option<LimitRow>> {
    let row = client.query_opt(&format!("{LIMIT_QUERY} WHERE l.key = $1"), &[&key]).await?;
    row.as_ref().map(limit_row).transpose()
}

/// Sets a key's values as an operator (definitions no longer change them).
/// A new rate's bucket starts full; a smaller burst cuts the tokens.
pub async fn set(client: &Client, key: &str, values: &LimitValues) -> Result<LimitRow> {
    let rate = values.rate;
    let count = rate.map(|r| r.count as i32);
    let per = rate.map(|r| r.per.as_millis() as i64);
    let burst = rate.map(|r| r.burst as i32);
    let conc = values.concurrency.map(|c| c as i32);
    client
        .execute(
            "INSERT INTO step_limits AS l (key, rate_count, rate_period_ms, burst, concurrency, set_by, tokens)
             VALUES ($1, $2, $3, $4, $5, 'api', coalesce($4, 0))
             ON CONFLICT (key) DO UPDATE
                SET rate_count = $2, rate_period_ms = $3, burst = $4, concurrency = $5, set_by = 'api',
                    tokens = CASE WHEN l.burst IS NULL THEN coalesce($4, 0) ELSE least(l.tokens, coalesce($4, 0)) END,
                    updated_at = now()",
            &[&key, &count, &per, &burst, &conc],
        )
        .await?;
    client.execute("SELECT pg_notify($1, '')", &[&LIMITS_CHANNEL]).await?;
    get(client, key).await?.ok_or_else(|| crate::Error::Corrupt(format!("limit {key:?} vanished")))
}

/// Forgets an operator's values: the key goes back to what its nodes say.
pub async fn delete(client: &Client, key: &str) -> Result<bool> {
    let n = client.execute("DELETE FROM step_limits WHERE key = $1", &[&key]).await?;
    client.execute("SELECT pg_notify($1, '')", &[&LIMITS_CHANNEL]).await?;
    Ok(n > 0)
}

/// Why a waiting step of `run_id` is held: by task, its first key that
/// holds it, the reason and (rate, hold) until when. A step waiting only
/// for its turn (the limiter has not passed since) says `queued`.
pub async fn held_in_run(client: &Client, run_id: Uuid) -> Result<HashMap<Uuid, Held>> {
    let rows = client
        .query(
            "SELECT w.task_id, w.key, l.rate_count, l.rate_period_ms, l.burst, l.concurrency, l.tokens, l.refilled_at,
                    now() AS now,
                    (SELECT count(*) FROM limit_waits a WHERE a.key = w.key AND a.admitted_at IS NOT NULL
                        AND (a.linger_until IS NULL OR a.linger_until > now())) AS in_use,
                    (SELECT h.until FROM limit_holds h WHERE h.key = w.key AND h.until > now()) AS held_until
               FROM limit_waits w LEFT JOIN step_limits l ON l.key = w.key
              WHERE w.run_id = $1 AND w.admitted_at IS NULL
              ORDER BY w.task_id, w.key",
            &[&run_id],
        )
        .await?;
    let mut held: HashMap<Uuid, Held> = HashMap::new();
    for r in &rows {
        let task: Uuid = r.try_get("task_id")?;
        let now: DateTime<Utc> = r.try_get("now")?;
        let v = values_of(r)?;
        let tokens: Option<f64> = r.try_get("tokens")?;
        let mut s = KeyState::new(
            v.rate,
            v.concurrency,
            tokens.unwrap_or(0.0),
            r.try_get::<_, Option<DateTime<Utc>>>("refilled_at")?.unwrap_or(now),
        );
        s.refill(now);
        s.in_use = r.try_get::<_, i64>("in_use")?.clamp(0, u32::MAX as i64) as u32;
        s.held_until = r.try_get("held_until")?;
        let key: String = r.try_get("key")?;
        let this = match s.blocked(now) {
            Some(b) => Held { key, reason: b.reason(), until: b.until() },
            None => Held { key, reason: "queued", until: None },
        };
        match held.get(&task) {
            Some(h) if h.reason != "queued" => {}
            _ => {
                held.insert(task, this);
            }
        }
    }
    Ok(held)
}

/// Why a step waits for its limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub key: String,
    /// `rate`, `concurrency`, `retry_after`, or `queued` (its turn comes at
    /// the limiter's next pass).
    pub reason: &'static str,
    pub until: Option<DateTime<Utc>>,
}
