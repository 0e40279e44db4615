//! The loop behind `Worker::run`: poll the coordinators' task API for
//! leased tasks, run each on a slot while heartbeating its lease, complete
//! or fail it, and run on the same slot what the answer leased next.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use composer_api::{FailTask, LeasedTask, PollTasks, TakeNext, TaskBatch, MAX_POLL_QUEUES};
use composer_config::ConfigError;
use composer_core::priority::URGENT;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::client::{Coordinators, Delivery, Heartbeat, Outcome};
use crate::config::Config;
use crate::error::Error;
use crate::task::{Handler, Registration, TaskContext, TaskError};

/// Counters of what a worker did; cheap to clone and read from tests.
#[derive(Debug, Clone, Default)]
pub struct Stats(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    executed: AtomicU64,
    lease_lost: AtomicU64,
    reported: AtomicU64,
    report_failed: AtomicU64,
    eager: AtomicU64,
}

impl Stats {
    /// Executions started (tasks leased to this worker).
    pub fn executed(&self) -> u64 {
        self.0.executed.load(Ordering::Relaxed)
    }
    /// Executions cancelled because their lease was lost.
    pub fn lease_lost(&self) -> u64 {
        self.0.lease_lost.load(Ordering::Relaxed)
    }
    /// Results a coordinator took (applied or ignored, or refused as of a lost lease).
    pub fn reported(&self) -> u64 {
        self.0.reported.load(Ordering::Relaxed)
    }
    /// Results no coordinator took before the report deadline.
    pub fn report_failed(&self) -> u64 {
        self.0.report_failed.load(Ordering::Relaxed)
    }
    /// Tasks run as given with a result's answer (eager dispatch).
    pub fn eager(&self) -> u64 {
        self.0.eager.load(Ordering::Relaxed)
    }
}

/// Most tasks one poll asks for (the task API's limit).
const MAX_POLL_TASKS: usize = 100;

/// The lease assumed before a coordinator said what it gives (its default).
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

struct Ctx {
    id: String,
    report_deadline: Duration,
    coordinators: Coordinators,
    handlers: HashMap<String, Handler>,
    stats: Stats,
    permits: Arc<Semaphore>,
    /// Slots only urgent work runs on (`COMPOSER_WORKER_URGENT_SLOTS`).
    urgent: Arc<Semaphore>,
    tracker: TaskTracker,
    /// What a result asks to run next (eager dispatch); `None` when off.
    next: Option<TakeNext>,
    /// Pollers waiting for a slot: when all are, every slot is busy and the
    /// streams may hold work, so results give their slots back to the polls.
    waiting_pollers: std::sync::atomic::AtomicUsize,
    /// The most urgent priority at which the last poll saw tasks still
    /// waiting: [`NOTHING_WAITS`] when none, [`UNKNOWN`] when it could not tell.
    waiting_best: AtomicU8,
    /// The longest lease a coordinator gave (how long a stop waits).
    lease_ms: AtomicU64,
    stopping: CancellationToken,
    /// Where task inputs' secrets come from.
    secrets: crate::secrets::Source,
    /// Polls of every priority in flight at once, each for at most
    /// `poll_max` tasks.
    pollers: usize,
    poll_max: usize,
}

/// [`Ctx::waiting_best`] when the last poll saw nothing waiting.
const NOTHING_WAITS: u8 = u8::MAX;
/// [`Ctx::waiting_best`] when the last poll could not tell (no priority is more urgent).
const UNKNOWN: u8 = 0;

impl Ctx {
    /// What a result of a task at `priority` asks to run next. Nothing
    /// while stopping. Nothing while every poller waits for a slot (the
    /// slot goes back to the polls, so chains of eager tasks cannot keep
    /// the streams' work waiting) — unless the run is more urgent than
    /// everything the last poll saw waiting, which its next task would go
    /// ahead of anyway.
    ///
    /// A task on an urgent slot asks while it is urgent itself: what its
    /// result makes ready is of its own run (or of a run its end let start,
    /// no less urgent), and the slot is kept for such work. (One that is not came from a run lowered after its step was
    /// sent: its next step goes to the ordinary slots.)
    fn offer(&self, priority: u8, lane: Lane) -> Option<&TakeNext> {
        if self.stopping.is_cancelled() {
            return None;
        }
        if lane == Lane::Urgent {
            return self.next.as_ref().filter(|_| priority <= URGENT);
        }
        let saturated = self.waiting_pollers.load(Ordering::Relaxed) >= self.pollers;
        let ahead = priority < self.waiting_best.load(Ordering::Relaxed);
        self.next.as_ref().filter(|_| !saturated || ahead)
    }

