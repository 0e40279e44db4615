//! The loop behind `Worker::run`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use composer_api::wire::{Dispatch, EagerOffer, ReportStatus, StageTimes, TaskReport};
use composer_store::leases::{Acquired, LeaseManager};
use composer_stream::{Keys, Message, Streams};
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Config;
use crate::error::Error;
use crate::report::{Delivery, Reporter};
use crate::task::{Handler, Registration, TaskContext};

/// Counters of what a worker did; cheap to clone and read from tests.
#[derive(Debug, Clone, Default)]
pub struct Stats(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    executed: AtomicU64,
    lease_denied: AtomicU64,
    lease_lost: AtomicU64,
    reported: AtomicU64,
    report_failed: AtomicU64,
    eager: AtomicU64,
}

impl Stats {
    /// Executions started (leases won).
    pub fn executed(&self) -> u64 {
        self.0.executed.load(Ordering::Relaxed)
    }
    /// Messages dropped because another worker held the task or it had moved on.
    pub fn lease_denied(&self) -> u64 {
        self.0.lease_denied.load(Ordering::Relaxed)
    }
    /// Executions cancelled because their lease was lost.
    pub fn lease_lost(&self) -> u64 {
        self.0.lease_lost.load(Ordering::Relaxed)
    }
    pub fn reported(&self) -> u64 {
        self.0.reported.load(Ordering::Relaxed)
    }
    pub fn report_failed(&self) -> u64 {
        self.0.report_failed.load(Ordering::Relaxed)
    }
    /// Tasks run as given with a report's answer (eager dispatch).
    pub fn eager(&self) -> u64 {
        self.0.eager.load(Ordering::Relaxed)
    }
}

struct Ctx {
    id: String,
    lease_ttl: Duration,
    report_deadline: Duration,
    max_deliveries: u64,
    leases: LeaseManager,
    streams: Streams,
    reporter: Reporter,
    handlers: HashMap<String, Handler>,
    stats: Stats,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    /// Reads waiting for their leases (see [`lease_loop`]).
    leasing: tokio::sync::mpsc::UnboundedSender<Read>,
    /// What a report offers to run next (eager dispatch); `None` when off.
    offer: Option<EagerOffer>,
    /// Messages read and waiting for a slot: while there are any, reports
    /// offer nothing, so the slots go by the streams' priorities, unless
    /// the report's priority is higher than any of theirs.
    held: AtomicU64,
    /// The highest priority (the least number) among the messages held.
    held_best: std::sync::atomic::AtomicU8,
    /// The read loop waits for a slot to read with.
    wants_slot: std::sync::atomic::AtomicBool,
    stopping: CancellationToken,
}

/// Messages of a read, a slot for each, and when they were read.
struct Read {
    messages: Vec<Message>,
    slots: Vec<OwnedSemaphorePermit>,
    at: std::time::Instant,
    at_us: i64,
}

impl Ctx {
    /// What a report of a task of `priority` offers now. Nothing while
    /// stopping. Nothing while read messages wait for a slot (they go first,
    /// by their priority) or while the read loop waits for a slot (the
    /// report's goes back to the streams, so chains of eager tasks cannot
    /// keep them from being read) — unless the report's priority is higher
    /// than that of every message held, which would give way to its run's
    /// next task anyway.
    fn offer(&self, priority: u8) -> Option<&EagerOffer> {
        if self.stopping.is_cancelled() {
            return None;
        }
        let held = self.held.load(Ordering::Relaxed);
        let free = held == 0 && !self.wants_slot.load(Ordering::Relaxed);
        let ahead = held > 0 && priority < self.held_best.load(Ordering::Relaxed);
        self.offer.as_ref().filter(|_| free || ahead)
    }

    /// Queues a read for its leases.
    fn lease(&self, messages: Vec<Message>, slots: Vec<OwnedSemaphorePermit>) {
        let read = Read { messages, slots, at: std::time::Instant::now(), at_us: composer_api::wire::now_us() };
        // The lease loops run as long as the read loop: the queue is open.
        let _ = self.leasing.send(read);
    }
}

/// Lease statements in flight at once: one collects reads while the other
/// waits for PostgreSQL.
const LEASE_LOOPS: usize = 2;

