//! Counts of open work, for the metrics gauges. Each count reads only open
//! rows through a partial index, so its cost does not grow with history.

use crate::{Client, Result};

/// What is in flight right now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpenWork {
    pub outbox_backlog: i64,
    /// Age of the oldest outbox row, in seconds (0 when empty).
    pub outbox_oldest_age: f64,
    pub pending_tasks: i64,
    pub running_tasks: i64,
    pub waiting_tasks: i64,
    pub running_runs: i64,
    /// WAITING tasks whose wake-up time has passed.
    pub due_timers: i64,
}

/// A queue's dispatched tasks no worker has started: how many, and how long
/// the oldest has waited (seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueBacklog {
    pub queue: String,
    pub tasks: i64,
    pub oldest_age: f64,
}

/// Per queue, through the partial index of PENDING tasks (open work only).
pub async fn queue_backlogs(client: &Client) -> Result<Vec<QueueBacklog>> {
    let rows = client
        .query(
            "SELECT queue, count(*), COALESCE(extract(epoch FROM now() - min(updated_at))::float8, 0)
               FROM task_instances WHERE state = 'PENDING' AND queue IS NOT NULL GROUP BY queue",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| Ok(QueueBacklog { queue: r.try_get(0)?, tasks: r.try_get(1)?, oldest_age: r.try_get(2)? }))
        .collect()
}

/// One statement, so the figures are of one snapshot.
pub async fn open_work(client: &Client) -> Result<OpenWork> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM outbox) AS outbox_backlog,
                    (SELECT COALESCE(extract(epoch FROM now() - min(created_at))::float8, 0) FROM outbox)
                        AS outbox_oldest_age,
                    (SELECT count(*) FROM task_instances WHERE state = 'PENDING') AS pending_tasks,
                    (SELECT count(*) FROM task_instances WHERE state = 'RUNNING') AS running_tasks,
                    (SELECT count(*) FROM task_instances WHERE state = 'WAITING') AS waiting_tasks,
                    (SELECT count(*) FROM workflow_runs WHERE status = 'RUNNING') AS running_runs,
                    (SELECT count(*) FROM task_instances WHERE state = 'WAITING' AND wake_at <= now()) AS due_timers",
            &[],
        )
        .await?;
    Ok(OpenWork {
        outbox_backlog: row.try_get("outbox_backlog")?,
        outbox_oldest_age: row.try_get("outbox_oldest_age")?,
        pending_tasks: row.try_get("pending_tasks")?,
        running_tasks: row.try_get("running_tasks")?,
        waiting_tasks: row.try_get("waiting_tasks")?,
        running_runs: row.try_get("running_runs")?,
        due_timers: row.try_get("due_timers")?,
    })
}

/// Runs by status among those created at or after the moment of `since` (a
/// UUIDv7): one index-only count per status over `(status, id)`.
pub async fn runs_by_status(client: &Client, since: uuid::Uuid) -> Result<Vec<(String, i64)>> {
    let rows = client
        .query(
            "SELECT s, (SELECT count(*) FROM workflow_runs WHERE status = s AND id >= $1)
               FROM unnest($2::text[]) AS s",
            &[&since, &composer_core::machine::RunStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>()],
        )
        .await?;
    let mut out = Vec::new();
    for r in rows {
        let n: i64 = r.try_get(1)?;
        if n > 0 {
            out.push((r.try_get(0)?, n));
        }
    }
    Ok(out)
}

/// Most runs (newest first) the per-minute throughput reads.
pub const THROUGHPUT_SAMPLE: i64 = 200_000;

/// Runs that ended in each minute of the last hour, among the newest
/// [`THROUGHPUT_SAMPLE`] runs created since `since`: `(minute, count)`.
pub async fn ended_per_minute(client: &Client, since: uuid::Uuid) -> Result<Vec<(chrono::DateTime<chrono::Utc>, i64)>> {
    let rows = client
        .query(
            "SELECT date_trunc('minute', finished_at) AS m, count(*) FROM (
                SELECT finished_at FROM workflow_runs WHERE id >= $1 ORDER BY id DESC LIMIT $2) AS r
              WHERE finished_at >= now() - interval '1 hour' GROUP BY m ORDER BY m",
            &[&since, &THROUGHPUT_SAMPLE],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// Most steps (of the newest runs) the latency percentiles read.
pub const LATENCY_SAMPLE: i64 = 20_000;

/// Percentiles (p50, p95, p99, in ms) of steps: how long each ran (started
/// → ended) and how long it waited to start (created → started); `None`
/// when no step ended.
pub struct StepLatency {
    pub ran: Option<(f64, f64, f64)>,
    pub waited: Option<(f64, f64, f64)>,
    pub steps: i64,
}

/// The latency of the steps that ended in the last hour, among the newest
/// [`LATENCY_SAMPLE`] steps of runs created since `since`.
pub async fn step_latency(client: &Client, since: uuid::Uuid) -> Result<StepLatency> {
    let row = client
        .query_one(
            "SELECT count(*),
                    percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY
                        extract(epoch FROM finished_at - started_at) * 1000),
                    percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY
                        extract(epoch FROM started_at - created_at) * 1000)
               FROM (SELECT created_at, started_at, finished_at FROM task_instances
                      WHERE run_id >= $1 ORDER BY run_id DESC LIMIT $2) AS t
              WHERE finished_at >= now() - interval '1 hour' AND started_at IS NOT NULL",
            &[&since, &LATENCY_SAMPLE],
        )
        .await?;
    let triple = |v: Option<Vec<f64>>| v.filter(|v| v.len() == 3).map(|v| (v[0], v[1], v[2]));
    Ok(StepLatency { steps: row.try_get(0)?, ran: triple(row.try_get(1)?), waited: triple(row.try_get(2)?) })
}

/// FAILED runs created since `since`, by workflow, most first (at most 20).
pub async fn failures_by_workflow(client: &Client, since: uuid::Uuid) -> Result<Vec<(String, i64)>> {
    let rows = client
        .query(
            "SELECT workflow_name, count(*) FROM workflow_runs WHERE status = 'FAILED' AND id >= $1
              GROUP BY workflow_name ORDER BY count(*) DESC, workflow_name LIMIT 20",
            &[&since],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// A queue's open work: PENDING and RUNNING tasks, and how long the oldest
/// PENDING one has waited (seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueLoad {
    pub queue: String,
    pub pending: i64,
    pub running: i64,
    pub oldest_pending_age: Option<f64>,
}

/// Every queue with open work, through the partial indexes of PENDING and
/// RUNNING tasks.
pub async fn queue_loads(client: &Client) -> Result<Vec<QueueLoad>> {
    let rows = client
        .query(
            "SELECT queue, count(*) FILTER (WHERE state = 'PENDING'), count(*) FILTER (WHERE state = 'RUNNING'),
                    extract(epoch FROM now() - min(updated_at) FILTER (WHERE state = 'PENDING'))::float8
               FROM (SELECT queue, state, updated_at FROM task_instances WHERE state = 'PENDING'
                     UNION ALL
                     SELECT queue, state, updated_at FROM task_instances WHERE state = 'RUNNING') AS open
              WHERE queue IS NOT NULL GROUP BY queue ORDER BY queue",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(QueueLoad {
                queue: r.try_get(0)?,
                pending: r.try_get(1)?,
                running: r.try_get(2)?,
                oldest_pending_age: r.try_get(3)?,
            })
        })
        .collect()
}
