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

/// Channel notified when a commit holds steps back by their limits, ends
/// attempts that held a slot, resumes a run of limited steps, or sets a
/// limit: the limiter looks again.
pub const LIMITS_CHANNEL: &str = "composer_limits";

/// What the engine's write (`write_transitions`) does to limits.
#[derive(Default)]
pub(crate) struct LimitWrites {
    /// Tasks whose attempt ended or changed other than by its worker's
    /// report: slots they hold while running linger until their lease ends.
    released: Vec<Uuid>,
    /// Tasks whose worker reported their attempt's end: freed at once.
    reported: Vec<Uuid>,
    /// MAPs whose open items are cancelled in SQL (`(run, MAP task)`).
    cancelled_run: Vec<Uuid>,
    cancelled_map: Vec<Uuid>,
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
    pub(crate) fn release(&mut self, task: Uuid, reported: bool) {
        match reported {
            true => self.reported.push(task),
            false => self.released.push(task),
        }
    }

    pub(crate) fn cancel_items_of(&mut self, run_id: Uuid, map: Uuid) {
        self.cancelled_run.push(run_id);
        self.cancelled_map.push(map);
    }

    /// A dispatched step of `node` waits for its limits: a row per key. Two
    /// limits whose keys come out the same are one, with the first rate
    /// given and the lower concurrency.
    pub(crate) fn hold(&mut self, run_id: Uuid, node: &Node, t: &machine::Task) {
        let mut merged: Vec<(&str, LimitValues)> = Vec::new();
        for (key, limit) in t.limit_keys.iter().zip(&node.limits) {
            match merged.iter_mut().find(|(k, _)| *k == key.as_str()) {
                Some((_, v)) => {
                    v.rate = v.rate.or(limit.values.rate);
                    v.concurrency = match (v.concurrency, limit.values.concurrency) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => merged.push((key, limit.values)),
            }
        }
        for (key, values) in merged {
            let rate = values.rate;
            self.run_id.push(run_id);
            self.task_id.push(t.id);
            self.attempt.push(t.attempt);
            self.key.push(key.to_string());
            self.rate_count.push(rate.map(|r| r.count as i32));
            self.rate_period_ms.push(rate.map(|r| r.per.as_millis() as i64));
            self.burst.push(rate.map(|r| r.burst as i32));
            self.concurrency.push(values.concurrency.map(|c| c as i32));
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
        self.released.is_empty()
            && self.reported.is_empty()
            && self.cancelled_map.is_empty()
            && self.task_id.is_empty()
            && self.held.is_empty()
            && !self.wake
    }

    /// Runs before the write's task changes (which end leases and delete
    /// reset tasks), so a running attempt's lease is still there to linger
    /// on; releases go before holds, as a retry's new attempt is held in the
    /// same write.
    pub(crate) async fn execute(&self, tx: &Transaction<'_>) -> Result<()> {
        self.release_ended(tx).await?;
        self.free_reported(tx).await?;
        self.release_cancelled_items(tx).await?;
        self.insert_waits(tx).await?;
        self.hold_retried_keys(tx).await
    }

    /// The slots of attempts that ended other than by their worker's
    /// report: a running one's lingers until its lease ends, the others go.
    async fn release_ended(&self, tx: &Transaction<'_>) -> Result<()> {
        if self.released.is_empty() {
            return Ok(());
        }
        let stmt = tx
            .prepare_cached(
                "WITH running AS (
                    UPDATE limit_waits w SET linger_until = t.lease_expires_at
                      FROM task_instances t
                     WHERE w.task_id = ANY($1) AND w.admitted_at IS NOT NULL AND w.linger_until IS NULL
                       AND t.run_id = w.run_id AND t.id = w.task_id AND t.attempt = w.attempt
                       AND t.state = 'RUNNING' AND t.lease_expires_at > now()
                    RETURNING w.task_id, w.attempt, w.key)
                 DELETE FROM limit_waits w
                  WHERE w.task_id = ANY($1) AND w.linger_until IS NULL
                    AND NOT EXISTS (SELECT 1 FROM running r
                                     WHERE r.task_id = w.task_id AND r.attempt = w.attempt AND r.key = w.key)",
            )
            .await?;
        tx.execute(&stmt, &[&self.released]).await?;
        Ok(())
    }

    /// The slots of attempts their worker reported ended: freed at once.
    async fn free_reported(&self, tx: &Transaction<'_>) -> Result<()> {
        if self.reported.is_empty() {
            return Ok(());
        }
        let stmt =
            tx.prepare_cached("DELETE FROM limit_waits WHERE task_id = ANY($1) AND linger_until IS NULL").await?;
        tx.execute(&stmt, &[&self.reported]).await?;
        Ok(())
    }

    /// The slots and waits of the open items of MAPs cancelled in SQL, as
    /// [`release_ended`](Self::release_ended) does for tasks.
    async fn release_cancelled_items(&self, tx: &Transaction<'_>) -> Result<()> {
        if self.cancelled_map.is_empty() {
            return Ok(());
        }
        let stmt = tx
            .prepare_cached(
                "WITH items AS (
                    SELECT t.run_id, t.id, t.attempt, t.state, t.lease_expires_at
                      FROM task_instances t JOIN unnest($1::uuid[], $2::uuid[]) AS m(run_id, map)
                        ON t.run_id = m.run_id AND t.parent_task_id = m.map
                     WHERE t.state IN ('PENDING', 'RUNNING') AND t.limit_keys IS NOT NULL),
                 running AS (
                    UPDATE limit_waits w SET linger_until = i.lease_expires_at
                      FROM items i
                     WHERE w.task_id = i.id AND w.attempt = i.attempt AND w.admitted_at IS NOT NULL
                       AND w.linger_until IS NULL AND i.state = 'RUNNING' AND i.lease_expires_at > now()
                    RETURNING w.task_id, w.attempt, w.key)
                 DELETE FROM limit_waits w USING items i
                  WHERE w.task_id = i.id AND w.linger_until IS NULL
                    AND NOT EXISTS (SELECT 1 FROM running r
                                     WHERE r.task_id = w.task_id AND r.attempt = w.attempt AND r.key = w.key)",
            )
            .await?;
        tx.execute(&stmt, &[&self.cancelled_run, &self.cancelled_map]).await?;
        Ok(())
    }

