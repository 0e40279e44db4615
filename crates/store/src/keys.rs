//! API keys, kept by the SHA-256 of their secret part (the caller hashes;
//! the key itself is only ever in its holder's hands). Every statement
//! touches rows by their id, so any number of coordinators may run them.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result};

#[derive(Debug, Clone)]
pub struct KeyRow {
    pub id: Uuid,
    pub name: String,
    pub secret_hash: Vec<u8>,
    pub scopes: Vec<String>,
    pub queues: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// The namespace it is bound to; `None`: every namespace.
    pub namespace: Option<String>,
}

/// A key to record: everything but its times.
pub struct NewKey<'a> {
    pub id: Uuid,
    pub name: &'a str,
    pub secret_hash: &'a [u8],
    pub scopes: &'a [String],
    pub queues: Option<&'a [String]>,
    pub created_by: &'a str,
    /// Seconds from now, by PostgreSQL's clock.
    pub expires_in_secs: Option<f64>,
    pub namespace: Option<&'a str>,
}

const COLUMNS: &str =
    "id, name, secret_hash, scopes, queues, created_at, created_by, expires_at, revoked_at, namespace";

fn from_row(r: &Row) -> Result<KeyRow> {
    Ok(KeyRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        secret_hash: r.try_get("secret_hash")?,
        scopes: r.try_get("scopes")?,
        queues: r.try_get("queues")?,
        created_at: r.try_get("created_at")?,
        created_by: r.try_get("created_by")?,
        expires_at: r.try_get("expires_at")?,
        revoked_at: r.try_get("revoked_at")?,
        namespace: r.try_get("namespace")?,
    })
}

pub async fn create(client: &Client, key: &NewKey<'_>) -> Result<KeyRow> {
    let row = client
        .query_one(
            &format!(
                "INSERT INTO api_keys (id, name, secret_hash, scopes, queues, created_by, expires_at, namespace)
                 VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8)
                 RETURNING {COLUMNS}"
            ),
            &[
                &key.id,
                &key.name,
                &key.secret_hash,
                &key.scopes,
                &key.queues,
                &key.created_by,
                &key.expires_in_secs,
                &key.namespace,
            ],
        )
        .await?;
    from_row(&row)
}

pub async fn get(client: &Client, id: Uuid) -> Result<Option<KeyRow>> {
    let stmt = client.prepare_cached(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = $1")).await?;
    client.query_opt(&stmt, &[&id]).await?.map(|r| from_row(&r)).transpose()
}

/// Keys, newest first (at most `limit`): every key, or only those bound to
/// namespace `bound` when there is one.
pub async fn list(client: &Client, bound: Option<&str>, limit: i64) -> Result<Vec<KeyRow>> {
    let rows = client
        .query(
            &format!(
                "SELECT {COLUMNS} FROM api_keys WHERE ($1::text IS NULL OR namespace = $1)
                 ORDER BY created_at DESC, id LIMIT $2"
            ),
            &[&bound, &limit],
        )
        .await?;
    rows.iter().map(from_row).collect()
}

/// Revokes a key (revoking one already revoked keeps its first time);
/// `None` when there is no such key.
pub async fn revoke(client: &Client, id: Uuid) -> Result<Option<KeyRow>> {
    let row = client
        .query_opt(
            &format!("UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 RETURNING {COLUMNS}"),
            &[&id],
        )
        .await?;
    row.map(|r| from_row(&r)).transpose()
}
