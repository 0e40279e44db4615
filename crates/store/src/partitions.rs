//! Monthly partitions: created ahead of need, dropped past retention. Both SQL
//! functions take an advisory lock, so every coordinator may call them. And
//! the partitioned tables' own statistics, which autovacuum never takes.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Client, Result};

/// Creates the partitions from this month to `months_ahead` ahead; returns how
/// many tables were created.
pub async fn ensure(client: &Client, months_ahead: i32) -> Result<i32> {
    let row = client.query_one("SELECT composer_ensure_partitions($1)", &[&months_ahead]).await?;
    Ok(row.get(0))
}

/// The least and the greatest of `ids` (run ids, the partition key): bounds
/// a statement adds (`run_id BETWEEN lo AND hi`) so that PostgreSQL skips the
/// months none of them is in when it starts the statement. `= ANY($1)` and a
/// join with `unnest($1)` prune nothing on their own, and every month of
/// history and every month made ahead costs an index descent per id.
pub fn span(ids: &[Uuid]) -> (Uuid, Uuid) {
    let lo = ids.iter().min().copied().unwrap_or_default();
    let hi = ids.iter().max().copied().unwrap_or_default();
    (lo, hi)
}

/// What retention did with the months that ended before its cut-off.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Months dropped, as `YYYY_MM`.
    pub dropped: Vec<String>,
    /// Months kept because they still hold a RUNNING run.
    pub kept_open: Vec<String>,
}

/// Drops whole months that ended before `before`, except a month that still
/// holds an open run: it is kept until that run ends.
pub async fn drop_before(client: &Client, before: DateTime<Utc>) -> Result<Expired> {
    let rows = client.query("SELECT month, dropped FROM composer_drop_partitions($1)", &[&before]).await?;
    let mut out = Expired::default();
    for r in rows {
        let month: String = r.try_get("month")?;
        if r.try_get("dropped")? {
            out.dropped.push(month);
        } else {
            out.kept_open.push(month);
        }
    }
    forget_dropped(client, before).await?;
    Ok(out)
}

/// Forgets what runs that went with their month leave behind: the budgets
/// of their trees and their step logs.
pub async fn forget_dropped(client: &Client, before: DateTime<Utc>) -> Result<()> {
    // The budgets of trees whose root went with its month.
    client
        .execute(
            "DELETE FROM run_trees t WHERE t.created_at < $1
                AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = t.root_run_id)",
            &[&before],
        )
        .await?;
    // The step logs of runs that went with their month.
    crate::logs::delete_orphaned(client, before).await?;
    Ok(())
}

/// The months (`YYYY_MM`) that ended at or before `before`, oldest first.
pub async fn expired_months(client: &Client, before: DateTime<Utc>) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT right(c.relname::text, 7) AS month
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'workflow_runs'::regclass
                AND c.relname ~ '^workflow_runs_p[0-9]{4}_[0-9]{2}$'
                AND (to_date(right(c.relname::text, 7), 'YYYY_MM') + interval '1 month')::timestamp
                    AT TIME ZONE 'UTC' <= $1
              ORDER BY 1",
            &[&before],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Whether month `month` (`YYYY_MM`) holds a run that has not ended.