    /// A row per key for each dispatched step its limits hold back.
    async fn insert_waits(&self, tx: &Transaction<'_>) -> Result<()> {
        if self.task_id.is_empty() {
            return Ok(());
        }
        let stmt = tx
            .prepare_cached(
                "INSERT INTO limit_waits (run_id, task_id, attempt, key, rate_count, rate_period_ms, burst,
                                          concurrency, timeout_ms)
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::text[], $5::int4[], $6::int8[],
                                      $7::int4[], $8::int4[], $9::int8[])
                 ON CONFLICT (task_id, attempt, key) DO NOTHING",
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
        Ok(())
    }

    /// The keys a target's `Retry-After` holds, until the latest time given.
    async fn hold_retried_keys(&self, tx: &Transaction<'_>) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
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
        Ok(())
    }
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pass {
    pub admitted: usize,
    /// Steps it looked at that still wait.
    pub waiting: usize,
    /// When to pass again: at once when it left work (more steps than one
    /// pass takes, steps of runs the engine held locked), else at the next
    /// token, hold's end or lingering slot's end; `None` when only an
    /// ending step can free one (a NOTIFY comes).
    pub next_in: Option<Duration>,
}

/// Most keys one pass looks at (`limiter_pass_keys`): past them, the next pass.
pub const PASS_KEYS: i64 = 1000;
/// Most steps of one key one pass takes.
pub const PASS_STEPS_PER_KEY: u32 = 100;
/// Steps of a key a pass looks at past those the key could let go.
pub const PASS_SLACK_PER_KEY: u32 = 16;

/// A step waiting for its limits, as a pass reads it: its attempt and
/// every key it waits on.
struct WaitingStep {
    run_id: Uuid,
    task_id: Uuid,
    attempt: i32,
    timeout_ms: Option<i64>,
    queued_at: DateTime<Utc>,
    keys: Vec<String>,
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

/// One limiter pass: frees the slots of steps that ended, then, key by key,
/// takes the oldest waiting steps each key could let go now, and admits
/// (oldest first, at most `max`) those whose keys all allow one more, into
/// the outbox (`shards` stream shards), in one commit. A key whose steps
/// wait is looked at whatever other keys hold back. A step's attempt
/// timeout starts here.
pub async fn admit(client: &mut Client, shards: i32, max: i64) -> Result<Pass> {
    let tx = crate::begin(client).await?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('composer_limiter'))", &[]).await?;
    forget_ended(&tx).await?;
    let keys = waiting_keys(&tx).await?;
    if keys.is_empty() {
        tx.commit().await?;
        return Ok(Pass::default());
    }
    let more_keys = keys.len() as i64 == PASS_KEYS;
    sync_definitions(&tx, &keys).await?;
    let (now, mut state) = key_states(&tx, &keys).await?;
    let mut steps = oldest_steps(&tx, &keys, &state, now).await?;
    steps.sort_by_key(|s| (s.queued_at, s.task_id));
    let more_steps = steps.len() as i64 > max;
    steps.truncate(max as usize);
    state.extend(other_key_states(&tx, &keys, &steps).await?);
    let busy = keep_live_steps(&tx, &mut steps).await?;

