//! Limits on steps across runs: the engine's writes (a step held back, an
//! attempt's end, a target's `Retry-After`), the limiter's pass that admits
//! waiting steps into the outbox, and the operators' reads and settings.
//!
//! Why it is safe on many coordinators:
//! - A pass runs under one transaction-scoped advisory lock, so passes run
//!   one at a time and every count and bucket they read is current.
//! - The engine touches a run's `limit_waits` rows only under the run's
//!   lock; a pass locks the runs it admits steps of with `SKIP LOCKED`, so it
//!   never waits for the engine and the engine never sees half a pass.
//! - `limit_holds` is written only by the engine and read by passes;
//!   `step_limits` only by passes and `PUT /v1/limits`: no lock cycle.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use composer_core::definition::limit::{LimitValues, Rate};
use composer_core::definition::Node;
use composer_core::limiter::{self, KeyState};
use composer_core::machine;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// What the engine's write does to limits, for [`crate::transitions`].
#[derive(Default)]
pub(crate) struct LimitWrites {
    /// Tasks whose attempt ended or changed: their rows go.
    released: Vec<Uuid>,
    run_id: Vec<Uuid>,
    task_id: Vec<Uuid>,
    attempt: Vec<i32>,
    key: Vec<String>,
    rate_count: Vec<Option<i32>>,
    rate_period_ms: Vec<Option<i64>>,
    burst: Vec<Option<i32>>,
    concurrency: Vec<Option<i32>>,
    timeout_ms: Vec<Option<i64>>,
    /// Keys a target's `Retry-After` holds, and until when.
    held: HashMap<String, DateTime<Utc>>,
    /// A run of limited steps started or resumed: the limiter looks again.
    wake: bool,
}

impl LimitWrites {
    pub(crate) fn release(&mut self, task: Uuid) {
        self.released.push(task);
    }

    /// A dispatched step of `node` waits for its limits (a row per key; a
    /// key two limits share counts once, with the first one's values).
    pub(crate) fn hold(&mut self, run_id: Uuid, node: &Node, t: &machine::Task) {
        let mut seen: Vec<&str> = Vec::new();
        for (key, limit) in t.limit_keys.iter().zip(&node.limits) {
            if seen.contains(&key.as_str()) {
                continue;
            }
            seen.push(key);
            let (rate, concurrency) = (limit.values.rate, limit.values.concurrency);
            self.run_id.push(run_id);
            self.task_id.push(t.id);
            self.attempt.push(t.attempt);
            self.key.push(key.clone());
            self.rate_count.push(rate.map(|r| r.count as i32));
            self.rate_period_ms.push(rate.map(|r| r.per.as_millis() as i64));
            self.burst.push(rate.map(|r| r.burst as i32));
            self.concurrency.push(concurrency.map(|c| c as i32));
            self.timeout_ms.push(node.timeout.map(|d| d.as_millis().min(i64::MAX as u128) as i64));
        }
    }

    pub(crate) fn retry_after(&mut self, keys: &[String], until: DateTime<Utc>) {
        for key in keys {
            let at = self.held.entry(key.clone()).or_insert(until);
            *at = (*at).max(until);
        }
    }

    pub(crate) fn wake(&mut self) {
        self.wake = true;
    }

    /// Whether the limiter has anything new to look at.
    pub(crate) fn is_empty(&self) -> bool {
        self.released.is_empty() && self.task_id.is_empty() && self.held.is_empty() && !self.wake
    }

    /// Releases first: a retry's new attempt is held again in the same write.
    pub(crate) async fn execute(&self, tx: &Transaction<'_>) -> Result<()> {
        if !self.released.is_empty() {
            let stmt = tx.prepare_cached("DELETE FROM limit_waits WHERE task_id = ANY($1)").await?;
            tx.execute(&stmt, &[&self.released]).await?;
        }
        if !self.task_id.is_empty() {
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO limit_waits (run_id, task_id, attempt, key, rate_count, rate_period_ms, burst,
                                              concurrency, timeout_ms)
                     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::text[], $5::int4[], $6::int8[],
                                          $7::int4[], $8::int4[], $9::int8[])
                     ON CONFLICT (task_id, key) DO NOTHING",
                )
                .await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
                &self.run_id,
                &self.task_id,
                &self.attempt,
                &self.key,
                &self.rate_count,
                &self.rate_period_ms,
                &self.burst,
                &self.concurrency,
                &self.timeout_ms,
            ];
            tx.execute(&stmt, &params).await?;
        }
        if !self.held.is_empty() {
            // In key order, so two writers holding the same keys cannot deadlock.
            let mut held: Vec<(&String, &DateTime<Utc>)> = self.held.iter().collect();
            held.sort();
            let (keys, until): (Vec<&String>, Vec<&DateTime<Utc>>) = held.into_iter().unzip();
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO limit_holds (key, until)
                     SELECT * FROM unnest($1::text[], $2::timestamptz[])
                     ON CONFLICT (key) DO UPDATE SET until = greatest(limit_holds.until, EXCLUDED.until)",
                )
                .await?;
            tx.execute(&stmt, &[&keys, &until]).await?;
        }
        Ok(())
    }
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pass {
    pub admitted: usize,
    /// Steps it looked at that still wait.
    pub waiting: usize,
    /// When to pass again: soon when it left steps of locked runs or more
    /// waiting than it read, at the next token or hold's end otherwise;
    /// `None` when only an ending step can free one (a NOTIFY comes).
    pub next_in: Option<Duration>,
}

