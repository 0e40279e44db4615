//! The task API: the one way workers (the Rust runtime and those of any
//! other language), with only coordinator URLs and the worker token, lease
//! tasks over HTTP.
//!
//! For a poll the coordinator reads the queue's streams in the workers'
//! consumer group, takes the
//! leases in PostgreSQL (one statement for a batch, owner = the polling
//! worker's id), and acknowledges the messages, so from then on the lease
//! is the only record of who runs a task. A worker that stops heartbeating
//! loses the task to the next poller once the lease expires: polls take
//! over expired leases of their queues first (looking at most every
//! [`takeover_every`] per set of queues), before they read new messages.
//! Each takeover counts as a recovery of the attempt, so an
//! attempt that keeps killing workers is failed by the recovery sweep
//! (`COMPOSER_MAX_DISPATCHES`) instead of going round for ever.
//!
//! Crashes: a coordinator that dies after reading and before leasing
//! leaves the task PENDING with its message unacknowledged. Once the
//! message has been idle for a lease, a poll of its queue claims it when it
//! looks for expired leases (`claim_stale`) and leases its task, so the
//! task does not wait for the lost-dispatch sweep. One that dies after
//! leasing leaves a lease nobody heartbeats, taken over as above. A
//! complete or fail is applied only while the worker still holds the lease
//! (409 otherwise): a worker that lost its task cannot overwrite the result
//! of the one that took it over.

use std::time::Duration;

use composer_api::wire::{Dispatch, StageTimes};
use composer_api::LeasedTask;
use composer_store::leases::{Acquired, LeaseManager};
use uuid::Uuid;