    let waiting: Vec<Vec<String>> = steps.iter().map(|s| s.keys.clone()).collect();
    let decided = limiter::admit(&mut state, &waiting, now);
    // When a key with steps left may next let one go, as this pass left it.
    let next = keys.iter().filter_map(|k| state.get(k)?.next_chance(now)).min();
    let admitted: Vec<&WaitingStep> = decided.admitted.iter().map(|&i| &steps[i]).collect();
    if !admitted.is_empty() {
        write_admissions(&tx, &state, &admitted, now, shards).await?;
    }
    tx.commit().await?;
    let next_in = match (more_steps || more_keys, busy) {
        (true, _) => Some(Duration::ZERO),
        // Steps of runs the engine held: it lets go within a batch.
        (false, true) => Some(Duration::from_millis(50)),
        (false, false) => next.map(|at| (at - now).to_std().unwrap_or_default()),
    };
    Ok(Pass { admitted: decided.admitted.len(), waiting: steps.len() - decided.admitted.len(), next_in })
}

/// The oldest steps of each key that could let some go now, of runs not
/// paused: as many as it could let go, and a few more, since a step that
/// also waits on another key may have to be passed over. A step comes once,
/// with every key it waits on.
async fn oldest_steps(
    tx: &Transaction<'_>,
    keys: &[String],
    state: &HashMap<String, KeyState>,
    now: DateTime<Utc>,
) -> Result<Vec<WaitingStep>> {
    let (mut cand_keys, mut cand_n) = (Vec::new(), Vec::new());
    for key in keys {
        let n = state.get(key).map_or(PASS_STEPS_PER_KEY, |s| s.allowance(now, PASS_STEPS_PER_KEY));
        if n > 0 {
            cand_keys.push(key.as_str());
            cand_n.push((n + PASS_SLACK_PER_KEY).min(PASS_STEPS_PER_KEY) as i64);
        }
    }
    let mut steps: Vec<WaitingStep> = Vec::new();
    if cand_keys.is_empty() {
        return Ok(steps);
    }
    let rows = tx
        .query(
            "WITH picked AS (
                SELECT DISTINCT w.task_id
                  FROM unnest($1::text[], $2::int8[]) AS k(key, n)
                  CROSS JOIN LATERAL (
                    SELECT q.task_id FROM limit_waits q JOIN workflow_runs r ON r.id = q.run_id
                     WHERE q.key = k.key AND q.admitted_at IS NULL AND r.status <> 'PAUSED'
                     ORDER BY q.queued_at, q.task_id LIMIT k.n) w)
             SELECT w.run_id, w.task_id, w.attempt, w.key, w.timeout_ms, w.queued_at
               FROM limit_waits w JOIN picked p ON p.task_id = w.task_id
              WHERE w.admitted_at IS NULL
              ORDER BY w.queued_at, w.task_id, w.key",
            &[&cand_keys, &cand_n],
        )
        .await?;
    // A step's rows are next to each other: one per key.
    for r in &rows {
        let task_id: Uuid = r.try_get("task_id")?;
        let attempt: i32 = r.try_get("attempt")?;
        let key: String = r.try_get("key")?;
        match steps.last_mut() {
            Some(s) if s.task_id == task_id && s.attempt == attempt => s.keys.push(key),
            _ => steps.push(WaitingStep {
                run_id: r.try_get("run_id")?,
                task_id,
                attempt,
                timeout_ms: r.try_get("timeout_ms")?,
                queued_at: r.try_get("queued_at")?,
                keys: vec![key],
            }),
        }
    }
    Ok(steps)
}

/// The state of the keys `steps` wait on past the pass's first `keys`
/// (none read when there are none).
async fn other_key_states(
    tx: &Transaction<'_>,
    keys: &[String],
    steps: &[WaitingStep],
) -> Result<HashMap<String, KeyState>> {
    let looked: std::collections::HashSet<&String> = keys.iter().collect();
    let mut extra: Vec<String> =
        steps.iter().flat_map(|s| s.keys.iter()).filter(|k| !looked.contains(k)).cloned().collect();
    extra.sort();
    extra.dedup();
    if extra.is_empty() {
        return Ok(HashMap::new());
    }
    let (_, more) = key_states(tx, &extra).await?;
    Ok(more)
}

