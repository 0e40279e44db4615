//! One namespace's share of a coordinator (a cell, see [`crate::cells`]):
//! its storage prepared, its engine, publisher and loops started.

use std::net::SocketAddr;
use std::sync::Arc;

use composer_stream::{Keys, Streams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::{Engine, Lane, URGENT_LOOPS};
use crate::shared::Shared;
use crate::{listener, loops, outbox, publish, schedules};

/// Why a coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(#[from] composer_config::ConfigError),
    #[error("cannot listen on {addr} (--listen, COMPOSER_LISTEN): {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot write the bound address to {path} (--addr-file, COMPOSER_ADDR_FILE): {source}")]
    AddrFile { path: std::path::PathBuf, source: std::io::Error },
    #[error("PostgreSQL (--database-url, COMPOSER_DATABASE_URL): {0}")]
    Store(#[from] composer_store::Error),
    #[error("Redis (--redis-url, COMPOSER_REDIS_URL): {0}")]
    Stream(#[from] composer_stream::Error),
    #[error("cannot use the state directory or its flight file {path} (--state-dir, COMPOSER_STATE_DIR): {source}")]
    State { path: std::path::PathBuf, source: std::io::Error },
    #[error(
        "{skew}, more than the {allowed:?} allowed (--max-clock-skew, COMPOSER_MAX_CLOCK_SKEW): \
         keep this host in time (NTP) before starting a coordinator on it"
    )]
    ClockSkew { skew: String, allowed: std::time::Duration },
    #[error("the archive (--archive-url, COMPOSER_ARCHIVE_URL): {0}")]
    Archive(#[from] crate::archive::ArchiveError),
    #[error("offloaded values' storage (--offload-url, COMPOSER_OFFLOAD_URL): {0}")]
    Offload(composer_archive::Error),
}

/// Starts the part of a coordinator that serves one namespace (a cell):
/// its connection to Redis under its own prefix, its engine, the outbox's
/// publisher, the loops — everything reading and writing `pool`, whose
/// connections reach that namespace's tables only. `default` is the
/// default namespace's cell, for another namespace's: its keys and its pool
/// of what is kept once for the cluster.
pub(crate) async fn start_cell(
    namespace: &str,
    config: Config,
    pool: composer_store::Pool,
    traces: Option<Arc<crate::trace::Traces>>,
    default: Option<&Shared>,
    shutdown: &CancellationToken,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<Arc<Shared>, Error> {
    let mut tasks = Tasks::new(tasks, namespace);
    let streams = Streams::connect_with(
        &config.redis.url,
        Keys::new(config.redis.prefix.clone()),
        config.redis.ca_file.as_deref(),
    )
    .await?;
    streams.publish_shard_count(config.stream_shards).await?;

    let outbox_wake = Arc::new(Notify::new());
    // A coordinator that runs no enqueuer publishes nothing itself either:
    // its rows are due at once, for the others.
    let (publisher, publish_inbox) = match config.run_outbox {
        true => {
            let (p, inbox) = crate::engine::publisher::Publisher::new();
            (Some(Arc::new(p)), Some(inbox))
        }
        false => (None, None),
    };
    let engine = Engine::new(
        pool.clone(),
        config.stream_shards,
        outbox_wake.clone(),
        publisher.clone().map(|p| (p, config.outbox_publish_grace)),
        crate::engine::Bounds {
            max_payload: config.max_value(),
            tree: crate::engine::TreeBudget { runs: config.max_tree_runs, items: config.max_tree_items },
            whole_run_nodes: config.whole_run_nodes,
        },
        config.engine_queue,
    )
    .with_traces(traces)
    .with_payloads(payloads_of(&config, namespace)?)
    .with_ui_url(config.ui_url.clone());
    let archive = crate::archive::Archive::open(
        config.archive_url.as_deref(),
        &config.archive_options,
        config.archive_dir.as_deref().unwrap_or(namespace),
        namespace,
    )
    .map_err(crate::archive::ArchiveError::from)?;
    if archive.is_set() {
        // From now on no coordinator without an archive drops this namespace's months.
        composer_store::partitions::require_archiving(&composer_store::client(&pool).await?).await?;
    }
    let mut shared = Shared::new(config, pool, streams, engine, outbox_wake);
    shared.archive = archive;
    if let Some(default) = default {
        shared.keys = default.keys.clone();
        shared.cluster = default.cluster.clone();
    }
    let shared = Arc::new(shared);
    if let (Some(publisher), Some(inbox)) = (publisher, publish_inbox) {
        tasks.spawn(publish::run(shared.clone(), publisher, inbox, shutdown.clone()));
    }
    for _ in 0..shared.config.engine_workers {
        tasks.spawn(shared.engine.clone().run_batches(Lane::All, shutdown.clone()));
    }
    for _ in 0..URGENT_LOOPS {
        tasks.spawn(shared.engine.clone().run_batches(Lane::Urgent, shutdown.clone()));
    }
    crate::metrics::in_namespace(tasks.namespace.clone(), loops::recover_tasks(&shared)).await;
    spawn_loops(&shared, shutdown, &mut tasks);
    Ok(shared)
}

/// Where `namespace`'s offloaded values go (`COMPOSER_OFFLOAD_URL`, in the
/// namespace's directory there), if anywhere.
pub(crate) fn payloads_of(config: &Config, namespace: &str) -> Result<composer_archive::payloads::Payloads, Error> {
    use composer_archive::payloads::Payloads;
    let Some(url) = &config.offload_url else { return Ok(Payloads::off()) };
    let store = composer_archive::Store::open_with(url, &config.archive_options).map_err(Error::Offload)?;
    let threshold = usize::try_from(config.offload_threshold).unwrap_or(usize::MAX);
    Ok(Payloads::new(store.sub(config.archive_dir.as_deref().unwrap_or(namespace)), threshold))
}

/// Applies the migrations to what `pool` reaches (the default namespace's
/// schema, or another's) and makes its partitions.
pub(crate) async fn prepare(config: &Config, pool: &composer_store::Pool) -> Result<(), Error> {
    let mut client = composer_store::client(pool).await?;
    let applied = composer_store::migrations::migrate(&mut client).await?;
    if applied > 0 {
        tracing::info!(applied, "applied migrations");
    }
    // With an archive, months are dropped by the partition loop, once written there.
    let retention = if config.archive_url.is_some() { 0 } else { config.retention_days };
    let none = crate::archive::Archive::default();
    drop(client);
    // The values of months dropped here go with the sweep (no row names them).
    let off = composer_archive::payloads::Payloads::off();
    loops::maintain_partitions(pool, config.partition_months_ahead, retention, &none, &off).await?;
    Ok(())
}

/// Wakes this coordinator's waiting polls when another coordinator
/// publishes, so that a step it dispatched is read at once rather than at
/// the polls' next idle read.
async fn wake_on_announcements(shared: Arc<Shared>, shutdown: CancellationToken) {
    let wake = || {
        crate::metrics::inc(composer_metrics::POLL_WAKES, &[], 1);
        shared.wakes.published.notify_waiters();
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = shared.streams.announced(wake) => {}
    }
}

/// With offloading, the sweep of offloaded values no row names.
fn spawn_sweep(shared: &Arc<Shared>, shutdown: &CancellationToken, tasks: &mut Tasks<'_>) {
    if !shared.engine.payloads().is_on() {
        return;
    }
    let every = loops::sweep_every(shared.config.offload_grace);
    tasks.spawn(loops::every(shutdown.clone(), every, shared.clone(), |s| {
        Box::pin(async move {
            if let Err(e) = loops::sweep_payloads(&s).await {
                tracing::warn!(error = %e, "sweeping offloaded values failed");
            }
        })
    }));
}

/// The periodic work of every coordinator: recovery, timers, partitions,
/// metrics (and the outbox and its wake-ups, when this one publishes).
fn spawn_loops(shared: &Arc<Shared>, shutdown: &CancellationToken, tasks: &mut Tasks<'_>) {
    tasks.spawn(listener::run(shared.clone(), shutdown.clone()));
    tasks.spawn(wake_on_announcements(shared.clone(), shutdown.clone()));
    if shared.config.run_outbox {
        tasks.spawn(outbox::run(shared.clone(), shutdown.clone()));
    }
    let c = &shared.config;
    tasks.spawn(loops::every(shutdown.clone(), c.recovery_interval, shared.clone(), |s| {
        Box::pin(async move { loops::recover_tasks(&s).await })
    }));
    tasks.spawn(loops::every(shutdown.clone(), c.timer_interval, shared.clone(), |s| {
        Box::pin(async move {
            // Before the timers: a host clock that jumped is corrected first.
            if let Err(e) = crate::clock::measure(&s.pool, s.config.max_clock_skew).await {
                tracing::warn!(error = %e, "measuring the clock against PostgreSQL's failed");
            }
            if let Err(e) = loops::fire_due_waits(&s).await {
                tracing::warn!(error = %e, "firing due timers failed");
            }
            if let Err(e) = loops::start_queued_runs(&s).await {
                tracing::warn!(error = %e, "starting queued runs failed");
            }
            if let Err(e) = schedules::fire_due(&s).await {
                tracing::warn!(error = %e, "firing schedules failed");
            }
        })
    }));
    tasks.spawn(loops::every(shutdown.clone(), loops::LOST_WRITES_CHECK_EVERY, shared.clone(), |s| {
        Box::pin(async move { loops::recover_lost_writes(&s).await })
    }));
    tasks.spawn(bulk_loop(shared.clone(), shutdown.clone()));
    spawn_sweep(shared, shutdown, tasks);
    tasks.spawn(crate::limits::run(shared.clone(), shutdown.clone()));
    tasks.spawn(loops::every(shutdown.clone(), c.partition_interval, shared.clone(), |s| {
        Box::pin(async move {
            let result = async {
                let client = composer_store::client(&s.pool).await?;
                forget_old(&s, &client).await;
                let c = &s.config;
                drop(client);
                loops::maintain_partitions(
                    &s.pool,
                    c.partition_months_ahead,
                    c.retention_days,
                    &s.archive,
                    s.engine.payloads(),
                )
                .await
            };
            if let Err(e) = result.await {
                tracing::error!(error = %e, "partition maintenance failed");
            }
        })
    }));
    tasks.spawn(loops::every(shutdown.clone(), c.analyze_interval, shared.clone(), |s| {
        Box::pin(async move { loops::analyze_grown_tables(&s).await })
    }));
    tasks.spawn(loops::every(shutdown.clone(), c.metrics_interval, shared.clone(), |s| {
        Box::pin(async move {
            if let Err(e) = loops::sample_metrics(&s).await {
                tracing::warn!(error = %e, "sampling metrics failed");
            }
        })
    }));
}

/// Forgets what is kept for a while only: schedule fires, events past
/// `COMPOSER_EVENT_LOG_KEPT`, and a week after they end, bulk jobs (with
/// the marks of the runs they acted on), replays and updates' answers.
async fn forget_old(s: &Shared, client: &composer_store::Client) {
    if let Err(e) = schedules::forget_old_fires(client).await {
        tracing::warn!(error = %e, "forgetting old schedule fires failed");
    }
    if let Err(e) = crate::triggers::forget_old_events(&s.config, client).await {
        tracing::warn!(error = %e, "forgetting old events failed");
    }
    let week = std::time::Duration::from_secs(7 * 86_400);
    if let Err(e) = composer_store::bulk::cleanup(client, week).await {
        tracing::warn!(error = %e, "forgetting old bulk jobs failed");
    }
    if let Err(e) = composer_store::replays::cleanup(client, week).await {
        tracing::warn!(error = %e, "forgetting old replays failed");
    }
    if let Err(e) = composer_store::updates::forget_old(client, week).await {
        tracing::warn!(error = %e, "forgetting old update answers failed");
    }
    if let Err(e) = composer_store::approvals::forget_orphans(client).await {
        tracing::warn!(error = %e, "forgetting the votes of dropped runs failed");
    }
}

/// Works bulk jobs and replays a batch at a time while there are any, then waits for a
/// new one (or a second, for jobs of other coordinators that died).
async fn bulk_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let worked = match crate::bulk::work_one_batch(&shared).await {
            Ok(worked) => worked,
            Err(e) => {
                tracing::warn!(error = %e, "working a bulk job failed; will retry");
                false
            }
        };
        let replayed = match crate::replay::work_one_batch(&shared).await {
            Ok(worked) => worked,
            Err(e) => {
                tracing::warn!(error = %e, "working a replay failed; will retry");
                false
            }
        };
        let worked = worked || replayed;
        if worked {
            if shutdown.is_cancelled() {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = shared.wakes.bulk.notified() => {}
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// A cell's tasks: each counts its metrics in the cell's namespace (the one
/// way this crate spawns into a `JoinSet`).
pub(crate) struct Tasks<'a> {
    set: &'a mut tokio::task::JoinSet<()>,
    namespace: Option<Arc<str>>,
}

impl<'a> Tasks<'a> {
    pub(crate) fn new(set: &'a mut tokio::task::JoinSet<()>, namespace: &str) -> Tasks<'a> {
        let namespace = (namespace != composer_store::namespaces::DEFAULT).then(|| Arc::from(namespace));
        Tasks { set, namespace }
    }

    #[allow(clippy::disallowed_methods)] // the door to JoinSet::spawn
    pub(crate) fn spawn(&mut self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.set.spawn(crate::metrics::in_namespace(self.namespace.clone(), f));
    }
}
