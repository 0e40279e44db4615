//! Runs and tasks: their rows, the engine's locked read ([`lock_many`]) and
//! the reads behind the API. The engine's write is in [`crate::transitions`].
//!
//! Every change to a run happens in a transaction that first takes the run
//! row's lock (`SELECT … FOR UPDATE`), so events for one run apply one after
//! another on any number of coordinators, while different runs proceed in
//! parallel.
//!
//! - [`rows`]: the rows of runs and tasks, and the columns every read names.
//! - [`machine_view`]: rows in the state machine's form.
//! - [`start`]: a new run's row, and the idempotency key's lock.
//! - [`concurrency`]: concurrency keys and the runs QUEUED behind them.
//! - [`locked`]: the engine's read of the runs it locks.
//! - [`maps`]: a MAP's items and list.
//! - [`children`]: the child runs of SUB_WORKFLOW and LOOP attempts.
//! - [`priority_change`]: a new priority for an open run tree.

mod children;
mod concurrency;
mod locked;
mod machine_view;
mod maps;
mod priority_change;
mod rows;
mod start;

pub use children::{
    childless_attempts, claim_child_slot, orphaned_children, stale_children, stale_item_children, unreported_children,
    ChildHolder, ChildSlot, FinishedChild,
};
pub use concurrency::{
    concurrency_usage, lock_concurrency_key, lock_queued, queue_head, queue_position, queued_keys, set_running,
    try_lock_concurrency_key,
};
pub use locked::{load_nodes, lock_many, InPart, Locked};
pub use machine_view::{into_machine, to_machine_task};
pub use maps::{items, load_items, load_sources, stalled_maps, Items};
pub use priority_change::{set_priority, PriorityChange, MAX_PRIORITY_MOVES};
pub use rows::{Parent, RunRow, TaskRow};
pub use start::{insert_run, insert_runs, lock_idempotency_key, NewRun};

use chrono::{DateTime, Utc};
use composer_core::machine::{HistoryKind, RunStatus};
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Error, Result};
use rows::{RUN_COLUMNS, SUMMARY_COLUMNS, TASK_COLUMNS};

/// A run and its node tasks (a MAP's items are read with [`items`]), for
/// the API (no lock).
pub async fn get(client: &Client, run_id: Uuid) -> Result<Option<(RunRow, Vec<TaskRow>)>> {
    let run_stmt = client.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = $1")).await?;
    let tasks_stmt = client
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM task_instances WHERE run_id = $1 AND parent_task_id IS NULL ORDER BY id"
        ))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&run_id];
    let (run, tasks) = tokio::try_join!(client.query_opt(&run_stmt, &params), client.query(&tasks_stmt, &params))?;
    let Some(run) = run else { return Ok(None) };
    let tasks = tasks.iter().map(TaskRow::from_row).collect::<Result<Vec<_>>>()?;
    Ok(Some((RunRow::from_row(&run)?, tasks)))
}

/// The task of `node_id` in a run — a node's (`charge`), or a MAP item's
/// (`ship_each[3]`, found by its MAP and index) — read without a lock.
pub async fn task_of_node(client: &Client, run_id: Uuid, node_id: &str) -> Result<Option<TaskRow>> {
    let item = node_id
        .strip_suffix(']')
        .and_then(|n| n.rsplit_once('['))
        .and_then(|(map, i)| Some((map, i.parse::<i32>().ok()?)));
    let stmt = match item {
        None => {
            client
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM task_instances
                      WHERE run_id = $1 AND parent_task_id IS NULL AND node_id = $2"
                ))
                .await?
        }
        Some(_) => {
            client
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM task_instances
                      WHERE run_id = $1 AND item_index = $3 AND parent_task_id =
                            (SELECT id FROM task_instances WHERE run_id = $1 AND parent_task_id IS NULL AND node_id = $2)"
                ))
                .await?
        }
    };
    let row = match item {
        None => client.query_opt(&stmt, &[&run_id, &node_id]).await?,
        Some((map, index)) => client.query_opt(&stmt, &[&run_id, &map, &index]).await?,
    };
    row.as_ref().map(TaskRow::from_row).transpose()
}

