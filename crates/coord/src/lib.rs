//! The coordinator: the public REST API, workers' result reports, the engine
//! that applies events under a run lock, the outbox enqueuer and the
//! background loops. Replicas share nothing but PostgreSQL and Redis; every
//! loop is safe to run on all of them at once.
//!
//! - [`engine`]: `handle(run_id, event)` — one transaction per event.
//! - [`outbox`]: publishes committed dispatches to Redis Streams.
//! - [`listener`]: LISTEN/NOTIFY wake-ups for the outbox and run waiters.
//! - [`loops`]: timers (and the other periodic work).
//! - [`api`]: the HTTP interface.

pub mod api;
pub mod auth;
pub mod engine;
pub mod listener;
pub mod loops;
pub mod outbox;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use composer_store::runs::DispatchConfig;
use composer_stream::{Keys, Streams};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::listener::RunWatch;

/// Everything a coordinator needs to run. Defaults are the seed's values.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: String,
    pub redis_url: String,
    /// Prefix of every Redis key Composer uses.
    pub redis_prefix: String,
    pub listen: SocketAddr,
    pub stream_shards: u32,
    pub db_pool_size: usize,
    /// How long a request waits for a database connection before a 503.
    pub db_timeout: Duration,
    /// Whether this coordinator publishes the outbox (an API-only replica may not).
    pub run_outbox: bool,
    pub outbox_poll_interval: Duration,
    pub outbox_claim_timeout: Duration,
    pub outbox_batch: i64,
    pub timer_interval: Duration,
    pub timer_batch: i64,
    /// How often the recovery sweeps run.
    pub recovery_interval: Duration,
    /// How long a PENDING task may sit without an outbox row before its
    /// message is assumed lost and it is dispatched again.
    pub lost_dispatch_age: Duration,
    pub partition_interval: Duration,
    pub partition_months_ahead: i32,
    /// Whole months older than this many days are dropped; 0 keeps everything.
    pub retention_days: u32,
    pub metrics_interval: Duration,
    pub api_token: Option<String>,
    pub worker_token: Option<String>,
    pub allow_no_auth: bool,
    /// Largest accepted run input, report output or event payload, in bytes.
    pub max_payload: usize,
    /// How long an event with no waiter is kept for a waiter to come.
    pub event_retention: Duration,
    /// Transactions applying event batches at once.
    pub engine_workers: usize,
}

impl Config {
    pub fn new(database_url: impl Into<String>, redis_url: impl Into<String>) -> Config {
        Config {
            database_url: database_url.into(),
            redis_url: redis_url.into(),
            redis_prefix: "composer:".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            stream_shards: 4,
            db_pool_size: 16,
            db_timeout: Duration::from_secs(5),
            run_outbox: true,
            outbox_poll_interval: Duration::from_secs(1),
            outbox_claim_timeout: Duration::from_secs(120),
            outbox_batch: 256,
            timer_interval: Duration::from_secs(1),
            timer_batch: 512,
            recovery_interval: Duration::from_secs(30),
            lost_dispatch_age: Duration::from_secs(600),
            partition_interval: Duration::from_secs(6 * 3600),
            partition_months_ahead: 3,
            retention_days: 0,
            metrics_interval: Duration::from_secs(15),
            api_token: None,
            worker_token: None,
            allow_no_auth: false,
            max_payload: 1024 * 1024,
            event_retention: Duration::from_secs(24 * 3600),
            engine_workers: 2,
        }
    }

    /// Refuses configurations that would be unsafe or cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, d) in [
            ("COMPOSER_OUTBOX_POLL_INTERVAL", self.outbox_poll_interval),
            ("COMPOSER_TIMER_INTERVAL", self.timer_interval),
            ("COMPOSER_RECOVERY_INTERVAL", self.recovery_interval),
            ("COMPOSER_PARTITION_INTERVAL", self.partition_interval),
        ] {
            if d.is_zero() {
                anyhow::bail!("{name} must be greater than zero");
            }
        }
        if !(1..=120).contains(&self.partition_months_ahead) {
            anyhow::bail!(
                "COMPOSER_PARTITION_MONTHS_AHEAD must be between 1 and 120, got {}",
                self.partition_months_ahead
            );
        }
        if self.stream_shards == 0 || self.stream_shards > 1024 {
            anyhow::bail!("COMPOSER_STREAM_SHARDS must be between 1 and 1024, got {}", self.stream_shards);
        }
        let open = !self.listen.ip().is_loopback();
        let no_tokens = self.api_token.is_none() || self.worker_token.is_none();
        if open && no_tokens && !self.allow_no_auth {
            anyhow::bail!(
                "refusing to listen on {} without COMPOSER_API_TOKEN and COMPOSER_WORKER_TOKEN; \
                 set both, or COMPOSER_ALLOW_NO_AUTH=true to run unauthenticated",
                self.listen
            );
        }
        Ok(())
    }
}

