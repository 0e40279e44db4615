//! What an evaluation killed a coordinator on: a definition version's
//! start-time expressions or a webhook's transform, which no coordinator
//! evaluates again. Rows are written by their key (a second coordinator's
//! insert of one is a no-op) and read whole: the table holds what crashed a
//! coordinator, a handful of rows at most.

use crate::{Client, Result};

/// Quarantines `(kind, key)`; one already there keeps its first reason.
pub async fn add(client: &Client, kind: &str, key: &str, reason: &str) -> Result<()> {
    client
        .execute(
            "INSERT INTO quarantine (kind, key, reason) VALUES ($1, $2, $3) ON CONFLICT (kind, key) DO NOTHING",
            &[&kind, &key, &reason],
        )
        .await?;
    Ok(())
}

/// Every quarantined `(kind, key, reason)`.
pub async fn all(client: &Client) -> Result<Vec<(String, String, String)>> {
    let stmt = client.prepare_cached("SELECT kind, key, reason FROM quarantine").await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect()
}

/// Lifts the quarantine of `(kind, key)` (a webhook created again).
pub async fn lift(client: &Client, kind: &str, key: &str) -> Result<()> {
    client.execute("DELETE FROM quarantine WHERE kind = $1 AND key = $2", &[&kind, &key]).await?;
    Ok(())
}
