//! Command-line flags, each with its `COMPOSER_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "composer", version, about = "Composer: a distributed workflow engine on PostgreSQL and Redis")]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Coordinator and worker in one process; starts its own PostgreSQL and
    /// Redis when no URLs are configured.
    Dev(DevArgs),
    /// The coordinator: REST API, engine, outbox and background loops.
    Coordinator(CoordinatorArgs),
    /// A worker running the built-in node types (HTTP).
    Worker(WorkerArgs),
    /// Applies database migrations and exits.
    Migrate(DatabaseArgs),
    /// Register and read workflow definitions.
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// Start, inspect and control runs.
    #[command(subcommand)]
    Run(RunCommand),
    /// Send external events to WAIT_FOR_EVENT steps.
    #[command(subcommand)]
    Event(EventCommand),
    /// Measures latency and throughput of K-step workflows against a built-in
    /// HTTP sink (on embedded services unless --target-url is given).
    Bench(BenchArgs),
}

#[derive(Args)]
pub struct BenchArgs {
    /// Sequential HTTP steps per workflow.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Workflows run one after another for the latency figures.
    #[arg(long, default_value_t = 200)]
    pub latency_runs: usize,
    /// Warm-up workflows before measuring.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Workflows in the throughput phase.
    #[arg(long, default_value_t = 2000)]
    pub runs: usize,
    /// Workflows in flight during the throughput phase.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Print one JSON line instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Also run pgbench's equivalent of one task's minimal writes on the same server.
    #[arg(long)]
    pub baseline: bool,
    /// Fill the tables with this many finished runs (3 tasks each) first, to
    /// show what history costs.
    #[arg(long, default_value_t = 0)]
    pub history: u64,
    /// Also measure the timer loop with this many pending WAITs (1,000 of
    /// them come due over 20 s, the rest in an hour).
    #[arg(long, default_value_t = 0)]
    pub timers: u64,
    /// Drive the Composer at this URL instead of starting an embedded one.
    #[arg(long)]
    pub target_url: Option<String>,
    /// Its database, for commits per step and the baseline.
    #[arg(long, env = "COMPOSER_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

#[derive(Args)]
pub struct LogArgs {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long = "log", global = true, env = "COMPOSER_LOG", default_value = "info")]
    pub level: String,
    /// `text` or `json`.
    #[arg(long = "log-format", global = true, env = "COMPOSER_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    pub format: String,
}

#[derive(Args, Clone)]
pub struct ClientArgs {
    /// The coordinator the client commands talk to.
    #[arg(long = "url", global = true, env = "COMPOSER_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token for `/v1` (client commands and the coordinator).
    #[arg(long, global = true, env = "COMPOSER_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
}

/// The `COMPOSER_*` variable behind the flag a parse error is about: every
/// flag `--some-name` reads `COMPOSER_SOME_NAME`.
pub fn env_var_of_error(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    let long = arg.strip_prefix("--")?.split([' ', '=']).next()?;
    Some(format!("COMPOSER_{}", long.to_ascii_uppercase().replace('-', "_")))
}

/// Parses a duration like `500ms`, `30s`, `10m`.
fn duration(s: &str) -> Result<Duration, String> {
    composer_core::duration::parse(s)
}

