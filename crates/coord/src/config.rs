//! The coordinator's configuration: every flag, its `COMPOSER_*` variable and
//! its default, written once here and flattened into the `composer
//! coordinator` and `composer dev` commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use composer_config::{defaults, non_empty, ConfigError, DatabaseArgs, RedisArgs, DEFAULT_MAX_PAYLOAD};

/// The shortest token (API, worker or metrics) a coordinator accepts: a
/// short one can be guessed.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Everything a coordinator needs to run, with the documented defaults.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Address the API listens on (port 0 picks a free one).
    #[arg(long, env = "COMPOSER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Write the bound API URL to this file once listening (for scripts and tests).
    #[arg(long, env = "COMPOSER_ADDR_FILE")]
    pub addr_file: Option<PathBuf>,
    /// Bearer token callers must present on `/v1`.
    #[arg(long, env = "COMPOSER_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The name the API token's control actions are recorded under (cancel,
    /// retry, rerun, complete, …: the history's `actor`); without a token
    /// they are recorded as `anonymous`.
    #[arg(long, env = "COMPOSER_API_TOKEN_NAME", default_value = "api")]
    pub api_token_name: String,
    /// Bearer token workers must present on the task API (`/v1/tasks/...`).
    #[arg(long, env = "COMPOSER_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,
    /// Origins (scheme://host[:port]) whose web pages may call the API, comma-separated. A request with any
    /// other `Origin` header is refused; the coordinator's own origin is always allowed.
    #[arg(long, env = "COMPOSER_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Host names this coordinator answers to, comma-separated, each `name` (any port) or `name:port`. A
    /// request to `/v1`, `/ui`, `/metrics` or `/openapi.json` with another `Host` is refused (421),
    /// so a web page whose own name was made to point at this address (DNS rebinding) gets nothing.
    /// `localhost`, IP addresses (the listen address's among them) are always allowed; `*` allows any name.
    #[arg(long, env = "COMPOSER_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Signing in to the UI with OpenID Connect.
    #[command(flatten)]
    pub oidc: crate::oidc::OidcConfig,
    /// How long a login to the web UI lasts.
    #[arg(long, env = "COMPOSER_UI_SESSION_TTL", default_value = "12h", value_parser = composer_core::duration::parse)]
    pub ui_session_ttl: Duration,
    /// Bearer token `/metrics` takes; without it, the API token (when one is set).
    #[arg(long, env = "COMPOSER_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Allow listening beyond loopback without tokens.
    #[arg(long, env = "COMPOSER_ALLOW_NO_AUTH", default_value_t = false)]
    pub allow_no_auth: bool,
    /// Shards per queue stream.
    #[arg(long, env = "COMPOSER_STREAM_SHARDS", default_value_t = 4)]
    pub stream_shards: u32,
    /// PostgreSQL connections per coordinator.
    #[arg(long, env = "COMPOSER_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: usize,
    /// How long a request waits for a database connection before a 503.
    #[arg(long, env = "COMPOSER_DB_TIMEOUT", default_value = "5s", value_parser = composer_core::duration::parse)]
    pub db_timeout: Duration,
    /// Whether this coordinator publishes the outbox (an API-only replica may not).
    #[arg(skip = true)]
    pub run_outbox: bool,
    /// Whether `/demo` serves the examples' demo target (`composer dev` only).
    #[arg(skip = false)]
    pub demo_target: bool,
    /// Outbox poll interval (the fallback to LISTEN/NOTIFY).
    #[arg(long, env = "COMPOSER_OUTBOX_POLL_INTERVAL", default_value = "1s", value_parser = composer_core::duration::parse)]
    pub outbox_poll_interval: Duration,
    /// How long a claimed outbox row waits before it is published again.
    #[arg(long, env = "COMPOSER_OUTBOX_CLAIM_TIMEOUT", default_value = "2m", value_parser = composer_core::duration::parse)]
    pub outbox_claim_timeout: Duration,
    /// How long an outbox row waits for the coordinator that committed it to
    /// publish it before any enqueuer does (the net for a coordinator that
    /// dies between commit and publish).
    #[arg(long, env = "COMPOSER_OUTBOX_PUBLISH_GRACE", default_value = "5s", value_parser = composer_core::duration::parse)]
    pub outbox_publish_grace: Duration,
    #[arg(skip = 256)]
    pub outbox_batch: i64,
    /// How often due timers are fired.
    #[arg(long, env = "COMPOSER_TIMER_INTERVAL", default_value = "1s", value_parser = composer_core::duration::parse)]
    pub timer_interval: Duration,
    #[arg(skip = 512)]
    pub timer_batch: i64,
    /// How often the recovery sweeps (expired leases, lost dispatches) run.
    #[arg(long, env = "COMPOSER_RECOVERY_INTERVAL", default_value = "30s", value_parser = composer_core::duration::parse)]
    pub recovery_interval: Duration,
    /// The most this host's clock may differ from PostgreSQL's. The
    /// coordinator works on PostgreSQL's clock (the offset is measured at
    /// start and at every timer pass); past this it refuses to start, and a
    /// running one logs an error.
    #[arg(long, env = "COMPOSER_MAX_CLOCK_SKEW", default_value = "5s", value_parser = composer_core::duration::parse)]
    pub max_clock_skew: Duration,
    /// The coordinator's own directory on this machine, for what must
    /// outlive the process: the flight recorder, which names what each
    /// thread is evaluating, so that an evaluation that killed the
    /// coordinator is failed at its next start instead of killing it again.
    /// Created 0700 when missing; refused when another user owns it or
    /// others may write in it. Default: `$STATE_DIRECTORY` (systemd), else
    /// `$XDG_STATE_HOME/composer`, else `~/.local/state/composer` (none when
    /// the listen port is 0 and no directory is given).
    #[arg(long, env = "COMPOSER_STATE_DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// How long applying one event (every expression it evaluates) may take
    /// before the engine stops waiting and fails it as a fault.
    #[arg(long, env = "COMPOSER_EVAL_BACKSTOP", default_value = "30s", value_parser = composer_core::duration::parse)]
    pub eval_backstop: Duration,
    /// How long a stopping coordinator (SIGTERM) waits for its loops and
    /// transactions to finish before it aborts them.
    #[arg(long, env = "COMPOSER_SHUTDOWN_GRACE", default_value = "20s", value_parser = composer_core::duration::parse)]
    pub shutdown_grace: Duration,
    /// A PENDING task without an outbox row for this long is dispatched again
    /// (at once when Redis is found to have lost everything: see `loops`).
    #[arg(long, env = "COMPOSER_LOST_DISPATCH_AGE", default_value = "10m", value_parser = composer_core::duration::parse)]
    pub lost_dispatch_age: Duration,
    /// The lease a worker gets with a task (`/v1/tasks/poll`, or a result's
    /// `next`): without a heartbeat for this long, its task goes to the next
    /// poller.
    #[arg(long, env = "COMPOSER_LEASE_TTL", default_value = "30s", value_parser = composer_core::duration::parse)]
    pub lease_ttl: Duration,
    /// The longest a task-API poll waits for a task (a longer `wait` is cut to it).
    #[arg(long, env = "COMPOSER_TASK_POLL_MAX_WAIT", default_value = "60s", value_parser = composer_core::duration::parse)]
    pub task_poll_max_wait: Duration,
    /// Times recovery dispatches one attempt again (expired lease, lost message) before failing it.
    #[arg(long, env = "COMPOSER_MAX_DISPATCHES", default_value_t = 5)]
    pub max_dispatches: i32,
    /// How often partitions are created ahead and expired.
    #[arg(long, env = "COMPOSER_PARTITION_INTERVAL", default_value = "6h", value_parser = composer_core::duration::parse)]
    pub partition_interval: Duration,
    /// Monthly partitions kept ready ahead.
    #[arg(long, env = "COMPOSER_PARTITION_MONTHS_AHEAD", default_value_t = 3)]
    pub partition_months_ahead: i32,
    /// How often a coordinator looks whether the runs and tasks
    /// have doubled since they were last analyzed.
    #[arg(long, env = "COMPOSER_ANALYZE_INTERVAL", default_value = "500ms", value_parser = composer_core::duration::parse)]
    pub analyze_interval: Duration,
    /// Rows below which those tables are not analyzed (0: never, leaving
    /// them to a DBA's `ANALYZE`; autovacuum does not analyze a partitioned
    /// table, only its partitions).
    #[arg(long, env = "COMPOSER_ANALYZE_MIN_ROWS", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(0..))]
    pub analyze_min_rows: i64,
    /// Drop whole months of runs older than this many days (0 keeps everything).
    #[arg(long, env = "COMPOSER_RETENTION_DAYS", default_value_t = 0)]
    pub retention_days: u32,
    /// Where retention writes the runs of each month before it drops them
    /// (`s3://BUCKET/PREFIX`, `file:///DIR` or a directory; S3 credentials
    /// from the `AWS_*` variables), read back by `GET /v1/archive/runs/{id}`.
    /// Unset, expired months are dropped unwritten.
    #[arg(long, env = "COMPOSER_ARCHIVE_URL")]
    pub archive_url: Option<String>,
    /// The address people open the UI at (`https://composer.example.com`):
    /// the start of the link an approval's notification carries. Unset,
    /// the link is the page's path alone.
    #[arg(long, env = "COMPOSER_UI_URL")]
    pub ui_url: Option<String>,
    /// S3 settings of the archive and of offloaded values besides the
    /// environment's, by their `AWS_*` names (these win): for a program that
    /// embeds a coordinator.
    #[arg(skip)]
    pub archive_options: Vec<(String, String)>,
    /// This namespace's directory under the archive's location: `NAME-ID`
    /// for a namespace other than `default` (set per cell), so that a
    /// namespace made again under an old name never reads the old one's runs.
    #[arg(skip)]
    pub archive_dir: Option<String>,
    /// Where values larger than `COMPOSER_OFFLOAD_THRESHOLD` (a run's input
    /// or output, a step's input or output) are kept as objects, their rows
    /// holding a reference (`s3://BUCKET/PREFIX`, `file:///DIR` or a
    /// directory; S3 credentials from the `AWS_*` variables). Unset, every
    /// value stays in its row, up to `COMPOSER_MAX_PAYLOAD`.
    #[arg(long, env = "COMPOSER_OFFLOAD_URL")]
    pub offload_url: Option<String>,
    /// Bytes of JSON past which a value is offloaded.
    #[arg(long, env = "COMPOSER_OFFLOAD_THRESHOLD", default_value_t = 256 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub offload_threshold: u64,
    /// With `COMPOSER_OFFLOAD_URL`: the largest run input or output and step
    /// input or output, in bytes of JSON (a worker's report or a start may
    /// be this large; each is held in memory while it is applied). At most
    /// 1 GiB: what a reader of an object takes. An event's payload too,
    /// with `COMPOSER_OFFLOAD_EVENTS_AND_LOGS`.
    #[arg(long, env = "COMPOSER_MAX_OFFLOADED", default_value_t = 1 << 30, value_parser = clap::value_parser!(u64).range(1..=(1u64 << 30)))]
    pub max_offloaded: u64,
    /// With `COMPOSER_OFFLOAD_URL`: whether event payloads are offloaded
    /// too (and may be as large as a value), and step logs sealed into
    /// objects past the threshold. False on every coordinator while rolling
    /// from a version that offloaded neither: its coordinators would take
    /// an event's reference for its payload, and their sweep would delete
    /// the sealed logs. Readers read both either way.
    #[arg(long, env = "COMPOSER_OFFLOAD_EVENTS_AND_LOGS", default_value_t = true, action = clap::ArgAction::Set)]
    pub offload_events_and_logs: bool,
    /// An offloaded object this old that no row names (its coordinator died
    /// between writing it and committing) is deleted; longer than any
    /// transaction lives.
    #[arg(long, env = "COMPOSER_OFFLOAD_GRACE", default_value = "1h", value_parser = composer_core::duration::parse)]
    pub offload_grace: Duration,
    /// How often the metrics gauges are sampled.
    #[arg(long, env = "COMPOSER_METRICS_INTERVAL", default_value = "15s", value_parser = composer_core::duration::parse)]
    pub metrics_interval: Duration,
    /// Largest run input, step output or event payload, in bytes.
    #[arg(long, env = "COMPOSER_MAX_PAYLOAD", default_value_t = DEFAULT_MAX_PAYLOAD)]
    pub max_payload: usize,
    /// Most bytes of log lines one attempt of a step keeps
    /// (`POST /v1/tasks/{id}/logs`; each line counts its bytes and 64 for
    /// its row); past it lines are dropped, and the log says so.
    #[arg(long, env = "COMPOSER_TASK_LOG_MAX_BYTES", default_value_t = 256 * 1024)]
    pub task_log_max_bytes: usize,
    /// Most bytes of log lines one run keeps over all its steps and
    /// attempts (counted as `COMPOSER_TASK_LOG_MAX_BYTES` counts them).
    #[arg(long, env = "COMPOSER_RUN_LOG_MAX_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub run_log_max_bytes: usize,
    /// Most runs one run tree (a root run and every SUB_WORKFLOW child under
    /// it, at any depth) may hold; a child past it fails its SUB_WORKFLOW.
    #[arg(long, env = "COMPOSER_MAX_TREE_RUNS", default_value_t = 100_000, value_parser = clap::value_parser!(i64).range(1..))]
    pub max_tree_runs: i64,
    /// Most namespaces the cluster may have, `default` included: each costs
    /// every coordinator a cell (its loops, a Redis connection and up to
    /// `COMPOSER_DB_POOL_SIZE` connections to PostgreSQL).
    #[arg(long, env = "COMPOSER_MAX_NAMESPACES", default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub max_namespaces: i64,
    /// Most MAP items one run tree may create; a MAP past it fails.
    #[arg(long, env = "COMPOSER_MAX_TREE_ITEMS", default_value_t = 1_000_000, value_parser = clap::value_parser!(i64).range(1..))]
    pub max_tree_items: i64,
    /// A step's result loads every task of its run when the run's
    /// definition has at most this many nodes; past it (once this
    /// coordinator has loaded the run), only the run's open and failed tasks
    /// and those the state machine asks for (0: every run so).
    #[arg(long, env = "COMPOSER_WHOLE_RUN_NODES", default_value_t = 16, value_parser = clap::value_parser!(i32).range(0..))]
    pub whole_run_nodes: i32,
    /// How long an event nobody waits for yet is kept for a waiter.
    #[arg(long, env = "COMPOSER_EVENT_RETENTION", default_value = "24h", value_parser = composer_core::duration::parse)]
    pub event_retention: Duration,
    /// How long the event log keeps an event (1m to 3650d): an event sent again with its id within it
    /// is a duplicate, and a replay (`POST /v1/events/replay`) reaches events this recent.
    #[arg(long, env = "COMPOSER_EVENT_LOG_KEPT", default_value = "7d", value_parser = composer_core::duration::parse)]
    pub event_log_kept: Duration,
    /// Events and run starts waiting for the engine, at most; beyond it requests get a 503 with Retry-After.
    #[arg(long, env = "COMPOSER_ENGINE_QUEUE", default_value_t = 10_000)]
    pub engine_queue: usize,
    /// Transactions applying batches of events at once, per coordinator (besides one more that takes only work of priority 1 or 2).
    #[arg(long, env = "COMPOSER_ENGINE_WORKERS", default_value_t = 2)]
    pub engine_workers: usize,
    /// Base URL of an OTLP/HTTP receiver (an OpenTelemetry Collector, Jaeger, Tempo …) that runs' traces
    /// are sent to, as `OTEL_EXPORTER_OTLP_ENDPOINT` is read (spans go to `<url>/v1/traces`). No traces
    /// without it.
    #[arg(long, env = "COMPOSER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Headers sent with every export of traces, comma-separated `name=value` (a receiver's API key).
    #[arg(long, env = "COMPOSER_OTLP_HEADERS", hide_env_values = true, value_delimiter = ',')]
    pub otlp_headers: Vec<String>,
}

