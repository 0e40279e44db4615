//! The background loops of every coordinator (docs/architecture.md): recovery,
//! timers, partitions and metrics sampling. Each is safe to run on many
//! coordinators at once — row locks, `SKIP LOCKED`, advisory locks and the
//! state machine's idempotent guards replace leader election.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use composer_core::machine::{codes, Event};
use composer_store::{partitions, recovery, stats, timers};
use tokio_util::sync::CancellationToken;

use crate::engine::EventRequest;
use crate::shared::Shared;

/// Calls `f` every `interval` until `shutdown`.
pub async fn every<F>(shutdown: CancellationToken, interval: Duration, shared: Arc<Shared>, f: F)
where
    F: Fn(Arc<Shared>) -> Pin<Box<dyn Future<Output = ()> + Send>>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = f(shared.clone()) => {}
        }
    }
}

/// Deletes the offloaded values of the runs of months retention dropped.
/// One that fails is logged: the sweep deletes what it left, since no row
/// names it any more.
async fn drop_payloads(payloads: &composer_archive::payloads::Payloads, months: &[String]) {
    for month in months {
        if let Err(e) = payloads.drop_month(month).await {
            tracing::warn!(month, error = %e, "deleting a dropped month's offloaded values failed: the sweep will");
        }
    }
}

/// Creates the monthly partitions `months_ahead` ahead and, with a
/// retention set, drops whole months past it: with an archive set, each
/// only once it is written there.
pub async fn maintain_partitions(
    pool: &composer_store::Pool,
    months_ahead: i32,
    retention_days: u32,
    archive: &crate::archive::Archive,
    payloads: &composer_archive::payloads::Payloads,
) -> Result<(), crate::archive::ArchiveError> {
    let mut client = composer_store::client(pool).await?;
    let client = &mut client;
    let created = partitions::ensure(client, months_ahead).await?;
    if created > 0 {
        crate::metrics::inc(composer_metrics::PARTITIONS_CREATED, &[], created as u64);
        tracing::info!(created, "created run partitions");
    }
    if retention_days == 0 {
        return Ok(());
    }
    let before = crate::clock::now() - chrono::Duration::days(retention_days as i64);
    if archive.is_set() {
        let mut lock = composer_store::client(pool).await?;
        let dropped = crate::archiving::archive_expired(client, &mut lock, archive, payloads, before).await?;
        drop_payloads(payloads, &dropped).await;
        if !dropped.is_empty() {
            crate::metrics::inc(composer_metrics::PARTITIONS_DROPPED, &[], dropped.len() as u64);
            tracing::info!(months = ?dropped, "dropped expired run partitions after archiving them");
        }
        return Ok(());
    }
    if partitions::archiving_required(client).await? {
        tracing::warn!(
            "retention dropped nothing: this namespace's months are archived (a coordinator with \
             COMPOSER_ARCHIVE_URL ran on it), and this coordinator has no archive: set COMPOSER_ARCHIVE_URL here \
             too, or delete the row of archive_required to stop archiving"
        );
        return Ok(());
    }
    let expired = partitions::drop_before(client, before).await?;
    drop_payloads(payloads, &expired.dropped).await;
    if !expired.dropped.is_empty() {
        crate::metrics::inc(composer_metrics::PARTITIONS_DROPPED, &[], expired.dropped.len() as u64);
        tracing::info!(months = ?expired.dropped, "dropped expired run partitions");
    }
    crate::metrics::set(composer_metrics::PARTITIONS_KEPT_OPEN, &[], expired.kept_open.len() as f64);
    if !expired.kept_open.is_empty() {
        tracing::info!(months = ?expired.kept_open, "kept expired months that still hold open runs");
    }
    Ok(())
}

/// Analyzes the runs and the tasks when they have doubled since
/// they were last analyzed (`COMPOSER_ANALYZE_MIN_ROWS`): see
/// [`partitions::analyze_grown`].
pub async fn analyze_grown_tables(shared: &Shared) {
    let result = async {
        let client = composer_store::client(&shared.pool).await?;
        partitions::analyze_grown(&client, shared.config.analyze_min_rows).await
    };
    match result.await {
        Ok(tables) if !tables.is_empty() => tracing::info!(?tables, "analyzed tables that doubled"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "analyzing grown tables failed"),
    }
}