pub async fn run(
    config: Config,
    handlers: HashMap<String, Registration>,
    shutdown: CancellationToken,
    stats: Stats,
) -> Result<(), Error> {
    let config = config.validated()?;
    let o = &config.options;
    let queues: BTreeSet<String> = match o.queues.is_empty() {
        false => o.queues.iter().cloned().collect(),
        true => handlers.values().map(|r| r.queue.clone()).collect(),
    };
    let pool = composer_store::connect(&config.database.url, o.db_pool_size, Duration::from_secs(5))?;
    let streams = Streams::connect_with(
        &config.redis.url,
        Keys::new(config.redis.prefix.clone()),
        config.redis.ca_file.as_deref(),
    )
    .await?;
    let (leasing, lease_queue) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        id: o.id.clone(),
        lease_ttl: o.lease_ttl,
        report_deadline: o.report_deadline,
        max_deliveries: o.max_deliveries,
        leases: LeaseManager::new(pool),
        streams: streams.clone(),
        reporter: Reporter::new(o.coordinator_urls.clone(), config.worker_token.clone()),
        handlers: handlers.into_iter().map(|(t, r)| (t, r.handler)).collect(),
        stats,
        permits: Arc::new(Semaphore::new(o.concurrency)),
        tracker: TaskTracker::new(),
        leasing,
        offer: o.eager.then(|| EagerOffer {
            slots: 1,
            lease: o.lease_ttl.clamp(
                Duration::from_millis(*composer_api::wire::EAGER_LEASE_MS.start()),
                Duration::from_millis(*composer_api::wire::EAGER_LEASE_MS.end()),
            ),
            queues: queues.iter().cloned().collect(),
        }),
        held: AtomicU64::new(0),
        held_best: std::sync::atomic::AtomicU8::new(u8::MAX),
        wants_slot: std::sync::atomic::AtomicBool::new(false),
        stopping: shutdown.clone(),
    });

    let Some(shards) = wait_for_shard_count(&streams, &shutdown).await else { return Ok(()) };
    let names = streams.keys().streams_of(queues.iter().map(String::as_str), shards);
    tracing::info!(worker = %ctx.id, queues = ?queues, shards, concurrency = o.concurrency, "worker started");
    // From zero, so that the first executions of each type show in a rate.
    for node_type in ctx.handlers.keys() {
        composer_metrics::WORKER.declare(composer_metrics::TASKS_EXECUTED, &[("node_type", node_type.as_str())]);
    }
    composer_metrics::WORKER.set(
        composer_metrics::BUILD_INFO,
        &[("version", env!("CARGO_PKG_VERSION")), ("role", "worker")],
        1.0,
    );
    if let Some(addr) = o.listen {
        crate::listen::serve(addr, ctx.id.clone(), o.metrics_token.clone(), shutdown.clone()).await?;
    }

    let lease_queue = Arc::new(tokio::sync::Mutex::new(lease_queue));
    for _ in 0..LEASE_LOOPS {
        ctx.tracker.spawn(lease_loop(ctx.clone(), lease_queue.clone(), shutdown.clone()));
    }
    read_loop(&ctx, &names, o.block, o.reclaim_interval, &shutdown).await;
    // Graceful: no new reads; let in-flight tasks finish and report, within a lease TTL.
    ctx.tracker.close();
    if tokio::time::timeout(o.lease_ttl, ctx.tracker.wait()).await.is_err() {
        tracing::warn!("in-flight tasks did not finish in time; their leases will expire and they will be retried");
    }
    tracing::info!(worker = %ctx.id, "worker stopped");
    Ok(())
}

