//! The registry of namespaces. `default` is this schema; every other
//! namespace is a schema of its own, `composer_ns_<id>`, holding every table
//! the migrations make. A namespace is created in three steps that can each
//! be taken again (a row `creating`, its schema migrated, the row `active`)
//! and deleted in two (the row `deleting`, then, once every coordinator has
//! stopped using it, its schema dropped and its row removed), so any number
//! of coordinators may run them and a crash between steps leaves nothing a
//! retry does not finish. Read and written through the default namespace's
//! connections only.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use crate::{Client, Result};

/// The namespace every call reaches when it names none.
pub const DEFAULT: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceRow {
    pub name: String,
    pub id: i64,
    pub description: String,
    /// `creating`, `active` or `deleting`.
    pub state: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub deleting_since: Option<DateTime<Utc>>,
    pub quotas: Quotas,
}

/// A namespace's quotas; `None`: no quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotas {
    /// Runs queued, running or paused at once.
    pub open_runs: Option<i64>,
    /// Runs started from outside a run (the API, schedules, triggers) in one second, across coordinators.
    pub starts_per_second: Option<i64>,
    pub schedules: Option<i64>,
    /// Limit keys with values (`step_limits` rows).
    pub limits: Option<i64>,
    /// Bytes of its schema's tables and their indexes.
    pub stored_bytes: Option<i64>,
}

/// What a namespace uses of each quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub open_runs: i64,
    pub schedules: i64,
    pub limits: i64,
    pub stored_bytes: i64,
}

impl NamespaceRow {
    /// The schema holding this namespace's data; `None` for `default`,
    /// whose data is in the schema the connection names.
    pub fn schema(&self) -> Option<String> {
        (self.name != DEFAULT).then(|| schema_name(self.id))
    }
}

/// The schema of the namespace of registry id `id`: made of digits, so it
/// never needs quoting.
pub fn schema_name(id: i64) -> String {
    format!("composer_ns_{id}")
}

const COLUMNS: &str = "name, id, description, state, created_by, created_at, deleting_since, \
                       quota_open_runs, quota_starts_per_second, quota_schedules, quota_limits, quota_stored_bytes";

fn from_row(r: &Row) -> Result<NamespaceRow> {
    Ok(NamespaceRow {
        name: r.try_get("name")?,
        id: r.try_get("id")?,
        description: r.try_get("description")?,
        state: r.try_get("state")?,
        created_by: r.try_get("created_by")?,
        created_at: r.try_get("created_at")?,
        deleting_since: r.try_get("deleting_since")?,
        quotas: Quotas {
            open_runs: r.try_get("quota_open_runs")?,
            starts_per_second: r.try_get("quota_starts_per_second")?,
            schedules: r.try_get("quota_schedules")?,
            limits: r.try_get("quota_limits")?,
            stored_bytes: r.try_get("quota_stored_bytes")?,
        },
    })
}

/// Records namespace `name` as being created, or answers its row as it is
/// (`creating`: a creation to finish; otherwise it exists already).
pub async fn begin_create(client: &Client, name: &str, description: &str, actor: &str) -> Result<(NamespaceRow, bool)> {
    let inserted = client
        .query_opt(
            &format!(
                "INSERT INTO namespaces (name, description, created_by) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO NOTHING RETURNING {COLUMNS}"
            ),
            &[&name, &description, &actor],
        )
        .await?;
    match inserted {
        Some(row) => Ok((from_row(&row)?, true)),
        // Deleted between the two statements: created again, by a retry.
        None => Ok((
            get(client, name)
                .await?
                .ok_or_else(|| crate::Error::Closed(format!("namespace {name} was just deleted; try again")))?,
            false,
        )),
    }
}

/// Makes `schema` if it is missing. The migrations are then applied to it
/// through a connection whose `search_path` is that schema alone.
pub async fn create_schema(client: &Client, schema: &str) -> Result<()> {
    client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
    Ok(())
}

/// The namespace, now migrated, is in use (a namespace being deleted stays so).
pub async fn activate(client: &Client, name: &str) -> Result<Option<NamespaceRow>> {
    let row = client
        .query_opt(
            &format!(
                "UPDATE namespaces SET state = 'active' WHERE name = $1 AND state <> 'deleting' RETURNING {COLUMNS}"
            ),
            &[&name],
        )
        .await?;
    row.as_ref().map(from_row).transpose()
}

pub async fn get(client: &Client, name: &str) -> Result<Option<NamespaceRow>> {
    let row = client.query_opt(&format!("SELECT {COLUMNS} FROM namespaces WHERE name = $1"), &[&name]).await?;
    row.as_ref().map(from_row).transpose()
}

/// Every namespace, `default` first, then by name; at most `limit`.
pub async fn list(client: &Client, limit: i64) -> Result<Vec<NamespaceRow>> {
    let rows = client
        .query(&format!("SELECT {COLUMNS} FROM namespaces ORDER BY name <> 'default', name LIMIT $1"), &[&limit])
        .await?;
    rows.iter().map(from_row).collect()
}

/// How many namespaces there are, `default` and those being created or
/// deleted included.
pub async fn count(client: &Client) -> Result<i64> {
    Ok(client.query_one("SELECT count(*) FROM namespaces", &[]).await?.try_get(0)?)
}

