//! The server roles: `dev` (everything in one process, on embedded services
//! unless URLs are given), `coordinator`, `worker` and `migrate`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use tokio_util::sync::CancellationToken;

use crate::cli::{
    non_empty, CoordinatorArgs, CoordinatorOptions, DatabaseArgs, DevArgs, RedisArgs, WorkerArgs, WorkerOptions,
};

fn coordinator_config(
    database_url: String,
    redis_url: String,
    redis: &RedisArgs,
    o: &CoordinatorOptions,
    api_token: Option<String>,
) -> composer_coord::Config {
    let mut c = composer_coord::Config::new(database_url, redis_url);
    c.redis_prefix = redis.redis_prefix.clone();
    c.listen = o.listen;
    c.stream_shards = o.stream_shards;
    c.api_token = api_token;
    c.worker_token = non_empty(&o.worker_token);
    c.allow_no_auth = o.allow_no_auth;
    c.outbox_poll_interval = o.outbox_poll_interval;
    c.outbox_claim_timeout = o.outbox_claim_timeout;
    c.timer_interval = o.timer_interval;
    c.partition_months_ahead = o.partition_months_ahead;
    c.recovery_interval = o.recovery_interval;
    c.lost_dispatch_age = o.lost_dispatch_age;
    c.partition_interval = o.partition_interval;
    c.retention_days = o.retention_days;
    c.metrics_interval = o.metrics_interval;
    c.event_retention = o.event_retention;
    c.engine_workers = o.engine_workers;
    c.max_payload = o.max_payload;
    c.db_pool_size = o.db_pool_size;
    c
}

fn worker_config(
    database_url: String,
    redis_url: String,
    redis: &RedisArgs,
    o: &WorkerOptions,
    coordinator_urls: Vec<String>,
    worker_token: Option<String>,
    max_payload: usize,
) -> anyhow::Result<composer_worker::Config> {
    if coordinator_urls.is_empty() {
        bail!("COMPOSER_COORDINATOR_URLS is empty: the worker needs at least one coordinator to report to");
    }
    if o.concurrency == 0 {
        bail!("COMPOSER_WORKER_CONCURRENCY must be at least 1");
    }
    if o.lease_ttl.as_millis() < 300 {
        bail!("COMPOSER_LEASE_TTL must be at least 300ms");
    }
    if o.reclaim_interval.is_zero() {
        bail!("COMPOSER_RECLAIM_INTERVAL must be greater than zero");
    }
    if o.max_deliveries == 0 {
        bail!("COMPOSER_MAX_DELIVERIES must be at least 1");
    }
    let mut c = composer_worker::Config::new(database_url, redis_url, coordinator_urls);
    c.redis_prefix = redis.redis_prefix.clone();
    if let Some(id) = non_empty(&o.worker_id) {
        c.id = id;
    }
    c.concurrency = o.concurrency;
    c.lease_ttl = o.lease_ttl;
    c.max_deliveries = o.max_deliveries;
    c.reclaim_interval = o.reclaim_interval;
    c.worker_token = worker_token;
    c.max_payload = max_payload;
    if !o.queues.is_empty() {
        c.queues = Some(o.queues.clone());
    }
    Ok(c)
}

fn required(value: Option<String>, var: &str) -> anyhow::Result<String> {
    value.ok_or_else(|| anyhow::anyhow!("{var} is not set (use `composer dev` to run on embedded services)"))
}

/// Resolves on SIGTERM or ctrl-c.
async fn terminated() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; shutting down"),
    }
}

async fn write_addr_file(o: &CoordinatorOptions, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    if let Some(path) = &o.addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("http://{addr}")).context("writing COMPOSER_ADDR_FILE")?;
        std::fs::rename(&tmp, path).context("writing COMPOSER_ADDR_FILE")?;
    }
    Ok(())
}