/// Keeps the steps that may go now: of the runs the engine does not hold
/// now, still RUNNING, the step still PENDING at that attempt. A paused
/// run's steps keep their place; the rows of an ended run or attempt go.
/// Whether the engine held any of the runs (their steps wait for the next
/// pass).
async fn keep_live_steps(tx: &Transaction<'_>, steps: &mut Vec<WaitingStep>) -> Result<bool> {
    let mut run_ids: Vec<Uuid> = steps.iter().map(|s| s.run_id).collect();
    run_ids.sort();
    run_ids.dedup();
    let (lo, hi) = crate::partitions::span(&run_ids);
    let locked = tx
        .query(
            "SELECT id, status FROM workflow_runs WHERE id = ANY($1) AND id BETWEEN $2 AND $3
              ORDER BY id FOR UPDATE SKIP LOCKED",
            &[&run_ids, &lo, &hi],
        )
        .await?;
    let mut status: HashMap<Uuid, String> = HashMap::new();
    for r in &locked {
        status.insert(r.try_get(0)?, r.try_get(1)?);
    }
    let busy = run_ids.len() > status.len();
    let task_ids: Vec<Uuid> = steps.iter().filter(|s| status.contains_key(&s.run_id)).map(|s| s.task_id).collect();
    let mine: Vec<Uuid> = status.keys().copied().collect();
    // `IS TRUE`: by the keys, not by the partial index of every pending task.
    let pending: HashMap<Uuid, i32> = tx
        .query(
            "SELECT id, attempt FROM task_instances
              WHERE run_id = ANY($1) AND run_id BETWEEN $3 AND $4 AND id = ANY($2) AND (state = 'PENDING') IS TRUE",
            &[&mine, &task_ids, &lo, &hi],
        )
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
    let (mut stale_task, mut stale_attempt) = (Vec::new(), Vec::new());
    steps.retain(|s| match status.get(&s.run_id).map(String::as_str) {
        None | Some("PAUSED") => false,
        Some(run) => {
            let live = run == "RUNNING" && pending.get(&s.task_id) == Some(&s.attempt);
            let ended =
                matches!(run, "SUCCEEDED" | "FAILED" | "CANCELLED") || pending.get(&s.task_id) != Some(&s.attempt);
            if ended {
                stale_task.push(s.task_id);
                stale_attempt.push(s.attempt);
            }
            live
        }
    });
    if !stale_task.is_empty() {
        tx.execute(
            "DELETE FROM limit_waits w USING unnest($1::uuid[], $2::int4[]) AS s(task_id, attempt)
              WHERE w.task_id = s.task_id AND w.attempt = s.attempt AND w.admitted_at IS NULL",
            &[&stale_task, &stale_attempt],
        )
        .await?;
    }
    Ok(busy)
}

/// Admits `admitted`: the tokens their keys took, their waits marked
/// admitted, their attempt timeouts started and their outbox rows written,
/// with a NOTIFY for the enqueuers.
async fn write_admissions(
    tx: &Transaction<'_>,
    state: &HashMap<String, KeyState>,
    admitted: &[&WaitingStep],
    now: DateTime<Utc>,
    shards: i32,
) -> Result<()> {
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
    let attempts: Vec<i32> = admitted.iter().map(|s| s.attempt).collect();
    let runs: Vec<Uuid> = admitted.iter().map(|s| s.run_id).collect();
    let secs: Vec<Option<f64>> = admitted.iter().map(|s| s.timeout_ms.map(|ms| ms as f64 / 1000.0)).collect();
    tx.execute(
        "UPDATE limit_waits w SET admitted_at = now() FROM unnest($1::uuid[], $2::int4[]) AS a(task_id, attempt)
          WHERE w.task_id = a.task_id AND w.attempt = a.attempt",
        &[&ids, &attempts],
    )
    .await?;
    tx.execute(
        "WITH admitted AS (
            UPDATE task_instances t
               SET updated_at = now(),
                   wake_at = CASE WHEN u.secs IS NULL THEN t.wake_at ELSE now() + make_interval(secs => u.secs) END
              FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) AS u(run_id, id, secs)
             WHERE t.run_id = u.run_id AND t.id = u.id AND t.state = 'PENDING'
            RETURNING t.run_id, t.id, t.queue, t.attempt)
         INSERT INTO outbox (run_id, task_id, queue, shard, attempt, priority)
         SELECT x.run_id, x.id, x.queue, composer_lane(x.id, r.fairness_key, $4), x.attempt, r.priority
           FROM admitted x JOIN workflow_runs r ON r.id = x.run_id",
        &[&runs, &ids, &secs, &shards],
    )
    .await?;
    tx.execute("SELECT pg_notify($1, '')", &[&crate::outbox::OUTBOX_CHANNEL]).await?;
    Ok(())
}

