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
//! - [`priority_change`]: a new priority for an open run tree.

mod concurrency;
mod machine_view;
mod priority_change;
mod rows;
mod start;

pub use concurrency::{
    concurrency_usage, lock_concurrency_key, lock_queued, queue_head, queue_position, queued_keys, set_running,
    try_lock_concurrency_key,
};
pub use machine_view::{into_machine, to_machine_task};
pub use priority_change::{set_priority, PriorityChange, MAX_PRIORITY_MOVES};
pub use rows::{Parent, RunRow, TaskRow};
pub use start::{insert_run, insert_runs, lock_idempotency_key, NewRun};

use chrono::{DateTime, Utc};
use composer_core::machine::{HistoryKind, RunStatus};
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Error, Result, Transaction};
use rows::{priority_of, RUN_COLUMNS, SUMMARY_COLUMNS, TASK_COLUMNS};

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
    let (runs, tasks) = tokio::try_join!(tx.query(&lock_stmt, &lock_params), tx.query(&tasks_stmt, &task_params[..]))?;
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

/// A page of the items of the MAP task `map`, by index after `after`.
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

/// A SUB_WORKFLOW or LOOP task as it now stands, for [`stale_children`].
#[derive(Debug, Clone, Copy)]
pub struct ChildHolder {
    pub task_id: Uuid,
    pub attempt: i32,
    pub iteration: i32,
    /// Still waiting for its child (RUNNING).
    pub waiting: bool,
}