/// A waiting step as a pass reads it.
struct Waiting {
    run_id: Uuid,
    task_id: Uuid,
    attempt: i32,
    timeout_ms: Option<i64>,
    keys: Vec<String>,
    /// The node's values for each of `keys`.
    values: Vec<LimitValues>,
}

fn values_of(r: &Row) -> Result<LimitValues> {
    let count: Option<i32> = r.try_get("rate_count")?;
    let per: Option<i64> = r.try_get("rate_period_ms")?;
    let burst: Option<i32> = r.try_get("burst")?;
    let rate = match (count, per, burst) {
        (Some(c), Some(p), Some(b)) if c > 0 && p > 0 && b > 0 => {
            Some(Rate { count: c as u32, per: Duration::from_millis(p as u64), burst: b as u32 })
        }
        _ => None,
    };
    let concurrency: Option<i32> = r.try_get("concurrency")?;
    Ok(LimitValues { rate, concurrency: concurrency.filter(|c| *c > 0).map(|c| c as u32) })
}

/// One limiter pass: admits up to `max` waiting steps, oldest first, whose
/// keys all allow one more, and puts them in the outbox (`shards` stream
/// shards) in one commit. A step's attempt timeout starts here.
pub async fn admit(client: &mut Client, shards: i32, max: i64) -> Result<Pass> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('composer_limiter'))", &[]).await?;
    let per_task = composer_core::definition::limit::MAX_NODE_LIMITS as i64;
    let rows = tx
        .query(
            "SELECT w.run_id, w.task_id, w.attempt, w.key, w.rate_count, w.rate_period_ms, w.burst, w.concurrency,
                    w.timeout_ms
               FROM limit_waits w JOIN workflow_runs r ON r.id = w.run_id
              WHERE w.admitted_at IS NULL AND r.status <> 'PAUSED'
              ORDER BY w.queued_at, w.task_id LIMIT $1",
            &[&(max * per_task)],
        )
        .await?;
    let full = rows.len() as i64 == max * per_task;
    let mut steps: Vec<Waiting> = Vec::new();
    for r in &rows {
        let task_id: Uuid = r.try_get("task_id")?;
        if steps.last().is_none_or(|s| s.task_id != task_id) {
            steps.push(Waiting {
                run_id: r.try_get("run_id")?,
                task_id,
                attempt: r.try_get("attempt")?,
                timeout_ms: r.try_get("timeout_ms")?,
                keys: Vec::new(),
                values: Vec::new(),
            });
        }
        let step = steps.last_mut().expect("pushed above");
        step.keys.push(r.try_get("key")?);
        step.values.push(values_of(r)?);
    }
    // The last step may have been cut by the LIMIT: it waits for the next pass.
    if full {
        steps.pop();
    }
    if steps.is_empty() {
        tx.commit().await?;
        return Ok(Pass { next_in: full.then_some(Duration::ZERO), ..Pass::default() });
    }

    // The runs whose steps may go: not locked by the engine now, still open,
    // and the step still waiting at that attempt. Others' rows are stale.
    let mut run_ids: Vec<Uuid> = steps.iter().map(|s| s.run_id).collect();
    run_ids.sort();
    run_ids.dedup();
    let locked = tx
        .query(
            "SELECT id, status FROM workflow_runs WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED",
            &[&run_ids],
        )
        .await?;
    let mut open: HashMap<Uuid, bool> = HashMap::new();
    for r in &locked {
        let status: String = r.try_get(1)?;
        open.insert(r.try_get(0)?, status == "RUNNING");
    }
    let busy = run_ids.len() > open.len();
    let task_ids: Vec<Uuid> = steps.iter().filter(|s| open.contains_key(&s.run_id)).map(|s| s.task_id).collect();
    let mine: Vec<Uuid> = open.keys().copied().collect();
    let pending: HashMap<Uuid, i32> = tx
        .query(
            "SELECT id, attempt FROM task_instances WHERE run_id = ANY($1) AND id = ANY($2) AND state = 'PENDING'",
            &[&mine, &task_ids],
        )
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
    let mut stale: Vec<Uuid> = Vec::new();
    steps.retain(|s| match open.get(&s.run_id) {
        None => false,
        Some(running) => {
            let live = pending.get(&s.task_id) == Some(&s.attempt);
            if !live || !running {
                stale.push(s.task_id);
            }
            live && *running
        }
    });
    if !stale.is_empty() {
        tx.execute("DELETE FROM limit_waits WHERE task_id = ANY($1) AND admitted_at IS NULL", &[&stale]).await?;
    }

    let mut keys: Vec<String> = steps.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    keys.sort();
    keys.dedup();
    sync_definitions(&tx, &steps).await?;
    forget_ended(&tx, &keys).await?;
    let (now, mut state) = key_states(&tx, &keys).await?;
    let waiting: Vec<Vec<String>> = steps.iter().map(|s| s.keys.clone()).collect();
    let decided = limiter::admit(&mut state, &waiting, now);
    let admitted: Vec<&Waiting> = decided.admitted.iter().map(|&i| &steps[i]).collect();
    if !admitted.is_empty() {
        let (mut keys_taken, mut tokens) = (Vec::new(), Vec::new());
        for (key, s) in state.iter().filter(|(_, s)| s.taken > 0) {
            keys_taken.push(key.as_str());
            tokens.push(s.tokens);
        }
        tx.execute(
            "UPDATE step_limits l SET tokens = u.tokens, refilled_at = $3
               FROM unnest($1::text[], $2::float8[]) AS u(key, tokens) WHERE l.key = u.key",
            &[&keys_taken, &tokens, &now],
        )
        .await?;
        let ids: Vec<Uuid> = admitted.iter().map(|s| s.task_id).collect();
        let runs: Vec<Uuid> = admitted.iter().map(|s| s.run_id).collect();
        let secs: Vec<Option<f64>> = admitted.iter().map(|s| s.timeout_ms.map(|ms| ms as f64 / 1000.0)).collect();
        tx.execute("UPDATE limit_waits SET admitted_at = now() WHERE task_id = ANY($1)", &[&ids]).await?;
        tx.execute(
            "WITH admitted AS (
                UPDATE task_instances t
                   SET updated_at = now(),
                       wake_at = CASE WHEN u.secs IS NULL THEN t.wake_at ELSE now() + make_interval(secs => u.secs) END
                  FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) AS u(run_id, id, secs)
                 WHERE t.run_id = u.run_id AND t.id = u.id AND t.state = 'PENDING'
                RETURNING t.run_id, t.id, t.queue, t.attempt)
             INSERT INTO outbox (run_id, task_id, queue, shard, attempt)
             SELECT run_id, id, queue, composer_shard(id, $4), attempt FROM admitted",
            &[&runs, &ids, &secs, &shards],
        )
        .await?;
        tx.execute("SELECT pg_notify($1, '')", &[&crate::transitions::OUTBOX_CHANNEL]).await?;
    }
    tx.commit().await?;
    let waiting = steps.len() - decided.admitted.len();
    let soon = Duration::from_millis(100);
    let next_in = match (busy || (full && !decided.admitted.is_empty()), decided.next_in) {
        (true, Some(d)) => Some(d.min(soon)),
        (true, None) => Some(soon),
        (false, next) => next,
    };
    Ok(Pass { admitted: decided.admitted.len(), waiting, next_in })
}