pub async fn coordinator(args: CoordinatorArgs) -> anyhow::Result<ExitCode> {
    let db = required(non_empty(&args.db.database_url), "COMPOSER_DATABASE_URL")?;
    let redis = required(non_empty(&args.redis.redis_url), "COMPOSER_REDIS_URL")?;
    let api_token = non_empty(&std::env::var("COMPOSER_API_TOKEN").ok());
    let running = composer_coord::start(coordinator_config(db, redis, &args.redis, &args.coord, api_token)).await?;
    write_addr_file(&args.coord, running.addr).await?;
    tracing::info!(addr = %running.addr, "coordinator ready");
    terminated().await;
    running.stop().await;
    Ok(ExitCode::SUCCESS)
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let db = required(non_empty(&args.db.database_url), "COMPOSER_DATABASE_URL")?;
    let redis = required(non_empty(&args.redis.redis_url), "COMPOSER_REDIS_URL")?;
    let urls = args.worker.coordinator_urls.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect();
    let config =
        worker_config(db, redis, &args.redis, &args.worker, urls, non_empty(&args.worker_token), args.max_payload)?;
    let worker = composer_worker::Worker::new(config);
    let shutdown = CancellationToken::new();
    let mut run = tokio::spawn(worker.run(shutdown.clone()));
    let finished = tokio::select! {
        _ = terminated() => {
            shutdown.cancel();
            (&mut run).await
        }
        r = &mut run => r,
    };
    finished.context("worker task")??;
    Ok(ExitCode::SUCCESS)
}

pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<ExitCode> {
    let db = required(non_empty(&args.database_url), "COMPOSER_DATABASE_URL")?;
    let pool = composer_store::connect(&db, 1, std::time::Duration::from_secs(10)).context("COMPOSER_DATABASE_URL")?;
    let mut client = composer_store::client(&pool).await.context("cannot connect to PostgreSQL")?;
    let applied = composer_store::migrations::migrate(&mut client).await?;
    println!("applied {applied} migration(s)");
    Ok(ExitCode::SUCCESS)
}

/// `composer dev`: embedded services unless URLs are given, then a
/// coordinator and a worker in this process until SIGTERM or ctrl-c; the
/// services are stopped on the way out.
pub fn dev(runtime: &tokio::runtime::Runtime, args: DevArgs) -> anyhow::Result<ExitCode> {
    let mut pg = None;
    let mut redis_server = None;
    let database_url = match non_empty(&args.db.database_url) {
        Some(url) => url,
        None => {
            let dir = absolute(&args.data_dir)?.join("postgres");
            eprintln!("starting embedded PostgreSQL in {} …", dir.display());
            let server =
                LocalPostgres::start(PgOptions { data_dir: dir, port: None, fsync: true, max_connections: 100 })
                    .context("starting the embedded PostgreSQL (COMPOSER_DATA_DIR)")?;
            let url = server.url("composer");
            runtime.block_on(ensure_database(&server.url("postgres"), "composer"))?;
            pg = Some(server);
            url
        }
    };
    let redis_url = match non_empty(&args.redis.redis_url) {
        Some(url) => url,
        None => {
            let dir = absolute(&args.data_dir)?.join("redis");
            let server =
                LocalRedis::start(&dir, None).context("starting the embedded redis-server (COMPOSER_DATA_DIR)")?;
            let url = server.url();
            redis_server = Some(server);
            url
        }
    };
    let result = runtime.block_on(run_dev(&args, database_url, redis_url, pg.is_some()));
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

async fn ensure_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let (client, conn) =
        composer_store::tokio_postgres::connect(admin_url, composer_store::tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(conn);
    let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?.is_some();
    if !exists {
        client.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await?;
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

async fn run_dev(args: &DevArgs, database_url: String, redis_url: String, embedded: bool) -> anyhow::Result<ExitCode> {
    let api_token = non_empty(&std::env::var("COMPOSER_API_TOKEN").ok());
    let coord_cfg = coordinator_config(database_url.clone(), redis_url.clone(), &args.redis, &args.coord, api_token);
    let coordinator = composer_coord::start(coord_cfg).await?;
    write_addr_file(&args.coord, coordinator.addr).await?;
    let url = format!("http://{}", coordinator.addr);
    let mut urls: Vec<String> = args.worker.coordinator_urls.clone();
    if urls.is_empty() {
        urls.push(url.clone());
    }
    let worker_cfg = worker_config(
        database_url,
        redis_url,
        &args.redis,
        &args.worker,
        urls,
        non_empty(&args.coord.worker_token),
        args.coord.max_payload,
    )?;
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(composer_worker::Worker::new(worker_cfg).run(shutdown.clone()));
    eprintln!(
        "composer dev is ready: API {url}{}  (ctrl-c to stop)",
        if embedded { " on embedded PostgreSQL and Redis" } else { "" }
    );
    terminated().await;
    shutdown.cancel();
    if let Ok(Err(e)) = worker.await {
        tracing::error!(error = %e, "worker failed");
    }
    coordinator.stop().await;
    Ok(ExitCode::SUCCESS)
}