/// Reads messages while a slot is free, until `shutdown`, reconnecting
/// (and re-creating consumer groups) as needed.
///
/// Slots are taken before reading and each message leased is given one: a
/// worker leases only what it can start now, so no lease waits (unrenewed)
/// for a slot. Every `reclaim_interval` the slots first go to messages idle
/// for longer than a lease TTL (their consumer died or stalled), then the
/// rest to new messages. XREADGROUP's COUNT applies per stream, so a read
/// can bring more messages than free slots: the extra ones are held, not
/// leased, and get the next slots (if this worker dies they are reclaimed
/// like any pending message; if another worker reclaims one meanwhile, the
/// lease lets only one of them run it).
///
/// Read messages wait by priority (their stream's), and slots go to them
/// by the weighted share of [`composer_core::priority::Share`]: higher
/// priorities first, none starved. Shards (a fairness key's lane each)
/// take turns by the read itself, which takes as many from each.
async fn read_loop(
    ctx: &Arc<Ctx>,
    names: &[String],
    block: Duration,
    reclaim_interval: Duration,
    shutdown: &CancellationToken,
) {
    // Read beyond the free slots: pending on this consumer, not leased,
    // first to get the next slots.
    let mut held = Held::default();
    let mut reading = Reading {
        names,
        block,
        reclaim_interval,
        // A read's COUNT divides the free slots among one priority's
        // streams: as many as before priorities when one level has work,
        // and when all have, at most five times the free slots held.
        per_level: (names.len() / composer_core::priority::WEIGHTS.len()).max(1),
        consumer: None,
        backoff: Duration::from_millis(100),
        last_reclaim: tokio::time::Instant::now(),
    };
    while !shutdown.is_cancelled() {
        let first = match ctx.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                ctx.wants_slot.store(true, Ordering::Relaxed);
                let p = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    p = ctx.permits.clone().acquire_owned() => p.ok(),
                };
                ctx.wants_slot.store(false, Ordering::Relaxed);
                match p {
                    Some(p) => p,
                    None => break,
                }
            }
        };
        let mut slots = vec![first];
        while let Ok(p) = ctx.permits.clone().try_acquire_owned() {
            slots.push(p);
        }
        // Read before the held messages get the slots, so that a higher
        // priority that arrived meanwhile is seen: blocking when nothing is
        // held, without blocking when some is (unless as many are held as
        // there are streams, which bounds what a worker holds).
        if held.len() < names.len() {
            read_more(ctx, &mut reading, &mut held, &mut slots, shutdown).await;
        }
        let n = held.len().min(slots.len());
        if n > 0 {
            slots.truncate(n);
            ctx.lease(held.take(n), slots);
        }
        ctx.held_best.store(held.best().unwrap_or(u8::MAX), Ordering::Relaxed);
        ctx.held.store(held.len() as u64, Ordering::Relaxed);
    }
}

/// What [`read_loop`] reads with, and its state between reads.
struct Reading<'a> {
    names: &'a [String],
    block: Duration,
    reclaim_interval: Duration,
    per_level: usize,
    consumer: Option<composer_stream::Consumer>,
    backoff: Duration,
    last_reclaim: tokio::time::Instant,
}

/// One read for [`read_loop`] into `held` (reclaims first, when due, onto
/// `slots`), connecting the consumer as needed; on an error the consumer is
/// dropped, to connect again, after a backoff when nothing is held.
async fn read_more(
    ctx: &Arc<Ctx>,
    r: &mut Reading<'_>,
    held: &mut Held,
    slots: &mut Vec<OwnedSemaphorePermit>,
    shutdown: &CancellationToken,
) {
    let names = r.names;
    let reader = match &mut r.consumer {
        Some(c) => c,
        None => match connect_consumer(&ctx.streams, &ctx.id, r.block, names).await {
            Ok(c) => r.consumer.insert(c),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read task streams; retrying");
                if held.is_empty() {
                    sleep_or_shutdown(shutdown, &mut r.backoff).await;
                }
                return;
            }
        },
    };
    if r.last_reclaim.elapsed() >= r.reclaim_interval {
        r.last_reclaim = tokio::time::Instant::now();
        if let Err(e) = reclaim(ctx, reader, names, slots).await {
            tracing::warn!(error = %e, "reclaiming stalled messages failed; reconnecting");
            r.consumer = None;
            return;
        }
        if slots.is_empty() {
            return;
        }
    }
    let per_stream = (slots.len() / r.per_level).max(1);
    let read = match held.is_empty() {
        true => reader.read(names, per_stream).await,
        false => reader.read_now(names, per_stream).await,
    };
    match read {
        Ok(messages) => {
            r.backoff = Duration::from_millis(100);
            for msg in messages {
                held.push(ctx.streams.keys().priority_of(&msg.stream), msg);
            }
        }
        Err(e) if e.is_no_group() => {
            tracing::warn!("a consumer group is missing (Redis lost its data?); re-creating");
            r.consumer = None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading task streams failed; reconnecting");
            r.consumer = None;
            if held.is_empty() {
                sleep_or_shutdown(shutdown, &mut r.backoff).await;
            }
        }
    }
}

/// Messages read and not leased yet, by priority.
#[derive(Default)]
struct Held {
    by_priority: [VecDeque<Message>; 5],
    share: composer_core::priority::Share,
}

impl Held {
    fn push(&mut self, priority: u8, msg: Message) {
        let at = usize::from(priority.saturating_sub(composer_core::priority::HIGHEST)).min(4);
        self.by_priority[at].push_back(msg);
    }

