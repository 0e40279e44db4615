//! A definition's deadlines as rows (`run_deadlines`): armed in the
//! engine's write (a run's when it starts, a step's when it is created),
//! disarmed in the write that ends the run, and fired by the timer loop,
//! which deletes a row in the commit that starts its run. Each row is fired
//! by the one transaction that holds its lock (`FOR UPDATE SKIP LOCKED`),
//! a short one of its own, so a deadline starts its run once, whichever
//! coordinator finds it, and one row never holds up the others.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// The `idx` an APPROVAL step's notification is armed at: a deadline of
/// its step due at once (when it begins to wait, and when it escalates).
pub const NOTIFY: i32 = -1;

/// A deadline to arm: due `after_ms` after the arming commit's start.
#[derive(Debug, Clone)]
pub struct Armed<'a> {
    pub run_id: Uuid,
    /// The step's node, or `""` for the run's own.
    pub node_id: &'a str,
    /// Its place in the definition's list.
    pub idx: i32,
    pub after_ms: i64,
}

/// Arms `rows` (one statement); a deadline armed again (a step created
/// again by a rerun) is due from now on. Safe from many coordinators: each
/// run's rows are armed under its lock.
pub async fn arm(tx: &Transaction<'_>, rows: &[Armed<'_>]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO run_deadlines (run_id, node_id, idx, due_at)
             SELECT r, n, i, now() + a * interval '1 millisecond'
               FROM unnest($1::uuid[], $2::text[], $3::int4[], $4::int8[]) AS u(r, n, i, a)
             ON CONFLICT (run_id, node_id, idx) DO UPDATE SET due_at = excluded.due_at",
        )
        .await?;
    let runs: Vec<Uuid> = rows.iter().map(|r| r.run_id).collect();
    let nodes: Vec<&str> = rows.iter().map(|r| r.node_id).collect();
    let idx: Vec<i32> = rows.iter().map(|r| r.idx).collect();
    let after: Vec<i64> = rows.iter().map(|r| r.after_ms).collect();
    tx.execute(&stmt, &[&runs, &nodes, &idx, &after]).await?;
    Ok(())
}

/// Deletes the deadlines of runs that ended (in the commit that ends them).
pub async fn disarm(tx: &Transaction<'_>, runs: &[Uuid]) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    let stmt = tx.prepare_cached("DELETE FROM run_deadlines WHERE run_id = ANY($1)").await?;
    tx.execute(&stmt, &[&runs]).await?;
    Ok(())
}

/// A deadline whose time has come.
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    pub run_id: Uuid,
    pub node_id: String,
    pub idx: i32,
    pub due_at: DateTime<Utc>,
}

