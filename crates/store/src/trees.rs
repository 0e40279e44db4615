//! What a run tree has created, against its fan-out budget. A tree is a
//! root run and every run started under it by SUB_WORKFLOW, at any depth;
//! its row counts the runs and MAP items the tree created. Each charge is
//! one conditional upsert on the root's row: concurrent charges of one tree
//! serialize on that row, and none can take the tree past its limit.
//!
//! The row is locked only by the statement that charges it, at the end of
//! a transaction's work (after its run locks), so it adds no lock-order
//! cycle with the run locks.

use uuid::Uuid;

use crate::{Result, Transaction};

/// MAP items the tree of `root` has created so far.
pub async fn items_used(tx: &Transaction<'_>, root: Uuid) -> Result<i64> {
    let stmt = tx.prepare_cached("SELECT items FROM run_trees WHERE root_run_id = $1").await?;
    Ok(match tx.query_opt(&stmt, &[&root]).await? {
        Some(row) => row.try_get(0)?,
        None => 0,
    })
}

/// Charges `items` MAP items to the tree of `root`; false (and nothing
/// charged) when that would take it past `max`.
pub async fn charge_items(tx: &Transaction<'_>, root: Uuid, items: i64, max: i64) -> Result<bool> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO run_trees (root_run_id, runs, items) SELECT $1::uuid, 1, $2::bigint WHERE $2::bigint <= $3::bigint
             ON CONFLICT (root_run_id) DO UPDATE SET items = run_trees.items + excluded.items
              WHERE run_trees.items + excluded.items <= $3
             RETURNING 1",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&root, &items, &max]).await?.is_some())
}

/// Charges one child run to the tree of `root` (the root is its first
/// run); false (and nothing charged) when that would take it past `max`.
pub async fn charge_run(tx: &Transaction<'_>, root: Uuid, max: i64) -> Result<bool> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO run_trees (root_run_id, runs, items) SELECT $1::uuid, 2, 0 WHERE 2 <= $2::bigint
             ON CONFLICT (root_run_id) DO UPDATE SET runs = run_trees.runs + 1
              WHERE run_trees.runs + 1 <= $2
             RETURNING 1",
        )
        .await?;
    Ok(tx.query_opt(&stmt, &[&root, &max]).await?.is_some())
}
