//! What the engine's write does to limits, in the engine's transaction:
//! a dispatched step held back by its limits, the slot of an attempt that
//! ended released (or left to linger until its lease ends), and the keys a
//! target's `Retry-After` holds.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use composer_core::definition::limit::LimitValues;
use composer_core::definition::Node;
use composer_core::machine;
use uuid::Uuid;

use crate::{Result, Transaction};

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
