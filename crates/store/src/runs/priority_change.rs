//! Changing the priority of an open run and every open run under it: the
//! runs' rows, a QUEUED run's turn, and its PENDING steps sent again on the
//! new priority's streams.

use composer_core::machine::{HistoryKind, RunStatus};
use uuid::Uuid;

use super::concurrency::{turn_of, CHANGED_TURN};
use super::rows::{priority_of, status_of};
use crate::{Result, Transaction};

/// What [`set_priority`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityChange {
    /// No such run.
    NotFound,
    /// The run has ended: it has no work left to order.
    Ended(RunStatus),
    /// `runs` open runs of the tree (the run and those under it) had
    /// another priority and now have this one (none: nothing changed);
    /// `moved` of their PENDING steps were sent again on its streams.
    Changed { from: u8, runs: u64, moved: u64 },
}

/// Most PENDING steps one priority change sends again on the new
/// priority's streams (`max_priority_moves`); the others keep their
/// messages, on the old priority's streams, and take the new one when next
/// dispatched.
pub const MAX_PRIORITY_MOVES: i64 = 10_000;

/// Gives an open run, and every open run under it, `priority`.
///
/// - Runs that have it already are left alone: a change to the same
///   priority writes nothing.
/// - A QUEUED run's turn moves with its priority: raised, it is no later
///   than its new class's next turn (right after the queue's head when the
///   class has none queued); lowered, it is no earlier than it was.
/// - PENDING steps are sent again on the new priority's streams (an outbox
///   row may be published already, waiting to be deleted, so each gets a
///   new row; the copy left behind finds the task leased or moved on, and
///   its lease refuses it), at most [`MAX_PRIORITY_MOVES`].
/// - The runs are locked in id order, as the engine locks them, and outbox
///   rows only inserted, so the change waits for neither the engine nor the
///   publishers in a cycle.
///
/// Records `PriorityChanged` in the run's history, with `actor`.
pub async fn set_priority(
    tx: &Transaction<'_>,
    run_id: Uuid,
    priority: u8,
    shards: i32,
    actor: &str,
) -> Result<PriorityChange> {
    let tree: Vec<Uuid> = tx
        .query(
            "WITH RECURSIVE tree(id) AS (
                SELECT id FROM workflow_runs WHERE id = $1
                UNION ALL
                SELECT c.id FROM workflow_runs c JOIN tree ON c.parent_run_id = tree.id
                 WHERE c.status IN ('QUEUED', 'RUNNING', 'PAUSED'))
             SELECT id FROM tree",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<std::result::Result<_, _>>()?;
    let locked = tx
        .query("SELECT id, status, priority FROM workflow_runs WHERE id = ANY($1) ORDER BY id FOR UPDATE", &[&tree])
        .await?;
    let Some(root) = locked.iter().find(|r| r.try_get::<_, Uuid>(0).ok() == Some(run_id)) else {
        return Ok(PriorityChange::NotFound);
    };
    let status: String = root.try_get(1)?;
    let status = status_of(&status)?;
    if status.is_terminal() {
        return Ok(PriorityChange::Ended(status));
    }
    let from = priority_of(root.try_get(2)?)?;
    let p = i16::from(priority);
    let changed = tx
        .query_one(
            "WITH changed AS (
                UPDATE workflow_runs r
                   SET priority = $2, updated_at = now(),
                       fair_turn = CASE
                           WHEN r.status <> 'QUEUED' THEN r.fair_turn
                           WHEN $2 < r.priority THEN least(r.fair_turn, {turn})
                           ELSE greatest(r.fair_turn, {turn}) END
                 WHERE r.id = ANY($1) AND r.priority <> $2 AND r.status IN ('QUEUED', 'RUNNING', 'PAUSED')
                RETURNING r.id, r.fairness_key),
             moved AS (
                INSERT INTO outbox (run_id, task_id, queue, shard, attempt, priority)
                SELECT t.run_id, t.id, t.queue, composer_lane(t.id, c.fairness_key, $3), t.attempt, $2
                  FROM changed c JOIN task_instances t ON t.run_id = c.id
                 WHERE t.state = 'PENDING' AND t.queue IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM limit_waits w WHERE w.task_id = t.id AND w.admitted_at IS NULL)
                 LIMIT $5
                RETURNING 1)
             SELECT (SELECT count(*) FROM changed), (SELECT count(*) FROM moved)"
                .replace("{turn}", CHANGED_TURN)
                .as_str(),
            &[&tree, &p, &shards, &turn_of(priority), &MAX_PRIORITY_MOVES],
        )
        .await?;
    let (runs, moved): (i64, i64) = (changed.try_get(0)?, changed.try_get(1)?);
    if runs > 0 {
        let payload = serde_json::json!({"priority": priority, "from": from, "runs": runs, "actor": actor});
        tx.execute(
            "INSERT INTO run_events (run_id, type, payload) VALUES ($1, $2, $3)",
            &[&run_id, &HistoryKind::PriorityChanged.as_str(), &payload],
        )
        .await?;
    }
    if moved > 0 {
        tx.execute("SELECT pg_notify($1, '')", &[&crate::outbox::OUTBOX_CHANNEL]).await?;
    }
    Ok(PriorityChange::Changed { from, runs: runs as u64, moved: moved as u64 })
}
