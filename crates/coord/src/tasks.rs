//! The task API: workers in any language, with only a URL and the worker
//! token, lease tasks of custom node types over HTTP.
//!
//! The coordinator does for them what the Rust worker does for itself: it
//! reads the queue's streams in the workers' consumer group, takes the
//! leases in PostgreSQL (one statement for a batch, owner = the polling
//! worker's id), and acknowledges the messages, so from then on the lease
//! is the only record of who runs a task. A worker that stops heartbeating
//! loses the task to the next poller once the lease expires: polls take
//! over expired leases of their queues first, before they read new
//! messages. Each takeover counts as a recovery of the attempt, so an
//! attempt that keeps killing workers is failed by the recovery sweep
//! (`COMPOSER_MAX_DISPATCHES`) instead of going round for ever.
//!
//! Crashes: a coordinator that dies after reading and before leasing
//! leaves the task PENDING with its message unacknowledged, and the lost
//! dispatch sweep sends it again; one that dies after leasing leaves a
//! lease nobody heartbeats, taken over as above. A complete or fail is
//! applied only while the worker still holds the lease (409 otherwise): a
//! worker that lost its task cannot overwrite the result of the one that
//! took it over.

use std::time::Duration;

use composer_api::wire::Dispatch;
use composer_api::LeasedTask;
use composer_store::leases::LeaseManager;
use uuid::Uuid;

use crate::shared::Shared;

/// Why a poll could not lease: the store or Redis is down.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error("Redis is unavailable; retry later")]
    Redis(#[source] composer_stream::Error),
}

/// Longest time between two reads of an idle long-poll (another
/// coordinator's publishes are seen by reading; this one's wake it).
pub const IDLE_READ_EVERY: Duration = Duration::from_millis(200);

/// Creates the consumer group of each stream once per coordinator (and
/// again after Redis lost it).
pub async fn ensure_groups(s: &Shared, streams: impl Iterator<Item = &String>) -> Result<(), LeaseError> {
    let missing: Vec<String> = {
        let known = s.task_api_groups.lock().unwrap_or_else(|p| p.into_inner());
        streams.filter(|n| !known.contains(*n)).cloned().collect()
    };
    for name in missing {
        s.streams.ensure_group(&name).await.map_err(redis_down)?;
        s.task_api_groups.lock().unwrap_or_else(|p| p.into_inner()).insert(name);
    }
    Ok(())
}

fn redis_down(e: composer_stream::Error) -> LeaseError {
    tracing::warn!(error = %e, "task API: Redis unavailable");
    LeaseError::Redis(e)
}

/// The streams of a poll's queues, by priority (level 1's first).
pub type ByPriority = [Vec<String>; 5];

/// The streams of `queues`, by priority.
pub fn streams_by_priority(s: &Shared, queues: &[String]) -> ByPriority {
    let keys = s.streams.keys();
    std::array::from_fn(|i| {
        let priority = composer_core::priority::HIGHEST + i as u8;
        queues
            .iter()
            .flat_map(|q| (0..s.config.stream_shards).map(move |shard| keys.stream(q, priority, shard)))
            .collect()
    })
}

/// One pass: expired leases first, then new messages, up to `max` tasks.
pub async fn lease(
    s: &Shared,
    worker: &str,
    queues: &[String],
    streams: &ByPriority,
    start: usize,
    max: usize,
) -> Result<Vec<LeasedTask>, LeaseError> {
    let leases = LeaseManager::new(s.pool.clone());
    let ttl = s.config.task_lease_ttl;
    let view = |d: Dispatch, queue: String| LeasedTask {
        id: d.task_id,
        run_id: d.run_id,
        attempt: d.attempt,
        node_id: d.node_id,
        node_type: d.node_type,
        queue,
        input: d.input,
        lease_ttl_ms: ttl.as_millis() as u64,
        traceparent: d.traceparent,
    };
    let mut out: Vec<LeasedTask> = leases
        .take_over_expired(queues, worker, ttl, max as i64, s.config.max_dispatches)
        .await?
        .into_iter()
        .map(|(d, q)| view(d, q))
        .collect();
    if !out.is_empty() {
        composer_metrics::inc(composer_metrics::LEASE_TAKEOVERS, &[], out.len() as u64);
    }
    // Stream by stream, never reading more than can be leased: a message
    // read and not leased would wait for the lost-dispatch sweep.
    let consumer = format!("api:{worker}");
    let want = max - out.len();
    if want == 0 {
        return Ok(out);
    }
    // The coordinator's share, carried through the read: polls at once may
    // each start from the same state, which only blurs the share a little.
    let mut share = s.priority_share.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (read, missing) =
        s.streams.read_weighted(&consumer, streams, want, &mut share, start).await.map_err(redis_down)?;
    *s.priority_share.lock().unwrap_or_else(|p| p.into_inner()) = share;
    if !missing.is_empty() {
        // Redis lost the groups (restarted without persistence): make them again next time.
        let mut known = s.task_api_groups.lock().unwrap_or_else(|p| p.into_inner());
        for stream in &missing {
            known.remove(stream);
        }
    }
    if read.is_empty() {
        return Ok(out);
    }
    let mut wanted = Vec::new();
    for msg in &read {
        match serde_json::from_str::<Dispatch>(&msg.payload) {
            Ok(d) => wanted.push((d, s.streams.keys().queue_of(&msg.stream).unwrap_or_default().to_string())),
            Err(e) => tracing::error!(stream = %msg.stream, id = %msg.id, error = %e, "dropping a malformed message"),
        }
    }
    let requests: Vec<(Uuid, Uuid, i32)> = wanted.iter().map(|(d, _)| (d.run_id, d.task_id, d.attempt)).collect();
    let granted = leases.acquire_many(&requests, worker, ttl).await?;
    // Acknowledged whether leased or not: a lease is the record of who runs
    // a task, and a message whose lease was denied is for a task another
    // worker holds or that moved on.
    let acks: Vec<(&str, &str)> = read.iter().map(|m| (m.stream.as_str(), m.id.as_str())).collect();
    if let Err(e) = s.streams.ack_many(&acks).await {
        tracing::warn!(error = %e, "task API: ack failed; the messages may be delivered again (their leases refuse them)");
    }
    let mut seen = std::collections::HashSet::new();
    for (d, queue) in wanted {
        if granted.contains_key(&d.task_id) && seen.insert(d.task_id) {
            out.push(view(d, queue));
        }
    }
    Ok(out)
}
