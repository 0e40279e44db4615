//! WAITING tasks whose wake-up time has passed: WAIT nodes and retry backoffs.

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
            "SELECT run_id, id FROM task_instances
              WHERE state = 'WAITING' AND wake_at <= now() ORDER BY wake_at LIMIT $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&limit]).await?;
    Ok(rows.iter().map(|r| DueWait { run_id: r.get(0), task_id: r.get(1) }).collect())
}
