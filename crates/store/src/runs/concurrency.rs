//! A workflow's concurrency keys and the runs QUEUED behind them: the
//! key's lock, its open runs, the turns that order its queue (start-time
//! fair queueing by priority and fairness key), and the reads and writes of
//! a promotion. Every admission to a key happens under its lock.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::rows::{RunRow, RUN_COLUMNS};
use crate::{Client, Result, Transaction};

/// A QUEUED run's turn (`$3` its workflow, `$13` its concurrency key, `$21`
/// its priority, `$22` its fairness key, `$23` its priority's share): the
/// last turn of its class (priority and fairness key) plus its share, or
/// the queue's head if later (start-time fair queueing: see the migration
/// that made it). Each part is one probe of an index of QUEUED runs. Read
/// under the concurrency key's lock, as every admission is.
pub(super) const NEXT_TURN: &str = "greatest(
        (SELECT fair_turn FROM workflow_runs
          WHERE workflow_name = $3 AND concurrency_key = $13 AND priority = $21
            AND coalesce(fairness_key, '') = coalesce($22::text, '') AND status = 'QUEUED'
          ORDER BY fair_turn DESC LIMIT 1) + $23::float8,
        (SELECT fair_turn FROM workflow_runs
          WHERE workflow_name = $3 AND concurrency_key = $13 AND status = 'QUEUED' ORDER BY fair_turn LIMIT 1),
        0)";

/// A priority's share of a queue's turns: 1/16 for priority 1 … 1 for 5.
pub(super) fn turn_of(priority: u8) -> f64 {
    let at = usize::from(priority.saturating_sub(composer_core::priority::HIGHEST)).min(4);
    1.0 / composer_core::priority::WEIGHTS[at] as f64
}

/// A QUEUED run `r`'s turn in its new class (priority `$2`, its fairness
/// key; `$4` the priority's share), as [`NEXT_TURN`] gives a new run's.
pub(super) const CHANGED_TURN: &str = "greatest(
        (SELECT q.fair_turn FROM workflow_runs q
          WHERE q.workflow_name = r.workflow_name AND q.concurrency_key = r.concurrency_key AND q.priority = $2
            AND coalesce(q.fairness_key, '') = coalesce(r.fairness_key, '') AND q.status = 'QUEUED'
          ORDER BY q.fair_turn DESC LIMIT 1) + $4::float8,
        (SELECT h.fair_turn FROM workflow_runs h
          WHERE h.workflow_name = r.workflow_name AND h.concurrency_key = r.concurrency_key AND h.status = 'QUEUED'
          ORDER BY h.fair_turn LIMIT 1),
        0)";

/// Serializes admission to one concurrency key of a workflow; held to the
/// end of the transaction.
pub async fn lock_concurrency_key(tx: &Transaction<'_>, workflow: &str, key: &str) -> Result<()> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('composer_concurrency:' || $1 || ':' || $2, 0))",
        &[&workflow, &key],
    )
    .await?;
    Ok(())
}

