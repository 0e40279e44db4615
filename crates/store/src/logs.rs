//! Step logs: lines a worker sends for an attempt it holds the lease of,
//! kept with the attempt up to a byte budget, read back by step.
//!
//! With offloading, the lines an attempt's rows hold past a threshold are
//! sealed into chunks ([`to_seal`], [`seal`]): an object of their run's,
//! written by the caller, named by a row of `task_log_chunks` that covers
//! their sequence numbers. An attempt's chunks come before its rows.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// What each line costs of an attempt's budget besides its bytes: its row
/// (so a flood of one-byte lines is bounded by rows too, at most
/// `max_bytes / 64` of them).
pub const LINE_OVERHEAD: usize = 64;

/// The line stored in place of the rest once an attempt's budget is spent.
pub const DROPPED_MARKER: &str =
    "[composer: this log reached its size limit (COMPOSER_TASK_LOG_MAX_BYTES for an attempt, \
                                  COMPOSER_RUN_LOG_MAX_BYTES for a run); later lines were dropped]";

/// What became of lines sent for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub accepted: usize,
    pub dropped: usize,
    /// What the attempt's rows hold now (counted as the budget counts),
    /// sealed chunks aside.
    pub row_bytes: i64,
}

/// A sealed chunk of an attempt's lines: `object` refers to them, seq
/// `first_seq` to `last_seq`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub attempt: i32,
    pub first_seq: i32,
    pub last_seq: i32,
    pub object: serde_json::Value,
}

/// One stored line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub attempt: i32,
    pub seq: i32,
    pub worker_id: String,
    pub at: DateTime<Utc>,
    pub line: String,
}

/// The limits of a log.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Bytes one attempt keeps.
    pub attempt: usize,
    /// Bytes one run keeps over all its steps and attempts.
    pub run: usize,
}

/// Appends `lines` to the log of `attempt` of a task, if `owner` holds its
/// lease (else `None`: nothing is stored). Lines past the budget of the
/// attempt or of the run (each line counted as its bytes and
/// [`LINE_OVERHEAD`]) are dropped; the first drop stores
/// [`DROPPED_MARKER`] and closes the attempt's log.
///
/// Safe from many coordinators at once: an append locks its run's usage
/// row, then its attempt's (always in that order), so the sequence numbers
/// and both budgets hold without reading the lines. The task row is not
/// locked (the hot path updates it): a worker that loses its lease as it
/// sends may still have that one batch stored.
pub async fn append(
    client: &mut Client,
    run_id: Uuid,
    task_id: Uuid,
    owner: &str,
    attempt: i32,
    lines: &[String],
    budget: Budget,
) -> Result<Option<Appended>> {
    let tx = crate::begin(client).await?;
    let holds = tx
        .query_opt(
            "SELECT 1 FROM task_instances
              WHERE run_id = $1 AND id = $2 AND attempt = $4 AND state = 'RUNNING' AND lease_owner = $3
                AND lease_expires_at > now()",
            &[&run_id, &task_id, &owner, &attempt],
        )
        .await?
        .is_some();
    if !holds {
        return Ok(None);
    }
    let run_bytes: i64 = tx
        .query_one(
            "INSERT INTO run_log_usage (run_id) VALUES ($1)
             ON CONFLICT (run_id) DO UPDATE SET run_id = EXCLUDED.run_id RETURNING bytes",
            &[&run_id],
        )
        .await?
        .get(0);
    let row = tx
        .query_one(
            "INSERT INTO task_log_usage (task_id, attempt, run_id) VALUES ($1, $2, $3)
             ON CONFLICT (task_id, attempt) DO UPDATE SET run_id = EXCLUDED.run_id
             RETURNING lines, bytes, closed, row_bytes",
            &[&task_id, &attempt, &run_id],
        )
        .await?;
    let (seq, bytes, closed): (i32, i64, bool) = (row.get(0), row.get(1), row.get(2));
    let mut row_bytes: i64 = row.get(3);
    let left =
        budget.attempt.saturating_sub(bytes.max(0) as usize).min(budget.run.saturating_sub(run_bytes.max(0) as usize));
    let plan = plan(left, closed, lines);
    if !plan.store.is_empty() {
        let seqs: Vec<i32> = (seq + 1..).take(plan.store.len()).collect();
        tx.execute(
            "INSERT INTO task_logs (task_id, attempt, seq, run_id, worker_id, line)
             SELECT $1, $2, s, $3, $4, l FROM unnest($5::int[], $6::text[]) AS u(s, l)",
            &[&task_id, &attempt, &run_id, &owner, &seqs, &plan.store],
        )
        .await?;
        let cost: i64 = plan.store.iter().map(|l| (l.len() + LINE_OVERHEAD) as i64).sum();
        let closes = plan.accepted < lines.len();
        tx.execute(
            "UPDATE task_log_usage
                SET lines = lines + $3, bytes = bytes + $4, row_bytes = row_bytes + $4, closed = closed OR $5
              WHERE task_id = $1 AND attempt = $2",
            &[&task_id, &attempt, &(plan.store.len() as i32), &cost, &closes],
        )
        .await?;
        row_bytes += cost;
        tx.execute("UPDATE run_log_usage SET bytes = bytes + $2 WHERE run_id = $1", &[&run_id, &cost]).await?;
    }
    tx.commit().await?;
    Ok(Some(Appended { accepted: plan.accepted, dropped: lines.len() - plan.accepted, row_bytes }))
}

