//! Updates sent to runs, each answered once by its id: an accepted one is
//! recorded in the engine's transaction that completes its step
//! ([`record_accepted`]), a refused one on its own ([`record_refused`]); a
//! retry of the same id reads the answer ([`find`]).

use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// An update a step accepted, as the engine records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub id: String,
    pub name: String,
    pub digest: String,
    pub node_id: String,
    pub output: Value,
    /// The definition version that decided it: applied only while the run
    /// is still on it (a move to another version since sends it back).
    pub definition: Uuid,
}

/// An update's answer, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateRow {
    pub update_id: String,
    pub name: String,
    pub digest: String,
    pub node_id: String,
    pub accepted: bool,
    pub output: Option<Value>,
    pub reason: Option<String>,
}

/// Records `u` as accepted by a step of `run`, in the transaction that
/// completes the step: false when an update of that id was recorded before
/// (the step is then not completed again).
pub async fn record_accepted(tx: &Transaction<'_>, run: Uuid, u: &Accepted) -> Result<bool> {
    let n = tx
        .execute(
            "INSERT INTO run_updates (run_id, update_id, name, digest, node_id, accepted, output)
             VALUES ($1, $2, $3, $4, $5, true, $6) ON CONFLICT DO NOTHING",
            &[&run, &u.id, &u.name, &u.digest, &u.node_id, &u.output],
        )
        .await?;
    Ok(n == 1)
}

/// Takes back what [`record_accepted`] wrote when the step did not take
/// the update after all (it was no longer waiting).
pub async fn forget(tx: &Transaction<'_>, run: Uuid, id: &str) -> Result<()> {
    tx.execute("DELETE FROM run_updates WHERE run_id = $1 AND update_id = $2", &[&run, &id]).await?;
    Ok(())
}

/// Records an update refused by step `node_id` of `run`, and why (nothing
/// when one of that id was recorded first: [`find`] reads which).
pub async fn record_refused(
    client: &Client,
    run: Uuid,
    (id, name, digest): (&str, &str, &str),
    node_id: &str,
    reason: &str,
) -> Result<()> {
    client
        .execute(
            "INSERT INTO run_updates (run_id, update_id, name, digest, node_id, accepted, reason)
             VALUES ($1, $2, $3, $4, $5, false, $6) ON CONFLICT DO NOTHING",
            &[&run, &id, &name, &digest, &node_id, &reason],
        )
        .await?;
    Ok(())
}

/// The answer recorded for update `id` of `run`, if any.
pub async fn find(client: &Client, run: Uuid, id: &str) -> Result<Option<UpdateRow>> {
    let row = client
        .query_opt(
            "SELECT update_id, name, digest, node_id, accepted, output, reason FROM run_updates
              WHERE run_id = $1 AND update_id = $2",
            &[&run, &id],
        )
        .await?;
    row.map(|r| {
        Ok(UpdateRow {
            update_id: r.try_get(0)?,
            name: r.try_get(1)?,
            digest: r.try_get(2)?,
            node_id: r.try_get(3)?,
            accepted: r.try_get(4)?,
            output: r.try_get(5)?,
            reason: r.try_get(6)?,
        })
    })
    .transpose()
}

/// Forgets answers recorded more than `older_than` ago: an update id
/// sent again after that is a new update.
pub async fn forget_old(client: &Client, older_than: std::time::Duration) -> Result<u64> {
    Ok(client
        .execute(
            "DELETE FROM run_updates WHERE created_at < now() - make_interval(secs => $1)",
            &[&older_than.as_secs_f64()],
        )
        .await?)
}