/// Fails the attempts recovery has dispatched `COMPOSER_MAX_DISPATCHES`
/// times without a result, whatever their stream messages say: the node's
/// retry policy decides what happens next.
async fn fail_exhausted(shared: &Shared, client: &composer_store::Client) {
    let max = shared.config.max_dispatches;
    let exhausted = match recovery::exhausted(client, shared.config.lost_dispatch_age, max, 1000).await {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "recovery: finding exhausted tasks failed");
            return;
        }
    };
    for t in exhausted {
        let error =
            format!("dispatched {} times without a result (COMPOSER_MAX_DISPATCHES is {max})", t.recoveries + 1);
        let event = Event::TaskFailed {
            task_id: t.task_id,
            attempt: t.attempt,
            error,
            retryable: true,
            code: Some(codes::MAX_DISPATCHES.into()),
            status: None,
            retry_after: None,
        };
        match shared.engine.handle(EventRequest::new(t.run_id, event)).await {
            Ok(_) => {
                crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "max_dispatches")], 1);
                tracing::error!(task_id = %t.task_id, attempt = t.attempt, "recovery: failed an attempt dispatched too often");
            }
            Err(e) => tracing::warn!(error = %e, "recovery: failing an exhausted task failed; will retry"),
        }
    }
}

/// Puts IN_DOUBT the at-most-once attempts whose lease expired: their
/// worker may have sent the request before it died, so no worker gets the
/// attempt again; an operator resolves it.
async fn put_in_doubt(shared: &Shared, client: &composer_store::Client) {
    let attempts = match recovery::in_doubt(client, 1000).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "recovery: finding at-most-once attempts in doubt failed");
            return;
        }
    };
    for (run_id, task_id, attempt) in attempts {
        let reason = "its worker's lease expired: the attempt may or may not have taken effect".to_string();
        match shared.engine.handle(EventRequest::new(run_id, Event::TaskInDoubt { task_id, attempt, reason })).await {
            Ok(h) if h.ignored.is_none() => {
                crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "in_doubt")], 1);
                tracing::warn!(%run_id, %task_id, attempt, "recovery: an at-most-once attempt is in doubt");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "recovery: putting an attempt in doubt failed; will retry"),
        }
    }
}

/// Delivers events whose sender failed half way (or died) to the tasks still
/// waiting for them. Applying an event twice is harmless: the state machine
/// ignores it for a task that no longer waits.
async fn deliver_stranded_events(shared: &Shared, client: &composer_store::Client) {
    let stranded = match composer_store::events::stranded(client, STRANDED_EVENT_AGE, 1000).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "recovery: finding undelivered events failed");
            return;
        }
    };
    for mut s in stranded {
        if let Err(e) = crate::payloads::resolve(shared.engine.payloads(), &mut s.payload).await {
            tracing::warn!(error = %e, event_id = s.event_id, "recovery: reading an event's payload failed");
            continue;
        }
        let event = composer_core::machine::Event::EventReceived { task_id: s.waiter.task_id, payload: s.payload };
        match shared.engine.handle(EventRequest::new(s.waiter.run_id, event)).await {
            Ok(h) if h.ignored.is_none() => {
                crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "stranded_event")], 1);
                tracing::warn!(event_id = s.event_id, task_id = %s.waiter.task_id, "recovery: delivered a stranded event");
                if let Err(e) = composer_store::events::mark_consumed(client, s.event_id, s.waiter.task_id).await {
                    tracing::warn!(error = %e, "recovery: cannot mark a delivered event consumed");
                }
                if let Err(e) = composer_store::events::count_taken(client, s.event_id).await {
                    tracing::warn!(error = %e, "recovery: cannot count a delivered event's step");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "recovery: delivering a stranded event failed; will retry"),
        }
    }
}

