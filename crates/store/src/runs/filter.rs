//! The runs a filter matches: a page of a list, a bulk job's next ids, a
//! count, and the nodes their definitions lack. Each read is planned for
//! its parameters' values ([`query_planned`]).

use composer_core::machine::RunStatus;
use serde_json::Value;
use uuid::Uuid;

use super::rows::{RunRow, SUMMARY_COLUMNS};
use crate::{Client, Result};

/// Which runs a list shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFilter<'a> {
    pub workflow: Option<&'a str>,
    pub status: Option<RunStatus>,
    /// Child runs of this run.
    pub parent: Option<Uuid>,
    /// Runs created at or after the moment of this UUIDv7 …
    pub since: Option<Uuid>,
    /// … and before the moment of this one.
    pub until: Option<Uuid>,
    /// Runs with every one of these tags (`{key: value}`).
    pub tags: Option<&'a Value>,
    /// Runs of this version of their workflow.
    pub version: Option<i32>,
    /// Open runs only (QUEUED, RUNNING or PAUSED).
    pub open: bool,
}

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// A WHERE clause of only the conditions a filter sets, and its parameters,
/// for [`query_planned`].
struct Where<'a> {
    sql: String,
    params: Vec<Param<'a>>,
}

impl<'a> Where<'a> {
    fn of(filter: &'a RunFilter<'a>, status: &'a Option<&'static str>) -> Where<'a> {
        let mut w = Where { sql: "TRUE".to_string(), params: Vec::with_capacity(8) };
        if let Some(v) = &filter.workflow {
            w.and("workflow_name = $", v);
        }
        if let Some(v) = status {
            w.and("status = $", v);
        }
        if let Some(v) = &filter.parent {
            w.and("parent_run_id = $", v);
        }
        if let Some(v) = &filter.since {
            w.and("id >= $", v);
        }
        if let Some(v) = &filter.until {
            w.and("id < $", v);
        }
        if let Some(v) = &filter.tags {
            w.and("tags @> $", v);
        }
        if let Some(v) = &filter.version {
            w.and("workflow_version = $", v);
        }
        if filter.open {
            w.sql.push_str(" AND status IN ('QUEUED', 'RUNNING', 'PAUSED')");
        }
        w
    }

    /// Adds `condition` (ending in `$`) over `value`.
    fn and(&mut self, condition: &str, value: Param<'a>) {
        self.params.push(value);
        self.sql = format!("{} AND {condition}{}", self.sql, self.params.len());
    }

    /// A parameter's placeholder, for what follows the WHERE clause.
    fn bind(&mut self, value: Param<'a>) -> String {
        self.params.push(value);
        format!("${}", self.params.len())
    }
}

/// Runs a read planned for its parameters' values, in a read-only
/// transaction that lifts the sessions' generic plans: a generic plan
/// guesses, and for a filter it guesses wrong — `tags @> $1` walks every run
/// newest first where the tags' index finds the 200 of one customer in a
/// millisecond. A list is a read for a person, not the hot path: the round
/// trips this adds are cheap.
async fn query_planned(client: &mut Client, sql: &str, params: &[Param<'_>]) -> Result<Vec<tokio_postgres::Row>> {
    let tx = client.build_transaction().read_only(true).start().await?;
    tx.batch_execute("SET LOCAL plan_cache_mode = force_custom_plan").await?;
    let rows = tx.query(sql, params).await?;
    tx.commit().await?;
    Ok(rows)
}

/// A page of runs, newest first, without their input and output. `before`
/// is the last id of the previous page (keyset pagination: UUIDv7 ids sort
/// by creation).
pub async fn list(
    client: &mut Client,
    filter: &RunFilter<'_>,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<RunRow>> {
    let status = filter.status.map(|s| s.as_str());
    let mut w = Where::of(filter, &status);
    if let Some(b) = &before {
        w.and("id < $", b);
    }
    let limit_at = w.bind(&limit);
    let sql = format!("SELECT {SUMMARY_COLUMNS} FROM workflow_runs WHERE {} ORDER BY id DESC LIMIT {limit_at}", w.sql);
    let rows = query_planned(client, &sql, &w.params).await?;
    rows.iter().map(RunRow::from_row).collect()
}

/// The ids of the runs `filter` matches after `after`, oldest first, at
/// most `limit` (a bulk job's next batch).
pub async fn matching_ids(
    client: &mut Client,
    filter: &RunFilter<'_>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<Uuid>> {
    let status = filter.status.map(|s| s.as_str());
    let mut w = Where::of(filter, &status);
    if let Some(a) = &after {
        w.and("id > $", a);
    }
    let limit_at = w.bind(&limit);
    let sql = format!("SELECT id FROM workflow_runs WHERE {} ORDER BY id LIMIT {limit_at}", w.sql);
    query_planned(client, &sql, &w.params).await?.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// How many runs `filter` matches, counting at most `cap`.
pub async fn count_matching(client: &mut Client, filter: &RunFilter<'_>, cap: i64) -> Result<i64> {
    let status = filter.status.map(|s| s.as_str());
    let mut w = Where::of(filter, &status);
    let cap_at = w.bind(&cap);
    let sql = format!("SELECT count(*) FROM (SELECT 1 FROM workflow_runs WHERE {} LIMIT {cap_at}) AS m", w.sql);
    let rows = query_planned(client, &sql, &w.params).await?;
    Ok(rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
}

/// Which of `nodes` no definition (version) of the first `cap` runs
/// `filter` matches has, read in PostgreSQL (no definition is loaded).
/// Read-only.
pub async fn nodes_missing(
    client: &mut Client,
    filter: &RunFilter<'_>,
    cap: i64,
    nodes: &[String],
) -> Result<Vec<String>> {
    let status = filter.status.map(|s| s.as_str());
    let mut w = Where::of(filter, &status);
    let cap_at = w.bind(&cap);
    let nodes_at = w.bind(&nodes);
    let sql = format!(
        "WITH defs AS (SELECT DISTINCT workflow_definition_id AS id FROM \
           (SELECT workflow_definition_id FROM workflow_runs WHERE {} LIMIT {cap_at}) AS m) \
         SELECT n FROM unnest({nodes_at}::text[]) AS n \
          WHERE EXISTS (SELECT 1 FROM defs) \
            AND NOT EXISTS (SELECT 1 FROM workflow_definitions d JOIN defs ON d.id = defs.id \
                             WHERE d.spec->'nodes' @> jsonb_build_array(jsonb_build_object('id', n)))",
        w.sql
    );
    let rows = query_planned(client, &sql, &w.params).await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}