use crate::shared::TaskApi;

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
pub async fn ensure_groups(s: &TaskApi, streams: impl Iterator<Item = &String>) -> Result<(), LeaseError> {
    let missing: Vec<String> = {
        let known = s.groups.lock().unwrap_or_else(|p| p.into_inner());
        streams.filter(|n| !known.contains(*n)).cloned().collect()
    };
    for name in missing {
        s.streams.ensure_group(&name).await.map_err(redis_down)?;
        s.groups.lock().unwrap_or_else(|p| p.into_inner()).insert(name);
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
pub fn streams_by_priority(s: &TaskApi, queues: &[String]) -> ByPriority {
    let keys = s.streams.keys();
    std::array::from_fn(|i| {
        let priority = composer_core::priority::HIGHEST + i as u8;
        queues
            .iter()
            .flat_map(|q| (0..s.config.stream_shards).map(move |shard| keys.stream(q, priority, shard)))
            .collect()
    })
}

/// What one pass leased, and at which priorities tasks of its queues still
/// wait (`None` when it read nothing, so does not know).
pub struct Leased {
    pub tasks: Vec<LeasedTask>,
    pub waiting: Option<Vec<u8>>,
}

/// One pass: expired leases first, then new messages, up to `max` tasks.
/// A poll of some priorities only (`every_priority` false) leases new
/// messages only: an expired lease or a stale message may be of any
/// priority, and polls of every priority take those over.
pub async fn lease(
    s: &TaskApi,
    worker: &str,
    queues: &[String],
    streams: &ByPriority,
    every_priority: bool,
    start: usize,
    max: usize,
) -> Result<Leased, LeaseError> {
    let leases = LeaseManager::new(s.pool.clone());
    let due = every_priority && takeover_due(s, queues);
    let mut out = match due {
        false => Vec::new(),
        true => take_over_expired(s, &leases, worker, queues, max).await?,
    };
    // Stream by stream, never reading more than can be leased: a message
    // read and not leased would wait for the lost-dispatch sweep.
    let consumer = format!("api:{worker}");
    let want = max - out.len();
    if want == 0 {
        return Ok(Leased { tasks: out, waiting: None });
    }
    let mut read = match due {
        true => claim_stale(s, &consumer, streams, want).await?,
        false => Vec::new(),
    };
    let waiting = read_new(s, &consumer, streams, start, want, &mut read).await?;
    if read.is_empty() {
        return Ok(Leased { tasks: out, waiting: Some(waiting) });
    }
    out.extend(lease_read(s, &leases, worker, read).await?);
    Ok(Leased { tasks: out, waiting: Some(waiting) })
}

/// A dispatch as the worker that leased it sees it.
fn leased(d: Dispatch, queue: String, priority: u8, stages: StageTimes, ttl: Duration) -> LeasedTask {
    LeasedTask {
        id: d.task_id,
        run_id: d.run_id,
        attempt: d.attempt,
        node_id: d.node_id,
        node_type: d.node_type,
        queue,
        input: d.input,
        lease_ttl_ms: ttl.as_millis() as u64,
        traceparent: d.traceparent,
        priority,
        stages: Some(stages),
    }
}

/// Up to `max` tasks of `queues` whose leases expired, leased to `worker`.
async fn take_over_expired(
    s: &TaskApi,
    leases: &LeaseManager,
    worker: &str,
    queues: &[String],
    max: usize,
) -> Result<Vec<LeasedTask>, LeaseError> {
    let ttl = s.config.lease_ttl;
    let taken = leases.take_over_expired(queues, worker, ttl, max as i64, s.config.max_dispatches).await?;
    if !taken.is_empty() {
        crate::metrics::inc(composer_metrics::LEASE_TAKEOVERS, &[], taken.len() as u64);
    }
    let stages = || StageTimes { leased_at_us: Some(composer_api::wire::now_us()), ..StageTimes::default() };
    Ok(taken.into_iter().map(|(d, q, priority)| leased(d, q, priority, stages(), ttl)).collect())
}

/// Messages a coordinator read for a poll and never acknowledged (it died
/// between the read and the lease), claimed once idle for a lease, when
/// expired leases are looked for: their tasks would otherwise wait for the
/// lost-dispatch sweep.
async fn claim_stale(
    s: &TaskApi,
    consumer: &str,
    streams: &ByPriority,
    want: usize,
) -> Result<Vec<composer_stream::Message>, LeaseError> {
    let mut read = Vec::new();
    for stream in streams.iter().flatten() {
        if read.len() >= want {
            break;
        }
        let mut stale =
            s.streams.claim_stale(consumer, stream, s.config.lease_ttl, want - read.len()).await.map_err(redis_down)?;
        read.append(&mut stale);
    }
    Ok(read)
}

/// New messages, up to `want` in all with those already `read`, by the
/// coordinator's priority share; returns the priorities where more wait.
async fn read_new(
    s: &TaskApi,
    consumer: &str,
    streams: &ByPriority,
    start: usize,
    want: usize,
    read: &mut Vec<composer_stream::Message>,
) -> Result<Vec<u8>, LeaseError> {
    // The coordinator's share, carried through the read: polls at once may
    // each start from the same state, which only blurs the share a little.
    let mut share = s.priority_share.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let composer_stream::Weighted { messages, missing, waiting } = match read.len() < want {
        true => s
            .streams
            .read_weighted(consumer, streams, want - read.len(), &mut share, start)
            .await
            .map_err(redis_down)?,
        // All from stale messages: what waits is not known.
        false => composer_stream::Weighted { waiting: [true; 5], ..Default::default() },
    };
    // Only what this read moved goes back: the levels it read (a poll of
    // some priorities must not put back a stale copy of the others'), and
    // nothing when it read nothing.
    if !messages.is_empty() {
        let mut kept = s.priority_share.lock().unwrap_or_else(|p| p.into_inner());
        let (mut merged, read_state) = (kept.state(), share.state());
        for (level, state) in merged.iter_mut().enumerate().filter(|(l, _)| !streams[*l].is_empty()) {
            *state = read_state[level];
        }
        *kept = composer_core::priority::Share::with_state(merged);
    }
    read.extend(messages);
    if !missing.is_empty() {
        // Redis lost the groups (restarted without persistence): make them again next time.
        let mut known = s.groups.lock().unwrap_or_else(|p| p.into_inner());
        for stream in &missing {
            known.remove(stream);
        }
    }
    Ok((0..5u8).filter(|l| waiting[usize::from(*l)]).map(|l| l + composer_core::priority::HIGHEST).collect())
}

/// The tasks of messages `read`, leased to `worker` where their leases are
/// granted; every message is acknowledged.
async fn lease_read(
    s: &TaskApi,
    leases: &LeaseManager,
    worker: &str,
    read: Vec<composer_stream::Message>,
) -> Result<Vec<LeasedTask>, LeaseError> {
    let read_at_us = composer_api::wire::now_us();
    let wanted = dispatches(s, &read, read_at_us);
    let requests: Vec<(Uuid, Uuid, i32)> = wanted.iter().map(|(d, _, _)| (d.run_id, d.task_id, d.attempt)).collect();
    let granted = leases.acquire_many(&requests, worker, s.config.lease_ttl).await?;
    let took = Duration::from_micros(composer_api::wire::now_us().saturating_sub(read_at_us).max(0) as u64);
    crate::metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "read_to_lease")], took);
    let taken_over = granted.values().filter(|a| **a == Acquired::TakenOver).count();
    if taken_over > 0 {
        crate::metrics::inc(composer_metrics::LEASE_TAKEOVERS, &[], taken_over as u64);
    }
    // Acknowledged whether leased or not: a lease is the record of who runs
    // a task, and a message whose lease was denied is for a task another
    // worker holds or that moved on.
    let acks: Vec<(&str, &str)> = read.iter().map(|m| (m.stream.as_str(), m.id.as_str())).collect();
    if let Err(e) = s.streams.ack_many(&acks).await {
        tracing::warn!(error = %e, "task API: ack failed; the messages may be delivered again (their leases refuse them)");
    }
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut denied = 0;
    let leased_at_us = composer_api::wire::now_us();
    for (d, queue, priority) in wanted {
        if granted.contains_key(&d.task_id) && seen.insert(d.task_id) {
            let stages = StageTimes {
                dispatched_at_us: d.dispatched_at_us,
                published_at_us: d.published_at_us,
                read_at_us: Some(read_at_us),
                leased_at_us: Some(leased_at_us),
                ..StageTimes::default()
            };
            out.push(leased(d, queue, priority, stages, s.config.lease_ttl));
        } else {
            denied += 1;
        }
    }
    if denied > 0 {
        crate::metrics::inc(composer_metrics::LEASES_DENIED, &[], denied);
        s.leases_denied.fetch_add(denied, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(out)
}

/// The dispatches messages carry, with their queue and priority (a
/// malformed one is logged and dropped).
fn dispatches(s: &TaskApi, read: &[composer_stream::Message], read_at_us: i64) -> Vec<(Dispatch, String, u8)> {
    let keys = s.streams.keys();
    let mut wanted = Vec::new();
    for msg in read {
        match serde_json::from_str::<Dispatch>(&msg.payload) {
            Ok(d) => {
                if let Some(published) = d.published_at_us {
                    let transit = Duration::from_micros(read_at_us.saturating_sub(published).max(0) as u64);
                    crate::metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "publish_to_read")], transit);
                }
                let queue = keys.queue_of(&msg.stream).unwrap_or_default().to_string();
                wanted.push((d, queue, keys.priority_of(&msg.stream)));
            }
            Err(e) => tracing::error!(stream = %msg.stream, id = %msg.id, error = %e, "dropping a malformed message"),
        }
    }
    wanted
}

/// How often polls of one set of queues look for expired leases: often
/// enough that a dead worker's task goes on within a fraction of its lease,
/// rarely enough that a busy worker's polls do not each pay a query for it.
pub fn takeover_every(lease_ttl: Duration) -> Duration {
    (lease_ttl / 4).min(Duration::from_secs(1))
}

/// Most sets of queues whose last look is remembered: past it all are
/// forgotten (and looked at on their next poll), so workers naming ever new
/// sets cannot grow the map.
const MAX_TAKEOVER_SETS: usize = 1024;

/// Whether a poll of `queues` (sorted) should look for expired leases now,
/// and if so, noting that it does.
fn takeover_due(s: &TaskApi, queues: &[String]) -> bool {
    let now = std::time::Instant::now();
    let every = takeover_every(s.config.lease_ttl);
    let mut checked = s.takeovers_checked.lock().unwrap_or_else(|p| p.into_inner());
    if checked.get(queues).is_some_and(|at| now.duration_since(*at) < every) {
        return false;
    }
    if checked.len() >= MAX_TAKEOVER_SETS {
        checked.clear();
    }
    checked.insert(queues.to_vec(), now);
    true
}
