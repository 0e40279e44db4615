//! Logins to the web UI, kept by the SHA-256 of their id (the caller
//! hashes; the id itself is only ever in the browser's cookie). Every
//! statement touches rows by their key or by expiry, so any number of
//! coordinators may run them at once.

use std::time::Duration;

use crate::{Client, Result};

/// Records a session that lasts `ttl`, and drops the sessions that have
/// expired (so the table holds only live ones; deleting an expired row
/// twice, from two coordinators, is harmless).
pub async fn create(client: &Client, id_hash: &[u8], ttl: Duration) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "WITH expired AS (DELETE FROM ui_sessions WHERE expires_at < now())
             INSERT INTO ui_sessions (id_hash, expires_at) VALUES ($1, now() + make_interval(secs => $2))",
        )
        .await?;
    client.execute(&stmt, &[&id_hash, &ttl.as_secs_f64()]).await?;
    Ok(())
}

/// Whether a session exists and has not expired.
pub async fn live(client: &Client, id_hash: &[u8]) -> Result<bool> {
    let stmt = client
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM ui_sessions WHERE id_hash = $1 AND expires_at > now())")
        .await?;
    Ok(client.query_one(&stmt, &[&id_hash]).await?.try_get(0)?)
}

/// Ends a session (logout); ending one that is gone is no error.
pub async fn revoke(client: &Client, id_hash: &[u8]) -> Result<()> {
    let stmt = client.prepare_cached("DELETE FROM ui_sessions WHERE id_hash = $1").await?;
    client.execute(&stmt, &[&id_hash]).await?;
    Ok(())
}