    /// Notes what a poll brought and saw (what waits only from a poll of
    /// every priority: an urgent slot's poll sees only urgent work).
    fn polled(&self, batch: &TaskBatch, lane: Lane) {
        if lane == Lane::All {
            let best = match &batch.waiting {
                None => UNKNOWN,
                Some(levels) => levels.iter().copied().min().unwrap_or(NOTHING_WAITS),
            };
            self.waiting_best.store(best, Ordering::Relaxed);
        }
        if let Some(longest) = batch.tasks.iter().map(|t| t.lease_ttl_ms).max() {
            self.lease_ms.fetch_max(longest, Ordering::Relaxed);
        }
    }
}

pub async fn run(
    config: Config,
    handlers: HashMap<String, Registration>,
    local: Option<Arc<dyn composer_api::in_process::InProcessApi>>,
    shutdown: CancellationToken,
    stats: Stats,
) -> Result<(), Error> {
    let config = config.validated()?;
    let o = &config.options;
    let queues: BTreeSet<String> = match o.queues.is_empty() {
        false => o.queues.iter().cloned().collect(),
        true => handlers.values().map(|r| r.queue.clone()).collect(),
    };
    let queues: Vec<String> = queues.into_iter().collect();
    check_queues(&queues)?;
    let ctx = Arc::new(Ctx {
        id: o.id.clone(),
        report_deadline: o.report_deadline,
        coordinators: match local {
            Some(api) => Coordinators::new(o.coordinator_urls.clone(), None).in_process(api),
            None => Coordinators::new(o.coordinator_urls.clone(), config.worker_token.clone())
                .in_namespace(config.namespace.clone()),
        },
        handlers: handlers.into_iter().map(|(t, r)| (t, r.handler)).collect(),
        stats,
        permits: Arc::new(Semaphore::new(o.concurrency)),
        urgent: Arc::new(Semaphore::new(o.urgent_slots)),
        tracker: TaskTracker::new(),
        next: o.eager.then(|| TakeNext { queues: queues.clone(), max: Some(1) }),
        waiting_pollers: Default::default(),
        waiting_best: AtomicU8::new(UNKNOWN),
        lease_ms: AtomicU64::new(DEFAULT_LEASE.as_millis() as u64),
        stopping: shutdown.clone(),
        secrets: o.secrets,
        pollers: o.pollers.max(1),
        poll_max: o.poll_max.clamp(1, MAX_POLL_TASKS),
    });

    tracing::info!(
        worker = %ctx.id, queues = ?queues, concurrency = o.concurrency, urgent_slots = o.urgent_slots,
        "worker started"
    );
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

    let lanes = std::iter::repeat_n(Lane::All, ctx.pollers).chain((o.urgent_slots > 0).then_some(Lane::Urgent));
    let pollers: Vec<_> = lanes
        .map(|lane| tokio::spawn(poll_loop(ctx.clone(), lane, queues.clone(), o.poll_wait, shutdown.clone())))
        .collect();
    for p in pollers {
        let _ = p.await;
    }
    // Graceful: no new polls; let in-flight tasks finish and report, within a lease.
    ctx.tracker.close();
    let lease = Duration::from_millis(ctx.lease_ms.load(Ordering::Relaxed));
    if tokio::time::timeout(lease, ctx.tracker.wait()).await.is_err() {
        tracing::warn!("in-flight tasks did not finish in time; their leases will expire and they will be retried");
    }
    tracing::info!(worker = %ctx.id, "worker stopped");
    Ok(())
}

