//! Bulk jobs: an action (cancel, retry, pause, resume, rerun, migrate) over every run
//! a filter matches, worked through a batch at a time by any coordinator.
//!
//! Safe on many coordinators at once: a batch is taken under the job row's
//! lock (`FOR UPDATE SKIP LOCKED`: one coordinator works a job at a time),
//! and each run the job acts on is marked in `bulk_job_runs` in the commit
//! of the action itself ([`mark`]), so a batch taken again after a crash
//! acts on no run twice.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Error, Result, Transaction};

/// A bulk job as stored.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: Uuid,
    pub filter: Value,
    pub action: String,
    pub rerun_from: Option<Vec<String>>,
    /// What a migrate job moves runs to: `{definition, from_version, to_version, map}`.
    pub migrate: Option<Value>,
    pub actor: String,
    pub reason: Option<String>,
    pub status: String,
    pub matched: i64,
    pub looked_at: i64,
    pub acted_on: i64,
    pub refused: i64,
    pub cursor: Option<Uuid>,
    pub until_id: Uuid,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str =
    "id, filter, action, rerun_from, migrate, actor, reason, status, matched, looked_at, acted_on, refused, \
                       cursor, until_id, last_error, created_at, updated_at, finished_at";

impl JobRow {
    fn from_row(r: &tokio_postgres::Row) -> Result<JobRow> {
        Ok(JobRow {
            id: r.try_get("id")?,
            filter: r.try_get("filter")?,
            action: r.try_get("action")?,
            rerun_from: r.try_get("rerun_from")?,
            migrate: r.try_get("migrate")?,
            actor: r.try_get("actor")?,
            reason: r.try_get("reason")?,
            status: r.try_get("status")?,
            matched: r.try_get("matched")?,
            looked_at: r.try_get("looked_at")?,
            acted_on: r.try_get("acted_on")?,
            refused: r.try_get("refused")?,
            cursor: r.try_get("cursor")?,
            until_id: r.try_get("until_id")?,
            last_error: r.try_get("last_error")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            finished_at: r.try_get("finished_at")?,
        })
    }
}

/// A job to create.
pub struct NewJob<'a> {
    pub filter: &'a Value,
    pub action: &'a str,
    pub rerun_from: Option<&'a [String]>,
    pub migrate: Option<&'a Value>,
    pub actor: &'a str,
    pub reason: Option<&'a str>,
    pub matched: i64,
}

/// Creates a RUNNING job; runs created from now on are not its.
pub async fn create(client: &Client, job: &NewJob<'_>) -> Result<JobRow> {
    let id = Uuid::now_v7();
    let row = client
        .query_one(
            &format!(
                "INSERT INTO bulk_jobs (id, filter, action, rerun_from, migrate, actor, reason, status, matched, until_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'RUNNING', $8, $1) RETURNING {COLUMNS}"
            ),
            &[&id, job.filter, &job.action, &job.rerun_from, &job.migrate, &job.actor, &job.reason, &job.matched],
        )
        .await?;
    JobRow::from_row(&row)
}

pub async fn get(client: &Client, id: Uuid) -> Result<Option<JobRow>> {
    let row = client.query_opt(&format!("SELECT {COLUMNS} FROM bulk_jobs WHERE id = $1"), &[&id]).await?;
    row.as_ref().map(JobRow::from_row).transpose()
}

/// Cancels a RUNNING job (waiting for a batch being worked to end); the
/// job as it now stands, or `None` when there is no such job.
pub async fn cancel(client: &Client, id: Uuid) -> Result<Option<JobRow>> {
    client
        .execute(
            "UPDATE bulk_jobs SET status = 'CANCELLED', updated_at = now(), finished_at = now()
              WHERE id = $1 AND status = 'RUNNING'",
            &[&id],
        )
        .await?;
    get(client, id).await
}

/// Takes a RUNNING job to work a batch of, for the rest of the caller's
/// transaction; other coordinators skip it meanwhile. (NO KEY UPDATE: the
/// marks of the batch's actions reference the row, which takes KEY SHARE.)
pub async fn claim(tx: &Transaction<'_>) -> Result<Option<JobRow>> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT {COLUMNS} FROM bulk_jobs WHERE status = 'RUNNING'
                  ORDER BY updated_at LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED"
            ),
            &[],
        )
        .await?;
    row.as_ref().map(JobRow::from_row).transpose()
}

/// What one batch did, for [`advance`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Batch {
    pub cursor: Option<Uuid>,
    pub looked_at: i64,
    pub acted_on: i64,
    pub refused: i64,
    /// The filter matched nothing after this batch: the job is done.
    pub done: bool,
}

/// Records a batch on the claimed job, in the claim's transaction.
pub async fn advance(tx: &Transaction<'_>, id: Uuid, b: &Batch, last_error: Option<&str>) -> Result<()> {
    tx.execute(
        "UPDATE bulk_jobs
            SET cursor = coalesce($2, cursor), looked_at = looked_at + $3, acted_on = acted_on + $4,
                refused = refused + $5, last_error = coalesce($6, last_error), updated_at = now(),
                status = CASE WHEN $7 THEN 'SUCCEEDED' ELSE status END,
                finished_at = CASE WHEN $7 THEN now() ELSE finished_at END
          WHERE id = $1",
        &[&id, &b.cursor, &b.looked_at, &b.acted_on, &b.refused, &last_error, &b.done],
    )
    .await?;
    Ok(())
}

/// Marks that job `job` acts on run `run`, in the transaction of the
/// action: false when it already did (the action is then not applied).
pub async fn mark(tx: &Transaction<'_>, job: Uuid, run: Uuid) -> Result<bool> {
    let stmt =
        tx.prepare_cached("INSERT INTO bulk_job_runs (job_id, run_id) VALUES ($1, $2) ON CONFLICT DO NOTHING").await?;
    Ok(tx.execute(&stmt, &[&job, &run]).await? == 1)
}

/// Deletes jobs that ended more than `older_than` ago, with their marks.
pub async fn cleanup(client: &Client, older_than: std::time::Duration) -> Result<u64> {
    Ok(client
        .execute(
            "DELETE FROM bulk_jobs WHERE status <> 'RUNNING' AND finished_at < now() - make_interval(secs => $1)",
            &[&older_than.as_secs_f64()],
        )
        .await?)
}

/// A stored filter's field, for the caller that reads it back.
pub fn field<'a>(filter: &'a Value, key: &str) -> Result<Option<&'a str>> {
    match &filter[key] {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        other => Err(Error::Corrupt(format!("bulk filter field {key} is {other}"))),
    }
}
