//! Starting a coordinator: storage first, then the loops and the API, in
//! the order docs/architecture.md gives; and stopping it.

use std::net::SocketAddr;
use std::sync::Arc;

use composer_stream::{Keys, Streams};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::{Engine, Lane, URGENT_LOOPS};
use crate::shared::Shared;
use crate::{http, listener, loops, outbox, publish, schedules};

/// A started coordinator. Dropping it does not stop it; call [`Running::stop`].
pub struct Running {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl Running {
    /// The task API for a worker in this process
    /// (`composer_worker::Worker::in_process`).
    pub fn in_process(&self) -> Arc<dyn composer_api::in_process::InProcessApi> {
        Arc::new(crate::in_process::InProcess::new(self.shared.task_api.clone()))
    }

    /// The task API for this coordinator's own HTTP executor (a worker in
    /// its process that runs only HTTP calls reading no secret, and only
    /// those its batches hand it: `composer_worker::Worker::coordinators_http`).
    pub fn http_executor(&self) -> Arc<dyn composer_api::in_process::InProcessApi> {
        Arc::new(crate::in_process::InProcess::for_http_executor(self.shared.task_api.clone()))
    }

    /// Marks the coordinator as going away while it still serves:
    /// `/readyz` answers 503 and long-polls return what they have.
    pub fn drain(&self) {
        self.shared.draining.begin();
    }

    /// Stops serving and the loops, and waits for them to end — at most
    /// `COMPOSER_SHUTDOWN_GRACE`, whatever they are doing: past it the rest
    /// are aborted, and a transaction they held rolls back (as after a crash,
    /// which every step survives).
    pub async fn stop(mut self) {
        self.drain();
        self.shutdown.cancel();
        let grace = self.shared.config.shutdown_grace;
        let until = tokio::time::Instant::now() + grace;
        let joined = tokio::time::timeout(grace, async { while self.tasks.join_next().await.is_some() {} }).await;
        if joined.is_err() {
            tracing::warn!(grace = ?grace, "stopping past COMPOSER_SHUTDOWN_GRACE: aborting what is still running");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        self.flush_traces(until).await;
    }

    /// Sends the spans still queued for export, on a thread of its own (the
    /// exporter's calls need the async runtime free), until `until` at the
    /// latest: a receiver that does not answer costs what is left of the
    /// grace, never more; the spans it did not take are lost.
    async fn flush_traces(&self, until: tokio::time::Instant) {
        if let Some(traces) = self.shared.engine.traces().cloned() {
            let flushed = tokio::time::timeout_at(until, tokio::task::spawn_blocking(move || traces.flush())).await;
            if flushed.is_err() {
                tracing::warn!("the trace receiver did not take the last spans within COMPOSER_SHUTDOWN_GRACE");
            }
        }
    }

    /// Stops at once, without waiting: what a crash looks like to the others.
    pub fn abort(mut self) {
        self.tasks.abort_all();
    }
}

/// The exporter of runs' traces, when `COMPOSER_OTLP_ENDPOINT` asks for one.
fn start_traces(config: &Config, addr: SocketAddr) -> Result<Option<Arc<crate::trace::Traces>>, Error> {
    let Some(endpoint) = &config.otlp_endpoint else { return Ok(None) };
    let instance = format!("{addr}/{}", std::process::id());
    let traces = crate::trace::Traces::start(endpoint, config.otlp_header_map(), &instance).map_err(|e| {
        Error::Config(composer_config::ConfigError::new("--otlp-endpoint", "COMPOSER_OTLP_ENDPOINT", e))
    })?;
    tracing::info!(endpoint, "sending runs' traces over OTLP/HTTP");
    Ok(Some(Arc::new(traces)))
}

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
}

/// Starts the evaluation pool with its flight recorder (in the state
/// directory), and fails, once, what evaluations cut short by the last
/// crash were for; reads the quarantine.
async fn fail_crashed(config: &Config, bound: SocketAddr, pool: &composer_store::Pool) -> Result<(), Error> {
    use crate::engine::evaluator::{self, default_state_dir, StateDir};
    let state_error = |path: &std::path::Path, source| Error::State { path: path.to_path_buf(), source };
    let dir = match (&config.state_dir, config.listen.port()) {
        (Some(dir), _) => Some(dir.clone()),
        (None, 0) => None,
        (None, _) => Some(default_state_dir().ok_or_else(|| {
            Error::Config(composer_config::ConfigError::new(
                "--state-dir",
                "COMPOSER_STATE_DIR",
                "no default: neither STATE_DIRECTORY, XDG_STATE_HOME nor HOME is set",
            ))
        })?),
    };
    let flight = match dir {
        Some(dir) => {
            let state = StateDir::open(&dir).map_err(|e| state_error(&dir, e))?;
            // By the address asked for, which the next start asks for too;
            // by the bound one when the port was left to the system.
            let listen = if config.listen.port() == 0 { bound } else { config.listen };
            Some(state.flight_file(&listen.to_string()))
        }
        None => None,
    };
    let crashed = evaluator::start(flight.as_deref(), config.eval_backstop)
        .map_err(|source| state_error(flight.as_deref().unwrap_or_else(|| std::path::Path::new("")), source))?;
    let mut client = composer_store::client(pool).await?;
    evaluator::fail_crashed(&mut client, crashed).await?;
    Ok(())
}

/// Prepares storage and starts the coordinator, in the start-up order of
/// docs/architecture.md:
/// migrations and partitions (no run can be inserted without one), then the
/// shard count (workers need it), then one recovery pass (so whatever was
/// orphaned while the cluster was down goes out in the outbox's first batch),
/// then the outbox, the loops and the API.
pub async fn start(config: Config) -> Result<Running, Error> {
    let config = config.validated()?;
    let listener =
        TcpListener::bind(config.listen).await.map_err(|source| Error::Listen { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| Error::Listen { addr: config.listen, source })?;
    tracing::info!(%addr, stream_shards = config.stream_shards, "starting coordinator");

    let pool = prepare_storage(&config).await?;
    let skew = crate::clock::measure(&pool, config.max_clock_skew).await?;
    if skew.size() > config.max_clock_skew {
        return Err(Error::ClockSkew { skew: skew.describe(), allowed: config.max_clock_skew });
    }
    warn_of_asynchronous_replication(&pool).await;
    fail_crashed(&config, addr, &pool).await?;
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
            max_payload: config.max_payload,
            tree: crate::engine::TreeBudget { runs: config.max_tree_runs, items: config.max_tree_items },
            whole_run_nodes: config.whole_run_nodes,
        },
        config.engine_queue,
    )
    .with_traces(start_traces(&config, addr)?);
    let shared = Arc::new(Shared::new(config, pool, streams, engine, outbox_wake));
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    if let (Some(publisher), Some(inbox)) = (publisher, publish_inbox) {
        tasks.spawn(publish::run(shared.clone(), publisher, inbox, shutdown.clone()));
    }
    for _ in 0..shared.config.engine_workers {
        tasks.spawn(shared.engine.clone().run_batches(Lane::All, shutdown.clone()));
    }
    for _ in 0..URGENT_LOOPS {
        tasks.spawn(shared.engine.clone().run_batches(Lane::Urgent, shutdown.clone()));
    }
    loops::recover_tasks(&shared).await;
    spawn_loops(&shared, &shutdown, &mut tasks);
    serve(listener, &shared, &shutdown, &mut tasks);
    write_addr_file(&shared.config, addr)?;
    composer_metrics::set(
        composer_metrics::BUILD_INFO,
        &[("version", env!("CARGO_PKG_VERSION")), ("role", "coordinator")],
        1.0,
    );
    Ok(Running { addr, shared, shutdown, tasks })
}

