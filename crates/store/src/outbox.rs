//! The transactional outbox: rows committed with the state change that
//! dispatched them, published to Redis afterwards.
//!
//! A row says which task and attempt to send and where (queue and shard);
//! the message itself is the [`Dispatch`] built from the task row when the
//! row is claimed, and the stream is named by the stream crate, so neither
//! has a second copy here.
//!
//! Claiming uses `FOR UPDATE SKIP LOCKED`, so enqueuers on many coordinators
//! take disjoint rows. A claim does not delete: it moves `next_attempt_at`
//! forward by the claim timeout, so a row whose publisher crashed between
//! XADD and DELETE is claimed and published again later (the duplicate
//! message is harmless: the lease admits one execution).

use std::time::Duration;

use composer_api::wire::Dispatch;
use composer_core::definition::Node;
use composer_core::machine;
use composer_core::trace::RunTrace;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// Channel notified when a commit adds outbox rows.
pub const OUTBOX_CHANNEL: &str = "composer_outbox";

/// A claimed row: where its message goes, and the message. `dispatch` is
/// `None` when the task no longer exists (its month was dropped): the row is
/// deleted like a published one.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub queue: String,
    pub shard: i32,
    /// The priority of its run, which names its stream with the queue and shard.
    pub priority: u8,
    pub attempts: i32,
    pub dispatch: Option<Dispatch>,
}

impl Claimed {
    fn from_row(r: &Row) -> Result<Claimed> {
        let dispatch = match r.try_get::<_, Option<String>>("node_id")? {
            None => None,
            Some(node_id) => Some(Dispatch {
                task_id: r.try_get("task_id")?,
                run_id: r.try_get("run_id")?,
                workflow_id: r.try_get("workflow_definition_id")?,
                workflow_version: r.try_get("workflow_version")?,
                node_id,
                node_type: r.try_get("node_type")?,
                attempt: r.try_get("attempt")?,
                input: r.try_get("input_json")?,
                published_at_us: None,
                traceparent: Some(attempt_traceparent(r)?),
                dispatched_at_us: None,
            }),
        };
        Ok(Claimed {
            id: r.try_get("id")?,
            queue: r.try_get("queue")?,
            shard: r.try_get("shard")?,
            priority: priority_of(r.try_get("priority")?),
            attempts: r.try_get("attempts")?,
            dispatch,
        })
    }
}

/// A stored priority as a level; out of range (never written so) is the default.
fn priority_of(p: i16) -> u8 {
    u8::try_from(p)
        .ok()
        .filter(|&p| composer_core::priority::is_level(p.into()))
        .unwrap_or(composer_core::priority::DEFAULT)
}

/// The `traceparent` of the attempt a row names (`run_id`, `task_id` or
/// `id`, `attempt`), from its run's `traceparent`.
pub(crate) fn attempt_traceparent(r: &Row) -> Result<String> {
    let run_id: Uuid = r.try_get("run_id")?;
    let task_id: Uuid = r.try_get("task_id")?;
    let trace = RunTrace::of(run_id, r.try_get::<_, Option<&str>>("traceparent")?);
    Ok(trace.attempt(task_id, r.try_get("attempt")?).header())
}

/// Claims up to `limit` due rows for `claim_timeout`, deleting in the same
/// commit the rows of the previous batch that were published (`published`).
/// The message is read from the task row as it is now; a task that moved to
/// another attempt meanwhile gets a message its lease will refuse.
pub async fn claim(client: &Client, limit: i64, claim_timeout: Duration, published: &[i64]) -> Result<Vec<Claimed>> {
    let stmt = client
        .prepare_cached(
            "WITH published AS (DELETE FROM outbox WHERE id = ANY($3)),
                  claimed AS (
                    UPDATE outbox o
                       SET status = 'CLAIMED', attempts = o.attempts + 1,
                           next_attempt_at = now() + make_interval(secs => $2)
                     WHERE o.id IN (SELECT id FROM outbox WHERE next_attempt_at <= now() AND NOT (id = ANY($3))
                                     ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING o.id, o.run_id, o.task_id, o.queue, o.shard, o.attempt, o.attempts, o.priority)
             SELECT c.id, c.run_id, c.task_id, c.queue, c.shard, c.attempt, c.attempts, c.priority,
                    r.workflow_definition_id, r.workflow_version, r.traceparent, t.node_id, t.node_type,
                    t.input_json
               FROM claimed c
               LEFT JOIN task_instances t ON t.run_id = c.run_id AND t.id = c.task_id
               LEFT JOIN workflow_runs r ON r.id = c.run_id",
        )
        .await?;
    let rows = client.query(&stmt, &[&limit, &claim_timeout.as_secs_f64(), &published]).await?;
    rows.iter().map(Claimed::from_row).collect()
}

/// Deletes rows whose messages are on their streams, on a connection or in
/// a transaction (the engine's write carries the deletes of the rows its
/// coordinator published since the last one).
pub async fn delete(client: &impl deadpool_postgres::GenericClient, ids: &[i64]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let stmt = client.prepare_cached("DELETE FROM outbox WHERE id = ANY($1)").await?;
    Ok(client.execute(&stmt, &[&ids]).await?)
}

/// Puts rows whose publish failed into RETRY with exponential backoff
/// (0.5 s doubling per attempt, at most `max_backoff`).
pub async fn retry_later(client: &Client, ids: &[i64], max_backoff: Duration) -> Result<u64> {
    let stmt = client
        .prepare_cached(
            "UPDATE outbox
                SET status = 'RETRY',
                    next_attempt_at = now() + make_interval(secs => least(0.5 * power(2, least(attempts, 20) - 1), $2))
              WHERE id = ANY($1)",
        )
        .await?;
    Ok(client.execute(&stmt, &[&ids, &max_backoff.as_secs_f64()]).await?)
}

/// An outbox row a writer publishes itself after its commit: the row's id
/// (to delete once the message is on its stream), where it goes, and the
/// message.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub id: i64,
    pub queue: String,
    pub shard: i32,
    pub priority: u8,
    pub dispatch: Dispatch,
}