/// What a coordinator that died after committing a child's end (or its
/// parent's move) did not get to send: the child's result to its parent, a
/// cancel to a child its parent no longer waits for. Both are no-ops when
/// they arrive twice.
async fn settle_children(shared: &Shared, client: &composer_store::Client) {
    use composer_core::machine::Event;
    match composer_store::runs::unreported_children(client, STRANDED_EVENT_AGE, 1000).await {
        Ok(children) => {
            for mut c in children {
                // The child's output read back, if it was offloaded.
                if let Some(output) = &mut c.output {
                    if let Err(e) = crate::payloads::resolve(shared.engine.payloads(), output).await {
                        tracing::warn!(error = %e, child = %c.id, "recovery: reading a child run's output failed");
                        continue;
                    }
                }
                let event = Event::ChildFinished {
                    task_id: c.parent.task_id,
                    attempt: c.parent.attempt,
                    iteration: u32::try_from(c.parent.iteration).unwrap_or(0),
                    child: Some(c.id),
                    status: c.status,
                    output: c.output,
                    error: c.error,
                };
                match shared.engine.handle(EventRequest::new(c.parent.run_id, event)).await {
                    Ok(h) if h.ignored.is_none() => {
                        crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "child_result")], 1);
                        tracing::warn!(child = %c.id, parent = %c.parent.run_id, "recovery: reported a child run's end");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "recovery: reporting a child run failed; will retry"),
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "recovery: finding unreported child runs failed"),
    }
    match composer_store::runs::stalled_maps(client, STRANDED_EVENT_AGE, 1000).await {
        Ok(maps) => {
            for (run_id, task_id) in maps {
                match shared.engine.handle(EventRequest::new(run_id, Event::ItemsLoaded { task_id })).await {
                    Ok(h) if h.ignored.is_none() => {
                        crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "map_continued")], 1);
                        tracing::warn!(%run_id, %task_id, "recovery: carried on a MAP its coordinator did not");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "recovery: carrying a MAP on failed; will retry"),
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "recovery: finding stalled MAPs failed"),
    }
    match composer_store::runs::childless_attempts(client, STRANDED_EVENT_AGE, 1000).await {
        Ok(attempts) => {
            for (run_id, task_id, attempt, iteration) in attempts {
                let iteration = u32::try_from(iteration).unwrap_or(0);
                match shared.engine.start_child(run_id, task_id, attempt, iteration).await {
                    Ok(()) => {
                        crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "child_start")], 1);
                        tracing::warn!(%run_id, %task_id, attempt, "recovery: started a child run its coordinator did not");
                    }
                    Err(e) => tracing::warn!(error = %e, "recovery: starting a child run failed; will retry"),
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "recovery: finding attempts without their child run failed"),
    }
    match composer_store::runs::orphaned_children(client, STRANDED_EVENT_AGE, 1000).await {
        Ok(children) => {
            for child in children {
                match shared.engine.handle(EventRequest::new(child, Event::CancelRun)).await {
                    Ok(h) if h.ignored.is_none() => {
                        crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "orphaned_child")], 1);
                        tracing::warn!(%child, "recovery: cancelled a child run its parent no longer waits for");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "recovery: cancelling an orphaned child failed; will retry"),
                }
            }
        }
        Err(e) => tracing::error!(error = %e, "recovery: finding orphaned child runs failed"),
    }
}

/// How old an undelivered event must be before the sweep delivers it (its
/// sender may still be at it).
const STRANDED_EVENT_AGE: Duration = Duration::from_secs(5);

/// Re-dispatches tasks orphaned by a dead worker (expired lease) or a lost
/// stream message (PENDING with no outbox row for `lost_dispatch_age`), and
/// republishes the stream shard count.
/// Every coordinator runs it; the statements are safe to race.
pub async fn recover_tasks(shared: &Shared) {
    // A Redis restarted without persistence lost the shard count too; workers
    // starting after that would wait for it forever.
    if let Err(e) = shared.streams.publish_shard_count(shared.config.stream_shards).await {
        tracing::warn!(error = %e, "recovery: cannot publish the stream shard count");
    }
    let client = match composer_store::client(&shared.pool).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "recovery: database unavailable");
            return;
        }
    };
    let shards = shared.engine.shards();
    let mut any = false;
    let max = shared.config.max_dispatches;
    match recovery::requeue_expired_leases(&client, shards, max).await {
        Ok(0) => {}
        Ok(n) => {
            any = true;
            crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "expired_lease")], n);
            tracing::warn!(count = n, "recovery: re-dispatched tasks with expired leases");
        }
        Err(e) => tracing::error!(error = %e, "recovery: requeue expired leases failed"),
    }
    let redis_lost_all = redis_lost_its_messages(shared).await;
    let age = if redis_lost_all { Duration::ZERO } else { shared.config.lost_dispatch_age };
    match recovery::redispatch_pending_tasks(&client, shards, age, max).await {
        Ok(0) => {}
        Ok(n) => {
            any = true;
            crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "lost_dispatch")], n);
            tracing::warn!(count = n, "recovery: re-dispatched pending tasks with lost messages");
        }
        Err(e) => {
            tracing::error!(error = %e, "recovery: redispatch pending tasks failed");
            if redis_lost_all {
                // Let the next pass (of any coordinator) find Redis new again.
                if let Err(e) = shared.streams.forget_epoch().await {
                    tracing::warn!(error = %e, "recovery: cannot reset the Redis epoch");
                }
            }
        }
    }
    if any {
        shared.wakes.outbox.notify_one();
    }
    fail_exhausted(shared, &client).await;
    put_in_doubt(shared, &client).await;
    deliver_stranded_events(shared, &client).await;
    settle_children(shared, &client).await;
    if let Err(e) = composer_store::events::cleanup(&client).await {
        tracing::warn!(error = %e, "recovery: cleaning up expired events failed");
    }
    // What another coordinator's crash quarantined is refused here too (the
    // quarantine is kept once for every namespace, in the default one's).
    let read = async {
        let cluster = composer_store::client(&shared.cluster.0).await?;
        crate::engine::evaluator::refresh_quarantine(&cluster).await
    };
    if let Err(e) = read.await {
        tracing::warn!(error = %e, "recovery: reading the quarantine failed");
    }
}

