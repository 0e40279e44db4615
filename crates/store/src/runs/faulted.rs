//! Failing a run the engine cannot apply events to, in SQL rather than
//! through the state machine (applying events to it is what fails).

use composer_core::machine::HistoryKind;
use uuid::Uuid;

use crate::{Client, Result};

/// Fails an open run that the engine cannot apply events to (an event that
/// fails every time it is applied): the run FAILED with `error`, its open
/// tasks CANCELLED with their timers and leases cleared, its undispatched
/// work dropped, a history line, and the run-done notification. Written in
/// SQL, not through the state machine, because applying events to this run
/// is what fails. Returns false when the run was already finished.
pub async fn fail_faulted(client: &mut Client, run_id: Uuid, error: &str) -> Result<bool> {
    let tx = crate::begin(client).await?;
    let failed = tx
        .execute(
            "UPDATE workflow_runs SET status = 'FAILED', error = $2, updated_at = now(), finished_at = now()
             WHERE id = $1 AND status IN ('RUNNING', 'PAUSED')",
            &[&run_id, &error],
        )
        .await?;
    if failed == 0 {
        return Ok(false);
    }
    tx.execute(
        "UPDATE task_instances SET state = 'CANCELLED', lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL,
                finished_at = now(), updated_at = now()
         WHERE run_id = $1 AND state IN ('PENDING', 'RUNNING', 'WAITING')",
        &[&run_id],
    )
    .await?;
    tx.execute("DELETE FROM outbox WHERE run_id = $1", &[&run_id]).await?;
    let payload = serde_json::json!({"error": error});
    tx.execute(
        "INSERT INTO run_events (run_id, type, payload) VALUES ($1, $2, $3)",
        &[&run_id, &HistoryKind::RunFailed.as_str(), &payload],
    )
    .await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&crate::transitions::RUN_DONE_CHANNEL, &run_id.to_string()]).await?;
    tx.commit().await?;
    Ok(true)
}