/// Up to `limit` due deadlines, oldest first (a plain read: each is locked
/// on its own by [`lock_due`] before it is fired).
pub async fn due(client: &Client, limit: i64) -> Result<Vec<Due>> {
    let stmt = client
        .prepare_cached(
            "SELECT run_id, node_id, idx, due_at FROM run_deadlines WHERE due_at <= now() ORDER BY due_at LIMIT $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&limit]).await?;
    rows.iter().map(due_of).collect()
}

fn due_of(r: &tokio_postgres::Row) -> Result<Due> {
    Ok(Due { run_id: r.try_get(0)?, node_id: r.try_get(1)?, idx: r.try_get(2)?, due_at: r.try_get(3)? })
}

/// `d` locked for this transaction if it is still armed and due (its time
/// as it is now: armed again, it may be later); `None` when it is gone,
/// not due, or another transaction holds it.
pub async fn lock_due(tx: &Transaction<'_>, d: &Due) -> Result<Option<Due>> {
    let stmt = tx
        .prepare_cached(
            "SELECT run_id, node_id, idx, due_at FROM run_deadlines
              WHERE run_id = $1 AND node_id = $2 AND idx = $3 AND due_at <= now()
              FOR UPDATE SKIP LOCKED",
        )
        .await?;
    tx.query_opt(&stmt, &[&d.run_id, &d.node_id, &d.idx]).await?.as_ref().map(due_of).transpose()
}

/// Puts `d` off by `by` (its firing failed for a passing reason), unless
/// it was armed again or fired meanwhile.
pub async fn put_off(client: &Client, d: &Due, by: std::time::Duration) -> Result<()> {
    let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    let stmt = client
        .prepare_cached(
            "UPDATE run_deadlines SET due_at = now() + $5 * interval '1 millisecond'
              WHERE run_id = $1 AND node_id = $2 AND idx = $3 AND due_at = $4",
        )
        .await?;
    client.execute(&stmt, &[&d.run_id, &d.node_id, &d.idx, &d.due_at, &ms]).await?;
    Ok(())
}

/// What a deadline sees of its run.
#[derive(Debug, Clone)]
pub struct DeadlineRun {
    pub status: String,
    pub definition_id: Uuid,
    pub workflow: String,
    pub version: i32,
    /// As its row keeps it (an offloaded input is a reference).
    pub input: Value,
    pub traceparent: Option<String>,
    /// The root of its run tree (itself for a root).
    pub root: Uuid,
}

/// The run as it stands.
#[derive(Debug, Clone)]
pub enum RunNow {
    /// No such run (retention dropped it).
    Gone,
    /// A transaction holds it (the engine, changing it): looked at again
    /// on a later pass, so a deadline never waits on a run's lock.
    Busy,
    Here(DeadlineRun),
}

/// The deadline's run, share-locked (its end cannot commit until this
/// transaction does), unless another transaction holds it.
pub async fn run_of(tx: &Transaction<'_>, run_id: Uuid) -> Result<RunNow> {
    let stmt = tx
        .prepare_cached(
            "SELECT status, workflow_definition_id, workflow_name, workflow_version, input, traceparent,
                    coalesce(root_run_id, id)
               FROM workflow_runs WHERE id = $1 FOR SHARE SKIP LOCKED",
        )
        .await?;
    if let Some(r) = tx.query_opt(&stmt, &[&run_id]).await? {
        return Ok(RunNow::Here(DeadlineRun {
            status: r.try_get(0)?,
            definition_id: r.try_get(1)?,
            workflow: r.try_get(2)?,
            version: r.try_get(3)?,
            input: r.try_get(4)?,
            traceparent: r.try_get(5)?,
            root: r.try_get(6)?,
        }));
    }
    let exists = tx.prepare_cached("SELECT 1 FROM workflow_runs WHERE id = $1").await?;
    Ok(match tx.query_opt(&exists, &[&run_id]).await? {
        Some(_) => RunNow::Busy,
        None => RunNow::Gone,
    })
}

/// The state and attempt of the run's step of `node_id` (its node's task,
/// not a MAP item), if it has one.
pub async fn step_of(tx: &Transaction<'_>, run_id: Uuid, node_id: &str) -> Result<Option<(String, i32)>> {
    let stmt = tx
        .prepare_cached(
            "SELECT state, attempt FROM task_instances
              WHERE run_id = $1 AND node_id = $2 AND parent_task_id IS NULL
              ORDER BY id DESC LIMIT 1",
        )
        .await?;
    let row = tx.query_opt(&stmt, &[&run_id, &node_id]).await?;
    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
}

/// Deletes a fired (or moot) deadline and, when it fired, notes it in its
/// run's history, in the caller's transaction.
pub async fn done(tx: &Transaction<'_>, d: &Due, noted: Option<&Value>) -> Result<()> {
    let stmt = tx.prepare_cached("DELETE FROM run_deadlines WHERE run_id = $1 AND node_id = $2 AND idx = $3").await?;
    tx.execute(&stmt, &[&d.run_id, &d.node_id, &d.idx]).await?;
    if let Some(payload) = noted {
        let stmt = tx
            .prepare_cached("INSERT INTO run_events (run_id, type, payload) VALUES ($1, 'DeadlinePassed', $2)")
            .await?;
        tx.execute(&stmt, &[&d.run_id, payload]).await?;
    }
    Ok(())
}
