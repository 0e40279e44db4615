//! A worker's lease on a task, held in the task row itself, taken by the
//! coordinator for the worker's poll (or with its result's answer).

use std::time::Duration;

use composer_api::wire::Dispatch;
use uuid::Uuid;

use crate::{Pool, Result};

/// The outcome of [`LeaseManager::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The task was PENDING and is now ours.
    Granted,
    /// The task was RUNNING under an expired lease and is now ours.
    TakenOver,
    /// Someone holds it, or it finished, or it is at another attempt.
    Denied,
}

impl Acquired {
    pub fn is_granted(self) -> bool {
        self != Acquired::Denied
    }
}

/// Acquires and renews leases. Both are single conditional UPDATEs, so two
/// workers racing for one task cannot both win: the row lock serializes them
/// and the loser's WHERE no longer matches.
#[derive(Clone)]
pub struct LeaseManager {
    pool: Pool,
}

impl LeaseManager {
    pub fn new(pool: Pool) -> LeaseManager {
        LeaseManager { pool }
    }

    /// Takes the lease on attempt `attempt` of a task for `ttl`. Succeeds only
    /// when the task is PENDING, or RUNNING with an expired lease (and not at
    /// most once). A live lease cannot be taken, not even by its owner, so a
    /// redelivered message does not start a second run of the attempt while
    /// the first holds it. Once the lease has expired, a redelivered message
    /// takes it over for any owner, the one that let it expire included,
    /// which then runs the attempt again. Unlike
    /// [`LeaseManager::take_over_expired`], this takeover neither checks nor
    /// counts the attempt's `recoveries`.
    pub async fn acquire(
        &self,
        run_id: Uuid,
        task_id: Uuid,
        owner: &str,
        ttl: Duration,
        attempt: i32,
    ) -> Result<Acquired> {
        let granted = self.acquire_many(&[(run_id, task_id, attempt)], owner, ttl).await?;
        Ok(granted.get(&task_id).copied().unwrap_or(Acquired::Denied))
    }

    /// Extends a lease `owner` still holds. False means it was lost (expired
    /// and taken over, or the task was cancelled or finished): the holder must
    /// stop and discard its result.
    pub async fn renew(&self, run_id: Uuid, task_id: Uuid, owner: &str, ttl: Duration, attempt: i32) -> Result<bool> {
        let client = crate::client(&self.pool).await?;
        let stmt = client
            .prepare_cached(
                "UPDATE task_instances
                    SET lease_expires_at = now() + make_interval(secs => $4), updated_at = now()
                  WHERE run_id = $1 AND id = $2 AND attempt = $5 AND state = 'RUNNING' AND lease_owner = $3",
            )
            .await?;
        let n = client.execute(&stmt, &[&run_id, &task_id, &owner, &ttl.as_secs_f64(), &attempt]).await?;
        Ok(n == 1)
    }

    /// [`LeaseManager::acquire`] for many messages: one statement (one
    /// commit) for a whole read when its tasks are PENDING, as they are but
    /// for redeliveries; a second one takes over, of the tasks the first did
    /// not grant, those RUNNING under an expired lease (their worker stopped
    /// renewing). Returns, per granted task, whether it was taken over;
    /// tasks not in the answer were denied. A task named twice is granted at
    /// most once (an UPDATE changes a row once, whatever it joins).
    pub async fn acquire_many(
        &self,
        tasks: &[(Uuid, Uuid, i32)],
        owner: &str,
        ttl: Duration,
    ) -> Result<std::collections::HashMap<Uuid, Acquired>> {
        let client = crate::client(&self.pool).await?;
        let granted = lease(&client, tasks, owner, ttl, LeaseFrom::Pending).await?;
        let mut answer: std::collections::HashMap<Uuid, Acquired> =
            granted.into_iter().map(|id| (id, Acquired::Granted)).collect();
        let rest: Vec<(Uuid, Uuid, i32)> = tasks.iter().filter(|t| !answer.contains_key(&t.1)).copied().collect();
        if !rest.is_empty() {
            for id in lease(&client, &rest, owner, ttl, LeaseFrom::Expired).await? {
                answer.insert(id, Acquired::TakenOver);
            }
        }
        Ok(answer)
    }

