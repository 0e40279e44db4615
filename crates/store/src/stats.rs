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
