//! What the API reads of one run, without a lock: the run and its node
//! tasks, its status, whether it exists, one task by node id, the failure
//! handler runs it started, and the backlog of a step's queue.

use chrono::{DateTime, Utc};
use composer_core::machine::RunStatus;
use uuid::Uuid;

use super::rows::{status_of, RunRow, TaskRow, RUN_COLUMNS, TASK_COLUMNS};
use crate::{Client, Result};

/// A run and its node tasks (a MAP's items are read with
/// [`items`](crate::runs::items)), for the API (no lock).
pub async fn get(client: &Client, run_id: Uuid) -> Result<Option<(RunRow, Vec<TaskRow>)>> {
    let run_stmt = client.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = $1")).await?;
    let tasks_stmt = client
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM task_instances WHERE run_id = $1 AND parent_task_id IS NULL ORDER BY id"
        ))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&run_id];
    let (run, tasks) =
        tokio::try_join!(biased; client.query_opt(&run_stmt, &params), client.query(&tasks_stmt, &params))?;
    let Some(run) = run else { return Ok(None) };
    let tasks = tasks.iter().map(TaskRow::from_row).collect::<Result<Vec<_>>>()?;
    Ok(Some((RunRow::from_row(&run)?, tasks)))
}

/// Only the run's status, for cheap polling.
pub async fn status(client: &Client, run_id: Uuid) -> Result<Option<RunStatus>> {
    let stmt = client.prepare_cached("SELECT status FROM workflow_runs WHERE id = $1").await?;
    match client.query_opt(&stmt, &[&run_id]).await? {
        Some(r) => {
            let s: String = r.try_get("status")?;
            Ok(Some(status_of(&s)?))
        }
        None => Ok(None),
    }
}

/// Whether a run with this id exists (of any age, in any state). Read-only.
pub async fn exists(client: &Client, id: Uuid) -> Result<bool> {
    let stmt = client.prepare_cached("SELECT EXISTS (SELECT 1 FROM workflow_runs WHERE id = $1)").await?;
    Ok(client.query_one(&stmt, &[&id]).await?.try_get(0)?)
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

/// The failure handler runs `run_id`'s ends started, oldest first.
pub async fn handlers_of(client: &Client, run_id: Uuid) -> Result<Vec<(Uuid, String)>> {
    let stmt = client
        .prepare_cached(
            "SELECT id, coalesce(trigger->>'hook', 'on_failure') FROM workflow_runs
              WHERE handles_run_id = $1 ORDER BY id LIMIT 100",
        )
        .await?;
    client.query(&stmt, &[&run_id]).await?.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
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

/// The offloaded objects the rows of run `run_id` (the run's, its tasks',
/// MAP items' included, and its sealed step logs') name: the sweep deletes
/// only an object none does.
/// A run that is gone names none.
pub async fn named_objects(client: &Client, run_id: Uuid) -> Result<std::collections::HashSet<String>> {
    let (lo, hi) = crate::partitions::span(&[run_id]);
    let stmt = client
        .prepare_cached(
            "SELECT v -> $2 ->> 'object' FROM (
                 SELECT input FROM workflow_runs WHERE id = $1 AND id BETWEEN $3 AND $4
                 UNION ALL SELECT output FROM workflow_runs WHERE id = $1 AND id BETWEEN $3 AND $4
                 UNION ALL SELECT input_json FROM task_instances WHERE run_id = $1 AND run_id BETWEEN $3 AND $4
                 UNION ALL SELECT output_json FROM task_instances WHERE run_id = $1 AND run_id BETWEEN $3 AND $4
                 UNION ALL SELECT object FROM task_log_chunks WHERE run_id = $1
             ) AS stored(v)
             WHERE v ? $2",
        )
        .await?;
    let key = composer_core::storable::OFFLOADED_KEY;
    let rows = client.query(&stmt, &[&run_id, &key, &lo, &hi]).await?;
    rows.iter().map(|r| Ok(r.try_get::<_, Option<String>>(0)?.unwrap_or_default())).collect()
}