/// Shared by the API, the engine and the loops of one coordinator.
pub struct Shared {
    pub config: Config,
    pub pool: composer_store::Pool,
    pub streams: Streams,
    pub engine: Arc<Engine>,
    pub outbox_wake: Arc<Notify>,
    pub runs: RunWatch,
}

/// A started coordinator. Dropping it does not stop it; call [`Running::stop`].
pub struct Running {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl Running {
    /// Stops serving and the loops, and waits for them to end.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Stops at once, without waiting: what a crash looks like to the others.
    pub fn abort(mut self) {
        self.tasks.abort_all();
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// Prepares storage and starts the coordinator, in the seed's order:
/// migrations and partitions (no run can be inserted without one), then the
/// shard count (workers need it), then one recovery pass (so whatever was
/// orphaned while the cluster was down goes out in the outbox's first batch),
/// then the outbox, the loops and the API.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    config.validate()?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (COMPOSER_LISTEN)", config.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, stream_shards = config.stream_shards, "starting coordinator");

    let pool = composer_store::connect(&config.database_url, config.db_pool_size, config.db_timeout)
        .context("COMPOSER_DATABASE_URL")?;
    {
        let mut client = composer_store::client(&pool).await.context("cannot connect to PostgreSQL")?;
        let applied = composer_store::migrations::migrate(&mut client).await.context("applying migrations")?;
        if applied > 0 {
            tracing::info!(applied, "applied migrations");
        }
        loops::maintain_partitions(&client, config.partition_months_ahead, config.retention_days).await?;
    }
    let streams = Streams::connect(&config.redis_url, Keys::new(config.redis_prefix.clone()))
        .await
        .context("cannot connect to Redis (COMPOSER_REDIS_URL)")?;
    streams.publish_shard_count(config.stream_shards).await.context("publishing the stream shard count")?;

    let outbox_wake = Arc::new(Notify::new());
    let dispatch = DispatchConfig { prefix: config.redis_prefix.clone(), shards: config.stream_shards as i64 };
    let engine = Engine::new(pool.clone(), dispatch, outbox_wake.clone(), !config.run_outbox);
    let shared =
        Arc::new(Shared { engine: Arc::new(engine), pool, streams, outbox_wake, runs: RunWatch::new(), config });
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..shared.config.engine_workers.max(1) {
        tasks.spawn(shared.engine.clone().run_batches(shutdown.clone()));
    }

    loops::recover_tasks(&shared).await;

    tasks.spawn(listener::run(shared.clone(), shutdown.clone()));
    if shared.config.run_outbox {
        tasks.spawn(outbox::run(shared.clone(), shutdown.clone()));
    }
    let c = &shared.config;
    tasks.spawn(loops::every(shutdown.clone(), c.recovery_interval, shared.clone(), |s| {
        Box::pin(async move {
            loops::recover_tasks(&s).await;
        })
    }));
    tasks.spawn(loops::every(shutdown.clone(), c.timer_interval, shared.clone(), |s| {
        Box::pin(async move {
            if let Err(e) = loops::fire_due_waits(&s).await {
                tracing::warn!(error = %e, "firing due timers failed");
            }
        })
    }));
    tasks.spawn(loops::every(shutdown.clone(), c.partition_interval, shared.clone(), |s| {
        Box::pin(async move {
            let result = async {
                let client = composer_store::client(&s.pool).await?;
                loops::maintain_partitions(&client, s.config.partition_months_ahead, s.config.retention_days).await
            };
            if let Err(e) = result.await {
                tracing::error!(error = %e, "partition maintenance failed");
            }
        })
    }));
    tasks.spawn(loops::every(shutdown.clone(), c.metrics_interval, shared.clone(), |s| {
        Box::pin(async move {
            if let Err(e) = loops::sample_metrics(&s).await {
                tracing::warn!(error = %e, "sampling metrics failed");
            }
        })
    }));
    let app = api::router(shared.clone());
    let serve_shutdown = shutdown.clone();
    tasks.spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(async move { serve_shutdown.cancelled().await });
        if let Err(e) = server.await {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok(Running { addr, shared, shutdown, tasks })
}
