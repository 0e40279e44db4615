//! The recovery sweeps of the seed (Steps 2 and 3). Each is one statement: an
//! `UPDATE … RETURNING` in a CTE feeding the outbox `INSERT … SELECT`, so the
//! reset and the re-dispatch are atomic, and because each UPDATE locks the
//! rows it changes, coordinators running a sweep at once claim disjoint tasks.
//!
//! The attempt does not change: the execution was interrupted, not failed.
//! If the "dead" worker was only slow and reports later, its report still
//! matches and is applied once; the second execution's report then finds the
//! task finished and is ignored.

use std::time::Duration;

use crate::dispatch::{dispatch_insert, DispatchParams};
use crate::runs::DispatchConfig;
use crate::{Client, Result};

const PARAMS: DispatchParams = DispatchParams { shards: "$1", prefix: "$2" };

/// Resets RUNNING tasks whose lease expired — their worker died or lost
/// contact — to PENDING and re-dispatches them. Returns how many.
pub async fn requeue_expired_leases(client: &Client, d: &DispatchConfig) -> Result<u64> {
    let sql = format!(
        "WITH expired AS (
            UPDATE task_instances
               SET state = 'PENDING', lease_owner = NULL, lease_expires_at = NULL,
                   started_at = NULL, updated_at = now()
             WHERE state = 'RUNNING' AND (lease_expires_at IS NULL OR lease_expires_at < now())
            RETURNING id, run_id, node_id, node_type, queue, attempt, input_json
        ) {} FROM expired t JOIN workflow_runs r ON r.id = t.run_id",
        dispatch_insert(&PARAMS)
    );
    let stmt = client.prepare_cached(&sql).await?;
    Ok(client.execute(&stmt, &[&d.shards, &d.prefix]).await?)
}

/// Re-dispatches PENDING tasks of running runs that have no outbox row and
/// were not touched for `older_than` — their stream message was lost.
/// Touching `updated_at` limits each task to one re-dispatch per interval; a
/// task whose message is merely queued may run twice, which the lease stops.
pub async fn redispatch_pending_tasks(client: &Client, d: &DispatchConfig, older_than: Duration) -> Result<u64> {
    let sql = format!(
        "WITH lost AS (
            UPDATE task_instances t
               SET updated_at = now()
              FROM workflow_runs r
             WHERE r.id = t.run_id
               AND r.status = 'RUNNING'
               AND t.state = 'PENDING'
               AND t.updated_at < now() - make_interval(secs => $3)
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.task_id = t.id)
            RETURNING t.id, t.run_id, t.node_id, t.node_type, t.queue, t.attempt, t.input_json
        ) {} FROM lost t JOIN workflow_runs r ON r.id = t.run_id",
        dispatch_insert(&PARAMS)
    );
    let stmt = client.prepare_cached(&sql).await?;
    Ok(client.execute(&stmt, &[&d.shards, &d.prefix, &older_than.as_secs_f64()]).await?)
}
