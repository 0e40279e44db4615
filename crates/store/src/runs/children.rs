//! The child runs of SUB_WORKFLOW and LOOP attempts: the claim that
//! starts one exactly once, the children their attempt no longer waits for,
//! and what the recovery sweep looks for (attempts whose child was never
//! started, ended children never reported, children orphaned).

use composer_core::machine::RunStatus;
use serde_json::Value;
use uuid::Uuid;

use super::rows::{priority_of, status_of, Parent};
use crate::{Client, Result, Transaction};

/// A SUB_WORKFLOW or LOOP task as a commit left it, for [`stale_children`].
#[derive(Debug, Clone, Copy)]
pub struct ChildHolder {
    pub task_id: Uuid,
    pub attempt: i32,
    pub iteration: i32,
    /// This attempt's (and iteration's) own child is stale too: the attempt
    /// ran and no longer waits for it.
    pub current: bool,
}

/// Open child runs of `tasks` that their task no longer waits for: those of
/// an earlier attempt or iteration, and the current one's when it is
/// `current`. A later attempt's child is never touched: it is read after
/// the commit, when the task may have been retried and be waiting for a new
/// child already. A child whose node said `on_parent_close: "abandon"` is
/// left to run.
pub async fn stale_children(client: &Client, tasks: &[ChildHolder]) -> Result<Vec<Uuid>> {
    let ids: Vec<Uuid> = tasks.iter().map(|t| t.task_id).collect();
    let attempts: Vec<i32> = tasks.iter().map(|t| t.attempt).collect();
    let iterations: Vec<i32> = tasks.iter().map(|t| t.iteration).collect();
    let current: Vec<bool> = tasks.iter().map(|t| t.current).collect();
    let rows = client
        .query(
            "SELECT c.id FROM workflow_runs c
               JOIN unnest($1::uuid[], $2::int4[], $3::bool[], $4::int4[]) AS u(task_id, attempt, current, iteration)
                 ON c.parent_task_id = u.task_id
              WHERE c.status IN ('RUNNING', 'PAUSED') AND NOT c.abandoned
                AND ((c.parent_attempt, c.parent_iteration) < (u.attempt, u.iteration)
                     OR (u.current AND c.parent_attempt = u.attempt AND c.parent_iteration = u.iteration))",
            &[&ids, &attempts, &current, &iterations],
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
                status: status_of(&status)?,
                output: r.try_get(5)?,
                error: r.try_get(6)?,
            })
        })
        .collect()
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
