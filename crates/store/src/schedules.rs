//! Schedules and their fires. The timer loop takes a due schedule with
//! `FOR UPDATE SKIP LOCKED` ([`lock_due`]), starts its runs and moves
//! `next_fire_at` forward ([`advance`]) in one transaction, so any number of
//! coordinators start each fire time once; [`record_fire`]'s primary key on
//! `(schedule, fire time)` refuses a second start outright. A backfill
//! queues past fire times on the same table ([`queue_backfill`]), which the
//! timer loop starts ([`queued`]).

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

#[derive(Debug, Clone)]
pub struct ScheduleRow {
    pub id: String,
    /// The schedule as its author wrote it.
    pub spec: Value,
    pub workflow: String,
    pub paused: bool,
    pub next_fire_at: Option<DateTime<Utc>>,
    pub buffered_fire_at: Option<DateTime<Utc>>,
    pub last_run_id: Option<Uuid>,
    /// Why the latest fire time started no run, when it failed.
    pub last_fire_error: Option<String>,
    /// Backfilled fire times waiting for the timer loop to start them.
    pub backfill_queued: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

// The subquery's `id` is the schedule's (schedule_fires has no column of
// that name), whatever the outer query calls the table.
const COLUMNS: &str = "id, spec, workflow, paused, next_fire_at, buffered_fire_at, last_run_id, created_at, updated_at,
     (SELECT count(*) FROM schedule_fires q WHERE q.schedule_id = id AND q.outcome = 'queued') AS backfill_queued,
     (SELECT f.error FROM schedule_fires f WHERE f.schedule_id = id AND f.outcome <> 'queued'
       ORDER BY f.fire_time DESC LIMIT 1) AS last_fire_error";

impl ScheduleRow {
    fn from_row(r: &Row) -> Result<ScheduleRow> {
        Ok(ScheduleRow {
            id: r.try_get("id")?,
            spec: r.try_get("spec")?,
            workflow: r.try_get("workflow")?,
            paused: r.try_get("paused")?,
            next_fire_at: r.try_get("next_fire_at")?,
            buffered_fire_at: r.try_get("buffered_fire_at")?,
            last_run_id: r.try_get("last_run_id")?,
            last_fire_error: r.try_get("last_fire_error")?,
            backfill_queued: r.try_get("backfill_queued")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
        })
    }
}

/// What [`upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Created,
    Updated,
    /// The same spec was already there.
    Unchanged,
}

/// Creates or replaces schedule `id`; a replaced schedule starts afresh from
/// `next_fire_at` (its buffered fire and its queued backfill are dropped).
pub async fn upsert(
    client: &mut Client,
    id: &str,
    spec: &Value,
    workflow: &str,
    paused: bool,
    next_fire_at: Option<DateTime<Utc>>,
) -> Result<(ScheduleRow, Upsert)> {
    let tx = crate::begin(client).await?;
    let existing = tx.query_opt(&format!("SELECT {COLUMNS} FROM schedules WHERE id = $1 FOR UPDATE"), &[&id]).await?;
    if let Some(row) = existing {
        let row = ScheduleRow::from_row(&row)?;
        if &row.spec == spec {
            return Ok((row, Upsert::Unchanged));
        }
        // A backfill was asked of the schedule as it was: its fire times are
        // not the new cron's.
        tx.execute("DELETE FROM schedule_fires WHERE schedule_id = $1 AND outcome = 'queued'", &[&id]).await?;
        let row = tx
            .query_one(
                &format!(
                    "UPDATE schedules SET spec = $2, workflow = $3, paused = $4, next_fire_at = $5,
                            buffered_fire_at = NULL, updated_at = now()
                      WHERE id = $1 RETURNING {COLUMNS}"
                ),
                &[&id, spec, &workflow, &paused, &next_fire_at],
            )
            .await?;
        tx.commit().await?;
        return Ok((ScheduleRow::from_row(&row)?, Upsert::Updated));
    }
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO schedules (id, spec, workflow, paused, next_fire_at) VALUES ($1, $2, $3, $4, $5)
                 RETURNING {COLUMNS}"
            ),
            &[&id, spec, &workflow, &paused, &next_fire_at],
        )
        .await?;
    tx.commit().await?;
    Ok((ScheduleRow::from_row(&row)?, Upsert::Created))
}