pub async fn month_has_open_runs(client: &Client, month: &str) -> Result<bool> {
    let (lo, hi) = month_ids(client, month).await?;
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM workflow_runs WHERE id >= $1 AND id < $2
                              AND status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED'))",
            &[&lo, &hi],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// The first run id of month `month` and of the month after.
async fn month_ids(client: &Client, month: &str) -> Result<(Uuid, Uuid)> {
    let row = client
        .query_one(
            "SELECT composer_month_uuid(m), composer_month_uuid(m + interval '1 month')
               FROM (SELECT to_date($1, 'YYYY_MM')::timestamp AT TIME ZONE 'UTC' AS m) AS t",
            &[&month],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Drops month `month` (`YYYY_MM`) with its runs, tasks and history if it
/// holds no open run and no run of it changed since `unchanged_since`;
/// returns whether it did. Then forgets what its runs left behind.
pub async fn drop_month(client: &Client, month: &str, unchanged_since: DateTime<Utc>) -> Result<bool> {
    let row = client.query_one("SELECT composer_drop_month($1, $2)", &[&month, &unchanged_since]).await?;
    let dropped: bool = row.try_get(0)?;
    if dropped {
        forget_dropped(client, unchanged_since).await?;
    }
    Ok(dropped)
}

/// Records that this namespace's months are archived: from now on a
/// coordinator without an archive drops none of them (`composer_drop_partitions`
/// refuses while the row is there).
pub async fn require_archiving(client: &Client) -> Result<()> {
    client.execute("INSERT INTO archive_required DEFAULT VALUES ON CONFLICT DO NOTHING", &[]).await?;
    Ok(())
}

/// Whether this namespace's months are archived ([`require_archiving`]).
pub async fn archiving_required(client: &Client) -> Result<bool> {
    Ok(client.query_one("SELECT EXISTS (SELECT 1 FROM archive_required)", &[]).await?.try_get(0)?)
}

/// Takes this namespace's archiving lock for the transaction `tx`, if no
/// other holds it: one coordinator archives a namespace at a time, and the
/// lock goes when `tx` ends, committed, rolled back or dropped
/// ([`try_hold_pass_lock`]).
pub async fn try_lock_archiving(tx: &crate::Transaction<'_>) -> Result<bool> {
    try_hold_pass_lock(tx, "composer_archive:").await
}

/// Takes the lock one coordinator sweeps a namespace's offloaded values
/// under, until the transaction ends; `false` when another holds it
/// ([`try_hold_pass_lock`]).
pub async fn try_lock_payload_sweep(tx: &crate::Transaction<'_>) -> Result<bool> {
    try_hold_pass_lock(tx, "composer_payload_sweep:").await
}

/// Takes the lock `name` for the transaction `tx`, which holds it, idle,
/// for a whole pass done on other connections (archiving a month,
/// sweeping objects): the session's idle limit (one minute) would end the
/// transaction and let the lock go half way, so another coordinator could
/// start the same pass beside it. `tx` may sit idle with no limit: the
/// lock goes with the coordinator's connection if it dies.
async fn try_hold_pass_lock(tx: &crate::Transaction<'_>, name: &str) -> Result<bool> {
    tx.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await?;
    let row = tx.query_one("SELECT pg_try_advisory_xact_lock(hashtext($1 || current_schema()))", &[&name]).await?;
    Ok(row.try_get(0)?)
}

/// The partitioned tables whose statistics [`analyze_grown`] keeps: those
/// the hot path joins with a batch of keys. Not `run_events`, only ever
/// appended to and read by run id, and the dearest to analyze (its
/// payloads: 219 ms at 16,000 rows where the tasks took 95).
pub const ANALYZED_TABLES: [&str; 2] = ["workflow_runs", "task_instances"];

/// Below this many rows a table is analyzed with a sample of 3,000 rows
/// ([`SMALL_TABLE_TARGET`]), not 30,000: it is analyzed at each doubling
/// while it fills, and a plan needs its sizes and its few states, which the
/// small sample gives for a fifth of the time (12 against 62 ms at 16,000
/// tasks). Past it, the table is sampled at the server's own target, since
/// nothing else ever analyzes it.
pub const SMALL_TABLE_ROWS: f64 = 100_000.0;

/// The statistics target of a small table's ANALYZE (PostgreSQL samples 300
/// rows per unit).
pub const SMALL_TABLE_TARGET: u32 = 10;

/// Analyzes each partitioned table of [`ANALYZED_TABLES`] whose partitions
/// hold at least `min_rows` live rows and at least twice what the table held
/// when it was last analyzed (never: any count past `min_rows`); returns the
/// tables analyzed. 0 analyzes nothing, and so does a role that may not
/// analyze them (neither their owner nor the database's), which PostgreSQL
/// would only warn about, leaving the counts to ask again on every pass.
///
/// Autovacuum analyzes partitions but never a partitioned table itself, and
/// our generic plans are made with the table's own statistics and kept until
/// an ANALYZE invalidates them. A plan made while the tables were small
/// reads a batch's tasks by the range of its run ids and joins (cheapest
/// when that range is a few rows), and keeps doing so at any size: a MAP's
/// items share one run id, so each lease of eight of them read all 10,000.
/// Analyzing at each doubling re-plans with sizes near the truth, about
/// log2(rows) times in a table's life. `SKIP_LOCKED`: a table another
/// coordinator is analyzing is left to it.
pub async fn analyze_grown(client: &Client, min_rows: i64) -> Result<Vec<String>> {
    if min_rows <= 0 {
        return Ok(Vec::new());
    }
    let tables: Vec<String> = ANALYZED_TABLES.iter().map(|t| t.to_string()).collect();
    // Prepared once per connection: the loop asks twice a second, and
    // planning this read took three times as long as running it.
    let stmt = client
        .prepare_cached(
            "SELECT p.relname::text AS name, sum(pg_stat_get_live_tuples(i.inhrelid))::float8 AS live
               FROM pg_class p
               JOIN pg_inherits i ON i.inhparent = p.oid
              WHERE p.oid = ANY (SELECT to_regclass(t) FROM unnest($1::text[]) AS t) AND p.relkind = 'p'
                AND (pg_has_role(p.relowner, 'USAGE')
                     OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE'))
              GROUP BY p.relname, p.reltuples
             HAVING sum(pg_stat_get_live_tuples(i.inhrelid)) >= greatest($2::float8, 2 * p.reltuples)",
        )
        .await?;
    let rows = client.query(&stmt, &[&tables, &(min_rows as f64)]).await?;
    let mut analyzed = Vec::new();
    for r in rows {
        let name: String = r.try_get("name")?;
        let live: f64 = r.try_get("live")?;
        // The name is one of ANALYZED_TABLES, not input.
        let analyze = format!("ANALYZE (SKIP_LOCKED) {name}");
        // A session setting, not a transaction's: a failed ANALYZE must not
        // hand the pool a connection inside an aborted transaction. Only
        // ANALYZE reads it, so a SET left behind by a failure is harmless.
        let target = match live < SMALL_TABLE_ROWS {
            true => format!("SET default_statistics_target = {SMALL_TABLE_TARGET}"),
            false => "RESET default_statistics_target".to_string(),
        };
        client.batch_execute(&format!("{target}; {analyze}; RESET default_statistics_target")).await?;
        analyzed.push(name);
    }
    Ok(analyzed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_holds_every_id_in_the_order_postgresql_compares_uuids() {
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        let (lo, hi) = span(&[ids[2], ids[0], ids[1]]);
        assert_eq!((lo, hi), (ids[0], ids[2]), "v7 ids sort by time");
        // PostgreSQL compares uuids byte by byte, as Uuid's Ord does.
        let a = Uuid::from_bytes([0x7f; 16]);
        let b = Uuid::from_bytes([0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(span(&[b, a]), (a, b));
        assert_eq!(span(&[]), (Uuid::nil(), Uuid::nil()));
    }
}