    fn len(&self) -> usize {
        self.by_priority.iter().map(VecDeque::len).sum()
    }

    fn is_empty(&self) -> bool {
        self.by_priority.iter().all(VecDeque::is_empty)
    }

    /// The highest priority held.
    fn best(&self) -> Option<u8> {
        let at = self.by_priority.iter().position(|q| !q.is_empty())?;
        Some(at as u8 + composer_core::priority::HIGHEST)
    }

    /// Up to `n` messages, each from the level the weighted share picks.
    fn take(&mut self, n: usize) -> Vec<Message> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let by = &self.by_priority;
            let waiting = |l: u8| !by[usize::from(l - composer_core::priority::HIGHEST)].is_empty();
            let Some(level) = self.share.next(waiting) else { break };
            let at = usize::from(level - composer_core::priority::HIGHEST);
            out.extend(self.by_priority[at].pop_front());
        }
        out
    }
}

/// Takes over messages idle for longer than the lease TTL — their consumer
/// died or stalled — and runs them on the slots given, as many as there
/// are. A message delivered more than `max_deliveries` times is reported
/// FAILED instead, so a message that keeps crashing workers ends under the
/// node's retry policy.
async fn reclaim(
    ctx: &Arc<Ctx>,
    consumer: &mut composer_stream::Consumer,
    names: &[String],
    slots: &mut Vec<OwnedSemaphorePermit>,
) -> Result<(), composer_stream::Error> {
    for stream in names {
        if slots.is_empty() {
            break;
        }
        let claimed = match consumer.reclaim(stream, ctx.lease_ttl, slots.len()).await {
            Ok(m) => m,
            Err(e) if e.is_no_group() => continue,
            Err(e) => return Err(e),
        };
        for (msg, deliveries) in claimed {
            composer_metrics::WORKER.inc(composer_metrics::RECLAIMED_MESSAGES, &[], 1);
            if deliveries > ctx.max_deliveries {
                ctx.tracker.spawn(give_up(ctx.clone(), msg, deliveries));
                continue;
            }
            let Some(slot) = slots.pop() else { break };
            ctx.tracker.spawn(process(ctx.clone(), msg, slot));
        }
    }
    Ok(())
}

/// Reports a message that was delivered too often as a retryable failure of
/// its attempt, then acks it. The lease comes first (a report is applied
/// only for its holder); when another worker holds it, or the task moved
/// on, the message is only acked.
async fn give_up(ctx: Arc<Ctx>, msg: Message, deliveries: u64) {
    let Ok(d) = serde_json::from_str::<Dispatch>(&msg.payload) else {
        ack(&ctx, &msg).await;
        return;
    };
    match ctx.leases.acquire(d.run_id, d.task_id, &ctx.id, ctx.lease_ttl, d.attempt).await {
        Ok(a) if a.is_granted() => {}
        Ok(_) => {
            ack(&ctx, &msg).await;
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot acquire the lease; the message will be redelivered");
            return;
        }
    }
    composer_metrics::WORKER.inc(composer_metrics::MAX_DELIVERIES_EXCEEDED, &[], 1);
    tracing::error!(run_id = %d.run_id, task_id = %d.task_id, deliveries, "max deliveries exceeded; reporting the attempt failed");
    let report = TaskReport {
        run_id: d.run_id,
        attempt: d.attempt,
        worker_id: ctx.id.clone(),
        status: ReportStatus::Failed,
        output: None,
        error: Some(format!("max deliveries exceeded ({deliveries} deliveries)")),
        retryable: true,
        code: Some(composer_core::machine::codes::MAX_DISPATCHES.into()),
        http_status: None,
        retry_after_ms: None,
        stages: None,
    };
    let priority = ctx.streams.keys().priority_of(&msg.stream);
    match ctx.reporter.send(d.task_id, &report, ctx.report_deadline, None, priority).await {
        Delivery::Delivered(_) | Delivery::Gone => ack(&ctx, &msg).await,
        Delivery::Failed => tracing::error!(task_id = %d.task_id, "no coordinator took the max-deliveries report"),
    }
}

