//! The server roles: `dev` (everything in one process, on embedded services
//! unless URLs are given), `coordinator`, `worker` and `migrate`.

use std::process::ExitCode;

use anyhow::Context;
use composer_config::DatabaseArgs;
use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::cli::{CoordinatorArgs, DevArgs, HttpSteps};

/// SIGTERM or ctrl-c, listened for from the moment it is made. Made before
/// a role announces its address, so a signal sent as soon as the address is
/// out stops it cleanly instead of killing it by the signal's default.
struct StopSignal {
    term: Option<Signal>,
    interrupt: Option<Signal>,
}

impl StopSignal {
    fn listen() -> Self {
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot handle {name}; it stops this process without a clean shutdown");
                None
            }
        };
        StopSignal {
            term: listen(SignalKind::terminate(), "SIGTERM"),
            interrupt: listen(SignalKind::interrupt(), "ctrl-c"),
        }
    }

    /// Resolves on the first of the two signals.
    async fn received(mut self) {
        async fn on(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = on(&mut self.term) => tracing::info!("SIGTERM received; shutting down"),
            _ = on(&mut self.interrupt) => tracing::info!("interrupt received; shutting down"),
        }
    }
}

pub async fn coordinator(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let CoordinatorArgs { coord, http_steps, egress } = args;
    let stop = StopSignal::listen();
    // Off unless asked for: the calls would start from the coordinator's
    // host, under rules an operator may have given only its workers.
    let executor = HttpExecutor::config(http_steps.slots.unwrap_or(0), egress, coord.max_value())?;
    let running = composer_coord::start(coord).await?;
    let executor = HttpExecutor::start(executor, &running);
    tracing::info!(addr = %running.addr, "coordinator ready");
    stop.received().await;
    executor.stop().await;
    running.stop().await;
    Ok(ExitCode::SUCCESS)
}

/// A coordinator's own HTTP executor (`--http-slots`): a worker in its
/// process, handed only HTTP calls that read no secret, by its own batches.
struct HttpExecutor {
    shutdown: CancellationToken,
    run: Option<tokio::task::JoinHandle<Result<(), composer_worker::Error>>>,
}

impl HttpExecutor {
    /// Its configuration, checked before the coordinator starts; `None`
    /// with no slots.
    fn config(
        slots: usize,
        egress: composer_worker::Egress,
        max_payload: usize,
    ) -> anyhow::Result<Option<(composer_worker::Config, usize)>> {
        if slots == 0 {
            return Ok(None);
        }
        if slots > composer_worker::MAX_WORKER_SLOTS {
            anyhow::bail!(
                "--http-slots (COMPOSER_COORDINATOR_HTTP_SLOTS): {slots} is more than {} slots",
                composer_worker::MAX_WORKER_SLOTS
            );
        }
        // In process, the URL is only its name in the log.
        let mut config = composer_worker::Config::new(vec!["http://in-process".into()]);
        config.max_payload = max_payload;
        config.options.egress = egress;
        let config = config.validated()?;
        Ok(Some((config, slots)))
    }

    fn start(config: Option<(composer_worker::Config, usize)>, running: &composer_coord::Running) -> HttpExecutor {
        let shutdown = CancellationToken::new();
        let run = config.map(|(config, slots)| {
            let worker = composer_worker::Worker::coordinators_http(config, running.http_executor(), slots);
            tokio::spawn(worker.run(shutdown.clone()))
        });
        HttpExecutor { shutdown, run }
    }

    /// Lets the calls in flight finish and report (within a lease).
    async fn stop(self) {
        self.shutdown.cancel();
        if let Some(Ok(Err(e))) = match self.run {
            Some(run) => Some(run.await),
            None => None,
        } {
            tracing::error!(error = %e, "the coordinator's HTTP executor failed");
        }
    }
}

pub async fn worker(config: composer_worker::Config) -> anyhow::Result<ExitCode> {
    let config = config.validated()?;
    let worker = composer_worker::Worker::new(config);
    let stop = StopSignal::listen();
    let shutdown = CancellationToken::new();
    let mut run = tokio::spawn(worker.run(shutdown.clone()));
    let finished = tokio::select! {
        _ = stop.received() => {
            shutdown.cancel();
            (&mut run).await
        }
        r = &mut run => r,
    };
    finished.context("worker task")??;
    Ok(ExitCode::SUCCESS)
}

pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<ExitCode> {
    let db = args.required()?;
    let pool = composer_store::connect(db, 1, std::time::Duration::from_secs(10)).context("COMPOSER_DATABASE_URL")?;
    let mut client = composer_store::client(&pool).await.context("cannot connect to PostgreSQL")?;
    let applied = composer_store::migrations::migrate(&mut client).await?;
    println!("applied {applied} migration(s)");
    Ok(ExitCode::SUCCESS)
}