/// Says so when a failover of PostgreSQL can lose acknowledged work: its
/// standbys receive commits after they are acknowledged (docs/operations/failures.md).
async fn warn_of_asynchronous_replication(pool: &composer_store::Pool) {
    match composer_store::replication(pool).await {
        Ok(r) if r.can_lose_commits() => tracing::warn!(
            standbys = r.standbys,
            "PostgreSQL replicates asynchronously: a failover to a standby loses the runs, results and \
             events of the commits it had not received, though they were acknowledged; set \
             synchronous_standby_names (and synchronous_commit = on) to lose none"
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "could not read how PostgreSQL replicates"),
    }
}

/// Migrates, and creates the partitions no run can be inserted without.
async fn prepare_storage(config: &Config) -> Result<composer_store::Pool, Error> {
    let pool = composer_store::connect(&config.database.url, config.db_pool_size, config.db_timeout)?;
    let mut client = composer_store::client(&pool).await?;
    let applied = composer_store::migrations::migrate(&mut client).await?;
    if applied > 0 {
        tracing::info!(applied, "applied migrations");
    }
    loops::maintain_partitions(&client, config.partition_months_ahead, config.retention_days).await?;
    Ok(pool)
}

/// Wakes this coordinator's waiting polls when another coordinator
/// publishes, so that a step it dispatched is read at once rather than at
/// the polls' next idle read.
async fn wake_on_announcements(shared: Arc<Shared>, shutdown: CancellationToken) {
    let wake = || {
        composer_metrics::inc(composer_metrics::POLL_WAKES, &[], 1);
        shared.wakes.published.notify_waiters();
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = shared.streams.announced(wake) => {}
    }
}

/// The periodic work of every coordinator: recovery, timers, partitions,
/// metrics (and the outbox and its wake-ups, when this one publishes).
fn spawn_loops(shared: &Arc<Shared>, shutdown: &CancellationToken, tasks: &mut tokio::task::JoinSet<()>) {
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
    tasks.spawn(crate::limits::run(shared.clone(), shutdown.clone()));
    tasks.spawn(loops::every(shutdown.clone(), c.partition_interval, shared.clone(), |s| {
        Box::pin(async move {
            let result = async {
                let client = composer_store::client(&s.pool).await?;
                if let Err(e) = schedules::forget_old_fires(&client).await {
                    tracing::warn!(error = %e, "forgetting old schedule fires failed");
                }
                if let Err(e) = crate::triggers::forget_old_events(&client).await {
                    tracing::warn!(error = %e, "forgetting old events failed");
                }
                // A bulk job and the marks of the runs it acted on are kept a week after it ends.
                if let Err(e) = composer_store::bulk::cleanup(&client, std::time::Duration::from_secs(7 * 86_400)).await
                {
                    tracing::warn!(error = %e, "forgetting old bulk jobs failed");
                }
                loops::maintain_partitions(&client, s.config.partition_months_ahead, s.config.retention_days).await
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

/// Works bulk jobs a batch at a time while there are any, then waits for a
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

fn serve(
    listener: TcpListener,
    shared: &Arc<Shared>,
    shutdown: &CancellationToken,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    let app = http::router(shared.clone());
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        // The client's address is the UI's login throttle's key.
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let server = axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await });
        if let Err(e) = server.await {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
}

/// Writes `http://addr` to `--addr-file`, atomically (scripts poll for it).
fn write_addr_file(config: &Config, addr: SocketAddr) -> Result<(), Error> {
    let Some(path) = &config.addr_file else { return Ok(()) };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("http://{addr}"))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| Error::AddrFile { path: path.clone(), source })
}
