//! A MAP's items and list: the items and list elements the engine loads
//! under the run's lock, a page of items for the API, and the MAPs the
//! recovery sweep carries on.

use serde_json::Value;
use uuid::Uuid;

use super::rows::{TaskRow, TASK_COLUMNS};
use crate::{Client, Error, Result, Transaction};

/// Which items of a MAP to load for the state machine.
#[derive(Debug, Clone, Copy)]
pub enum Items {
    /// The `count` QUEUED items with the lowest index, skipping the ids the
    /// caller holds already, looked for from index `from` first (where the
    /// caller expects them to begin) and below it only when there are too
    /// few above.
    Queued { count: u32, from: i32 },
    /// Every item.
    All,
    /// Items whose retry the run's pause held (WAITING with no wake-up).
    Held,
}

/// Items of MAP task `map` (of every MAP of the run for [`Items::Held`]),
/// inside the transaction that holds the run's lock. `held_ids` are items the
/// caller already has (their rows may be older than its copy).
pub async fn load_items(
    tx: &Transaction<'_>,
    run_id: Uuid,
    map: Option<Uuid>,
    which: Items,
    held_ids: &[Uuid],
) -> Result<Vec<TaskRow>> {
    let rows = match which {
        Items::Queued { count, from } => {
            // The partial index of QUEUED items keeps an entry for every item
            // that left the queue until VACUUM: scanning it from the lowest
            // index would step over all the items started so far (900,000 of
            // a million-item MAP), on every load. From `from`, it does not.
            let stmt = tx
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM task_instances
                      WHERE run_id = $1 AND parent_task_id = $2 AND state = 'QUEUED' AND NOT (id = ANY($3))
                        AND item_index >= $5
                      ORDER BY item_index LIMIT $4"
                ))
                .await?;
            let rows = tx.query(&stmt, &[&run_id, &map, &held_ids, &(count as i64), &from]).await?;
            if rows.len() >= count as usize || from <= 0 {
                rows
            } else {
                // Fewer above `from` than asked: some were sent back to the
                // queue below it (a rerun of items).
                tx.query(&stmt, &[&run_id, &map, &held_ids, &(count as i64), &i32::MIN]).await?
            }
        }
        Items::All => {
            let stmt = tx
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM task_instances
                      WHERE run_id = $1 AND parent_task_id = $2 AND NOT (id = ANY($3))"
                ))
                .await?;
            tx.query(&stmt, &[&run_id, &map, &held_ids]).await?
        }
        Items::Held => {
            let stmt = tx
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM task_instances
                      WHERE run_id = $1 AND state = 'WAITING' AND wake_at IS NULL AND parent_task_id IS NOT NULL
                        AND NOT (id = ANY($2))"
                ))
                .await?;
            tx.query(&stmt, &[&run_id, &held_ids]).await?
        }
    };
    rows.iter().map(TaskRow::from_row).collect()
}

/// Elements `from..from + count` of a MAP's list (the chunks that hold
/// them), inside the transaction that holds the run's lock.
pub async fn load_sources(tx: &Transaction<'_>, run_id: Uuid, map: Uuid, from: u32, count: u32) -> Result<Vec<Value>> {
    let size = composer_core::machine::ITEM_CHUNK;
    let (first, last) = ((from / size) as i32, ((from + count.max(1) - 1) / size) as i32);
    let stmt = tx
        .prepare_cached(
            "SELECT chunk, items FROM map_sources
              WHERE run_id = $1 AND map_id = $2 AND chunk BETWEEN $3 AND $4 ORDER BY chunk",
        )
        .await?;
    let rows = tx.query(&stmt, &[&run_id, &map, &first, &last]).await?;
    let mut out = Vec::with_capacity(count as usize);
    for (next, row) in (first..).zip(rows.iter()) {
        let chunk: i32 = row.try_get(0)?;
        let Value::Array(items) = row.try_get::<_, Value>(1)? else {
            return Err(Error::Corrupt(format!("MAP {map}'s list chunk {chunk} is not a list")));
        };
        if chunk != next {
            return Err(Error::Corrupt(format!("MAP {map}'s list lacks chunk {next}")));
        }
        let skip = if chunk == first { (from % size) as usize } else { 0 };
        out.extend(items.into_iter().skip(skip));
    }
    out.truncate(count as usize);
    if out.len() < count as usize {
        return Err(Error::Corrupt(format!("MAP {map}'s list has {} of the {count} elements from {from}", out.len())));
    }
    Ok(out)
}

/// A page of the items of the MAP task `map`, by index after `after` (for
/// the API, and for the engine gathering a MAP's output inside the
/// transaction that holds the run's lock).
pub async fn items(client: &Client, run_id: Uuid, map: Uuid, after: i32, limit: i64) -> Result<Vec<TaskRow>> {
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM task_instances
              WHERE run_id = $1 AND parent_task_id = $2 AND item_index > $3
              ORDER BY item_index LIMIT $4"
        ))
        .await?;
    client.query(&stmt, &[&run_id, &map, &after, &limit]).await?.iter().map(TaskRow::from_row).collect()
}

/// For the recovery sweep: MAPs of running runs with items to start and
/// slots free, untouched for `older_than` — the coordinator that was to
/// carry them on after a commit died first. `(run, task)`. A run whose row
/// is locked is left out: a coordinator is applying an event to it (the
/// row's `updated_at` is that transaction's start, so a long carry, such
/// as gathering a million items, looks untouched), and the sweep would
/// only wait for its lock.
pub async fn stalled_maps(client: &Client, older_than: std::time::Duration, limit: i64) -> Result<Vec<(Uuid, Uuid)>> {
    let rows = client
        .query(
            "SELECT t.run_id, t.id
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE t.state = 'RUNNING' AND t.node_type = 'MAP' AND r.status = 'RUNNING'
                AND t.updated_at < now() - make_interval(secs => $1)
                AND (t.progress ->> 'queued')::int > 0
                AND (t.progress ->> 'open')::int < coalesce((t.input_json ->> 'max_concurrency')::int, $3)
              LIMIT $2
              FOR KEY SHARE OF r SKIP LOCKED",
            &[&older_than.as_secs_f64(), &limit, &(composer_core::definition::MAP_DEFAULT_CONCURRENCY as i32)],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}