/// The keys that have waiting steps, in key order, at most [`PASS_KEYS`]:
/// a loose scan of the queue index, a probe per key however long its queue.
async fn waiting_keys(tx: &Transaction<'_>) -> Result<Vec<String>> {
    let rows = tx
        .query(
            "WITH RECURSIVE k AS (
                (SELECT key FROM limit_waits WHERE admitted_at IS NULL ORDER BY key LIMIT 1)
                UNION ALL
                SELECT (SELECT w.key FROM limit_waits w WHERE w.admitted_at IS NULL AND w.key > k.key
                         ORDER BY w.key LIMIT 1)
                  FROM k WHERE k.key IS NOT NULL)
             SELECT key FROM k WHERE key IS NOT NULL LIMIT $1",
            &[&PASS_KEYS],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Writes the values the latest waiting step that gives any gives each key, for
/// keys no operator set (`set_by = 'definition'`). A new rate's bucket
/// starts full.
async fn sync_definitions(tx: &Transaction<'_>, keys: &[String]) -> Result<()> {
    tx.execute(
        "INSERT INTO step_limits AS l (key, rate_count, rate_period_ms, burst, concurrency, set_by, tokens)
         SELECT k.key, v.rate_count, v.rate_period_ms, v.burst, v.concurrency, 'definition', coalesce(v.burst, 0)
           FROM unnest($1::text[]) AS k(key)
          CROSS JOIN LATERAL (
            SELECT w.rate_count, w.rate_period_ms, w.burst, w.concurrency FROM limit_waits w
             WHERE w.key = k.key AND w.admitted_at IS NULL
               AND (w.rate_count IS NOT NULL OR w.concurrency IS NOT NULL)
             ORDER BY w.queued_at DESC, w.task_id DESC LIMIT 1) v
          ORDER BY k.key
         ON CONFLICT (key) DO UPDATE
            SET rate_count = EXCLUDED.rate_count, rate_period_ms = EXCLUDED.rate_period_ms, burst = EXCLUDED.burst,
                concurrency = EXCLUDED.concurrency,
                tokens = CASE WHEN l.burst IS NULL THEN EXCLUDED.tokens ELSE least(l.tokens, EXCLUDED.tokens) END,
                refilled_at = CASE WHEN l.burst IS NULL THEN now() ELSE l.refilled_at END,
                updated_at = now()
          WHERE l.set_by = 'definition'
            AND (l.rate_count, l.rate_period_ms, l.burst, l.concurrency)
                IS DISTINCT FROM (EXCLUDED.rate_count, EXCLUDED.rate_period_ms, EXCLUDED.burst, EXCLUDED.concurrency)",
        &[&keys],
    )
    .await?;
    Ok(())
}

/// Frees slots: lingering ones past their end, and those of admitted steps
/// that ended without the engine's release (a run deleted). Rows the
/// engine holds are skipped, never waited for.
async fn forget_ended(tx: &Transaction<'_>) -> Result<()> {
    tx.execute(
        "DELETE FROM limit_waits WHERE ctid IN (
            SELECT w.ctid FROM limit_waits w
             WHERE w.admitted_at IS NOT NULL
               AND CASE WHEN w.linger_until IS NOT NULL THEN w.linger_until <= now()
                        ELSE NOT EXISTS (SELECT 1 FROM task_instances t
                                          WHERE t.run_id = w.run_id AND t.id = w.task_id AND t.attempt = w.attempt
                                            AND t.state IN ('PENDING', 'RUNNING')) END
             FOR UPDATE SKIP LOCKED)",
        &[],
    )
    .await?;
    Ok(())
}

/// The state of `keys` now (the database's clock): a key nobody set has
/// none and is not limited, unless a hold or a lingering slot says otherwise.
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
        let mut s = KeyState::new(v.rate, v.concurrency, r.try_get("tokens")?, r.try_get("refilled_at")?);
        s.refill(now);
        state.insert(r.try_get::<_, String>("key")?, s);
    }
    let rows = tx
        .query(
            "SELECT key, count(*), min(linger_until) FROM limit_waits
              WHERE admitted_at IS NOT NULL AND key = ANY($1) AND (linger_until IS NULL OR linger_until > $2)
              GROUP BY key",
            &[&keys, &now],
        )
        .await?;
    for r in &rows {
        if let Some(s) = state.get_mut(&r.try_get::<_, String>(0)?) {
            s.in_use = r.try_get::<_, i64>(1)?.clamp(0, u32::MAX as i64) as u32;
            s.frees_at = r.try_get(2)?;
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