/// Polls while a slot is free, until `shutdown`.
///
/// Slots are taken before polling and the poll asks for as many tasks as
/// it holds slots: a worker is leased only what it can start now, so no
/// lease waits (unrenewed) for a slot. The coordinator reads the queues'
/// streams by the weighted share of the priorities and takes over expired
/// leases first; each task it leases runs on its own slot, and the slots
/// it brought no task for go back. A poll in flight is not cut short by a
/// stop (what it leased would wait for its lease to expire): it ends
/// within its `wait`.
/// The queues a worker polls, as every coordinator would take them: at
/// least one, at most [`MAX_POLL_QUEUES`], each a plain name. Checked at
/// start, since a coordinator refuses every poll of a set it does not take.
fn check_queues(queues: &[String]) -> Result<(), Error> {
    let bad = |message: String| Error::Config(ConfigError::new("--queues", "COMPOSER_QUEUES", message));
    if queues.is_empty() {
        return Err(bad("is empty and no handler is registered: the worker has nothing to poll".into()));
    }
    if queues.len() > MAX_POLL_QUEUES {
        return Err(bad(format!(
            "names {} queues (or the registered handlers do): a worker may poll at most {MAX_POLL_QUEUES}",
            queues.len()
        )));
    }
    queues.iter().try_for_each(|q| composer_core::definition::check_name("a queue", q).map_err(bad))
}

/// Which slots a poller fills, and so which work it polls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// The `concurrency` slots: work of any priority.
    All,
    /// The urgent slots: work of priority [`URGENT`] or more urgent only.
    Urgent,
}

impl Lane {
    fn permits(self, ctx: &Ctx) -> &Arc<Semaphore> {
        match self {
            Lane::All => &ctx.permits,
            Lane::Urgent => &ctx.urgent,
        }
    }
}

async fn poll_loop(ctx: Arc<Ctx>, lane: Lane, queues: Vec<String>, wait: Duration, shutdown: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    let permits = lane.permits(&ctx).clone();
    // Only the pollers of every priority count: when all of them wait for
    // a slot, the streams may hold work they would take.
    let counted = usize::from(lane == Lane::All);
    while !shutdown.is_cancelled() {
        let first = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                ctx.waiting_pollers.fetch_add(counted, Ordering::Relaxed);
                let p = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    p = permits.clone().acquire_owned() => p.ok(),
                };
                ctx.waiting_pollers.fetch_sub(counted, Ordering::Relaxed);
                match p {
                    Some(p) => p,
                    None => break,
                }
            }
        };
        let mut slots = vec![first];
        while slots.len() < ctx.poll_max {
            match permits.clone().try_acquire_owned() {
                Ok(p) => slots.push(p),
                Err(_) => break,
            }
        }
        let poll = PollTasks {
            worker_id: ctx.id.clone(),
            queues: queues.clone(),
            max: Some(slots.len() as u32),
            wait: Some(format!("{}ms", wait.as_millis().min(99_999))),
            priority_at_most: (lane == Lane::Urgent).then_some(URGENT),
        };
        let asked = tokio::time::Instant::now();
        match ctx.coordinators.poll(&poll, wait).await {
            Ok(batch) => {
                backoff = Duration::from_millis(100);
                let brought = batch.tasks.len();
                ctx.polled(&batch, lane);
                let leased_at = std::time::Instant::now();
                for task in batch.tasks {
                    let Some(slot) = slots.pop() else {
                        // More than asked for is a coordinator's mistake; its
                        // lease expires and the task goes to the next poller.
                        tracing::warn!(task_id = %task.id, "a poll brought more tasks than asked for; leaving it to expire");
                        continue;
                    };
                    ctx.tracker.spawn(run_on_slot(ctx.clone(), lane, task, slot, leased_at));
                }
                // A coordinator that answers at once with nothing is stopping.
                if brought == 0 && asked.elapsed() < wait / 2 {
                    drop(slots);
                    sleep_or_shutdown(&shutdown, &mut backoff).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "polling for tasks failed; trying the next coordinator");
                drop(slots);
                sleep_or_shutdown(&shutdown, &mut backoff).await;
            }
        }
    }
}

async fn sleep_or_shutdown(shutdown: &CancellationToken, backoff: &mut Duration) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(*backoff) => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

fn task_span(t: &LeasedTask) -> tracing::Span {
    tracing::info_span!("task", run_id = %t.run_id, task_id = %t.id, node_id = %t.node_id, attempt = t.attempt)
}

