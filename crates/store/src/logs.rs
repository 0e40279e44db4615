//! Step logs: lines a worker sends for an attempt it holds the lease of,
//! kept with the attempt up to a byte budget, read back by step.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Client, Result};

/// What each line costs of an attempt's budget besides its bytes: its row
/// (so a flood of one-byte lines is bounded by rows too, at most
/// `max_bytes / 64` of them).
pub const LINE_OVERHEAD: usize = 64;

/// The line stored in place of the rest once an attempt's budget is spent.
pub const DROPPED_MARKER: &str = "[composer: this attempt's log reached its size limit; later lines were dropped]";

/// What became of lines sent for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub accepted: usize,
    pub dropped: usize,
}

/// One stored line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub attempt: i32,
    pub seq: i32,
    pub at: DateTime<Utc>,
    pub line: String,
}

/// Appends `lines` to the log of `attempt` of a task, if `owner` holds its
/// lease (else `None`: nothing is stored). Lines past `max_bytes` for the
/// attempt (each line counted as its bytes and [`LINE_OVERHEAD`]) are
/// dropped; the first drop stores [`DROPPED_MARKER`] instead.
///
/// Safe from many coordinators at once: an advisory lock on the attempt
/// orders appends to one log, so the sequence numbers and the budget hold.
/// The task row is not locked (the hot path updates it): a worker that
/// loses its lease as it sends may still have that one batch stored.
pub async fn append(
    client: &mut Client,
    run_id: Uuid,
    task_id: Uuid,
    owner: &str,
    attempt: i32,
    lines: &[String],
    max_bytes: usize,
) -> Result<Option<Appended>> {
    let tx = client.transaction().await?;
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
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1::uuid::text || ':' || $2::int::text, 0))",
        &[&task_id, &attempt],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT coalesce(sum(octet_length(line) + $4), 0)::bigint, coalesce(max(seq), 0),
                    coalesce(bool_or(line = $3), false)
               FROM task_logs WHERE task_id = $1 AND attempt = $2",
            &[&task_id, &attempt, &DROPPED_MARKER, &(LINE_OVERHEAD as i32)],
        )
        .await?;
    let (used, last_seq, already_dropped): (i64, i32, bool) = (row.get(0), row.get(1), row.get(2));
    let plan = plan(used.max(0) as usize, already_dropped, lines, max_bytes);
    if !plan.store.is_empty() {
        let seqs: Vec<i32> = (last_seq + 1..).take(plan.store.len()).collect();
        tx.execute(
            "INSERT INTO task_logs (task_id, attempt, seq, run_id, line)
             SELECT $1, $2, s, $3, l FROM unnest($4::int[], $5::text[]) AS u(s, l)",
            &[&task_id, &attempt, &run_id, &seqs, &plan.store],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Some(Appended { accepted: plan.accepted, dropped: lines.len() - plan.accepted }))
}

struct Plan<'a> {
    store: Vec<&'a str>,
    accepted: usize,
}

/// Which of `lines` fit in what is left of the budget, in order; the marker
/// goes in once, when the first line does not.
fn plan<'a>(used: usize, already_dropped: bool, lines: &'a [String], max_bytes: usize) -> Plan<'a> {
    let mut store = Vec::new();
    let mut left = max_bytes.saturating_sub(used);
    if already_dropped {
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

/// The lines of one attempt after `after_seq`, at most `limit`.
pub async fn read(client: &Client, task_id: Uuid, attempt: i32, after_seq: i32, limit: i64) -> Result<Vec<LogLine>> {
    let stmt = client
        .prepare_cached(
            "SELECT attempt, seq, at, line FROM task_logs
              WHERE task_id = $1 AND attempt = $2 AND seq > $3 ORDER BY seq LIMIT $4",
        )
        .await?;
    let rows = client.query(&stmt, &[&task_id, &attempt, &after_seq, &limit]).await?;
    rows.iter()
        .map(|r| Ok(LogLine { attempt: r.try_get(0)?, seq: r.try_get(1)?, at: r.try_get(2)?, line: r.try_get(3)? }))
        .collect()
}

/// The attempts of a task that have lines, with how many each.
pub async fn attempts(client: &Client, task_id: Uuid) -> Result<Vec<(i32, i64)>> {
    let stmt = client
        .prepare_cached("SELECT attempt, count(*) FROM task_logs WHERE task_id = $1 GROUP BY attempt ORDER BY attempt")
        .await?;
    let rows = client.query(&stmt, &[&task_id]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// How many lines each of `tasks` has, over all its attempts (tasks with
/// none are left out).
pub async fn counts(client: &Client, tasks: &[Uuid]) -> Result<std::collections::HashMap<Uuid, i64>> {
    let stmt = client
        .prepare_cached("SELECT task_id, count(*) FROM task_logs WHERE task_id = ANY($1) GROUP BY task_id")
        .await?;
    let rows = client.query(&stmt, &[&tasks]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// Deletes the lines, older than `before`, of runs that are gone (retention
/// dropped their month); returns how many.
pub async fn delete_orphaned(client: &Client, before: DateTime<Utc>) -> Result<u64> {
    Ok(client
        .execute(
            "DELETE FROM task_logs l WHERE l.at < $1
                AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = l.run_id)",
            &[&before],
        )
        .await?)
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
        let p = plan(0, false, &l, 3 * each - 1);
        assert_eq!((p.store, p.accepted), (vec!["aaaa", "bbbb", DROPPED_MARKER], 2));
        let p = plan(0, false, &l, 3 * each);
        assert_eq!((p.store, p.accepted), (vec!["aaaa", "bbbb", "cccc"], 3));
    }

    #[test]
    fn a_spent_budget_stores_nothing_more() {
        let l = lines(&["a"]);
        let p = plan(10, true, &l, 100);
        assert_eq!((p.store.len(), p.accepted), (0, 0));
        let p = plan(100, false, &l, 100);
        assert_eq!((p.store, p.accepted), (vec![DROPPED_MARKER], 0));
    }
}