pub async fn get(client: &Client, id: &str) -> Result<Option<ScheduleRow>> {
    let row = client.query_opt(&format!("SELECT {COLUMNS} FROM schedules WHERE id = $1"), &[&id]).await?;
    row.map(|r| ScheduleRow::from_row(&r)).transpose()
}

/// A page of schedules by id, after `after`.
pub async fn list(client: &Client, after: Option<&str>, limit: i64) -> Result<Vec<ScheduleRow>> {
    let rows = client
        .query(
            &format!("SELECT {COLUMNS} FROM schedules WHERE ($1::text IS NULL OR id > $1) ORDER BY id LIMIT $2"),
            &[&after, &limit],
        )
        .await?;
    rows.iter().map(ScheduleRow::from_row).collect()
}

/// Removes a schedule (its runs stay); false when there was none.
pub async fn delete(client: &Client, id: &str) -> Result<bool> {
    Ok(client.execute("DELETE FROM schedules WHERE id = $1", &[&id]).await? > 0)
}

/// Pauses, or resumes from `next_fire_at` (the fire times of the pause are
/// not caught up); `None` when there is no such schedule.
pub async fn set_paused(
    client: &Client,
    id: &str,
    paused: bool,
    next_fire_at: Option<DateTime<Utc>>,
) -> Result<Option<ScheduleRow>> {
    let row = client
        .query_opt(
            &format!(
                "UPDATE schedules
                    SET paused = $2, updated_at = now(),
                        next_fire_at = CASE WHEN $2 THEN next_fire_at ELSE $3 END,
                        buffered_fire_at = CASE WHEN $2 THEN buffered_fire_at ELSE NULL END
                  WHERE id = $1 RETURNING {COLUMNS}"
            ),
            &[&id, &paused, &next_fire_at],
        )
        .await?;
    row.map(|r| ScheduleRow::from_row(&r)).transpose()
}

/// A schedule with work to do — a fire time that has come, or a buffered
/// fire whose blocking run has ended — locked, skipping ones another
/// coordinator holds.
pub async fn lock_due(tx: &Transaction<'_>) -> Result<Option<ScheduleRow>> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT {COLUMNS} FROM schedules s
                  WHERE NOT s.paused
                    AND (s.next_fire_at <= now()
                         OR (s.buffered_fire_at IS NOT NULL AND NOT EXISTS (
                               SELECT 1 FROM workflow_runs r
                                WHERE r.id = s.last_run_id AND r.status IN ('QUEUED', 'RUNNING', 'PAUSED')))
                         -- A backfilled fire that may start now (as [`queued`] finds them).
                         OR EXISTS (
                               SELECT 1 FROM schedule_fires f
                                WHERE f.schedule_id = s.id AND f.outcome = 'queued'
                                  AND (f.backfill <> 'buffer_all' OR NOT EXISTS (
                                        SELECT 1 FROM workflow_runs r
                                         WHERE r.id = s.last_run_id
                                           AND r.status IN ('QUEUED', 'RUNNING', 'PAUSED')))))
                  ORDER BY s.next_fire_at NULLS LAST
                  LIMIT 1 FOR UPDATE SKIP LOCKED"
            ),
            &[],
        )
        .await?;
    row.map(|r| ScheduleRow::from_row(&r)).transpose()
}

/// Locks schedule `id` (for a manual trigger).
pub async fn lock(tx: &Transaction<'_>, id: &str) -> Result<Option<ScheduleRow>> {
    let row = tx.query_opt(&format!("SELECT {COLUMNS} FROM schedules WHERE id = $1 FOR UPDATE"), &[&id]).await?;
    row.map(|r| ScheduleRow::from_row(&r)).transpose()
}

/// Whether run `id` is still open (QUEUED, RUNNING or PAUSED).
pub async fn run_is_open(tx: &Transaction<'_>, id: Uuid) -> Result<bool> {
    let row = tx
        .query_opt("SELECT 1 FROM workflow_runs WHERE id = $1 AND status IN ('QUEUED', 'RUNNING', 'PAUSED')", &[&id])
        .await?;
    Ok(row.is_some())
}

/// Records what a fire time did; false when it was recorded already (the
/// fire time was handled, and must not start another run).
pub async fn record_fire(
    tx: &Transaction<'_>,
    id: &str,
    fire_time: DateTime<Utc>,
    outcome: &str,
    run_id: Option<Uuid>,
) -> Result<bool> {
    let n = tx
        .execute(
            "INSERT INTO schedule_fires (schedule_id, fire_time, outcome, run_id) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
            &[&id, &fire_time, &outcome, &run_id],
        )
        .await?;
    Ok(n == 1)
}