/// `composer dev`: embedded services unless URLs are given, then a
/// coordinator and a worker in this process until SIGTERM or ctrl-c; the
/// services are stopped on the way out.
pub fn dev(runtime: &tokio::runtime::Runtime, mut args: DevArgs) -> anyhow::Result<ExitCode> {
    // Before the embedded services start: a signal while they start stops
    // them once they are up rather than leaving them behind.
    let stop = {
        let _in_runtime = runtime.enter();
        StopSignal::listen()
    };
    let mut pg = None;
    let mut redis_server = None;
    if args.coord.database.url.trim().is_empty() {
        let dir = absolute(&args.data_dir)?.join("postgres");
        eprintln!("starting embedded PostgreSQL in {} …", dir.display());
        let opts = PgOptions { data_dir: dir.clone(), port: None, fsync: true, max_connections: 100 };
        let server = LocalPostgres::start(opts).context("starting the embedded PostgreSQL (COMPOSER_DATA_DIR)")?;
        if server.data_dir() != dir {
            eprintln!(
                "the postgres user cannot reach {}: its data is in {} (linked from there)",
                dir.display(),
                server.data_dir().display()
            );
        }
        runtime.block_on(composer_store::ensure_database(&server.url("postgres"), "composer"))?;
        args.coord.database.url = server.url("composer");
        pg = Some(server);
    }
    if args.coord.redis.url.trim().is_empty() {
        let dir = absolute(&args.data_dir)?.join("redis");
        let server = LocalRedis::start(&dir, None).context("starting the embedded redis-server (COMPOSER_DATA_DIR)")?;
        args.coord.redis.url = server.url();
        redis_server = Some(server);
    }
    // The coordinator's state (its flight recorder) with the rest of the
    // data, when there is a data directory: an embedded service's.
    if args.coord.state_dir.is_none() && (pg.is_some() || redis_server.is_some()) {
        args.coord.state_dir = Some(absolute(&args.data_dir)?.join("state"));
    }
    // Values too large for their rows, beside the embedded database's.
    if args.coord.offload_url.is_none() && pg.is_some() {
        args.coord.offload_url = Some(absolute(&args.data_dir)?.join("objects").display().to_string());
    }
    let embedded = pg.is_some();
    let result = runtime.block_on(run_dev(args, embedded, stop));
    if let Some(mut r) = redis_server {
        r.stop();
    }
    if let Some(mut p) = pg {
        p.stop();
    }
    result
}

fn absolute(p: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    Ok(if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir()?.join(p) })
}

async fn run_dev(args: DevArgs, embedded: bool, stop: StopSignal) -> anyhow::Result<ExitCode> {
    let DevArgs { mut coord, worker: mut options, demo_target, worker_in_process, http_steps, .. } = args;
    coord.demo_target = demo_target;
    // Only a worker of this process's own coordinator calls it directly.
    let in_process = worker_in_process && options.coordinator_urls.is_empty();
    let slots = http_steps.slots.unwrap_or(HttpSteps::DEV_DEFAULT);
    let executor = HttpExecutor::config(slots, options.egress.clone(), coord.max_value())?;
    // The worker's metrics are its listener's from the start: a scrape of
    // the coordinator before the worker has bound it must not show them.
    if options.listen.is_some() {
        composer_metrics::worker_serves_its_own();
    }
    let worker_config = |url: String| {
        if options.coordinator_urls.is_empty() {
            options.coordinator_urls.push(url);
        }
        composer_worker::Config {
            // With only an API token, the task API takes that token.
            worker_token: coord.worker_token.clone().or_else(|| coord.api_token.clone()),
            namespace: None,
            max_payload: coord.max_value(),
            options,
        }
        .validated()
    };
    let coordinator = composer_coord::start(coord.clone()).await?;
    let url = format!("http://{}", coordinator.addr);
    let worker_cfg = match worker_config(url.clone()) {
        Ok(c) => c,
        Err(e) => {
            coordinator.stop().await;
            return Err(e.into());
        }
    };
    let executor = HttpExecutor::start(executor, &coordinator);
    let shutdown = CancellationToken::new();
    let mut worker = composer_worker::Worker::new(worker_cfg);
    if in_process {
        worker = worker.in_process(coordinator.in_process());
    }
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    eprintln!(
        "composer dev is ready: API {url}{}  (ctrl-c to stop)",
        if embedded { " on embedded PostgreSQL and Redis" } else { "" }
    );
    stop.received().await;
    shutdown.cancel();
    if let Ok(Err(e)) = worker.await {
        tracing::error!(error = %e, "worker failed");
    }
    executor.stop().await;
    coordinator.stop().await;
    Ok(ExitCode::SUCCESS)
}