/// How often a coordinator looks whether Redis kept what it published.
pub const LOST_WRITES_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Re-dispatches every PENDING task at once when Redis lost writes this
/// coordinator made (`Streams::lost_writes`: a failover to a replica that
/// lacked them, a restart from an older snapshot or AOF), instead of after
/// `COMPOSER_LOST_DISPATCH_AGE`: messages it published may be gone. A
/// message that was in fact kept makes its task run once all the same (the
/// lease), and Redis losing everything is the epoch's case, below.
pub async fn recover_lost_writes(shared: &Shared) {
    match shared.streams.lost_writes().await {
        Ok(false) => return,
        Ok(true) => tracing::warn!(
            "Redis lost writes it had taken (a failover to a replica behind it, or a restart from older data): \
             re-dispatching every pending task now"
        ),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read this coordinator's stream marks; looking again later");
            return;
        }
    }
    let redispatched = match composer_store::client(&shared.pool).await {
        Ok(client) => {
            let (shards, max) = (shared.engine.shards(), shared.config.max_dispatches);
            recovery::redispatch_pending_tasks(&client, shards, Duration::ZERO, max).await
        }
        Err(e) => Err(e),
    };
    match redispatched {
        Ok(n) => {
            crate::metrics::inc(composer_metrics::RECOVERIES, &[("kind", "lost_dispatch")], n);
            tracing::warn!(count = n, "recovery: re-dispatched pending tasks after Redis lost writes");
            shared.wakes.outbox.notify_one();
        }
        // The lost-dispatch sweep still finds them, after its age.
        Err(e) => tracing::error!(error = %e, "recovery: re-dispatching after Redis lost writes failed"),
    }
}

/// Whether Redis lost every message since a coordinator last looked: its
/// epoch key is gone (a Redis restarted without persistence, as under
/// `composer dev` after a crash, or flushed). Then every PENDING task is
/// re-dispatched at once instead of after the lost-dispatch age. One
/// coordinator claims the new epoch; a task whose message was in fact kept
/// runs once all the same, since a lease is taken per (task, attempt).
async fn redis_lost_its_messages(shared: &Shared) -> bool {
    match shared.streams.claim_new_epoch(&uuid::Uuid::now_v7().to_string()).await {
        Ok(true) => {
            // Normal for a new Redis (every start of `composer dev`): what
            // was lost is counted by the warning of the re-dispatch.
            tracing::info!("recovery: Redis holds no epoch (new, flushed or restarted without its data): re-dispatching every pending task now");
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(error = %e, "recovery: cannot read the Redis epoch");
            false
        }
    }
}