impl Config {
    /// Whether event payloads and step logs are offloaded.
    pub fn offloads_events_and_logs(&self) -> bool {
        self.offload_url.is_some() && self.offload_events_and_logs
    }

    /// The largest event payload: the largest value when events are
    /// offloaded, else `COMPOSER_MAX_PAYLOAD`.
    pub fn max_event(&self) -> usize {
        match self.offload_events_and_logs {
            true => self.max_value(),
            false => self.max_payload,
        }
    }

    /// The largest value a run or step may hold: `COMPOSER_MAX_OFFLOADED`
    /// with offloading, else `COMPOSER_MAX_PAYLOAD`.
    pub fn max_value(&self) -> usize {
        match self.offload_url {
            Some(_) => usize::try_from(self.max_offloaded).unwrap_or(usize::MAX).max(self.max_payload),
            None => self.max_payload,
        }
    }

    /// `COMPOSER_OTLP_HEADERS` as a map (checked by [`Config::validated`]).
    pub fn otlp_header_map(&self) -> std::collections::HashMap<String, String> {
        self.otlp_headers
            .iter()
            .filter_map(|h| h.split_once('='))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect()
    }

    /// The defaults, on the given services.
    pub fn new(database_url: impl Into<String>, redis_url: impl Into<String>) -> Config {
        let mut c: Config = defaults();
        c.database.url = database_url.into();
        c.redis.url = redis_url.into();
        c
    }