/// Writes the values the waiting steps' nodes give their keys, for keys
/// no operator set (`set_by = 'definition'`). A new key's bucket starts full.
async fn sync_definitions(tx: &Transaction<'_>, steps: &[Waiting]) -> Result<()> {
    let mut given: HashMap<&str, LimitValues> = HashMap::new();
    for s in steps {
        for (key, values) in s.keys.iter().zip(&s.values) {
            if !values.is_named() {
                given.entry(key).or_insert(*values);
            }
        }
    }
    if given.is_empty() {
        return Ok(());
    }
    let mut given: Vec<(&str, LimitValues)> = given.into_iter().collect();
    given.sort_by(|a, b| a.0.cmp(b.0));
    let (mut key, mut count, mut per, mut burst, mut conc) = (vec![], vec![], vec![], vec![], vec![]);
    for (k, v) in &given {
        key.push(*k);
        count.push(v.rate.map(|r| r.count as i32));
        per.push(v.rate.map(|r| r.per.as_millis() as i64));
        burst.push(v.rate.map(|r| r.burst as i32));
        conc.push(v.concurrency.map(|c| c as i32));
    }
    tx.execute(
        "INSERT INTO step_limits AS l (key, rate_count, rate_period_ms, burst, concurrency, set_by, tokens)
         SELECT u.key, u.count, u.per, u.burst, u.conc, 'definition', coalesce(u.burst, 0)
           FROM unnest($1::text[], $2::int4[], $3::int8[], $4::int4[], $5::int4[]) AS u(key, count, per, burst, conc)
         ON CONFLICT (key) DO UPDATE
            SET rate_count = EXCLUDED.rate_count, rate_period_ms = EXCLUDED.rate_period_ms, burst = EXCLUDED.burst,
                concurrency = EXCLUDED.concurrency, tokens = least(l.tokens, coalesce(EXCLUDED.burst, 0)),
                updated_at = now()
          WHERE l.set_by = 'definition'
            AND (l.rate_count, l.rate_period_ms, l.burst, l.concurrency)
                IS DISTINCT FROM (EXCLUDED.rate_count, EXCLUDED.rate_period_ms, EXCLUDED.burst, EXCLUDED.concurrency)",
        &[&key, &count, &per, &burst, &conc],
    )
    .await?;
    Ok(())
}

