//! Starting a coordinator: storage first, then the loops and the API, in
//! the order docs/architecture.md gives; and stopping it.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use crate::cell::Error;
use crate::cell::{prepare, start_cell};
use crate::config::Config;
use crate::http;
use crate::shared::Shared;

/// A started coordinator. Dropping it does not stop it; call [`Running::stop`].
pub struct Running {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    cells: Arc<crate::cells::Cells>,
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
        let cells = self.cells.clone();
        let joined = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
            cells.stop_all().await;
        })
        .await;
        if joined.is_err() {
            tracing::warn!(grace = ?grace, "stopping past COMPOSER_SHUTDOWN_GRACE: aborting what is still running");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
            self.cells.abort_all();
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
        self.cells.abort_all();
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
    let others = match crashed.iter().any(|s| matches!(s, evaluator::Subject::Run(_))) {
        true => namespace_pools(config, &client).await?,
        false => Vec::new(),
    };
    evaluator::fail_crashed(&mut client, crashed, &others).await?;
    Ok(())
}

/// A pool of one connection for each namespace but `default`.
async fn namespace_pools(config: &Config, client: &composer_store::Client) -> Result<Vec<composer_store::Pool>, Error> {
    let rows = composer_store::namespaces::list(client, i64::MAX).await?;
    let url = &config.database.url;
    // Not one being created: its schema may not be there yet.
    let made = rows.iter().filter(|r| r.state != "creating");
    let pools =
        made.filter_map(|r| r.schema()).map(|s| composer_store::connect_in(url, Some(&s), 1, config.db_timeout));
    Ok(pools.collect::<Result<_, _>>()?)
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
    let traces = start_traces(&config, addr)?;
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let shared =
        start_cell(composer_store::namespaces::DEFAULT, config, pool, traces, None, &shutdown, &mut tasks).await?;
    let cells = crate::cells::Cells::new(shared.clone(), shutdown.clone());
    let mut default_tasks = crate::cell::Tasks::new(&mut tasks, composer_store::namespaces::DEFAULT);
    default_tasks.spawn(crate::cells::keep(cells.clone(), shutdown.clone()));
    serve(listener, &shared, &cells, &shutdown, &mut default_tasks);
    write_addr_file(&shared.config, addr)?;
    crate::metrics::set(
        composer_metrics::BUILD_INFO,
        &[("version", env!("CARGO_PKG_VERSION")), ("role", "coordinator")],
        1.0,
    );
    Ok(Running { addr, shared, cells, shutdown, tasks })
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
    prepare(config, &pool).await?;
    Ok(pool)
}

fn serve(
    listener: TcpListener,
    shared: &Arc<Shared>,
    cells: &Arc<crate::cells::Cells>,
    shutdown: &CancellationToken,
    tasks: &mut crate::cell::Tasks<'_>,
) {
    let app = http::router(shared.clone(), cells.clone());
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