/// Treats an empty value the same as an unset one.
pub fn non_empty(v: &Option<String>) -> Option<String> {
    v.as_ref().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

#[derive(Args, Clone)]
pub struct DatabaseArgs {
    /// PostgreSQL URL. Unset or empty under `dev`: an embedded server is started.
    #[arg(long, env = "COMPOSER_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

#[derive(Args, Clone)]
pub struct RedisArgs {
    /// Redis URL. Unset or empty under `dev`: an embedded server is started.
    #[arg(long, env = "COMPOSER_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Prefix of every Redis key Composer uses.
    #[arg(long, env = "COMPOSER_REDIS_PREFIX", default_value = "composer:")]
    pub redis_prefix: String,
}

#[derive(Args, Clone)]
pub struct CoordinatorOptions {
    /// Address the API listens on (port 0 picks a free one).
    #[arg(long, env = "COMPOSER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Write the bound API URL to this file once listening (for scripts and tests).
    #[arg(long, env = "COMPOSER_ADDR_FILE")]
    pub addr_file: Option<PathBuf>,
    /// Shards per queue stream.
    #[arg(long, env = "COMPOSER_STREAM_SHARDS", default_value_t = 4)]
    pub stream_shards: u32,
    /// Bearer token workers must present on `/internal`.
    #[arg(long, env = "COMPOSER_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,
    /// Allow listening beyond loopback without tokens.
    #[arg(long, env = "COMPOSER_ALLOW_NO_AUTH", default_value_t = false)]
    pub allow_no_auth: bool,
    /// Outbox poll interval (the fallback to LISTEN/NOTIFY).
    #[arg(long, env = "COMPOSER_OUTBOX_POLL_INTERVAL", default_value = "1s", value_parser = duration)]
    pub outbox_poll_interval: Duration,
    /// How long a claimed outbox row waits before it is published again.
    #[arg(long, env = "COMPOSER_OUTBOX_CLAIM_TIMEOUT", default_value = "2m", value_parser = duration)]
    pub outbox_claim_timeout: Duration,
    /// How often due timers are fired.
    #[arg(long, env = "COMPOSER_TIMER_INTERVAL", default_value = "1s", value_parser = duration)]
    pub timer_interval: Duration,
    /// How often the recovery sweeps (expired leases, lost dispatches) run.
    #[arg(long, env = "COMPOSER_RECOVERY_INTERVAL", default_value = "30s", value_parser = duration)]
    pub recovery_interval: Duration,
    /// A PENDING task without an outbox row for this long is dispatched again.
    #[arg(long, env = "COMPOSER_LOST_DISPATCH_AGE", default_value = "10m", value_parser = duration)]
    pub lost_dispatch_age: Duration,
    /// How often partitions are created ahead and expired.
    #[arg(long, env = "COMPOSER_PARTITION_INTERVAL", default_value = "6h", value_parser = duration)]
    pub partition_interval: Duration,
    /// Drop whole months of runs older than this many days (0 keeps everything).
    #[arg(long, env = "COMPOSER_RETENTION_DAYS", default_value_t = 0)]
    pub retention_days: u32,
    /// How often the metrics gauges are sampled.
    #[arg(long, env = "COMPOSER_METRICS_INTERVAL", default_value = "15s", value_parser = duration)]
    pub metrics_interval: Duration,
    /// Monthly partitions kept ready ahead.
    #[arg(long, env = "COMPOSER_PARTITION_MONTHS_AHEAD", default_value_t = 3)]
    pub partition_months_ahead: i32,
    /// Largest run input, step output or event payload, in bytes.
    #[arg(long, env = "COMPOSER_MAX_PAYLOAD", default_value_t = 1024 * 1024)]
    pub max_payload: usize,
    /// How long an event nobody waits for yet is kept for a waiter.
    #[arg(long, env = "COMPOSER_EVENT_RETENTION", default_value = "24h", value_parser = duration)]
    pub event_retention: Duration,
    /// Transactions applying batches of events at once, per coordinator.
    #[arg(long, env = "COMPOSER_ENGINE_WORKERS", default_value_t = 2)]
    pub engine_workers: usize,
    /// PostgreSQL connections per coordinator.
    #[arg(long, env = "COMPOSER_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: usize,
}

#[derive(Args, Clone)]
pub struct WorkerOptions {
    /// Coordinators to report to, comma-separated; reports fail over between them.
    #[arg(long, env = "COMPOSER_COORDINATOR_URLS", value_delimiter = ',')]
    pub coordinator_urls: Vec<String>,
    /// Unique worker id (lease owner); default: host-pid-random.
    #[arg(long, env = "COMPOSER_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Tasks executed at once.
    #[arg(long, env = "COMPOSER_WORKER_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
    /// Lease length; renewed every third of it.
    #[arg(long, env = "COMPOSER_LEASE_TTL", default_value = "30s", value_parser = duration)]
    pub lease_ttl: Duration,
    /// A message delivered more often than this is reported failed.
    #[arg(long, env = "COMPOSER_MAX_DELIVERIES", default_value_t = 5)]
    pub max_deliveries: u64,
    /// How often stalled stream messages are reclaimed.
    #[arg(long, env = "COMPOSER_RECLAIM_INTERVAL", default_value = "10s", value_parser = duration)]
    pub reclaim_interval: Duration,
    /// Queues to read, comma-separated (default: those of the built-in types).
    #[arg(long, env = "COMPOSER_QUEUES", value_delimiter = ',')]
    pub queues: Vec<String>,
}

#[derive(Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub coord: CoordinatorOptions,
    #[command(flatten)]
    pub worker: WorkerOptions,
    /// Where the embedded PostgreSQL and Redis keep their files.
    #[arg(long, env = "COMPOSER_DATA_DIR", default_value = ".composer")]
    pub data_dir: PathBuf,
}

#[derive(Args)]
pub struct CoordinatorArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub coord: CoordinatorOptions,
}

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub worker: WorkerOptions,
    /// Bearer token for reports to `/internal`.
    #[arg(long, env = "COMPOSER_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,
    #[arg(long, env = "COMPOSER_MAX_PAYLOAD", default_value_t = 1024 * 1024)]
    pub max_payload: usize,
}

#[derive(Subcommand)]
pub enum WorkflowCommand {
    /// Registers a definition from a JSON or YAML file.
    Apply {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Lists workflows (latest version of each).
    List,
    /// Shows a workflow's latest definition and its versions.
    Get { name: String },
}

#[derive(Subcommand)]
pub enum RunCommand {
    /// Starts a run.
    Start {
        workflow: String,
        /// Run input as JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        /// Pin a definition version (default: latest).
        #[arg(long)]
        version: Option<i32>,
        /// Wait for the run to end; exit non-zero unless it SUCCEEDED.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long.
        #[arg(long, default_value = "10m", value_parser = duration)]
        timeout: Duration,
    },
    /// Shows a run with its tasks.
    Get { id: String },
    /// Lists runs, newest first.
    List {
        #[arg(long)]
        workflow: Option<String>,
        /// RUNNING, SUCCEEDED, FAILED or CANCELLED.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Shows a run's history.
    Events { id: String },
    /// Cancels a running run.
    Cancel { id: String },
    /// Retries a failed run's failed steps.
    Retry { id: String },
}

#[derive(Subcommand)]
pub enum EventCommand {
    /// Completes the steps waiting for (NAME, KEY) with the payload, or keeps
    /// the event for a waiter to come.
    Send {
        name: String,
        key: String,
        /// The event's payload as JSON.
        #[arg(long, default_value = "{}")]
        payload: String,
    },
}