/// Runs a leased task on its slot, then, on the same slot, the task its
/// result's answer leased to this worker (eager dispatch), and so on. The
/// slot is given back only when an answer brings nothing.
async fn run_on_slot(
    ctx: Arc<Ctx>,
    lane: Lane,
    task: LeasedTask,
    _slot: OwnedSemaphorePermit,
    leased_at: std::time::Instant,
) {
    let (mut task, mut leased_at) = (task, leased_at);
    loop {
        let span = task_span(&task);
        let mut next = execute(&ctx, lane, task, leased_at).instrument(span).await.into_iter();
        let Some(first) = next.next() else { return };
        // One task was asked for: more is a coordinator's mistake, left to
        // expire and go to the next poller.
        for extra in next {
            tracing::warn!(task_id = %extra.id, "a result's answer brought more tasks than asked for; leaving it to expire");
        }
        ctx.stats.0.eager.fetch_add(1, Ordering::Relaxed);
        composer_metrics::WORKER.inc(composer_metrics::EAGER_DISPATCHES, &[], 1);
        (task, leased_at) = (first, std::time::Instant::now());
    }
}

/// One stage of a step's way to its next task (`composer_step_stage_seconds`).
fn stage(name: &'static str, took: Duration) {
    composer_metrics::WORKER.observe(composer_metrics::STEP_STAGE, &[("stage", name)], took);
}

