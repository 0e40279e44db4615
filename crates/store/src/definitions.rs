//! Workflow definitions. Versions are immutable: registering a new spec
//! adds version + 1, registering a spec already registered returns its
//! version.

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
    /// The spec equals a registered version's (the newest such); nothing
    /// was written.
    Unchanged(DefinitionRow),
    /// The version the caller declared cannot be this spec: it is
    /// registered with another, or it is not the next one.
    Refused(String),
}

const COLUMNS: &str = "id, name, version, spec, created_at";

/// Registers `spec` (already validated and normalized) under `name`, whose
/// triggers listen to `trigger_events`. Registration is idempotent by
/// content: a spec equal to any registered version of the name answers
/// that version, so workers of two builds starting over each other never
/// mint a version per start. `declared` is the version the caller means it
/// to be: that version when it is registered with this spec, the next
/// version when it is the next one, refused otherwise. The per-name
/// advisory lock serializes concurrent registrations of one name, so two
/// coordinators cannot both create version N, and the triggers that apply
/// are always the latest version's.
pub async fn register(
    client: &mut Client,
    name: &str,
    spec: &Value,
    trigger_events: &[String],
    declared: Option<i32>,
) -> Result<Registered> {
    let tx = crate::begin(client).await?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('composer_definition:' || $1))", &[&name]).await?;
    let latest: i32 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM workflow_definitions WHERE name = $1", &[&name])
        .await?
        .try_get(0)?;
    // The declared version, or the newest version equal to this spec, and
    // whether it is equal: as jsonb (key order and spacing aside) and as
    // jsonb's text, which keeps each number as written (jsonb alone finds
    // 1 and 1.0 equal, and a run's output would show the difference).
    let found = tx
        .query_opt(
            &format!(
                "SELECT {COLUMNS}, (spec = $2 AND spec::text = $2::text) AS same FROM workflow_definitions
                 WHERE name = $1
                   AND CASE WHEN $3::int IS NULL THEN spec = $2 AND spec::text = $2::text ELSE version = $3 END
                 ORDER BY version DESC LIMIT 1"
            ),
            &[&name, spec, &declared],
        )
        .await?;
    match (found, declared) {
        (Some(r), _) if r.try_get::<_, bool>("same")? => {
            return Ok(Registered::Unchanged(DefinitionRow::from_row(&r)?))
        }
        (Some(r), _) => {
            let version: i32 = r.try_get("version")?;
            return Ok(Registered::Refused(format!(
                "workflow {name:?} version {version} is registered with a different definition: \
                 declare version {} for this one (or register it without a version)",
                latest + 1
            )));
        }
        (None, Some(v)) if v != latest + 1 => {
            return Ok(Registered::Refused(format!(
                "workflow {name:?} has versions up to {latest}: version {v} would not be the next one ({})",
                latest + 1
            )))
        }
        (None, _) => {}
    }
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO workflow_definitions (id, name, version, spec)
                 VALUES ($1, $2, $3, $4)
                 RETURNING {COLUMNS}"
            ),
            &[&Uuid::now_v7(), &name, &(latest + 1), spec],
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
