//! Workflow definitions. Versions are immutable: registering a changed spec
//! adds version + 1, registering the latest spec again returns it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result};

#[derive(Debug, Clone)]
pub struct DefinitionRow {
    pub id: Uuid,
    pub name: String,
    pub version: i32,
    pub spec: Value,
    pub created_at: DateTime<Utc>,
}

impl DefinitionRow {
    fn from_row(r: &Row) -> Result<DefinitionRow> {
        Ok(DefinitionRow {
            id: r.try_get("id")?,
            name: r.try_get("name")?,
            version: r.try_get("version")?,
            spec: r.try_get("spec")?,
            created_at: r.try_get("created_at")?,
        })
    }
}

/// The outcome of registering a spec.
#[derive(Debug, Clone)]
pub enum Registered {
    Created(DefinitionRow),
    /// The spec equals the latest version's; nothing was written.
    Unchanged(DefinitionRow),
}

const COLUMNS: &str = "id, name, version, spec, created_at";

/// Registers `spec` (already validated and normalized) under `name`, whose
/// triggers listen to `trigger_events`. The per-name advisory lock
/// serializes concurrent registrations of one name, so two coordinators
/// cannot both create version N, and the triggers that apply are always the
/// latest version's.
pub async fn register(client: &mut Client, name: &str, spec: &Value, trigger_events: &[String]) -> Result<Registered> {
    let tx = crate::begin(client).await?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('composer_definition:' || $1))", &[&name]).await?;
    let latest = tx
        .query_opt(
            &format!("SELECT {COLUMNS} FROM workflow_definitions WHERE name = $1 ORDER BY version DESC LIMIT 1"),
            &[&name],
        )
        .await?
        .map(|r| DefinitionRow::from_row(&r))
        .transpose()?;
    if let Some(latest) = latest {
        if &latest.spec == spec {
            return Ok(Registered::Unchanged(latest));
        }
    }
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO workflow_definitions (id, name, version, spec)
                 SELECT $1, $2, COALESCE(MAX(version), 0) + 1, $3 FROM workflow_definitions WHERE name = $2
                 RETURNING {COLUMNS}"
            ),
            &[&Uuid::now_v7(), &name, spec],
        )
        .await?;
    crate::triggers::set_for_workflow(&tx, name, trigger_events).await?;
    tx.commit().await?;
    Ok(Registered::Created(DefinitionRow::from_row(&row)?))
}

/// The id of the latest version of each of `names` that exists.
pub async fn latest_ids(client: &Client, names: &[String]) -> Result<Vec<Uuid>> {
    let stmt = client
        .prepare_cached(
            "SELECT DISTINCT ON (name) id FROM workflow_definitions
              WHERE name = ANY($1) ORDER BY name, version DESC",
        )
        .await?;
    let rows = client.query(&stmt, &[&names]).await?;
    rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
}

/// The definitions of `ids` that exist.
pub async fn by_ids(client: &Client, ids: &[Uuid]) -> Result<Vec<DefinitionRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let stmt = client.prepare_cached(&format!("SELECT {COLUMNS} FROM workflow_definitions WHERE id = ANY($1)")).await?;
    client.query(&stmt, &[&ids]).await?.iter().map(DefinitionRow::from_row).collect()
}

pub async fn by_id(client: &Client, id: Uuid) -> Result<Option<DefinitionRow>> {
    let stmt = client.prepare_cached(&format!("SELECT {COLUMNS} FROM workflow_definitions WHERE id = $1")).await?;
    client.query_opt(&stmt, &[&id]).await?.map(|r| DefinitionRow::from_row(&r)).transpose()
}

/// The given version of `name`, or its latest when `version` is `None`
/// (on a connection, or inside a transaction).
pub async fn by_name(
    client: &impl deadpool_postgres::GenericClient,
    name: &str,
    version: Option<i32>,
) -> Result<Option<DefinitionRow>> {
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM workflow_definitions
              WHERE name = $1 AND ($2::int4 IS NULL OR version = $2)
              ORDER BY version DESC LIMIT 1"
        ))
        .await?;
    client.query_opt(&stmt, &[&name, &version]).await?.map(|r| DefinitionRow::from_row(&r)).transpose()
}

/// Every version of `name`, newest first.
/// A page of `name`'s versions, newest first, before version `before`,
/// without their specs.
pub async fn versions(client: &Client, name: &str, before: Option<i32>, limit: i64) -> Result<Vec<DefinitionRow>> {
    // Metadata only: a page of versions must not load every spec.
    let rows = client
        .query(
            "SELECT id, name, version, 'null'::jsonb AS spec, created_at FROM workflow_definitions
              WHERE name = $1 AND ($2::int IS NULL OR version < $2)
              ORDER BY version DESC LIMIT $3",
            &[&name, &before, &limit],
        )
        .await?;
    rows.iter().map(DefinitionRow::from_row).collect()
}

/// The latest version of every workflow, by name, at most `limit`.
pub async fn latest_of_each(client: &Client, limit: i64) -> Result<Vec<DefinitionRow>> {
    let rows = client
        .query(
            &format!(
                "SELECT DISTINCT ON (name) {COLUMNS} FROM workflow_definitions
                  ORDER BY name, version DESC LIMIT $1"
            ),
            &[&limit],
        )
        .await?;
    rows.iter().map(DefinitionRow::from_row).collect()
}
