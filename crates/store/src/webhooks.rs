//! Webhooks: how a signed delivery from another service becomes an event.
//! The spec names the environment variable holding the signing secret; the
//! secret itself is never stored.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;

use crate::{Client, Result};

#[derive(Debug, Clone)]
pub struct WebhookRow {
    pub name: String,
    pub spec: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "name, spec, created_at, updated_at";

fn from_row(r: &Row) -> Result<WebhookRow> {
    Ok(WebhookRow {
        name: r.try_get("name")?,
        spec: r.try_get("spec")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Creates or replaces webhook `name`; true when it is new.
pub async fn upsert(client: &Client, name: &str, spec: &Value) -> Result<(WebhookRow, bool)> {
    let row = client
        .query_one(
            &format!(
                "INSERT INTO webhooks (name, spec) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()
                 RETURNING {COLUMNS}, (xmax = 0) AS created"
            ),
            &[&name, spec],
        )
        .await?;
    Ok((from_row(&row)?, row.try_get("created")?))
}

pub async fn get(client: &Client, name: &str) -> Result<Option<WebhookRow>> {
    let row = client.query_opt(&format!("SELECT {COLUMNS} FROM webhooks WHERE name = $1"), &[&name]).await?;
    row.map(|r| from_row(&r)).transpose()
}

/// Every webhook, by name (at most `limit`).
pub async fn list(client: &Client, limit: i64) -> Result<Vec<WebhookRow>> {
    let rows = client.query(&format!("SELECT {COLUMNS} FROM webhooks ORDER BY name LIMIT $1"), &[&limit]).await?;
    rows.iter().map(from_row).collect()
}

/// Removes webhook `name`; false when there was none.
pub async fn delete(client: &Client, name: &str) -> Result<bool> {
    Ok(client.execute("DELETE FROM webhooks WHERE name = $1", &[&name]).await? > 0)
}