/// Runs one leased task: run the handler while heartbeating the lease,
/// send its logs, then complete or fail it. A type this worker has no
/// handler for fails its attempt at once, for good: every worker that
/// serves a queue must handle every type routed to it. Returns the tasks
/// the answer leased to this worker.
async fn execute(ctx: &Arc<Ctx>, lane: Lane, task: LeasedTask, leased_at: std::time::Instant) -> Vec<LeasedTask> {
    stage("lease_to_start", leased_at.elapsed());
    let handler = ctx.handlers.get(&task.node_type).cloned();
    ctx.stats.0.executed.fetch_add(1, Ordering::Relaxed);
    composer_metrics::WORKER.inc(composer_metrics::TASKS_EXECUTED, &[("node_type", task.node_type.as_str())], 1);

    let lost = CancellationToken::new();
    let done = CancellationToken::new();
    // Heartbeats stop however this function ends, panics included.
    let _stop_heartbeats = done.clone().drop_guard();
    let logs = crate::task::LogBuffer::default();
    let heartbeats = tokio::spawn(heartbeat(ctx.clone(), task.clone(), lost.clone(), done.clone(), logs.clone()));
    let started = std::time::Instant::now();
    let mut stages = task.stages.unwrap_or_default();
    stages.started_at_us = Some(composer_api::wire::now_us());
    let outcome = match handler {
        Some(handler) => run_handler(handler, &task, &lost, logs.clone(), ctx.secrets).await,
        None => {
            let message = format!("no handler for type {} on queue {} (worker {})", task.node_type, task.queue, ctx.id);
            tracing::error!(node_type = %task.node_type, queue = %task.queue, "no handler for this type; failing the attempt");
            Some(Err(TaskError::fatal(message).with_code(composer_core::machine::codes::NO_HANDLER)))
        }
    };
    let Some(result) = outcome else {
        done.cancel();
        let _ = heartbeats.await;
        ctx.stats.0.lease_lost.fetch_add(1, Ordering::Relaxed);
        composer_metrics::WORKER.inc(composer_metrics::LEASES_LOST, &[], 1);
        tracing::warn!("lease lost; execution cancelled and its result discarded");
        return Vec::new();
    };
    let how = if result.is_ok() { "ok" } else { "error" };
    composer_metrics::WORKER.observe(
        composer_metrics::TASK_DURATION,
        &[("node_type", task.node_type.as_str()), ("outcome", how)],
        started.elapsed(),
    );
    // The last lines land before the result: the log is whole when the step ends.
    send_logs(ctx, &task, &logs).await;
    stages.finished_at_us = Some(composer_api::wire::now_us());
    let outcome = match result {
        Ok(output) => Outcome::Completed(output),
        Err(e) => Outcome::Failed(Box::new(failure(&ctx.id, &task, e))),
    };
    // The lease is heartbeaten until the result lands, so a slow
    // coordinator does not make the task look abandoned.
    let next = ctx.offer(task.priority, lane);
    let delivery = ctx.coordinators.finish(&task, &ctx.id, outcome, ctx.report_deadline, next, Some(stages)).await;
    done.cancel();
    let _ = heartbeats.await;
    match delivery {
        Delivery::Delivered(next) => {
            ctx.stats.0.reported.fetch_add(1, Ordering::Relaxed);
            return next;
        }
        Delivery::Gone => {
            ctx.stats.0.reported.fetch_add(1, Ordering::Relaxed);
        }
        Delivery::Failed => {
            tracing::error!(
                "no coordinator took the result; the lease expires and the attempt goes to the next poller"
            );
            ctx.stats.0.report_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    Vec::new()
}

/// The failure an attempt reports, in the form the task API takes it: a
/// NUL (which PostgreSQL's text cannot hold) replaced, the message cut to
/// the longest taken, a code that is not one and a status that is not an
/// HTTP status dropped (the message says so), so that the report is never
/// refused for what a handler put in it.
fn failure(worker_id: &str, task: &LeasedTask, e: TaskError) -> FailTask {
    let mut error = e.message.replace('\0', "\u{FFFD}");
    let code = match e.code {
        Some(code) if composer_core::definition::is_error_code(&code) => Some(code),
        Some(code) => {
            let code = composer_core::clipped(&code.replace('\0', "\u{FFFD}"), 80);
            error.push_str(&format!(
                " (the handler's code {code:?} is not an error code: 1 to 64 of a-z, 0-9, '_', '.' and '-')"
            ));
            None
        }
        None => None,
    };
    if error.chars().count() > composer_api::MAX_ERROR_CHARS {
        error = composer_core::clipped(&error, composer_api::MAX_ERROR_CHARS - 16);
    }
    FailTask {
        worker_id: worker_id.to_string(),
        run_id: task.run_id,
        attempt: task.attempt,
        error,
        retryable: e.retryable,
        code,
        status: e.status.filter(|s| (100..=599).contains(s)),
        retry_after_ms: e.retry_after.map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
        next: None,
        stages: None,
    }
}

/// Sends what the handler logged and has not been sent. One sender at a
/// time, so lines land in the order they were logged.
async fn send_logs(ctx: &Ctx, t: &LeasedTask, logs: &crate::task::LogBuffer) {
    let _one_at_a_time = logs.sending.lock().await;
    let lines = logs.take();
    if !lines.is_empty() {
        ctx.coordinators.send_logs(t.id, t.run_id, &ctx.id, t.attempt, lines).await;
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
    task: &LeasedTask,
    lost: &CancellationToken,
    logs: crate::task::LogBuffer,
    source: crate::secrets::Source,
) -> Option<Result<Value, TaskError>> {
    // Secrets are resolved here and nowhere else; an unknown one fails the attempt.
    let (input, secrets) = match crate::secrets::resolve_from(&task.input, source) {
        Ok((input, secrets)) => (keep_bound_secrets_to_http(task, input, &secrets), secrets),
        Err(message) => (Err(TaskError::fatal(message)), Default::default()),
    };
    let task_ctx = TaskContext {
        task_id: task.id,
        run_id: task.run_id,
        node_id: task.node_id.clone(),
        node_type: task.node_type.clone(),
        attempt: task.attempt,
        traceparent: task.traceparent.clone(),
        cancelled: lost.clone(),
        secrets: secrets.clone(),
        logs,
    };
    let guarded = std::panic::AssertUnwindSafe(async move { handler(task_ctx, input?).await }).catch_unwind();
    let result = tokio::select! {
        r = guarded => r.unwrap_or_else(|panic| {
            let what = composer_core::panic_message(&*panic);
            tracing::error!(panic = %what, "handler panicked");
            Err(TaskError::retryable(format!("handler panicked: {what}")))
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
    task: &LeasedTask,
    input: Value,
    secrets: &crate::secrets::Secrets,
) -> Result<Value, TaskError> {
    match secrets.bound().next() {
        Some(name) if task.node_type != crate::http::NODE_TYPE => Err(TaskError::fatal(format!(
            "secret {name} is bound to hosts ({}), which only the HTTP node enforces: a {} node cannot use it",
            crate::secrets::hosts_var(name),
            task.node_type
        ))),
        _ => Ok(input),
    }
}

/// Heartbeats the lease every third of it until `done`; cancels `lost`
/// when the lease is gone, or when no heartbeat got through for a whole
/// lease (someone else may hold it by now).
async fn heartbeat(
    ctx: Arc<Ctx>,
    t: LeasedTask,
    lost: CancellationToken,
    done: CancellationToken,
    logs: crate::task::LogBuffer,
) {
    let lease = Duration::from_millis(t.lease_ttl_ms.max(300));
    let every = lease / 3;
    let mut last_ok = tokio::time::Instant::now();
    let mut last_beat = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(every.min(LOG_FLUSH_EVERY)) => {}
        }
        if last_beat.elapsed() >= every {
            last_beat = tokio::time::Instant::now();
            match ctx.coordinators.heartbeat(&t, &ctx.id).await {
                Heartbeat::Extended => last_ok = tokio::time::Instant::now(),
                Heartbeat::Lost => {
                    lost.cancel();
                    return;
                }
                Heartbeat::Unknown => {
                    if last_ok.elapsed() >= lease {
                        lost.cancel();
                        return;
                    }
                }
            }
        }
        // The handler's lines go out about once a second while it runs,
        // after the heartbeat when one is due: a slow coordinator must not
        // cost the lease.
        if logs.pending() {
            send_logs(&ctx, &t, &logs).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn task() -> LeasedTask {
        LeasedTask {
            id: Uuid::now_v7(),
            run_id: Uuid::now_v7(),
            attempt: 1,
            node_id: "n".into(),
            node_type: "t".into(),
            queue: "q".into(),
            input: Value::Null,
            lease_ttl_ms: 30_000,
            traceparent: None,
            priority: 3,
            stages: None,
        }
    }

    #[tokio::test]
    async fn a_worker_whose_queues_no_coordinator_takes_refuses_to_start() {
        let worker = |queues: &[&str], handlers: usize| {
            let mut config = Config::new(vec!["http://127.0.0.1:1".into()]);
            config.options.queues = queues.iter().map(|q| q.to_string()).collect();
            let mut w = crate::Worker::new(config);
            for i in 0..handlers {
                w.handle(&format!("type-{i}"), |_ctx, _input| async { Ok(Value::Null) });
            }
            w
        };
        let refused = |w: crate::Worker| async move {
            match w.run(CancellationToken::new()).await {
                Err(e @ Error::Config(_)) => e.to_string(),
                other => panic!("started: {other:?}"),
            }
        };
        let e = refused(worker(&[], MAX_POLL_QUEUES + 1)).await;
        assert!(e.contains("COMPOSER_QUEUES") && e.contains("at most 32"), "{e}");
        let e = check_queues(&[]).unwrap_err().to_string();
        assert!(e.contains("COMPOSER_QUEUES") && e.contains("nothing to poll"), "{e}");
        let e = refused(worker(&["ok", "not a queue"], 1)).await;
        assert!(e.contains("COMPOSER_QUEUES") && e.contains("a queue"), "{e}");
        let many: Vec<String> = (0..MAX_POLL_QUEUES).map(|i| format!("q{i}")).collect();
        assert!(check_queues(&many).is_ok());
    }

    #[test]
    fn a_failure_is_sent_in_a_form_the_task_api_takes() {
        let mut e = TaskError::retryable("bad\0byte").with_code("Not A Code");
        e.status = Some(42);
        let f = failure("w", &task(), e);
        assert!(!f.error.contains('\0') && f.error.starts_with("bad\u{FFFD}byte"), "{}", f.error);
        assert!(f.error.contains("\"Not A Code\" is not an error code"), "{}", f.error);
        assert_eq!((f.code, f.status, f.retryable), (None, None, true));
        let kept =
            failure("w", &task(), TaskError::fatal("x".repeat(composer_api::MAX_ERROR_CHARS + 5)).with_code("ok.code"));
        assert!(kept.error.chars().count() <= composer_api::MAX_ERROR_CHARS);
        assert_eq!(kept.code.as_deref(), Some("ok.code"));
    }
}