struct Plan<'a> {
    store: Vec<&'a str>,
    accepted: usize,
}

/// Which of `lines` fit in `left` bytes, in order; the marker goes in once,
/// when the first line does not fit, and closes the log.
fn plan(mut left: usize, closed: bool, lines: &[String]) -> Plan<'_> {
    let mut store = Vec::new();
    if closed {
        return Plan { store, accepted: 0 };
    }
    for (i, line) in lines.iter().enumerate() {
        let cost = line.len() + LINE_OVERHEAD;
        if cost > left {
            store.push(DROPPED_MARKER);
            return Plan { store, accepted: i };
        }
        left -= cost;
        store.push(line);
    }
    Plan { store, accepted: lines.len() }
}

/// The lines of one attempt's rows after `after_seq`, at most `limit`
/// (its sealed chunks aside: [`chunks`]).
pub async fn read(client: &Client, task_id: Uuid, attempt: i32, after_seq: i32, limit: i64) -> Result<Vec<LogLine>> {
    let stmt = client
        .prepare_cached(
            "SELECT attempt, seq, worker_id, at, line FROM task_logs
              WHERE task_id = $1 AND attempt = $2 AND seq > $3 ORDER BY seq LIMIT $4",
        )
        .await?;
    let rows = client.query(&stmt, &[&task_id, &attempt, &after_seq, &limit]).await?;
    rows.iter().map(log_line).collect()
}

fn log_line(r: &tokio_postgres::Row) -> Result<LogLine> {
    Ok(LogLine {
        attempt: r.try_get("attempt")?,
        seq: r.try_get("seq")?,
        worker_id: r.try_get("worker_id")?,
        at: r.try_get("at")?,
        line: r.try_get("line")?,
    })
}

/// The sealed chunks of one attempt that hold lines after `after_seq`, in
/// order.
pub async fn chunks(client: &Client, task_id: Uuid, attempt: i32, after_seq: i32) -> Result<Vec<Chunk>> {
    let rows = client
        .query(
            "SELECT attempt, first_seq, last_seq, object FROM task_log_chunks
              WHERE task_id = $1 AND attempt = $2 AND last_seq > $3 ORDER BY first_seq",
            &[&task_id, &attempt, &after_seq],
        )
        .await?;
    rows.iter().map(chunk).collect()
}

fn chunk(r: &tokio_postgres::Row) -> Result<Chunk> {
    Ok(Chunk {
        attempt: r.try_get("attempt")?,
        first_seq: r.try_get("first_seq")?,
        last_seq: r.try_get("last_seq")?,
        object: r.try_get("object")?,
    })
}

/// Every sealed chunk of `tasks`, by task, attempt and seq.
pub async fn chunks_of_tasks(client: &Client, tasks: &[Uuid]) -> Result<Vec<(Uuid, Chunk)>> {
    let rows = client
        .query(
            "SELECT task_id, attempt, first_seq, last_seq, object FROM task_log_chunks
              WHERE task_id = ANY($1) ORDER BY task_id, attempt, first_seq",
            &[&tasks],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get("task_id")?, chunk(r)?))).collect()
}

/// The first lines the rows of `attempt` of a task hold, up to about
/// `max_bytes` (counted as the budget counts them; at least one line), to
/// seal into one chunk; with their cost. Read without a lock: [`seal`]
/// checks they are still there.
pub async fn to_seal(client: &Client, task_id: Uuid, attempt: i32, max_bytes: i64) -> Result<(Vec<LogLine>, i64)> {
    let rows = client
        .query(
            "SELECT attempt, seq, worker_id, at, line FROM (
                 SELECT *, sum(octet_length(line) + $4) OVER (ORDER BY seq) - (octet_length(line) + $4) AS before
                   FROM task_logs WHERE task_id = $1 AND attempt = $2) AS l
              WHERE before < $3 ORDER BY seq",
            &[&task_id, &attempt, &max_bytes, &(LINE_OVERHEAD as i32)],
        )
        .await?;
    let lines: Vec<LogLine> = rows.iter().map(log_line).collect::<Result<_>>()?;
    let cost = lines.iter().map(|l| (l.line.len() + LINE_OVERHEAD) as i64).sum();
    Ok((lines, cost))
}