/// [`lock_concurrency_key`] unless another transaction holds it: whether
/// this one now does (it waits for nothing).
pub async fn try_lock_concurrency_key(tx: &Transaction<'_>, workflow: &str, key: &str) -> Result<bool> {
    let row = tx
        .query_one(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('composer_concurrency:' || $1 || ':' || $2, 0))",
            &[&workflow, &key],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// How a concurrency key stands: its open (RUNNING or PAUSED) runs, and
/// whether any run waits QUEUED. Call under [`lock_concurrency_key`].
pub async fn concurrency_usage(tx: &Transaction<'_>, workflow: &str, key: &str) -> Result<(i64, bool)> {
    let row = tx
        .query_one(
            "SELECT (SELECT count(*) FROM workflow_runs
                      WHERE workflow_name = $1 AND concurrency_key = $2 AND status IN ('RUNNING', 'PAUSED')),
                    EXISTS (SELECT 1 FROM workflow_runs
                             WHERE workflow_name = $1 AND concurrency_key = $2 AND status = 'QUEUED')",
            &[&workflow, &key],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The next `limit` QUEUED runs of a key in admission order (their turns:
/// priorities by weight, fairness keys taking turns), locked; call under
/// [`lock_concurrency_key`].
pub async fn lock_queued(tx: &Transaction<'_>, workflow: &str, key: &str, limit: i64) -> Result<Vec<RunRow>> {
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM workflow_runs
              WHERE workflow_name = $1 AND concurrency_key = $2 AND status = 'QUEUED'
              ORDER BY fair_turn, id LIMIT $3 FOR UPDATE"
        ))
        .await?;
    let rows = tx.query(&stmt, &[&workflow, &key, &limit]).await?;
    rows.iter().map(RunRow::from_row).collect()
}

/// A key's queue as a promotion pass sees it, in one read: the definition
/// of its next QUEUED run (whose limit applies), if any, and its open
/// (RUNNING or PAUSED) runs. Call under [`lock_concurrency_key`].
pub async fn queue_head(tx: &Transaction<'_>, workflow: &str, key: &str) -> Result<Option<(Uuid, i64)>> {
    let stmt = tx
        .prepare_cached(
            "SELECT (SELECT workflow_definition_id FROM workflow_runs
                      WHERE workflow_name = $1 AND concurrency_key = $2 AND status = 'QUEUED'
                      ORDER BY fair_turn, id LIMIT 1),
                    (SELECT count(*) FROM workflow_runs
                      WHERE workflow_name = $1 AND concurrency_key = $2 AND status IN ('RUNNING', 'PAUSED'))",
        )
        .await?;
    let row = tx.query_one(&stmt, &[&workflow, &key]).await?;
    let head: Option<Uuid> = row.try_get(0)?;
    Ok(head.map(|definition| (definition, row.get(1))))
}

/// QUEUED runs leave the queue: RUNNING, each with its deadline, in one
/// statement (bounded by the ids' span, so it visits only their months).
pub async fn set_running(tx: &Transaction<'_>, ids: &[Uuid], deadlines: &[Option<DateTime<Utc>>]) -> Result<()> {
    let (lo, hi) = crate::partitions::span(ids);
    let stmt = tx
        .prepare_cached(
            "UPDATE workflow_runs r SET status = 'RUNNING', deadline = d.deadline, updated_at = now()
               FROM unnest($1::uuid[], $2::timestamptz[]) AS d(id, deadline)
              WHERE r.id = d.id AND r.id BETWEEN $3 AND $4",
        )
        .await?;
    tx.execute(&stmt, &[&ids, &deadlines, &lo, &hi]).await?;
    Ok(())
}

/// Keys with QUEUED runs: `(workflow, key)`, for the sweep that starts them.
pub async fn queued_keys(client: &Client, limit: i64) -> Result<Vec<(String, String)>> {
    let rows = client
        .query(
            "SELECT DISTINCT workflow_name, concurrency_key FROM workflow_runs WHERE status = 'QUEUED' LIMIT $1",
            &[&limit],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get::<_, Option<String>>(1)?.unwrap_or_default()))).collect()
}

/// Where a QUEUED run of a concurrency key stands: the key's open runs,
/// and how many of its queued runs go before it.
pub async fn queue_position(client: &Client, run: &RunRow) -> Result<(i64, i64)> {
    let key = run.concurrency_key.as_deref().unwrap_or_default();
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM workflow_runs
                      WHERE workflow_name = $1 AND concurrency_key = $2 AND status IN ('RUNNING', 'PAUSED')),
                    (SELECT count(*) FROM workflow_runs q
                      WHERE q.workflow_name = $1 AND q.concurrency_key = $2 AND q.status = 'QUEUED'
                        AND (q.fair_turn, q.id) < (SELECT fair_turn, id FROM workflow_runs WHERE id = $3))",
            &[&run.workflow_name, &key, &run.id],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}