async fn wait_for_shard_count(streams: &Streams, shutdown: &CancellationToken) -> Option<u32> {
    loop {
        match streams.shard_count().await {
            Ok(Some(n)) if n > 0 => return Some(n),
            Ok(_) => tracing::info!("waiting for a coordinator to publish the stream shard count"),
            Err(e) => tracing::warn!(error = %e, "cannot read the stream shard count"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

async fn connect_consumer(
    streams: &Streams,
    id: &str,
    block: Duration,
    names: &[String],
) -> Result<composer_stream::Consumer, composer_stream::Error> {
    for name in names {
        streams.ensure_group(name).await?;
    }
    streams.consumer(id, block).await
}

async fn sleep_or_shutdown(shutdown: &CancellationToken, backoff: &mut Duration) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(*backoff) => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

/// Parses a message; a malformed one is acked and dropped.
async fn parse(ctx: &Ctx, msg: &Message) -> Option<Dispatch> {
    match serde_json::from_str::<Dispatch>(&msg.payload) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::error!(stream = %msg.stream, id = %msg.id, error = %e, "dropping a malformed message");
            ack(ctx, msg).await;
            None
        }
    }
}

/// Takes every read queued and leases their messages in one statement,
/// until `shutdown` (then what is queued still gets its leases). Like the
/// engine's batches: one statement (and commit) for whatever arrived while
/// the last one ran, and no wait when nothing else is queued.
async fn lease_loop(
    ctx: Arc<Ctx>,
    queue: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Read>>>,
    shutdown: CancellationToken,
) {
    loop {
        let reads = {
            let mut queue = queue.lock().await;
            let first = tokio::select! {
                r = queue.recv() => r,
                _ = shutdown.cancelled() => queue.try_recv().ok(),
            };
            let Some(first) = first else { return };
            let mut reads = vec![first];
            while let Ok(more) = queue.try_recv() {
                reads.push(more);
            }
            reads
        };
        take(ctx.clone(), reads).await;
    }
}

/// The messages of some reads, with a slot taken for each: their leases are
/// taken in one statement (one commit for the batch), then each granted task
/// runs on its own slot.
async fn take(ctx: Arc<Ctx>, reads: Vec<Read>) {
    let mut wanted = Vec::new();
    for Read { messages, mut slots, at, at_us } in reads {
        for msg in messages {
            let Some(d) = parse(&ctx, &msg).await else { continue };
            if let Some(published) = d.published_at_us {
                let transit = Duration::from_micros(at_us.saturating_sub(published).max(0) as u64);
                stage("publish_to_read", transit);
            }
            // The read loop gives as many slots as messages.
            let Some(slot) = slots.pop() else { break };
            wanted.push((msg, d, slot, at, at_us));
        }
    }
    if wanted.is_empty() {
        return;
    }
    let requests: Vec<(uuid::Uuid, uuid::Uuid, i32)> =
        wanted.iter().map(|(_, d, _, _, _)| (d.run_id, d.task_id, d.attempt)).collect();
    let granted = match ctx.leases.acquire_many(&requests, &ctx.id, ctx.lease_ttl).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(error = %e, "cannot acquire leases; the messages will be redelivered");
            return;
        }
    };
    let (leased_at, leased_at_us) = (std::time::Instant::now(), composer_api::wire::now_us());
    let mut started = std::collections::HashSet::new();
    for (msg, d, slot, read_at, read_at_us) in wanted {
        match granted.get(&d.task_id) {
            Some(how) if started.insert(d.task_id) => {
                if *how == Acquired::TakenOver {
                    composer_metrics::WORKER.inc(composer_metrics::LEASE_TAKEOVERS, &[], 1);
                }
                stage("read_to_lease", leased_at - read_at);
                let stages = StageTimes {
                    read_at_us: Some(read_at_us),
                    leased_at_us: Some(leased_at_us),
                    ..StageTimes::default()
                };
                ctx.tracker.spawn(run_on_slot(ctx.clone(), Some(msg), d, slot, Some(leased_at), stages));
            }
            // Another worker holds it, it finished or moved to another
            // attempt, or this read carried it twice.
            _ => {
                ctx.stats.0.lease_denied.fetch_add(1, Ordering::Relaxed);
                ack(&ctx, &msg).await;
            }
        }
    }
}

fn task_span(d: &Dispatch) -> tracing::Span {
    tracing::info_span!("task", run_id = %d.run_id, task_id = %d.task_id, node_id = %d.node_id, attempt = d.attempt)
}