/// The edges the engine took in a run, as its history records them (the
/// first line of a task says which edges it came by): `(task, from, to)`
/// by node id.
pub async fn taken_edges(client: &Client, run_id: Uuid) -> Result<Vec<(Uuid, String, String)>> {
    let stmt = client
        .prepare_cached(
            "SELECT (payload ->> 'task_id')::uuid, v ->> 'from', payload ->> 'node_id'
               FROM run_events, jsonb_array_elements(payload -> 'via') AS v
              WHERE run_id = $1 AND payload ? 'via' AND jsonb_typeof(payload -> 'via') = 'array'
              LIMIT 100000",
        )
        .await?;
    let rows = client.query(&stmt, &[&run_id]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect()
}

/// How many tasks wait PENDING on `queue` (counting at most `cap`), and
/// since when the oldest does.
pub async fn queue_backlog(client: &Client, queue: &str, cap: i64) -> Result<(i64, Option<DateTime<Utc>>)> {
    let row = client
        .query_one(
            "SELECT count(*), min(updated_at) FROM (
                SELECT updated_at FROM task_instances WHERE state = 'PENDING' AND queue = $1 LIMIT $2) AS p",
            &[&queue, &cap],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The failure handler runs `run_id`'s ends started, oldest first.
pub async fn handlers_of(client: &Client, run_id: Uuid) -> Result<Vec<Uuid>> {
    let stmt =
        client.prepare_cached("SELECT id FROM workflow_runs WHERE handles_run_id = $1 ORDER BY id LIMIT 100").await?;
    client.query(&stmt, &[&run_id]).await?.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Only the run's status, for cheap polling.
pub async fn status(client: &Client, run_id: Uuid) -> Result<Option<RunStatus>> {
    let stmt = client.prepare_cached("SELECT status FROM workflow_runs WHERE id = $1").await?;
    match client.query_opt(&stmt, &[&run_id]).await? {
        Some(r) => {
            let s: String = r.try_get("status")?;
            Ok(Some(RunStatus::parse(&s).ok_or_else(|| Error::Corrupt(format!("run status {s:?}")))?))
        }
        None => Ok(None),
    }
}

#[derive(Debug, Clone)]
pub struct HistoryRow {
    pub seq: i64,
    pub kind: HistoryKind,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

/// The run's history after `after_seq`, oldest first, at most `limit` entries.
pub async fn history(client: &Client, run_id: Uuid, after_seq: i64, limit: i64) -> Result<Vec<HistoryRow>> {
    let rows = client
        .query(
            "SELECT seq, type, payload, created_at FROM run_events
              WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            &[&run_id, &after_seq, &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get("type")?;
            Ok(HistoryRow {
                seq: r.try_get("seq")?,
                kind: HistoryKind::parse(&kind).ok_or_else(|| Error::Corrupt(format!("history kind {kind:?}")))?,
                payload: r.try_get("payload")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .collect()
}

/// A page of runs, newest first. `before` is the last id of the previous page
/// (keyset pagination: UUIDv7 ids sort by creation).
/// A page of runs, newest first, without their input and output.
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

/// Whether a run with this id exists (of any age, in any state). Read-only.
pub async fn exists(client: &Client, id: Uuid) -> Result<bool> {
    let stmt = client.prepare_cached("SELECT EXISTS (SELECT 1 FROM workflow_runs WHERE id = $1)").await?;
    Ok(client.query_one(&stmt, &[&id]).await?.try_get(0)?)
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

/// Fails an open run that the engine cannot apply events to (an event that
/// fails every time it is applied): the run FAILED with `error`, its open
/// tasks CANCELLED with their timers and leases cleared, its undispatched
/// work dropped, a history line, and the run-done notification. Written in
/// SQL, not through the state machine, because applying events to this run
/// is what fails. Returns false when the run was already finished.
pub async fn fail_faulted(client: &mut Client, run_id: Uuid, error: &str) -> Result<bool> {
    let tx = crate::begin(client).await?;
    let failed = tx
        .execute(
            "UPDATE workflow_runs SET status = 'FAILED', error = $2, updated_at = now(), finished_at = now()
             WHERE id = $1 AND status IN ('RUNNING', 'PAUSED')",
            &[&run_id, &error],
        )
        .await?;
    if failed == 0 {
        return Ok(false);
    }
    tx.execute(
        "UPDATE task_instances SET state = 'CANCELLED', lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL,
                finished_at = now(), updated_at = now()
         WHERE run_id = $1 AND state IN ('PENDING', 'RUNNING', 'WAITING')",
        &[&run_id],
    )
    .await?;
    tx.execute("DELETE FROM outbox WHERE run_id = $1", &[&run_id]).await?;
    let payload = serde_json::json!({"error": error});
    tx.execute(
        "INSERT INTO run_events (run_id, type, payload) VALUES ($1, $2, $3)",
        &[&run_id, &HistoryKind::RunFailed.as_str(), &payload],
    )
    .await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&crate::transitions::RUN_DONE_CHANNEL, &run_id.to_string()]).await?;
    tx.commit().await?;
    Ok(true)
}
