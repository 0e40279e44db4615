//! What the bench drives: a Composer URL and the database behind it, by
//! default an embedded one started here, and the sink its HTTP steps call.

use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// What the bench drives: a Composer URL and the database behind it.
pub(super) struct Target {
    pub(super) url: String,
    pub(super) database_url: Option<String>,
    pub(super) _embedded: Option<Embedded>,
    /// Processes on this machine whose CPU per step is measured, by what
    /// they are (this one, the driver, is always one of them).
    pub(super) processes: Vec<(&'static str, u32)>,
}

/// The embedded default: PostgreSQL (fsync on), Redis, a coordinator and a
/// worker in this process, all stopped on drop.
pub(super) struct Embedded {
    pub(super) coordinator: Option<composer_coord::Running>,
    pub(super) worker: CancellationToken,
    pub(super) _pg: LocalPostgres,
    pub(super) _redis: LocalRedis,
    pub(super) dir: std::path::PathBuf,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.worker.cancel();
        if let Some(c) = self.coordinator.take() {
            c.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The payload limit of the embedded coordinator under `--map`: a MAP's
/// output holds every item's (10,000 HTTP outputs are about 1.5 MB).
pub(super) const MAP_BENCH_MAX_PAYLOAD: usize = 16 * 1024 * 1024;

pub(super) async fn start_embedded(concurrency: usize, max_payload: Option<usize>) -> anyhow::Result<Target> {
    let dir = composer_embedded::temp_dir("bench")?;
    let pg_dir = dir.join("pg");
    let redis_dir = dir.join("redis");
    let (pg, redis) = tokio::task::spawn_blocking(move || {
        let pg = LocalPostgres::start(PgOptions { data_dir: pg_dir, port: None, fsync: true, max_connections: 200 })?;
        let redis = LocalRedis::start(&redis_dir, None)?;
        Ok::<_, composer_embedded::Error>((pg, redis))
    })
    .await??;
    composer_store::ensure_database(&pg.url("postgres"), "composer").await?;
    let database_url = pg.url("composer");
    let mut cfg = composer_coord::Config::new(database_url.clone(), redis.url());
    cfg.listen = "127.0.0.1:0".parse()?;
    cfg.db_pool_size = 32;
    if let Some(max) = max_payload {
        cfg.max_payload = max;
    }
    if let Some(n) = std::env::var("COMPOSER_ENGINE_WORKERS").ok().and_then(|v| v.parse().ok()) {
        cfg.engine_workers = n;
    }
    // What keeping the tables' statistics costs: 0 turns it off.
    if let Some(n) = std::env::var("COMPOSER_ANALYZE_MIN_ROWS").ok().and_then(|v| v.parse().ok()) {
        cfg.analyze_min_rows = n;
    }
    if let Some(d) =
        std::env::var("COMPOSER_ANALYZE_INTERVAL").ok().and_then(|v| composer_core::duration::parse(&v).ok())
    {
        cfg.analyze_interval = d;
    }
    // As `composer dev` does: values over the threshold go to a directory
    // beside the data (COMPOSER_OFFLOAD_URL= , empty, keeps them all in rows).
    cfg.offload_url = match std::env::var("COMPOSER_OFFLOAD_URL") {
        Ok(url) => Some(url).filter(|u| !u.trim().is_empty()),
        Err(_) => Some(dir.join("objects").display().to_string()),
    };
    // What tracing costs: the bench's coordinator sends its spans where a coordinator would.
    cfg.otlp_endpoint = std::env::var("COMPOSER_OTLP_ENDPOINT").ok().filter(|v| !v.is_empty());
    let coordinator_max_payload = cfg.max_payload;
    let coordinator = composer_coord::start(cfg).await?;
    let url = format!("http://{}", coordinator.addr);
    let mut wcfg = composer_worker::Config::new(vec![url.clone()]);
    wcfg.options.concurrency = concurrency.max(1);
    let worker = CancellationToken::new();
    // As `composer dev` runs its worker: calling the coordinator directly
    // unless COMPOSER_WORKER_IN_PROCESS=false.
    let mut w = composer_worker::Worker::new(wcfg);
    if std::env::var("COMPOSER_WORKER_IN_PROCESS").map_or(true, |v| v.trim() != "false") {
        w = w.in_process(coordinator.in_process());
    }
    tokio::spawn(w.run(worker.clone()));
    // And, as `composer dev` and a coordinator do, the coordinator's own
    // HTTP executor, unless COMPOSER_COORDINATOR_HTTP_SLOTS=0.
    let slots = std::env::var("COMPOSER_COORDINATOR_HTTP_SLOTS").ok().and_then(|v| v.trim().parse().ok());
    let slots: usize = slots.unwrap_or(256).min(composer_worker::MAX_WORKER_SLOTS);
    if slots > 0 {
        let mut config = composer_worker::Config::new(vec![url.clone()]);
        config.max_payload = coordinator_max_payload;
        let executor = composer_worker::Worker::coordinators_http(config, coordinator.http_executor(), slots);
        tokio::spawn(executor.run(worker.clone()));
    }
    let embedded = Embedded { coordinator: Some(coordinator), worker, _pg: pg, _redis: redis, dir };
    let processes = vec![("this process (driver, coordinator, worker)", std::process::id())];
    Ok(Target { url, database_url: Some(database_url), _embedded: Some(embedded), processes })
}

/// The fastest HTTP endpoint we can offer: 200 `{}`; `/pad/N` answers
/// `{"pad": "xx…"}` of N bytes (at most 64 KiB).
pub(super) async fn start_sink() -> anyhow::Result<String> {
    let pad = |axum::extract::Path(n): axum::extract::Path<usize>| async move {
        axum::Json(json!({"pad": "x".repeat(n.min(65536))}))
    };
    let app =
        axum::Router::new().route("/pad/{n}", axum::routing::post(pad)).fallback(|| async { axum::Json(json!({})) });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}