/// Replaces the rows of the chunk's lines (`first_seq` to `last_seq`,
/// costing `cost`) by a row naming their object; what the attempt's rows
/// hold after, or `None` (nothing done) when they are no longer all there
/// (another coordinator sealed them first).
pub async fn seal(tx: &Transaction<'_>, run_id: Uuid, task_id: Uuid, chunk: &Chunk, cost: i64) -> Result<Option<i64>> {
    let Chunk { attempt, first_seq, last_seq, object } = chunk;
    tx.execute("SELECT 1 FROM task_log_usage WHERE task_id = $1 AND attempt = $2 FOR UPDATE", &[&task_id, attempt])
        .await?;
    let deleted = tx
        .execute(
            "DELETE FROM task_logs WHERE task_id = $1 AND attempt = $2 AND seq BETWEEN $3 AND $4",
            &[&task_id, attempt, first_seq, last_seq],
        )
        .await?;
    if deleted != (last_seq - first_seq + 1) as u64 {
        return Ok(None);
    }
    tx.execute(
        "INSERT INTO task_log_chunks (task_id, attempt, first_seq, last_seq, run_id, object)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[&task_id, attempt, first_seq, last_seq, &run_id, object],
    )
    .await?;
    let left = tx
        .query_one(
            "UPDATE task_log_usage SET row_bytes = greatest(row_bytes - $3, 0)
              WHERE task_id = $1 AND attempt = $2 RETURNING row_bytes",
            &[&task_id, attempt, &cost],
        )
        .await?;
    Ok(Some(left.try_get(0)?))
}

/// Every line of `tasks` in rows, by task, attempt and seq (a run's logs,
/// for its archive: a run keeps at most `COMPOSER_RUN_LOG_MAX_BYTES` of
/// them), sealed chunks aside ([`chunks_of_tasks`]).
pub async fn of_tasks(client: &Client, tasks: &[Uuid]) -> Result<Vec<(Uuid, LogLine)>> {
    let rows = client
        .query(
            "SELECT task_id, attempt, seq, worker_id, at, line FROM task_logs
              WHERE task_id = ANY($1) ORDER BY task_id, attempt, seq",
            &[&tasks],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get("task_id")?, log_line(r)?))).collect()
}

/// The attempts of a task that have lines, with how many each.
pub async fn attempts(client: &Client, task_id: Uuid) -> Result<Vec<(i32, i64)>> {
    let stmt = client
        .prepare_cached(
            "SELECT attempt, lines::bigint FROM task_log_usage WHERE task_id = $1 AND lines > 0 ORDER BY attempt",
        )
        .await?;
    let rows = client.query(&stmt, &[&task_id]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// How many lines each of `tasks` has, over all its attempts (tasks with
/// none are left out).
pub async fn counts(client: &Client, tasks: &[Uuid]) -> Result<std::collections::HashMap<Uuid, i64>> {
    let stmt = client
        .prepare_cached(
            "SELECT task_id, sum(lines)::bigint FROM task_log_usage
              WHERE task_id = ANY($1) AND lines > 0 GROUP BY task_id",
        )
        .await?;
    let rows = client.query(&stmt, &[&tasks]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// Deletes the lines, older than `before`, and the counts of runs that are
/// gone (retention dropped their month); returns how many lines.
pub async fn delete_orphaned(client: &Client, before: DateTime<Utc>) -> Result<u64> {
    let lines = client
        .execute(
            "DELETE FROM task_logs l WHERE l.at < $1
                AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = l.run_id)",
            &[&before],
        )
        .await?;
    for table in ["task_log_chunks", "task_log_usage", "run_log_usage"] {
        client
            .execute(
                &format!(
                    "DELETE FROM {table} u WHERE NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = u.run_id)"
                ),
                &[],
            )
            .await?;
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn lines_fit_in_order_then_one_marker() {
        let l = lines(&["aaaa", "bbbb", "cccc"]);
        let each = 4 + LINE_OVERHEAD;
        let p = plan(3 * each - 1, false, &l);
        assert_eq!((p.store, p.accepted), (vec!["aaaa", "bbbb", DROPPED_MARKER], 2));
        let p = plan(3 * each, false, &l);
        assert_eq!((p.store, p.accepted), (vec!["aaaa", "bbbb", "cccc"], 3));
        // An empty line is not free.
        let empty = lines(&[""; 3]);
        assert_eq!(plan(2 * LINE_OVERHEAD, false, &empty).accepted, 2);
    }

    #[test]
    fn a_closed_or_spent_log_stores_nothing_more_but_the_marker_once() {
        let l = lines(&["a"]);
        let p = plan(1000, true, &l);
        assert_eq!((p.store.len(), p.accepted), (0, 0));
        let p = plan(0, false, &l);
        assert_eq!((p.store, p.accepted), (vec![DROPPED_MARKER], 0));
    }
}
