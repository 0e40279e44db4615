//! Moving a run to another version of its workflow: its row names the new
//! definition, and its steps' rows (a MAP's items with their MAP) the new
//! version's nodes. The engine does this in the transaction that applies
//! the move, under the run's lock.

use uuid::Uuid;

use crate::{Result, Transaction};

/// Points run `run_id` at `definition` (its id and version) and renames
/// its steps' nodes, old id → new id (a swap included: every row is
/// matched on its old name).
pub async fn move_to(
    tx: &Transaction<'_>,
    run_id: Uuid,
    definition: (Uuid, i32),
    renamed: &[(String, String)],
) -> Result<()> {
    tx.execute(
        "UPDATE workflow_runs SET workflow_definition_id = $2, workflow_version = $3, updated_at = now() WHERE id = $1",
        &[&run_id, &definition.0, &definition.1],
    )
    .await?;
    if renamed.is_empty() {
        return Ok(());
    }
    let (from, to): (Vec<&str>, Vec<&str>) = renamed.iter().map(|(a, b)| (a.as_str(), b.as_str())).unzip();
    tx.execute(
        "UPDATE task_instances t
            SET node_id = m.to_id || substr(t.node_id, length(m.from_id) + 1), updated_at = now()
           FROM unnest($2::text[], $3::text[]) AS m(from_id, to_id)
          WHERE t.run_id = $1
            AND (t.node_id = m.from_id OR left(t.node_id, length(m.from_id) + 1) = m.from_id || '[')",
        &[&run_id, &from, &to],
    )
    .await?;
    Ok(())
}