    /// Checks the configuration and normalizes it (a blank token is no
    /// token), or names the flag and variable of the first value that is
    /// unsafe or cannot work.
    pub fn validated(mut self) -> Result<Config, ConfigError> {
        self.database.required()?;
        self.redis.required()?;
        self.api_token = non_empty(&self.api_token);
        self.worker_token = non_empty(&self.worker_token);
        self.metrics_token = non_empty(&self.metrics_token);
        self.check_intervals()?;
        self.check_sizes()?;
        self.check_tokens()?;
        self.normalize_otlp()?;
        self.normalize_allowed_hosts()?;
        self.allowed_origins =
            self.allowed_origins.iter().map(|o| o.trim().trim_end_matches('/').to_string()).collect();
        self.allowed_origins.retain(|o| !o.is_empty());
        self.check_open_listen()?;
        Ok(self)
    }

    /// Every loop's interval, and the UI's session, is longer than zero.
    fn check_intervals(&self) -> Result<(), ConfigError> {
        for (flag, env, d) in [
            ("--outbox-poll-interval", "COMPOSER_OUTBOX_POLL_INTERVAL", self.outbox_poll_interval),
            ("--timer-interval", "COMPOSER_TIMER_INTERVAL", self.timer_interval),
            ("--recovery-interval", "COMPOSER_RECOVERY_INTERVAL", self.recovery_interval),
            ("--partition-interval", "COMPOSER_PARTITION_INTERVAL", self.partition_interval),
            ("--analyze-interval", "COMPOSER_ANALYZE_INTERVAL", self.analyze_interval),
            ("--metrics-interval", "COMPOSER_METRICS_INTERVAL", self.metrics_interval),
            ("--ui-session-ttl", "COMPOSER_UI_SESSION_TTL", self.ui_session_ttl),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(flag, env, "must be greater than zero"));
            }
        }
        Ok(())
    }

    /// Leases, partitions, shards, pools and queues are of a size that works.
    fn check_sizes(&self) -> Result<(), ConfigError> {
        let kept = Duration::from_secs(60)..=Duration::from_secs(3650 * 86_400);
        if !kept.contains(&self.event_log_kept) {
            return Err(ConfigError::new(
                "--event-log-kept",
                "COMPOSER_EVENT_LOG_KEPT",
                "must be between 1m and 3650d",
            ));
        }
        if self.lease_ttl < Duration::from_millis(300) {
            return Err(ConfigError::new("--lease-ttl", "COMPOSER_LEASE_TTL", "must be at least 300ms"));
        }
        if !(1..=120).contains(&self.partition_months_ahead) {
            return Err(ConfigError::new(
                "--partition-months-ahead",
                "COMPOSER_PARTITION_MONTHS_AHEAD",
                format!("must be between 1 and 120, got {}", self.partition_months_ahead),
            ));
        }
        if !(1..=1024).contains(&self.stream_shards) {
            return Err(ConfigError::new(
                "--stream-shards",
                "COMPOSER_STREAM_SHARDS",
                format!("must be between 1 and 1024, got {}", self.stream_shards),
            ));
        }
        if self.db_pool_size == 0 {
            return Err(ConfigError::new("--db-pool-size", "COMPOSER_DB_POOL_SIZE", "must be at least 1"));
        }
        if self.max_dispatches < 1 {
            return Err(ConfigError::new("--max-dispatches", "COMPOSER_MAX_DISPATCHES", "must be at least 1"));
        }
        if self.engine_queue == 0 {
            return Err(ConfigError::new("--engine-queue", "COMPOSER_ENGINE_QUEUE", "must be at least 1"));
        }
        // Below a second, rows the publisher deletes when the engine is idle
        // (once a second) would fall due first and go out twice.
        if self.outbox_publish_grace < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "--outbox-publish-grace",
                "COMPOSER_OUTBOX_PUBLISH_GRACE",
                format!("must be at least 1s, got {:?}", self.outbox_publish_grace),
            ));
        }
        if self.engine_workers == 0 {
            return Err(ConfigError::new("--engine-workers", "COMPOSER_ENGINE_WORKERS", "must be at least 1"));
        }
        Ok(())
    }

    /// The worker token is not the API token, no token is short enough to
    /// guess, and single sign-on has its client and roles.
    fn check_tokens(&self) -> Result<(), ConfigError> {
        if let Err(e) = self.oidc.check() {
            return Err(ConfigError::new("--oidc-issuer", "COMPOSER_OIDC_ISSUER", e));
        }
        if self.api_token.is_some() && self.api_token == self.worker_token {
            return Err(ConfigError::new(
                "--worker-token",
                "COMPOSER_WORKER_TOKEN",
                "must differ from the API token: a worker must not be able to call the API, nor a user report results",
            ));
        }
        for (flag, env, token) in [
            ("--api-token", "COMPOSER_API_TOKEN", &self.api_token),
            ("--worker-token", "COMPOSER_WORKER_TOKEN", &self.worker_token),
            ("--metrics-token", "COMPOSER_METRICS_TOKEN", &self.metrics_token),
        ] {
            let len = token.as_deref().map_or(MIN_TOKEN_CHARS, |t| t.chars().count());
            if len < MIN_TOKEN_CHARS {
                return Err(ConfigError::new(
                    flag,
                    env,
                    format!(
                        "must be at least {MIN_TOKEN_CHARS} characters (MIN_TOKEN_CHARS), got {len}: \
                         make one with `openssl rand -hex 32`"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The OTLP endpoint (without a trailing `/`) is a web URL, and each
    /// OTLP header (blank ones dropped) is a valid `name=value`.
    fn normalize_otlp(&mut self) -> Result<(), ConfigError> {
        self.otlp_endpoint = non_empty(&self.otlp_endpoint).map(|u| u.trim_end_matches('/').to_string());
        if let Some(url) = self.otlp_endpoint.as_deref().filter(|url| !is_otlp_url(url)) {
            return Err(ConfigError::new(
                "--otlp-endpoint",
                "COMPOSER_OTLP_ENDPOINT",
                format!(
                    "{:?} is not an http:// or https:// URL with a host and without credentials, a query \
                     or a fragment (such as http://127.0.0.1:4318)",
                    without_credentials(url)
                ),
            ));
        }
        self.otlp_headers.retain(|h| !h.trim().is_empty());
        for (i, h) in self.otlp_headers.iter().enumerate() {
            let pair = h.split_once('=').map(|(n, v)| (n.trim(), v.trim()));
            let fine = pair.is_some_and(|(n, v)| {
                axum::http::HeaderName::try_from(n).is_ok() && axum::http::HeaderValue::try_from(v).is_ok()
            });
            if !fine {
                // The value may be a key: the error names the header's place, never its text.
                return Err(ConfigError::new(
                    "--otlp-headers",
                    "COMPOSER_OTLP_HEADERS",
                    format!("header {} is not name=value with a valid HTTP header name and value", i + 1),
                ));
            }
        }
        Ok(())
    }

    /// The allowed hosts, trimmed and lower-cased, are each `*` or a host
    /// name with an optional port.
    fn normalize_allowed_hosts(&mut self) -> Result<(), ConfigError> {
        self.allowed_hosts = self.allowed_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect();
        self.allowed_hosts.retain(|h| !h.is_empty());
        for host in &self.allowed_hosts {
            let plain = host == "*" || host.parse::<axum::http::uri::Authority>().is_ok_and(|a| a.as_str() == host);
            if !plain || host.contains('@') {
                return Err(ConfigError::new(
                    "--allowed-hosts",
                    "COMPOSER_ALLOWED_HOSTS",
                    format!("{host:?} is not a host name with an optional port (such as composer.example:8080)"),
                ));
            }
        }
        Ok(())
    }

    /// Listening beyond loopback takes both tokens, unless running without
    /// authentication is asked for.
    fn check_open_listen(&self) -> Result<(), ConfigError> {
        let open = !self.listen.ip().is_loopback();
        let no_tokens = self.api_token.is_none() || self.worker_token.is_none();
        if open && no_tokens && !self.allow_no_auth {
            return Err(ConfigError::new(
                "--api-token",
                "COMPOSER_API_TOKEN",
                format!(
                    "and --worker-token (COMPOSER_WORKER_TOKEN) must both be set to listen on {}; \
                     or pass --allow-no-auth (COMPOSER_ALLOW_NO_AUTH=true) to run unauthenticated",
                    self.listen
                ),
            ));
        }
        Ok(())
    }
}

/// Whether `url` can be an OTLP endpoint: http or https, with a host (and a
/// port above 0 if any), without credentials, a query or a fragment.
fn is_otlp_url(url: &str) -> bool {
    let uri = url.parse::<axum::http::Uri>().ok();
    uri.as_ref().is_some_and(|u| {
        matches!(u.scheme_str(), Some("http" | "https"))
            && u.query().is_none()
            && !url.contains('#')
            && u.authority().is_some_and(|a| {
                let port = if a.as_str().ends_with(']') { None } else { a.as_str().rsplit_once(':') };
                let port_ok = port.is_none_or(|(_, p)| p.parse::<u16>().is_ok_and(|p| p > 0));
                !a.as_str().contains('@') && !a.host().is_empty() && port_ok
            })
    })
}

/// `url` as an error may show it: credentials in it are not repeated.
fn without_credentials(url: &str) -> String {
    match url.split_once("://").and_then(|(scheme, rest)| Some((scheme, rest.split_once('@')?.1))) {
        Some((scheme, rest)) => format!("{scheme}://***@{rest}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = Config::new("postgres://db", "redis://r");
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(c.redis.prefix, "composer:");
        assert_eq!(c.stream_shards, 4);
        assert_eq!(c.recovery_interval, Duration::from_secs(30));
        assert_eq!(c.max_clock_skew, Duration::from_secs(5));
        assert_eq!(c.lost_dispatch_age, Duration::from_secs(600));
        assert_eq!(c.max_payload, 1024 * 1024);
        assert_eq!((c.task_log_max_bytes, c.run_log_max_bytes), (256 * 1024, 64 * 1024 * 1024));
        assert_eq!((c.max_tree_runs, c.max_tree_items), (100_000, 1_000_000));
        assert_eq!(c.max_namespaces, 100);
        assert_eq!(c.whole_run_nodes, 16);
        assert_eq!((c.analyze_interval, c.analyze_min_rows), (Duration::from_millis(500), 1000));
        assert_eq!(c.shutdown_grace, Duration::from_secs(20));
        assert!(c.run_outbox);
        assert_eq!(c.outbox_batch, 256);
        assert_eq!(c.outbox_publish_grace, Duration::from_secs(5));
        assert!(c.api_token.is_none());
        assert_eq!(c.ui_session_ttl, Duration::from_secs(12 * 3600));
        assert!(c.allowed_hosts.is_empty() && c.metrics_token.is_none());
    }

    #[test]
    fn an_otlp_endpoint_must_be_a_web_url_and_its_headers_never_show_their_values() {
        let mut c = Config::new("postgres://db", "redis://r");
        assert!(c.otlp_endpoint.is_none() && c.otlp_headers.is_empty());
        c.otlp_endpoint = Some("http://127.0.0.1:4318/".into());
        c.otlp_headers = vec!["x-api-key = s3cr3t".into(), " ".into()];
        let ok = c.clone().validated().unwrap();
        assert_eq!(ok.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        assert_eq!(ok.otlp_header_map().get("x-api-key").map(String::as_str), Some("s3cr3t"));
        for bad in [
            "127.0.0.1:4318",
            "ftp://collector",
            "http://user:pw@collector:4318",
            "http://",
            "http://h/otlp?api_key=k",
            "http://h/#frag",
            "http://h:99999",
            "http://h:0",
        ] {
            c.otlp_endpoint = Some(bad.into());
            let e = c.clone().validated().unwrap_err().to_string();
            assert!(e.contains("COMPOSER_OTLP_ENDPOINT"), "{bad}: {e}");
            assert!(!e.contains("pw@"), "credentials are not repeated: {e}");
        }
        for good in ["http://collector.example:4318/otlp", "http://[::1]:4318", "http://[::1]"] {
            c.otlp_endpoint = Some(good.into());
            assert!(c.clone().validated().is_ok(), "{good}");
        }
        c.otlp_endpoint = Some("https://collector.example".into());
        c.otlp_headers = vec!["x-api-key: s3cr3t\n".into()];
        let e = c.clone().validated().unwrap_err().to_string();
        assert!(e.contains("COMPOSER_OTLP_HEADERS") && e.contains("header 1") && !e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn an_open_listener_without_tokens_is_refused_naming_the_flags() {
        let mut c = Config::new("postgres://db", "redis://r");
        c.listen = SocketAddr::from(([0, 0, 0, 0], 8080));
        c.api_token = Some("a".repeat(MIN_TOKEN_CHARS));
        let e = c.clone().validated().unwrap_err();
        assert!(e.to_string().contains("--worker-token (COMPOSER_WORKER_TOKEN)"), "{e}");
        c.worker_token = Some("w".repeat(MIN_TOKEN_CHARS));
        assert!(c.validated().is_ok());
    }

    #[test]
    fn a_blank_token_is_no_token() {
        let mut c = Config::new("postgres://db", "redis://r");
        c.api_token = Some("  ".into());
        assert_eq!(c.validated().unwrap().api_token, None);
    }

    #[test]
    fn a_publish_grace_under_a_second_names_the_flag() {
        let mut c = Config::new("postgres://db", "redis://r");
        c.outbox_publish_grace = Duration::from_millis(500);
        let e = c.clone().validated().unwrap_err();
        assert_eq!((e.flag, e.env), ("--outbox-publish-grace", "COMPOSER_OUTBOX_PUBLISH_GRACE"));
        c.outbox_publish_grace = Duration::from_secs(1);
        assert!(c.validated().is_ok());
    }

    #[test]
    fn a_token_shorter_than_sixteen_characters_is_refused_naming_it() {
        for (flag, set) in [
            ("--api-token", (|c: &mut Config| c.api_token = Some("short-token".into())) as fn(&mut Config)),
            ("--worker-token", |c| c.worker_token = Some("short-token".into())),
            ("--metrics-token", |c| c.metrics_token = Some("short-token".into())),
        ] {
            let mut c = Config::new("postgres://db", "redis://r");
            set(&mut c);
            let e = c.validated().unwrap_err();
            assert_eq!(e.flag, flag);
            assert!(e.to_string().contains("at least 16 characters"), "{e}");
        }
        let mut c = Config::new("postgres://db", "redis://r");
        c.api_token = Some("x".repeat(MIN_TOKEN_CHARS));
        assert!(c.validated().is_ok());
    }

    #[test]
    fn allowed_hosts_are_host_names_with_an_optional_port() {
        let mut c = Config::new("postgres://db", "redis://r");
        c.allowed_hosts = vec![" Composer.Example:8080".into(), "ops.example".into(), "*".into(), "".into()];
        assert_eq!(c.clone().validated().unwrap().allowed_hosts, ["composer.example:8080", "ops.example", "*"]);
        for bad in ["http://composer.example", "composer.example/ui", "user@composer.example"] {
            c.allowed_hosts = vec![bad.into()];
            let e = c.clone().validated().unwrap_err();
            assert_eq!(e.env, "COMPOSER_ALLOWED_HOSTS", "{bad}");
        }
    }

    #[test]
    fn zero_shards_names_the_flag() {
        let mut c = Config::new("postgres://db", "redis://r");
        c.stream_shards = 0;
        let e = c.validated().unwrap_err();
        assert_eq!((e.flag, e.env), ("--stream-shards", "COMPOSER_STREAM_SHARDS"));
    }

    #[test]
    fn analyze_settings_name_their_flags() {
        let mut c = Config::new("postgres://db", "redis://r");
        c.analyze_interval = Duration::ZERO;
        let e = c.validated().unwrap_err();
        assert_eq!((e.flag, e.env), ("--analyze-interval", "COMPOSER_ANALYZE_INTERVAL"));
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            config: Config,
        }
        let refused = <Cli as clap::Parser>::try_parse_from(["composer", "--analyze-min-rows=-1"]).unwrap_err();
        let refused = refused.to_string();
        assert!(refused.contains("--analyze-min-rows"), "{refused}");
    }

    #[test]
    fn events_and_logs_are_offloaded_with_values_unless_told_not_to() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            config: Config,
        }
        let parse = |args: &[&str]| <Cli as clap::Parser>::try_parse_from(args).unwrap().config;
        let on = parse(&["composer", "--offload-url", "/tmp/objects", "--max-payload", "100"]);
        assert!(on.offloads_events_and_logs());
        assert_eq!(on.max_event(), 1 << 30);
        let off = parse(&[
            "composer",
            "--offload-url",
            "/tmp/objects",
            "--max-payload",
            "100",
            "--offload-events-and-logs",
            "false",
        ]);
        assert!(!off.offloads_events_and_logs());
        assert_eq!((off.max_event(), off.max_value()), (100, 1 << 30));
        let none = parse(&["composer", "--max-payload", "100"]);
        assert!(!none.offloads_events_and_logs());
        assert_eq!(none.max_event(), 100);
    }
}