/// Marks `name` as being deleted (never `default`) and revokes the keys
/// bound to it, in one transaction: coordinators stop serving it at their
/// next look at the registry, and a namespace made later under the same
/// name admits none of its keys. Answers its row and the ids of the keys
/// revoked, or `None` when there is no such namespace.
pub async fn begin_delete(client: &mut Client, name: &str) -> Result<Option<(NamespaceRow, Vec<uuid::Uuid>)>> {
    let tx = crate::begin(client).await?;
    let row = tx
        .query_opt(
            &format!(
                "UPDATE namespaces SET state = 'deleting', deleting_since = coalesce(deleting_since, now())
                 WHERE name = $1 AND name <> 'default' RETURNING {COLUMNS}"
            ),
            &[&name],
        )
        .await?;
    let Some(row) = row.as_ref().map(from_row).transpose()? else { return Ok(None) };
    let revoked = tx
        .query(
            "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE namespace = $1 RETURNING id",
            &[&name],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<std::result::Result<Vec<uuid::Uuid>, _>>()?;
    tx.commit().await?;
    Ok(Some((row, revoked)))
}

/// The namespaces marked for deletion at least `grace` ago.
pub async fn due_for_deletion(client: &Client, grace: std::time::Duration) -> Result<Vec<NamespaceRow>> {
    let rows = client
        .query(
            &format!(
                "SELECT {COLUMNS} FROM namespaces
                 WHERE state = 'deleting' AND deleting_since <= now() - make_interval(secs => $1)"
            ),
            &[&grace.as_secs_f64()],
        )
        .await?;
    rows.iter().map(from_row).collect()
}

/// Drops the schema of namespace `row` with every table in it, and then
/// its row, in one transaction.
pub async fn finish_delete(client: &mut Client, row: &NamespaceRow) -> Result<()> {
    let Some(schema) = row.schema() else { return Ok(()) };
    let tx = crate::begin(client).await?;
    tx.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await?;
    tx.execute("DELETE FROM namespaces WHERE name = $1 AND state = 'deleting'", &[&row.name]).await?;
    tx.commit().await?;
    Ok(())
}

/// Sets namespace `name`'s quotas, every one (`None`: no quota); `None`
/// when there is no such namespace.
pub async fn set_quotas(client: &Client, name: &str, q: &Quotas) -> Result<Option<NamespaceRow>> {
    let row = client
        .query_opt(
            &format!(
                "UPDATE namespaces SET quota_open_runs = $2, quota_schedules = $3, quota_limits = $4,
                        quota_stored_bytes = $5, quota_starts_per_second = $6
                 WHERE name = $1 AND state <> 'deleting' RETURNING {COLUMNS}"
            ),
            &[&name, &q.open_runs, &q.schedules, &q.limits, &q.stored_bytes, &q.starts_per_second],
        )
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// How many runs are open (queued, running or paused), counting at most `cap`.
pub async fn open_runs(client: &Client, cap: i64) -> Result<i64> {
    let row = client
        .query_one(
            "SELECT count(*) FROM (SELECT 1 FROM workflow_runs WHERE status IN ('QUEUED', 'RUNNING', 'PAUSED')
             LIMIT $1) AS open",
            &[&cap],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// What the namespace `client`'s connection reaches uses of each quota:
/// read in its own schema (`current_schema()`). Its stored bytes are its
/// tables' and its offloaded objects' (as the sweep last listed them:
/// [`record_payload_usage`]).
pub async fn usage(client: &Client) -> Result<Usage> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM workflow_runs WHERE status IN ('QUEUED', 'RUNNING', 'PAUSED')),
                    (SELECT count(*) FROM schedules),
                    (SELECT count(*) FROM step_limits),
                    (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
                     WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'm'))
                    + (SELECT coalesce(sum(bytes), 0)::bigint FROM payload_usage)",
            &[],
        )
        .await?;
    Ok(Usage {
        open_runs: row.try_get(0)?,
        schedules: row.try_get(1)?,
        limits: row.try_get(2)?,
        stored_bytes: row.try_get(3)?,
    })
}

/// What the namespace's offloaded objects hold, as the sweep listed them.
pub async fn record_payload_usage(client: &Client, objects: u64, bytes: u64) -> Result<()> {
    let (objects, bytes) = (i64::try_from(objects).unwrap_or(i64::MAX), i64::try_from(bytes).unwrap_or(i64::MAX));
    client
        .execute(
            "INSERT INTO payload_usage (objects, bytes) VALUES ($1, $2)
             ON CONFLICT (one) DO UPDATE SET objects = $1, bytes = $2, measured_at = now()",
            &[&objects, &bytes],
        )
        .await?;
    Ok(())
}

/// How many schedules there are besides `id`, when there is none of that
/// id (a new one would count); `None` when it exists (a replacement).
pub async fn schedules_but(client: &Client, id: &str) -> Result<Option<i64>> {
    let row = client.query_one("SELECT count(*), coalesce(bool_or(id = $1), false) FROM schedules", &[&id]).await?;
    Ok((!row.try_get::<_, bool>(1)?).then_some(row.try_get(0)?).map(|n: i64| n))
}

/// How many limit keys have values, when `key` has none (it would count);
/// `None` when it has.
pub async fn limits_but(client: &Client, key: &str) -> Result<Option<i64>> {
    let row = client.query_one("SELECT count(*), coalesce(bool_or(key = $1), false) FROM step_limits", &[&key]).await?;
    Ok((!row.try_get::<_, bool>(1)?).then_some(row.try_get(0)?).map(|n: i64| n))
}
