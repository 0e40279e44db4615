//! Tasks whose wake-up time has passed: WAITING ones (WAIT nodes, retry
//! backoffs, event timeouts) and dispatched attempts past their node's
//! timeout.

use uuid::Uuid;

use crate::{Client, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueWait {
    pub run_id: Uuid,
    pub task_id: Uuid,
}

/// Up to `limit` due waits, oldest first. A plain read: two coordinators may
/// both fire one timer, and the state machine's guard (the task must still
/// be WAITING) turns the second firing into a no-op.
pub async fn due(client: &Client, limit: i64) -> Result<Vec<DueWait>> {
    let stmt = client
        .prepare_cached(
            "(SELECT run_id, id, wake_at FROM task_instances
               WHERE state = 'WAITING' AND wake_at <= now() ORDER BY wake_at LIMIT $1)
             UNION ALL
             (SELECT run_id, id, wake_at FROM task_instances
               WHERE state IN ('PENDING', 'RUNNING') AND wake_at IS NOT NULL AND wake_at <= now()
               ORDER BY wake_at LIMIT $1)
             ORDER BY wake_at LIMIT $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&limit]).await?;
    rows.iter().map(|r| Ok(DueWait { run_id: r.try_get(0)?, task_id: r.try_get(1)? })).collect()
}

/// Open runs past their deadline (the definition's `timeout`), oldest first.
pub async fn overdue_runs(client: &Client, limit: i64) -> Result<Vec<Uuid>> {
    let stmt = client
        .prepare_cached(
            "SELECT id FROM workflow_runs
              WHERE status IN ('RUNNING', 'PAUSED') AND deadline IS NOT NULL AND deadline <= now()
              ORDER BY deadline LIMIT $1",
        )
        .await?;
    client.query(&stmt, &[&limit]).await?.iter().map(|r| Ok(r.try_get(0)?)).collect()
}
