//! The worker's lease on a task, held in the task row itself.

use std::time::Duration;

use composer_core::machine::TaskState;
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
    /// when the task is PENDING, or RUNNING with an expired lease; an owner
    /// cannot re-acquire a lease it still holds, so a redelivered message is
    /// not executed twice by the same worker.
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

    /// Hands a lease back before its time: the task stays RUNNING at its
    /// attempt with a lease that has expired, so the next reclaim or recovery
    /// sweep takes it over at once. Used when a result could not be delivered.
    pub async fn release(&self, run_id: Uuid, task_id: Uuid, owner: &str, attempt: i32) -> Result<bool> {
        let client = crate::client(&self.pool).await?;
        let stmt = client
            .prepare_cached(
                "UPDATE task_instances SET lease_expires_at = now() - interval '1 millisecond', updated_at = now()
                  WHERE run_id = $1 AND id = $2 AND attempt = $4 AND state = 'RUNNING' AND lease_owner = $3",
            )
            .await?;
        Ok(client.execute(&stmt, &[&run_id, &task_id, &owner, &attempt]).await? == 1)
    }

    /// [`LeaseManager::acquire`] for many messages in one statement: one
    /// commit for a whole read. `prev` reads each row as it was before the
    /// statement: RUNNING there means the lease was taken over from a worker
    /// that stopped renewing. Returns, per granted task, whether it was
    /// taken over; tasks not in the answer were denied. A task named twice
    /// is granted at most once.
    pub async fn acquire_many(
        &self,
        tasks: &[(Uuid, Uuid, i32)],
        owner: &str,
        ttl: Duration,
    ) -> Result<std::collections::HashMap<Uuid, Acquired>> {
        let run_ids: Vec<Uuid> = tasks.iter().map(|t| t.0).collect();
        let task_ids: Vec<Uuid> = tasks.iter().map(|t| t.1).collect();
        let attempts: Vec<i32> = tasks.iter().map(|t| t.2).collect();
        let client = crate::client(&self.pool).await?;
        let stmt = client
            .prepare_cached(
                "WITH req AS (SELECT DISTINCT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[]) AS r(run_id, id, attempt)),
                      prev AS (SELECT t.id, t.state FROM task_instances t JOIN req ON t.run_id = req.run_id AND t.id = req.id)
                 UPDATE task_instances t
                    SET state = 'RUNNING', lease_owner = $4,
                        lease_expires_at = now() + make_interval(secs => $5),
                        started_at = now(), updated_at = now()
                   FROM req
                  WHERE t.run_id = req.run_id AND t.id = req.id AND t.attempt = req.attempt
                    AND (t.state = 'PENDING' OR (t.state = 'RUNNING' AND t.lease_expires_at < now()))
              RETURNING t.id, (SELECT state FROM prev WHERE prev.id = t.id) AS prev_state",
            )
            .await?;
        let rows = client.query(&stmt, &[&run_ids, &task_ids, &attempts, &owner, &ttl.as_secs_f64()]).await?;
        rows.iter()
            .map(|r| {
                let prev: Option<String> = r.try_get("prev_state")?;
                let taken_over = prev.as_deref() == Some(TaskState::Running.as_str());
                Ok((r.try_get("id")?, if taken_over { Acquired::TakenOver } else { Acquired::Granted }))
            })
            .collect()
    }
}