    /// Takes over, for `owner`, up to `max` tasks of `queues` whose lease
    /// expired (their worker stopped heartbeating), at the same attempt,
    /// without waiting for the recovery sweep to dispatch them again. Each
    /// takeover counts as a recovery of the attempt; an attempt recovered
    /// `max_recoveries` times is left to the sweep, which fails it. Locked
    /// rows are skipped, so pollers take disjoint tasks.
    pub async fn take_over_expired(
        &self,
        queues: &[String],
        owner: &str,
        ttl: Duration,
        max: i64,
        max_recoveries: i32,
    ) -> Result<Vec<(Dispatch, String, u8)>> {
        let client = crate::client(&self.pool).await?;
        let stmt = client
            .prepare_cached(
                "WITH cand AS (
                    SELECT run_id, id FROM task_instances
                     WHERE state = 'RUNNING' AND lease_expires_at < now() AND queue = ANY($1) AND NOT at_most_once
                       AND NOT (recovered_attempt IS NOT DISTINCT FROM attempt AND recoveries >= $5)
                     ORDER BY lease_expires_at LIMIT $4 FOR UPDATE SKIP LOCKED)
                 UPDATE task_instances t
                    SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
                        started_at = now(), updated_at = now(),
                        recoveries = CASE WHEN t.recovered_attempt = t.attempt THEN t.recoveries + 1 ELSE 1 END,
                        recovered_attempt = t.attempt
                   FROM cand, workflow_runs r
                  WHERE t.run_id = cand.run_id AND t.id = cand.id AND r.id = t.run_id
              RETURNING t.id, t.id AS task_id, t.run_id, r.workflow_definition_id, r.workflow_version,
                        r.traceparent, r.priority, t.node_id, t.node_type, t.attempt, t.input_json, t.queue",
            )
            .await?;
        let rows = client.query(&stmt, &[&queues, &owner, &ttl.as_secs_f64(), &max, &max_recoveries]).await?;
        rows.iter()
            .map(|r| {
                let d = Dispatch {
                    task_id: r.try_get("id")?,
                    run_id: r.try_get("run_id")?,
                    workflow_id: r.try_get("workflow_definition_id")?,
                    workflow_version: r.try_get("workflow_version")?,
                    node_id: r.try_get("node_id")?,
                    node_type: r.try_get("node_type")?,
                    attempt: r.try_get("attempt")?,
                    input: r.try_get("input_json")?,
                    published_at_us: None,
                    traceparent: Some(crate::outbox::attempt_traceparent(r)?),
                    dispatched_at_us: None,
                };
                let priority: i16 = r.try_get("priority")?;
                Ok((d, r.try_get("queue")?, priority as u8))
            })
            .collect()
    }
}

/// Which tasks [`lease`] may take: PENDING ones, or RUNNING ones whose lease
/// expired.
#[derive(Debug, Clone, Copy)]
enum LeaseFrom {
    Pending,
    /// Any owner's expired lease, its own included; `recoveries` is not
    /// checked or counted.
    Expired,
}

/// Leases to `owner`, for `ttl`, the tasks of `tasks` (run, task, attempt)
/// at that attempt that `from` allows; returns their ids. One conditional
/// UPDATE: two workers racing for a task are serialized by its row lock and
/// the loser's WHERE no longer matches.
async fn lease(
    client: &crate::Client,
    tasks: &[(Uuid, Uuid, i32)],
    owner: &str,
    ttl: Duration,
    from: LeaseFrom,
) -> Result<Vec<Uuid>> {
    let run_ids: Vec<Uuid> = tasks.iter().map(|t| t.0).collect();
    let task_ids: Vec<Uuid> = tasks.iter().map(|t| t.1).collect();
    let attempts: Vec<i32> = tasks.iter().map(|t| t.2).collect();
    // `IS TRUE` keeps these conditions from matching the predicate of the
    // partial index on pending tasks: with statistics taken while few tasks
    // were pending, the planner otherwise reads that whole index (every
    // pending MAP item) and hash-joins it with the batch, on every lease.
    let condition = match from {
        LeaseFrom::Pending => "(t.state = 'PENDING') IS TRUE",
        // An at-most-once attempt whose lease expired may have been sent:
        // it goes IN_DOUBT (recovery), never to another worker.
        LeaseFrom::Expired => "(t.state = 'RUNNING') IS TRUE AND t.lease_expires_at < now() AND NOT t.at_most_once",
    };
    let stmt = client
        .prepare_cached(&format!(
            "UPDATE task_instances t
                SET state = 'RUNNING', lease_owner = $4, lease_expires_at = now() + make_interval(secs => $5),
                    started_at = now(), updated_at = now()
               FROM unnest($1::uuid[], $2::uuid[], $3::int4[]) AS req(run_id, id, attempt)
              WHERE t.run_id = req.run_id AND t.id = req.id AND t.attempt = req.attempt AND {condition}
                AND t.run_id BETWEEN $6 AND $7
          RETURNING t.id"
        ))
        .await?;
    let (lo, hi) = crate::partitions::span(&run_ids);
    let rows = client.query(&stmt, &[&run_ids, &task_ids, &attempts, &owner, &ttl.as_secs_f64(), &lo, &hi]).await?;
    rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
}

/// The queue of task `task_id` of run `run_id`; `None` when there is no
/// such task (or it has no queue: it is never leased). Asked only for a
/// worker's key limited to some queues, before its report is applied.
pub async fn queue_of(client: &crate::Client, run_id: Uuid, task_id: Uuid) -> Result<Option<String>> {
    let stmt = client.prepare_cached("SELECT queue FROM task_instances WHERE run_id = $1 AND id = $2").await?;
    Ok(client.query_opt(&stmt, &[&run_id, &task_id]).await?.and_then(|r| r.get::<_, Option<String>>(0)))
}