/// Queues backfilled fire times (`overlap`: allow, skip or buffer_all) for
/// the timer loop; returns how many were queued. A fire time already
/// recorded — started, queued, buffered — is left alone, so asking twice
/// queues nothing twice; one that was skipped is queued again.
pub async fn queue_backfill(
    tx: &Transaction<'_>,
    id: &str,
    fire_times: &[DateTime<Utc>],
    overlap: &str,
) -> Result<u64> {
    Ok(tx
        .execute(
            "INSERT INTO schedule_fires (schedule_id, fire_time, outcome, backfill)
             SELECT $1, t, 'queued', $3 FROM unnest($2::timestamptz[]) AS t
             ON CONFLICT (schedule_id, fire_time) DO UPDATE
                SET outcome = 'queued', backfill = EXCLUDED.backfill, run_id = NULL, error = NULL, created_at = now()
              WHERE schedule_fires.outcome IN ('skipped', 'failed')",
            &[&id, &fire_times, &overlap],
        )
        .await?)
}

/// A backfilled fire time waiting to start.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedFire {
    pub fire_time: DateTime<Utc>,
    /// Its overlap: allow, skip or buffer_all.
    pub overlap: String,
}

/// The oldest `limit` backfilled fire times of schedule `id` that may start
/// now: with a run of the schedule `open`, buffer_all ones wait.
pub async fn queued(tx: &Transaction<'_>, id: &str, open: bool, limit: i64) -> Result<Vec<QueuedFire>> {
    let rows = tx
        .query(
            "SELECT fire_time, backfill FROM schedule_fires
              WHERE schedule_id = $1 AND outcome = 'queued' AND (NOT $2 OR backfill <> 'buffer_all')
              ORDER BY fire_time LIMIT $3",
            &[&id, &open, &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(QueuedFire { fire_time: r.try_get(0)?, overlap: r.try_get::<_, Option<String>>(1)?.unwrap_or_default() })
        })
        .collect()
}

/// Marks a queued backfilled fire time skipped (a run was open).
pub async fn skip_fire(tx: &Transaction<'_>, id: &str, fire_time: DateTime<Utc>) -> Result<()> {
    tx.execute(
        "UPDATE schedule_fires SET outcome = 'skipped' WHERE schedule_id = $1 AND fire_time = $2",
        &[&id, &fire_time],
    )
    .await?;
    Ok(())
}

/// A fire time whose run could not start, and why. Its row is the
/// caller's (written earlier in the same transaction, or queued by a
/// backfill, which may ask for it again).
pub async fn fail_fire(tx: &Transaction<'_>, id: &str, fire_time: DateTime<Utc>, error: &str) -> Result<()> {
    tx.execute(
        "UPDATE schedule_fires SET outcome = 'failed', error = $3, run_id = NULL
          WHERE schedule_id = $1 AND fire_time = $2",
        &[&id, &fire_time, &error],
    )
    .await?;
    Ok(())
}

/// Sets the run a fire started.
pub async fn set_fire_run(tx: &Transaction<'_>, id: &str, fire_time: DateTime<Utc>, run_id: Uuid) -> Result<()> {
    tx.execute(
        "UPDATE schedule_fires SET run_id = $3, outcome = 'started' WHERE schedule_id = $1 AND fire_time = $2",
        &[&id, &fire_time, &run_id],
    )
    .await?;
    Ok(())
}

/// Where the schedule stands after a pass of the timer loop.
pub async fn advance(
    tx: &Transaction<'_>,
    id: &str,
    next_fire_at: Option<DateTime<Utc>>,
    buffered_fire_at: Option<DateTime<Utc>>,
    last_run_id: Option<Uuid>,
) -> Result<()> {
    tx.execute(
        "UPDATE schedules SET next_fire_at = $2, buffered_fire_at = $3, last_run_id = $4, updated_at = now()
          WHERE id = $1",
        &[&id, &next_fire_at, &buffered_fire_at, &last_run_id],
    )
    .await?;
    Ok(())
}

/// Forgets fires recorded before `before` (the key only needs to cover fire
/// times a coordinator could still be handling); returns how many.
pub async fn forget_fires(client: &Client, before: DateTime<Utc>) -> Result<u64> {
    Ok(client.execute("DELETE FROM schedule_fires WHERE created_at < $1 AND outcome <> 'queued'", &[&before]).await?)
}
