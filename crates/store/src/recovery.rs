//! The recovery sweeps (expired leases, lost dispatches). Each is one statement: an
//! `UPDATE … RETURNING` in a CTE feeding the outbox `INSERT … SELECT`, so the
//! reset and the re-dispatch are atomic, and because each UPDATE locks the
//! rows it changes, coordinators running a sweep at once claim disjoint tasks.
//!
//! Only dispatched node types (HTTP and custom) reach PENDING or RUNNING, and
//! their tasks are created with their queue resolved, so `queue` is set.
//!
//! Each re-dispatch is counted against the attempt (`recoveries`); at
//! `max` the sweeps leave the task to [`exhausted`], whose tasks the caller
//! fails, so no attempt is dispatched forever (a result the coordinator
//! cannot take, a worker that dies on the task every time).
//!
//! The attempt does not change: the execution was interrupted, not failed.
//! If the "dead" worker was only slow and reports after its task was
//! requeued or taken over, it no longer holds the lease: its report is
//! refused (409) and its result dropped. Only the lease holder's result is
//! applied.

use std::time::Duration;

use uuid::Uuid;

use crate::{Client, Result};

/// Resets RUNNING tasks whose lease expired — their worker died or lost
/// contact — to PENDING and re-dispatches them over `shards` stream shards.
/// Returns how many.
pub async fn requeue_expired_leases(client: &Client, shards: i32, max: i32) -> Result<u64> {
    let stmt = client
        .prepare_cached(
            "WITH expired AS (
                UPDATE task_instances
                   SET state = 'PENDING', lease_owner = NULL, lease_expires_at = NULL,
                       started_at = NULL, updated_at = now(),
                       recoveries = CASE WHEN recovered_attempt = attempt THEN recoveries + 1 ELSE 1 END,
                       recovered_attempt = attempt
                 WHERE state = 'RUNNING' AND (lease_expires_at IS NULL OR lease_expires_at < now())
                   AND queue IS NOT NULL AND NOT at_most_once
                   AND NOT (recovered_attempt IS NOT DISTINCT FROM attempt AND recoveries >= $2)
                RETURNING run_id, id, queue, attempt
             )
             INSERT INTO outbox (run_id, task_id, queue, shard, attempt, priority)
             SELECT x.run_id, x.id, x.queue, composer_lane(x.id, r.fairness_key, $1), x.attempt, r.priority
               FROM expired x JOIN workflow_runs r ON r.id = x.run_id",
        )
        .await?;
    Ok(client.execute(&stmt, &[&shards, &max]).await?)
}

/// Re-dispatches PENDING tasks of running runs that have no outbox row and
/// were not touched for `older_than` — their stream message was lost. A
/// step its limits hold has no message yet: the limiter sends it.
/// Touching `updated_at` limits each task to one re-dispatch per interval; a
/// task whose message is merely queued may run twice, which the lease stops.
pub async fn redispatch_pending_tasks(client: &Client, shards: i32, older_than: Duration, max: i32) -> Result<u64> {
    let stmt = client
        .prepare_cached(
            "WITH lost AS (
                UPDATE task_instances t
                   SET updated_at = now(),
                       recoveries = CASE WHEN t.recovered_attempt = t.attempt THEN t.recoveries + 1 ELSE 1 END,
                       recovered_attempt = t.attempt
                  FROM workflow_runs r
                 WHERE r.id = t.run_id
                   AND r.status IN ('RUNNING', 'PAUSED')
                   AND t.state = 'PENDING'
                   AND t.queue IS NOT NULL
                   AND t.updated_at < now() - make_interval(secs => $2)
                   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_id = t.id)
                   AND NOT EXISTS (SELECT 1 FROM limit_waits w WHERE w.task_id = t.id AND w.admitted_at IS NULL)
                   AND NOT (t.recovered_attempt IS NOT DISTINCT FROM t.attempt AND t.recoveries >= $3)
                RETURNING t.run_id, t.id, t.queue, t.attempt
             )
             INSERT INTO outbox (run_id, task_id, queue, shard, attempt, priority)
             SELECT x.run_id, x.id, x.queue, composer_lane(x.id, r.fairness_key, $1), x.attempt, r.priority
               FROM lost x JOIN workflow_runs r ON r.id = x.run_id",
        )
        .await?;
    Ok(client.execute(&stmt, &[&shards, &older_than.as_secs_f64(), &max]).await?)
}

/// An attempt recovery will not dispatch again.
#[derive(Debug, Clone, Copy)]
pub struct Exhausted {
    pub run_id: Uuid,
    pub task_id: Uuid,
    pub attempt: i32,
    pub recoveries: i32,
}

/// Tasks of running runs that recovery would dispatch again (lease expired,
/// or message lost for `older_than`) but whose attempt already was, `max`
/// times: the caller fails these attempts.
pub async fn exhausted(client: &Client, older_than: Duration, max: i32, limit: i64) -> Result<Vec<Exhausted>> {
    let rows = client
        .query(
            "SELECT t.run_id, t.id, t.attempt, t.recoveries
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE r.status IN ('RUNNING', 'PAUSED')
                AND t.recovered_attempt = t.attempt AND t.recoveries >= $2
                AND ((t.state = 'RUNNING' AND (t.lease_expires_at IS NULL OR t.lease_expires_at < now())
                      AND NOT t.at_most_once)
                  OR (t.state = 'PENDING' AND t.updated_at < now() - make_interval(secs => $1)
                      AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_id = t.id)
                      AND NOT EXISTS (SELECT 1 FROM limit_waits w WHERE w.task_id = t.id
                                                                     AND w.admitted_at IS NULL)))
              LIMIT $3",
            &[&older_than.as_secs_f64(), &max, &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Exhausted {
                run_id: r.try_get(0)?,
                task_id: r.try_get(1)?,
                attempt: r.try_get(2)?,
                recoveries: r.try_get(3)?,
            })
        })
        .collect()
}

/// RUNNING attempts of at-most-once nodes whose lease expired (their worker
/// died or lost the lease, maybe after sending the request): `(run, task,
/// attempt)`, for the caller to put IN_DOUBT. Not dispatched again.
pub async fn in_doubt(client: &Client, limit: i64) -> Result<Vec<(Uuid, Uuid, i32)>> {
    let stmt = client
        .prepare_cached(
            "SELECT t.run_id, t.id, t.attempt
               FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
              WHERE t.state = 'RUNNING' AND t.at_most_once
                AND (t.lease_expires_at IS NULL OR t.lease_expires_at < now())
                AND r.status IN ('RUNNING', 'PAUSED')
              LIMIT $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&limit]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect()
}
