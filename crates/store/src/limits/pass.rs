//! The limiter's pass: under one advisory lock, frees the slots of steps
//! that ended, takes the oldest waiting steps of each key, keeps those of
//! runs still open whose attempt still waits, and admits the ones every key
//! lets go into the outbox, in one commit.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use composer_core::definition::limit::{LimitValues, Rate};
use composer_core::limiter::{self, KeyState};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// Channel notified when a commit holds steps back by their limits, ends
/// attempts that held a slot, resumes a run of limited steps, or sets a
/// limit: the limiter looks again.
pub const LIMITS_CHANNEL: &str = "composer_limits";

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

/// A limit's values from its columns (`rate_count`, `rate_period_ms`,
/// `burst`, `concurrency`); a rate with a zero part is none.
pub(super) fn values_of(r: &Row) -> Result<LimitValues> {
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