/// One reclaimed message, with its slot: lease, then run.
async fn process(ctx: Arc<Ctx>, msg: Message, slot: OwnedSemaphorePermit) {
    let Some(d) = parse(&ctx, &msg).await else { return };
    let read_at_us = composer_api::wire::now_us();
    match ctx.leases.acquire(d.run_id, d.task_id, &ctx.id, ctx.lease_ttl, d.attempt).await {
        Ok(Acquired::Granted) => {}
        Ok(Acquired::TakenOver) => {
            composer_metrics::WORKER.inc(composer_metrics::LEASE_TAKEOVERS, &[], 1);
            tracing::info!(task_id = %d.task_id, "took over the lease of a worker that stopped renewing");
        }
        Ok(Acquired::Denied) => {
            ctx.stats.0.lease_denied.fetch_add(1, Ordering::Relaxed);
            ack(&ctx, &msg).await;
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot acquire the lease; the message will be redelivered");
            return;
        }
    }
    let now = composer_api::wire::now_us();
    let stages = StageTimes { read_at_us: Some(read_at_us), leased_at_us: Some(now), ..StageTimes::default() };
    run_on_slot(ctx, Some(msg), d, slot, None, stages).await
}

/// Runs a leased task on its slot, then, on the same slot, the task its
/// report's answer leased to this worker (eager dispatch), and so on. The
/// slot is given back only when an answer brings nothing.
async fn run_on_slot(
    ctx: Arc<Ctx>,
    msg: Option<Message>,
    dispatch: Dispatch,
    _slot: OwnedSemaphorePermit,
    leased_at: Option<std::time::Instant>,
    stages: StageTimes,
) {
    // The tasks given with a report's answer are of the same run: its
    // priority, which the stream of the first one says.
    let priority = msg.as_ref().map_or(composer_core::priority::DEFAULT, |m| ctx.streams.keys().priority_of(&m.stream));
    let (mut msg, mut dispatch, mut leased_at, mut stages) = (msg, dispatch, leased_at, stages);
    loop {
        let span = task_span(&dispatch);
        let ran = execute(&ctx, msg.take(), dispatch, priority, leased_at, stages);
        let mut next = ran.instrument(span).await.into_iter();
        let Some(first) = next.next() else { return };
        // One slot was offered: more is a coordinator's mistake, handed
        // back at once rather than left to expire.
        for extra in next {
            tracing::warn!(task_id = %extra.task_id, "a report's answer brought more tasks than offered; handing the lease back");
            if let Err(e) = ctx.leases.release(extra.run_id, extra.task_id, &ctx.id, extra.attempt).await {
                tracing::warn!(error = %e, "cannot hand the lease back; it will expire");
            }
        }
        ctx.stats.0.eager.fetch_add(1, Ordering::Relaxed);
        composer_metrics::WORKER.inc(composer_metrics::EAGER_DISPATCHES, &[], 1);
        (dispatch, leased_at) = (first, Some(std::time::Instant::now()));
        stages = StageTimes { leased_at_us: Some(composer_api::wire::now_us()), ..StageTimes::default() };
    }
}

/// One stage of a step's way to its next task (`composer_step_stage_seconds`).
fn stage(name: &'static str, took: Duration) {
    composer_metrics::WORKER.observe(composer_metrics::STEP_STAGE, &[("stage", name)], took);
}