/// Where a run's messages go besides their queue: its priority's streams,
/// and its fairness key's lane.
#[derive(Debug, Clone, Copy)]
pub struct Order<'a> {
    pub priority: u8,
    pub fairness_key: Option<&'a str>,
}

/// The message that dispatches attempt `t.attempt` of task `t`, written now,
/// with `input` (its input, or the reference to it once offloaded).
pub(crate) fn dispatch_of(
    run_id: Uuid,
    definition: (Uuid, i32),
    node: &Node,
    t: &machine::Task,
    input: &serde_json::Value,
    trace: &RunTrace,
) -> Dispatch {
    Dispatch {
        task_id: t.id,
        run_id,
        workflow_id: definition.0,
        workflow_version: definition.1,
        node_id: t.node_id(node).into_owned(),
        node_type: node.node_type.clone(),
        attempt: t.attempt,
        input: input.clone(),
        published_at_us: None,
        traceparent: Some(trace.attempt(t.id, t.attempt).header()),
        dispatched_at_us: Some(composer_api::wire::now_us()),
    }
}

/// `INSERT INTO outbox` for the tasks a batch of transitions dispatches. The
/// shard comes from `composer_lane` (the run's fairness key's, else the
/// task's own), the one place it is computed (the recovery sweeps use it too).
#[derive(Default)]
pub(crate) struct OutboxInserts<'a> {
    run_id: Vec<Uuid>,
    task_id: Vec<Uuid>,
    queue: Vec<&'a str>,
    attempt: Vec<i32>,
    priority: Vec<i16>,
    fairness_key: Vec<Option<&'a str>>,
    /// The message of each row, for a writer that publishes it.
    dispatch: Vec<Dispatch>,
}

impl<'a> OutboxInserts<'a> {
    pub(crate) fn push(
        &mut self,
        run_id: Uuid,
        definition: (Uuid, i32),
        node: &'a Node,
        (t, input): (&machine::Task, &serde_json::Value),
        trace: &RunTrace,
        order: Order<'a>,
    ) {
        self.run_id.push(run_id);
        self.task_id.push(t.id);
        self.queue.push(node.dispatch_queue());
        self.attempt.push(t.attempt);
        self.priority.push(order.priority.into());
        self.fairness_key.push(order.fairness_key);
        self.dispatch.push(dispatch_of(run_id, definition, node, t, input, trace));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.task_id.is_empty()
    }

    /// Inserts the rows, due `due_in` from now; returns them with their
    /// messages unless they are due at once (for the enqueuers).
    pub(crate) async fn execute(&self, tx: &Transaction<'_>, shards: i32, due_in: Duration) -> Result<Vec<Outbound>> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        let stmt = tx
            .prepare_cached(
                "INSERT INTO outbox (run_id, task_id, queue, shard, attempt, priority, next_attempt_at)
                 SELECT u.run_id, u.task_id, u.queue, composer_lane(u.task_id, u.fairness_key, $1), u.attempt,
                        u.priority, now() + make_interval(secs => $6)
                   FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::int4[], $7::int2[], $8::text[])
                        AS u(run_id, task_id, queue, attempt, priority, fairness_key)
              RETURNING id, task_id, shard",
            )
            .await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &shards,
            &self.run_id,
            &self.task_id,
            &self.queue,
            &self.attempt,
            &due_in.as_secs_f64(),
            &self.priority,
            &self.fairness_key,
        ];
        let rows = tx.query(&stmt, &params).await?;
        if due_in.is_zero() {
            // The enqueuers publish these.
            return Ok(Vec::new());
        }
        let index: std::collections::HashMap<Uuid, usize> =
            self.task_id.iter().enumerate().map(|(i, &t)| (t, i)).collect();
        let mut written = Vec::with_capacity(rows.len());
        for row in rows {
            let task_id: Uuid = row.try_get("task_id")?;
            let Some(&i) = index.get(&task_id) else { continue };
            written.push(Outbound {
                id: row.try_get("id")?,
                queue: self.queue[i].to_string(),
                shard: row.try_get("shard")?,
                priority: u8::try_from(self.priority[i]).unwrap_or(composer_core::priority::DEFAULT),
                dispatch: self.dispatch[i].clone(),
            });
        }
        Ok(written)
    }
}