/// Open child runs of `tasks` that their task no longer waits for: it ended,
/// or a newer attempt (or iteration) started. A child whose node said
/// `on_parent_close: "abandon"` is left to run.
pub async fn stale_children(client: &Client, tasks: &[ChildHolder]) -> Result<Vec<Uuid>> {
    let ids: Vec<Uuid> = tasks.iter().map(|t| t.task_id).collect();
    let attempts: Vec<i32> = tasks.iter().map(|t| t.attempt).collect();
    let iterations: Vec<i32> = tasks.iter().map(|t| t.iteration).collect();
    let waiting: Vec<bool> = tasks.iter().map(|t| t.waiting).collect();
    let rows = client
        .query(
            "SELECT c.id FROM workflow_runs c
               JOIN unnest($1::uuid[], $2::int4[], $3::bool[], $4::int4[]) AS u(task_id, attempt, waiting, iteration)
                 ON c.parent_task_id = u.task_id
              WHERE c.status IN ('RUNNING', 'PAUSED') AND NOT c.abandoned
                AND NOT (u.waiting AND c.parent_attempt = u.attempt AND c.parent_iteration = u.iteration)",
            &[&ids, &attempts, &waiting, &iterations],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Open child runs of the items of the MAP tasks `maps` that their item no
/// longer waits for: every one, once the MAP ended and storage cancelled
/// the items it did not hold. Like [`stale_children`], an `abandon` child
/// is left to run. Read-only: any coordinator may run it at once.
pub async fn stale_item_children(client: &Client, maps: &[Uuid]) -> Result<Vec<Uuid>> {
    if maps.is_empty() {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            "SELECT c.id FROM task_instances i
               JOIN workflow_runs c ON c.parent_task_id = i.id
              WHERE i.parent_task_id = ANY($1) AND c.status IN ('RUNNING', 'PAUSED') AND NOT c.abandoned
                AND NOT (i.state = 'RUNNING' AND c.parent_attempt = i.attempt)",
            &[&maps],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// A SUB_WORKFLOW attempt whose child run may be started: its run's depth
/// and the evaluated `{workflow, version, input}` of its config.
#[derive(Debug, Clone)]
pub struct ChildSlot {
    pub parent_depth: i32,
    pub spec: Value,
    /// The root of the parent's run tree, which the child joins.
    pub root: Uuid,
    /// The `traceparent` the parent run was started under.
    pub parent_traceparent: Option<String>,
    /// The parent run's priority and fairness key, which the child inherits.
    pub parent_priority: u8,
    pub parent_fairness_key: Option<String>,
}

/// Claims the right to start the child run of `(task, attempt, iteration)`,
/// for the rest of the caller's transaction: `None` when the attempt no
/// longer waits (it ended, a newer attempt or iteration started, its run
/// ended) or has its child already. Safe on many coordinators at once: the
/// transaction-scoped advisory lock on the attempt makes a second claimer
/// wait for the first to commit, and then it sees the child the first one
/// inserted.
pub async fn claim_child_slot(
    tx: &Transaction<'_>,
    run_id: Uuid,
    task_id: Uuid,
    attempt: i32,
    iteration: i32,
) -> Result<Option<ChildSlot>> {
    let lock = tx
        .prepare_cached(
            "SELECT pg_advisory_xact_lock(
                 hashtextextended($1::uuid::text || ':' || $2::int4::text || ':' || $3::int4::text, 7))",
        )
        .await?;
    tx.execute(&lock, &[&task_id, &attempt, &iteration]).await?;
    let stmt = tx
        .prepare_cached(
            "SELECT r.depth, t.input_json, coalesce(r.root_run_id, r.id), r.traceparent, r.priority, r.fairness_key
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE t.run_id = $1 AND t.id = $2 AND t.attempt = $3 AND t.state = 'RUNNING'
                AND coalesce(t.iteration, 0) = $4
                AND r.status IN ('RUNNING', 'PAUSED')
                AND NOT EXISTS (SELECT 1 FROM workflow_runs c
                                 WHERE c.parent_task_id = $2 AND c.parent_attempt = $3 AND c.parent_iteration = $4)",
        )
        .await?;
    match tx.query_opt(&stmt, &[&run_id, &task_id, &attempt, &iteration]).await? {
        Some(row) => Ok(Some(ChildSlot {
            parent_depth: row.try_get(0)?,
            spec: row.try_get(1)?,
            root: row.try_get(2)?,
            parent_traceparent: row.try_get(3)?,
            parent_priority: priority_of(row.try_get(4)?)?,
            parent_fairness_key: row.try_get(5)?,
        })),
        None => Ok(None),
    }
}

/// For the recovery sweep: SUB_WORKFLOW and LOOP attempts waiting
/// (untouched for `older_than`) for a child that was never started — the
/// coordinator that committed the attempt died before starting it.
/// `(run, task, attempt, iteration)`.
pub async fn childless_attempts(
    client: &Client,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<Vec<(Uuid, Uuid, i32, i32)>> {
    let rows = client
        .query(
            "SELECT t.run_id, t.id, t.attempt, coalesce(t.iteration, 0)
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE t.state = 'RUNNING' AND t.node_type IN ('SUB_WORKFLOW', 'LOOP')
                AND t.updated_at < now() - make_interval(secs => $1)
                AND r.status IN ('RUNNING', 'PAUSED')
                AND NOT EXISTS (SELECT 1 FROM workflow_runs c
                                 WHERE c.parent_task_id = t.id AND c.parent_attempt = t.attempt
                                   AND c.parent_iteration = coalesce(t.iteration, 0))
              LIMIT $2",
            &[&older_than.as_secs_f64(), &limit],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))).collect()
}

/// A child run that ended, and the attempt it reports to.
#[derive(Debug, Clone)]
pub struct FinishedChild {
    pub id: Uuid,
    pub parent: Parent,
    pub status: RunStatus,
    pub output: Option<Value>,
    pub error: Option<String>,
}

/// For the recovery sweep: SUB_WORKFLOW attempts still waiting (untouched
/// for `older_than`) whose child run has ended — the coordinator that ended
/// it died before telling the parent.
pub async fn unreported_children(
    client: &Client,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<Vec<FinishedChild>> {
    let rows = client
        .query(
            "SELECT c.id, c.parent_run_id, c.parent_task_id, c.parent_attempt, c.status, c.output, c.error,
                    c.parent_iteration
               FROM task_instances t
               JOIN workflow_runs c ON c.parent_task_id = t.id AND c.parent_attempt = t.attempt
                                   AND c.parent_iteration = coalesce(t.iteration, 0)
              WHERE t.state = 'RUNNING' AND t.node_type IN ('SUB_WORKFLOW', 'LOOP')
                AND t.updated_at < now() - make_interval(secs => $1)
                AND c.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
              LIMIT $2",
            &[&older_than.as_secs_f64(), &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let status: String = r.try_get(4)?;
            Ok(FinishedChild {
                id: r.try_get(0)?,
                parent: Parent {
                    run_id: r.try_get(1)?,
                    task_id: r.try_get(2)?,
                    attempt: r.try_get(3)?,
                    iteration: r.try_get(7)?,
                },
                status: RunStatus::parse(&status).ok_or_else(|| Error::Corrupt(format!("run status {status:?}")))?,
                output: r.try_get(5)?,
                error: r.try_get(6)?,
            })
        })
        .collect()
}

/// For the recovery sweep: MAPs of running runs with items to start and
/// slots free, untouched for `older_than` — the coordinator that was to
/// carry them on after a commit died first. `(run, task)`.
pub async fn stalled_maps(client: &Client, older_than: std::time::Duration, limit: i64) -> Result<Vec<(Uuid, Uuid)>> {
    let rows = client
        .query(
            "SELECT t.run_id, t.id
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE t.state = 'RUNNING' AND t.node_type = 'MAP' AND r.status = 'RUNNING'
                AND t.updated_at < now() - make_interval(secs => $1)
                AND (t.progress ->> 'queued')::int > 0
                AND (t.progress ->> 'open')::int < coalesce((t.input_json ->> 'max_concurrency')::int, $3)
              LIMIT $2",
            &[&older_than.as_secs_f64(), &limit, &(composer_core::definition::MAP_DEFAULT_CONCURRENCY as i32)],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// For the recovery sweep: open child runs whose parent attempt has moved
/// on (it ended, or a newer attempt started) — the coordinator that moved it
/// died before cancelling them.
pub async fn orphaned_children(client: &Client, older_than: std::time::Duration, limit: i64) -> Result<Vec<Uuid>> {
    let rows = client
        .query(
            "SELECT c.id
               FROM workflow_runs c
               LEFT JOIN task_instances t ON t.run_id = c.parent_run_id AND t.id = c.parent_task_id
              WHERE c.parent_run_id IS NOT NULL AND c.status IN ('RUNNING', 'PAUSED') AND NOT c.abandoned
                AND c.created_at < now() - make_interval(secs => $1)
                -- its task was reset (a retry went back before it) ...
                AND (t.id IS NULL
                     -- ... or has moved on
                     OR ((t.state <> 'RUNNING' OR t.attempt <> c.parent_attempt
                          OR coalesce(t.iteration, 0) <> c.parent_iteration)
                         AND t.updated_at < now() - make_interval(secs => $1)))
              LIMIT $2",
            &[&older_than.as_secs_f64(), &limit],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
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

#[cfg(test)]
mod in_part_tests {
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