/// Runs one leased task on its slot: run the handler while renewing the
/// lease, report the result, then ack (or hand the lease back when no
/// coordinator took the report). A type this worker has no handler for
/// fails its attempt at once, for good: every worker that serves a queue
/// must handle every type routed to it.
/// `leased_at` is when a read's lease was granted, for the step's stages.
/// `msg` is the stream message it came in (none for a task given with a
/// report's answer). Returns the tasks the report's answer leased to this
/// worker.
async fn execute(
    ctx: &Arc<Ctx>,
    msg: Option<Message>,
    dispatch: Dispatch,
    priority: u8,
    leased_at: Option<std::time::Instant>,
    mut stages: StageTimes,
) -> Vec<Dispatch> {
    if let Some(at) = leased_at {
        stage("lease_to_start", at.elapsed());
    }
    let handler = ctx.handlers.get(&dispatch.node_type).cloned();
    ctx.stats.0.executed.fetch_add(1, Ordering::Relaxed);
    composer_metrics::WORKER.inc(composer_metrics::TASKS_EXECUTED, &[("node_type", dispatch.node_type.as_str())], 1);

    let lost = CancellationToken::new();
    let done = CancellationToken::new();
    // Renewal stops however this function ends, panics included.
    let _stop_renewing = done.clone().drop_guard();
    let logs = crate::task::LogBuffer::default();
    let renewer = tokio::spawn(renew(ctx.clone(), dispatch.clone(), lost.clone(), done.clone(), logs.clone()));
    let started = std::time::Instant::now();
    stages.started_at_us = Some(composer_api::wire::now_us());
    let outcome = match handler {
        Some(handler) => run_handler(handler, &dispatch, &lost, logs.clone()).await,
        None => {
            let stream = msg.as_ref().map_or("(given with a report's answer)", |m| m.stream.as_str());
            let queue = ctx.streams.keys().queue_of(stream).unwrap_or(stream);
            let message = format!("no handler for type {} on queue {queue} (worker {})", dispatch.node_type, ctx.id);
            tracing::error!(node_type = %dispatch.node_type, %queue, "no handler for this type; failing the attempt");
            Some(Err(crate::task::TaskError::fatal(message).with_code(composer_core::machine::codes::NO_HANDLER)))
        }
    };
    let Some(result) = outcome else {
        done.cancel();
        let _ = renewer.await;
        ctx.stats.0.lease_lost.fetch_add(1, Ordering::Relaxed);
        composer_metrics::WORKER.inc(composer_metrics::LEASES_LOST, &[], 1);
        tracing::warn!("lease lost; execution cancelled and its result discarded");
        ack_if(ctx, msg.as_ref()).await;
        return Vec::new();
    };
    let outcome = if result.is_ok() { "ok" } else { "error" };
    composer_metrics::WORKER.observe(
        composer_metrics::TASK_DURATION,
        &[("node_type", dispatch.node_type.as_str()), ("outcome", outcome)],
        started.elapsed(),
    );
    // The last lines land before the result: the log is whole when the step ends.
    send_logs(ctx, &dispatch, &logs).await;
    stages.finished_at_us = Some(composer_api::wire::now_us());
    stages.dispatched_at_us = dispatch.dispatched_at_us;
    stages.published_at_us = dispatch.published_at_us;
    let mut report = to_report(&ctx.id, &dispatch, result);
    // A coordinator that gives no traceparent predates stage times, and
    // refuses a report with a field it does not know.
    report.stages = dispatch.traceparent.is_some().then_some(stages);
    // The lease is renewed until the report lands, so a slow coordinator does
    // not make the task look abandoned.
    let offer = ctx.offer(priority);
    let delivery = ctx.reporter.send(dispatch.task_id, &report, ctx.report_deadline, offer, priority).await;
    done.cancel();
    let _ = renewer.await;
    match delivery {
        Delivery::Delivered(next) => {
            ctx.stats.0.reported.fetch_add(1, Ordering::Relaxed);
            ack_if(ctx, msg.as_ref()).await;
            return next;
        }
        Delivery::Gone => {
            ctx.stats.0.reported.fetch_add(1, Ordering::Relaxed);
            ack_if(ctx, msg.as_ref()).await;
        }
        Delivery::Failed => {
            tracing::error!("no coordinator took the report; handing the lease back, the message stays pending");
            if let Err(e) = ctx.leases.release(dispatch.run_id, dispatch.task_id, &ctx.id, dispatch.attempt).await {
                tracing::warn!(error = %e, "cannot hand the lease back; it will expire");
            }
            ctx.stats.0.report_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    Vec::new()
}

/// Sends what the handler logged and has not been sent. One sender at a
/// time, so lines land in the order they were logged.
async fn send_logs(ctx: &Ctx, d: &Dispatch, logs: &crate::task::LogBuffer) {
    let _one_at_a_time = logs.sending.lock().await;
    let lines = logs.take();
    if !lines.is_empty() {
        ctx.reporter.send_logs(d.task_id, d.run_id, &ctx.id, d.attempt, lines).await;
    }
}

/// How often a running task's log lines are sent.
const LOG_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Resolves the task's secrets, runs the handler, and scrubs the secrets'
/// values from what it returns. `None` when the lease was lost meanwhile
/// (the result must be discarded). A panicking handler fails its attempt
/// (retryably); it does not take the worker down or leave the task leased.
async fn run_handler(
    handler: Handler,
    dispatch: &Dispatch,
    lost: &CancellationToken,
    logs: crate::task::LogBuffer,
) -> Option<Result<Value, crate::task::TaskError>> {
    // Secrets are resolved here and nowhere else; an unknown one fails the attempt.
    let (input, secrets) = match crate::secrets::resolve(&dispatch.input) {
        Ok((input, secrets)) => (keep_bound_secrets_to_http(dispatch, input, &secrets), secrets),
        Err(message) => (Err(crate::task::TaskError::fatal(message)), Default::default()),
    };
    let task_ctx = TaskContext {
        task_id: dispatch.task_id,
        run_id: dispatch.run_id,
        node_id: dispatch.node_id.clone(),
        node_type: dispatch.node_type.clone(),
        attempt: dispatch.attempt,
        traceparent: dispatch.traceparent.clone(),
        cancelled: lost.clone(),
        secrets: secrets.clone(),
        logs,
    };
    let guarded = std::panic::AssertUnwindSafe(async move { handler(task_ctx, input?).await }).catch_unwind();
    let result = tokio::select! {
        r = guarded => r.unwrap_or_else(|panic| {
            let what = composer_core::panic_message(&*panic);
            tracing::error!(panic = %what, "handler panicked");
            Err(crate::task::TaskError::retryable(format!("handler panicked: {what}")))
        }),
        _ = lost.cancelled() => return None,
    };
    if lost.is_cancelled() {
        return None;
    }
    Some(match result {
        Ok(mut output) => {
            secrets.scrub(&mut output);
            Ok(output)
        }
        Err(mut e) => {
            e.message = secrets.scrub_message(&e.message);
            Err(e)
        }
    })
}

/// A secret bound to hosts goes only to the HTTP node, which checks every
/// host its request goes to; a handler of another type could send it
/// anywhere.
fn keep_bound_secrets_to_http(
    dispatch: &Dispatch,
    input: Value,
    secrets: &crate::secrets::Secrets,
) -> Result<Value, crate::task::TaskError> {
    match secrets.bound().next() {
        Some(name) if dispatch.node_type != crate::http::NODE_TYPE => Err(crate::task::TaskError::fatal(format!(
            "secret {name} is bound to hosts ({}), which only the HTTP node enforces: a {} node cannot use it",
            crate::secrets::hosts_var(name),
            dispatch.node_type
        ))),
        _ => Ok(input),
    }
}

fn to_report(worker_id: &str, dispatch: &Dispatch, result: Result<Value, crate::task::TaskError>) -> TaskReport {
    let (status, output, error) = match result {
        Ok(output) => (ReportStatus::Completed, Some(output), None),
        Err(e) => (ReportStatus::Failed, None, Some(e)),
    };
    TaskReport {
        run_id: dispatch.run_id,
        attempt: dispatch.attempt,
        worker_id: worker_id.to_string(),
        status,
        output,
        retryable: error.as_ref().is_some_and(|e| e.retryable),
        code: error.as_ref().and_then(|e| e.code.clone()),
        http_status: error.as_ref().and_then(|e| e.status),
        retry_after_ms: error.as_ref().and_then(|e| e.retry_after).map(|d| d.as_millis().min(u64::MAX as u128) as u64),
        error: error.map(|e| e.message),
        stages: None,
    }
}

/// Renews the lease every ttl/3 until `done`; cancels `lost` when the lease
/// is gone, or when no renewal succeeded for a whole TTL (someone else may
/// hold it by now).
async fn renew(
    ctx: Arc<Ctx>,
    d: Dispatch,
    lost: CancellationToken,
    done: CancellationToken,
    logs: crate::task::LogBuffer,
) {
    let every = ctx.lease_ttl / 3;
    let mut last_ok = tokio::time::Instant::now();
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(every.min(LOG_FLUSH_EVERY)) => {}
        }
        if last_renewal.elapsed() >= every {
            last_renewal = tokio::time::Instant::now();
            match ctx.leases.renew(d.run_id, d.task_id, &ctx.id, ctx.lease_ttl, d.attempt).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    lost.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease renewal failed");
                    if last_ok.elapsed() >= ctx.lease_ttl {
                        lost.cancel();
                        return;
                    }
                }
            }
        }
        // The handler's lines go out about once a second while it runs,
        // after the renewal when one is due: a slow coordinator must not
        // cost the lease.
        if logs.pending() {
            send_logs(&ctx, &d, &logs).await;
        }
    }
}

/// Acks the message a task came in, if it came in one.
async fn ack_if(ctx: &Ctx, msg: Option<&Message>) {
    if let Some(msg) = msg {
        ack(ctx, msg).await;
    }
}

async fn ack(ctx: &Ctx, msg: &Message) {
    if let Err(e) = ctx.streams.ack(&msg.stream, &msg.id).await {
        tracing::warn!(stream = %msg.stream, id = %msg.id, error = %e, "ack failed; the message may be redelivered");
    }
}