/// Frees the slots of admitted steps that ended without the engine's
/// release (a MAP's items cancelled in SQL, a run deleted): rows the
/// engine holds are skipped, never waited for.
async fn forget_ended(tx: &Transaction<'_>, keys: &[String]) -> Result<()> {
    tx.execute(
        "DELETE FROM limit_waits WHERE ctid IN (
            SELECT w.ctid FROM limit_waits w
             WHERE w.admitted_at IS NOT NULL AND w.key = ANY($1)
               AND NOT EXISTS (SELECT 1 FROM task_instances t
                                WHERE t.run_id = w.run_id AND t.id = w.task_id AND t.attempt = w.attempt
                                  AND t.state IN ('PENDING', 'RUNNING'))
             FOR UPDATE SKIP LOCKED)",
        &[&keys],
    )
    .await?;
    Ok(())
}

/// The state of `keys` now (the database's clock): a key nobody set has
/// none and is not limited.
async fn key_states(tx: &Transaction<'_>, keys: &[String]) -> Result<(DateTime<Utc>, HashMap<String, KeyState>)> {
    let now: DateTime<Utc> = tx.query_one("SELECT now()", &[]).await?.try_get(0)?;
    let mut state = HashMap::new();
    let rows = tx
        .query(
            "SELECT key, rate_count, rate_period_ms, burst, concurrency, tokens, refilled_at
               FROM step_limits WHERE key = ANY($1)",
            &[&keys],
        )
        .await?;
    for r in &rows {
        let v = values_of(r)?;
        let s = KeyState::new(v.rate, v.concurrency, r.try_get("tokens")?, r.try_get("refilled_at")?);
        state.insert(r.try_get::<_, String>("key")?, s);
    }
    let rows = tx
        .query(
            "SELECT key, count(*) FROM limit_waits WHERE admitted_at IS NOT NULL AND key = ANY($1) GROUP BY key",
            &[&keys],
        )
        .await?;
    for r in &rows {
        if let Some(s) = state.get_mut(&r.try_get::<_, String>(0)?) {
            s.in_use = r.try_get::<_, i64>(1)?.clamp(0, u32::MAX as i64) as u32;
        }
    }
    let rows =
        tx.query("SELECT key, until FROM limit_holds WHERE key = ANY($1) AND until > $2", &[&keys, &now]).await?;
    for r in &rows {
        let key: String = r.try_get(0)?;
        let until: DateTime<Utc> = r.try_get(1)?;
        // A key held but not otherwise limited still waits out the hold.
        state.entry(key).or_insert_with(|| KeyState::new(None, None, 0.0, now)).held_until = Some(until);
    }
    Ok((now, state))
}

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
            (SELECT count(*) FROM limit_waits w WHERE w.key = l.key AND w.admitted_at IS NOT NULL) AS in_use,
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
    client.execute("SELECT pg_notify($1, '')", &[&crate::transitions::LIMITS_CHANNEL]).await?;
    get(client, key).await?.ok_or_else(|| crate::Error::Corrupt(format!("limit {key:?} vanished")))
}

/// Forgets an operator's values: the key goes back to what its nodes say.
pub async fn delete(client: &Client, key: &str) -> Result<bool> {
    let n = client.execute("DELETE FROM step_limits WHERE key = $1", &[&key]).await?;
    client.execute("SELECT pg_notify($1, '')", &[&crate::transitions::LIMITS_CHANNEL]).await?;
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
                    (SELECT count(*) FROM limit_waits a WHERE a.key = w.key AND a.admitted_at IS NOT NULL) AS in_use,
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