/// Applies TimerFired to every WAITING task whose time has come (WAIT nodes
/// and retry backoffs), in batches; returns how many fired. Two coordinators
/// may pick the same timer: the state machine ignores the second firing.
pub async fn fire_due_waits(shared: &Shared) -> Result<usize, composer_store::Error> {
    let mut fired = 0;
    loop {
        let due = {
            let client = composer_store::client(&shared.pool).await?;
            timers::due(&client, shared.config.timer_batch).await?
        };
        let batch = due.len();
        // Submitted together, so the engine applies them in shared transactions.
        let results = futures_util::future::join_all(
            due.iter()
                .map(|w| shared.engine.handle(EventRequest::new(w.run_id, Event::TimerFired { task_id: w.task_id }))),
        )
        .await;
        for (w, r) in due.iter().zip(results) {
            match r {
                Ok(h) if h.ignored.is_none() => fired += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(run_id = %w.run_id, task_id = %w.task_id, error = %e, "failed to fire timer")
                }
            }
        }
        if (batch as i64) < shared.config.timer_batch {
            break;
        }
    }
    fired += time_out_runs(shared).await?;
    // A deadline the pass cannot fire now (the store out of reach) stays
    // armed for the next pass; the timers above are fired either way.
    match shared.engine.fire_deadlines(shared.config.timer_batch).await {
        Ok(n) => fired += n,
        Err(e) => tracing::error!(error = %e, "failed to fire deadlines"),
    }
    // Triggers' held events whose time has come (debounce, batch, throttle).
    match crate::flows::fire_due(&shared.config, &shared.engine, shared.config.timer_batch).await {
        Ok(n) => fired += n,
        Err(e) => tracing::error!(error = %e, "failed to start the runs of held trigger events"),
    }
    if fired > 0 {
        crate::metrics::inc(composer_metrics::TIMERS_FIRED, &[], fired as u64);
    }
    Ok(fired)
}

/// Starts QUEUED runs whose key has a free slot. Runs are started at once
/// when a run of their key ends; this catches what a coordinator that died
/// just then left behind. Cheap when nothing is queued (a partial index).
pub async fn start_queued_runs(shared: &Shared) -> Result<usize, crate::engine::EngineError> {
    let keys = {
        let client = composer_store::client(&shared.pool).await?;
        composer_store::runs::queued_keys(&client, 1000).await?
    };
    let mut started = 0;
    for (workflow, key) in keys {
        started += shared.engine.promote(&workflow, &key).await?;
    }
    Ok(started)
}

/// Fails the open runs past their definition's `timeout`; returns how many.
async fn time_out_runs(shared: &Shared) -> Result<usize, composer_store::Error> {
    let overdue = {
        let client = composer_store::client(&shared.pool).await?;
        timers::overdue_runs(&client, shared.config.timer_batch).await?
    };
    let results = futures_util::future::join_all(
        overdue.iter().map(|id| shared.engine.handle(EventRequest::new(*id, Event::RunTimedOut))),
    )
    .await;
    let mut timed_out = 0;
    for (id, r) in overdue.iter().zip(results) {
        match r {
            Ok(h) if h.ignored.is_none() => timed_out += 1,
            Ok(_) => {}
            Err(e) => tracing::error!(run_id = %id, error = %e, "failed to time out a run"),
        }
    }
    Ok(timed_out)
}

