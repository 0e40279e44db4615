//! The engine's read of the runs it applies a batch to: their rows locked
//! in id order and their node tasks, all of them or in part, in one round
//! trip ([`lock_many`]), and the node tasks the state machine then finds
//! missing.

use uuid::Uuid;

use super::rows::{RunRow, TaskRow, RUN_COLUMNS, TASK_COLUMNS};
use crate::{Result, Transaction};

/// Runs [`lock_many`] loads in part: of these, only the open and failed
/// node tasks and those named; of the others, every node task.
#[derive(Debug, Clone, Copy)]
pub struct InPart<'a> {
    pub runs: &'a [Uuid],
    /// Loaded whatever their state: the tasks the events name.
    pub named: &'a [Uuid],
}

/// The node tasks [`lock_many`] reads when some runs are in part ($4): all
/// of the others', the open and failed ones of these by (run id, state), and
/// their others named ($5) by primary key.
pub(crate) const NODE_TASKS_IN_PART: &str = "
        SELECT {TASK_COLUMNS} FROM task_instances
         WHERE run_id = ANY($1) AND run_id BETWEEN $2 AND $3 AND parent_task_id IS NULL AND NOT (run_id = ANY($4))
        UNION ALL
        SELECT {TASK_COLUMNS} FROM task_instances
         WHERE run_id = ANY($4) AND run_id BETWEEN $2 AND $3 AND parent_task_id IS NULL
           AND state = ANY('{QUEUED,PENDING,RUNNING,WAITING,IN_DOUBT,FAILED}')
        UNION ALL
        SELECT {TASK_COLUMNS} FROM task_instances
         WHERE run_id = ANY($4) AND id = ANY($5) AND run_id BETWEEN $2 AND $3
           AND parent_task_id IS NULL AND state IN ('COMPLETED', 'SKIPPED', 'CANCELLED')";

/// A run [`lock_many`] locked: its row, its tasks, and whether those are
/// only its open and failed tasks and the ones named (in part) or all of
/// its node tasks.
pub type Locked = (RunRow, Vec<TaskRow>, bool);

/// Locks the rows of `run_ids` in id order (so two batches cannot deadlock on
/// each other) and loads their node tasks (all of them, or in part: see
/// [`InPart`]) and, of MAP items, only those in `items` ((run id, task id):
/// the ones the events name), in one round trip.
pub async fn lock_many(
    tx: &Transaction<'_>,
    run_ids: &[Uuid],
    items: &[(Uuid, Uuid)],
    part: InPart<'_>,
) -> Result<Vec<Locked>> {
    let (lo, hi) = crate::partitions::span(run_ids);
    let lock_stmt = tx
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = ANY($1) AND id BETWEEN $2 AND $3 ORDER BY id FOR UPDATE"
        ))
        .await?;
    // Without runs in part, the plain read (its plan is the cheapest).
    let node_tasks = match part.runs.is_empty() {
        true => format!(
            "SELECT {TASK_COLUMNS} FROM task_instances
              WHERE run_id = ANY($1) AND run_id BETWEEN $2 AND $3 AND parent_task_id IS NULL"
        ),
        false => NODE_TASKS_IN_PART.replace("{TASK_COLUMNS}", TASK_COLUMNS),
    };
    // The items' half only when the events name tasks, and by their keys:
    // with no ids it still visited every month's partition, and by id alone
    // it read every task of the runs to find none. `IS TRUE` keeps it off the
    // partial index of items, which a plan made while the run had few items
    // reads whole (all 10,000 of a MAP) to hash-join with the keys.
    let (items_from, tasks_stmt) = match (items.is_empty(), part.runs.is_empty()) {
        (true, _) => (0, tx.prepare_cached(&node_tasks).await?),
        (false, none_in_part) => {
            let n = if none_in_part { 4 } else { 6 };
            let stmt = tx
                .prepare_cached(&format!(
                    "{node_tasks}
                     UNION ALL
                     SELECT {TASK_COLUMNS} FROM task_instances
                      WHERE (run_id, id) IN (SELECT * FROM unnest(${n}::uuid[], ${}::uuid[]))
                        AND run_id BETWEEN $2 AND $3 AND (parent_task_id IS NOT NULL) IS TRUE",
                    n + 1
                ))
                .await?;
            (n, stmt)
        }
    };
    let item_runs: Vec<Uuid> = items.iter().map(|i| i.0).collect();
    let item_ids: Vec<Uuid> = items.iter().map(|i| i.1).collect();
    let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&run_ids, &lo, &hi];
    let mut task_params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&run_ids, &lo, &hi];
    if !part.runs.is_empty() {
        task_params.extend([&part.runs as &(dyn tokio_postgres::types::ToSql + Sync), &part.named]);
    }
    if items_from > 0 {
        task_params.extend([&item_runs as &(dyn tokio_postgres::types::ToSql + Sync), &item_ids]);
    }
    // `biased`: the lock's error (a statement timeout while it waits) is
    // the one returned, not the task read's 25P02 that follows it.
    let (runs, tasks) =
        tokio::try_join!(biased; tx.query(&lock_stmt, &lock_params), tx.query(&tasks_stmt, &task_params[..]))?;
    let mut by_run: std::collections::HashMap<Uuid, Vec<TaskRow>> = std::collections::HashMap::new();
    for row in &tasks {
        let t = TaskRow::from_row(row)?;
        by_run.entry(t.run_id).or_default().push(t);
    }
    runs.iter()
        .map(|r| {
            let run = RunRow::from_row(r)?;
            let mut tasks = by_run.remove(&run.id).unwrap_or_default();
            // In creation order (UUIDv7), sorted here: an ORDER BY over the
            // UNION made PostgreSQL sort every row of every event's read.
            tasks.sort_unstable_by_key(|t| t.id);
            let in_part = part.runs.contains(&run.id);
            Ok((run, tasks, in_part))
        })
        .collect()
}

/// The node tasks of `nodes` (node ids) of a run loaded in part, but for
/// those in `held` (the caller has them): what the state machine found
/// missing. Call in the transaction that holds the run's lock.
pub async fn load_nodes(tx: &Transaction<'_>, run_id: Uuid, nodes: &[&str], held: &[Uuid]) -> Result<Vec<TaskRow>> {
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM task_instances
              WHERE run_id = $1 AND node_id = ANY($2) AND parent_task_id IS NULL AND NOT (id = ANY($3))
              ORDER BY id"
        ))
        .await?;
    let rows = tx.query(&stmt, &[&run_id, &nodes, &held]).await?;
    rows.iter().map(TaskRow::from_row).collect()
}

#[cfg(test)]
mod tests {
    use composer_core::machine::TaskState::{self, *};

    /// The machine holds a run read in part to have every task not ended
    /// well: a state added to TaskState must be sorted here.
    #[test]
    fn a_run_read_in_part_gets_every_task_but_those_ended_without_failing() {
        let all: [TaskState; 9] = [Queued, Pending, Running, Waiting, InDoubt, Completed, Failed, Skipped, Cancelled];
        let (open, ended) =
            super::NODE_TASKS_IN_PART.split_once("UNION ALL").unwrap().1.split_once("UNION ALL").unwrap();
        for state in all {
            let named_only = match state {
                Completed | Skipped | Cancelled => true,
                Queued | Pending | Running | Waiting | InDoubt | Failed => false,
            };
            let quoted = format!("'{}'", state.as_str());
            assert_eq!(open.contains(state.as_str()), !named_only, "{state:?}");
            assert_eq!(ended.contains(&quoted), named_only, "{state:?}");
        }
    }
}