/// Queues the metrics loop has reported a backlog for, by namespace (none
/// for `default`): each namespace's loop zeroes its own queues only.
type Sampled = std::collections::BTreeMap<Option<std::sync::Arc<str>>, std::collections::BTreeSet<String>>;
static SAMPLED_QUEUES: std::sync::Mutex<Sampled> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Samples the gauges: outbox backlog and age, open tasks by state, running
/// runs, due timers.
pub async fn sample_metrics(shared: &Shared) -> Result<(), composer_store::Error> {
    let client = composer_store::client(&shared.pool).await?;
    let w = stats::open_work(&client).await?;
    crate::metrics::set(composer_metrics::OUTBOX_BACKLOG, &[], w.outbox_backlog as f64);
    crate::metrics::set(composer_metrics::OUTBOX_OLDEST_AGE, &[], w.outbox_oldest_age);
    for (state, n) in [("PENDING", w.pending_tasks), ("RUNNING", w.running_tasks), ("WAITING", w.waiting_tasks)] {
        crate::metrics::set(composer_metrics::OPEN_TASKS, &[("state", state)], n as f64);
    }
    crate::metrics::set(composer_metrics::RUNNING_RUNS, &[], w.running_runs as f64);
    crate::metrics::set(composer_metrics::DUE_TIMERS, &[], w.due_timers as f64);
    // What the namespace uses of its quotas (and its stored bytes, which a
    // start's check reads from here).
    let usage = composer_store::namespaces::usage(&client).await?;
    shared.quotas.measured(usage.stored_bytes);
    let quotas = shared.quotas.quotas();
    for (quota, used, most) in [
        ("open_runs", usage.open_runs, quotas.open_runs),
        ("schedules", usage.schedules, quotas.schedules),
        ("limits", usage.limits, quotas.limits),
        ("stored_bytes", usage.stored_bytes, quotas.stored_bytes),
    ] {
        crate::metrics::set(composer_metrics::NAMESPACE_USAGE, &[("quota", quota)], used as f64);
        if let Some(most) = most {
            crate::metrics::set(composer_metrics::NAMESPACE_QUOTA, &[("quota", quota)], most as f64);
        }
    }
    let backlogs = stats::queue_backlogs(&client).await?;
    // A queue that drained since the last sample reads 0, not its last value.
    let mut sampled = SAMPLED_QUEUES.lock().expect("sampled queues");
    let seen = sampled.entry(crate::metrics::current()).or_default();
    for queue in seen.iter() {
        if !backlogs.iter().any(|b| &b.queue == queue) {
            crate::metrics::set(composer_metrics::QUEUE_BACKLOG, &[("queue", queue)], 0.0);
            crate::metrics::set(composer_metrics::QUEUE_LAG, &[("queue", queue)], 0.0);
        }
    }
    for b in backlogs {
        crate::metrics::set(composer_metrics::QUEUE_BACKLOG, &[("queue", &b.queue)], b.tasks as f64);
        crate::metrics::set(composer_metrics::QUEUE_LAG, &[("queue", &b.queue)], b.oldest_age);
        if seen.len() < 1000 {
            seen.insert(b.queue);
        }
    }
    Ok(())
}

/// How often the offloaded values' sweep runs: a quarter of the grace, from
/// a second to ten minutes.
pub fn sweep_every(grace: Duration) -> Duration {
    (grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// Deletes the offloaded objects older than `COMPOSER_OFFLOAD_GRACE` that no
/// row names: those of a write whose commit never came (its coordinator
/// died in between), of a value replaced since, of a run that is gone, of
/// an event the event log and the buffer forgot. Records what the rest
/// hold, which the namespace's stored bytes count.
pub async fn sweep_payloads(s: &Shared) -> Result<u64, composer_store::Error> {
    let payloads = s.engine.payloads();
    if !payloads.is_on() {
        // Nothing is offloaded: nothing counts in stored bytes.
        composer_store::namespaces::record_payload_usage(&composer_store::client(&s.pool).await?, 0, 0).await?;
        return Ok(0);
    }
    let grace = chrono::Duration::from_std(s.config.offload_grace).unwrap_or(chrono::Duration::MAX);
    let before = crate::clock::now().checked_sub_signed(grace).unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let mut lock = composer_store::client(&s.pool).await?;
    let held = composer_store::begin(&mut lock).await?;
    if !composer_store::partitions::try_lock_payload_sweep(&held).await? {
        tracing::debug!("another coordinator sweeps this namespace's offloaded values now");
        return Ok(0);
    }
    let client = composer_store::client(&s.pool).await?;
    let client = &client;
    let named = |run: uuid::Uuid| async move {
        let named = composer_store::runs::named_objects(client, run)
            .await
            .map_err(|e| composer_archive::Error::Location(format!("asking PostgreSQL: {e}")))?;
        Ok(named.iter().filter_map(|o| o.parse().ok()).collect())
    };
    let swept = payloads.sweep(before, named).await.map_err(crate::payloads::store_error)?;
    let mut deleted = swept.deleted;
    let named = |owner: uuid::Uuid| async move {
        let named = composer_store::events::named_objects(client, owner)
            .await
            .map_err(|e| composer_archive::Error::Location(format!("asking PostgreSQL: {e}")))?;
        Ok(named.iter().filter_map(|o| o.parse().ok()).collect())
    };
    deleted += payloads.sweep_events(before, named).await.map_err(crate::payloads::store_error)?;
    // The objects count in the namespace's stored bytes (listed before the
    // events' sweep: what it deleted counts until the next).
    composer_store::namespaces::record_payload_usage(client, swept.kept, swept.kept_bytes).await?;
    held.commit().await?;
    if deleted > 0 {
        tracing::info!(deleted, "deleted offloaded values no row names");
    }
    Ok(deleted)
}
