//! The worker's configuration: every flag, its `COMPOSER_*` variable and its
//! default, written once here. `composer worker` takes all of it; `composer
//! dev` takes [`Options`] and shares the connection settings and the worker
//! token with its coordinator.

use std::time::Duration;

use composer_config::{defaults, non_empty, ConfigError, DatabaseArgs, RedisArgs, DEFAULT_MAX_PAYLOAD};
use uuid::Uuid;

/// How a worker connects and behaves.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Bearer token for reports to `/internal`.
    #[arg(long, env = "COMPOSER_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,
    /// Largest HTTP response body an HTTP node accepts, in bytes.
    #[arg(long, env = "COMPOSER_MAX_PAYLOAD", default_value_t = DEFAULT_MAX_PAYLOAD)]
    pub max_payload: usize,
    #[command(flatten)]
    pub options: Options,
}

/// What only a worker has (`composer dev` takes these beside its coordinator's).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Coordinators to report to, comma-separated; reports fail over between them.
    #[arg(long, env = "COMPOSER_COORDINATOR_URLS", value_delimiter = ',')]
    pub coordinator_urls: Vec<String>,
    /// Lease owner and consumer name; unique per worker process (default: host-pid-random).
    #[arg(long = "worker-id", env = "COMPOSER_WORKER_ID", default_value_t = default_worker_id(),
          hide_default_value = true)]
    pub id: String,
    /// Queues to read, comma-separated (default: those of the registered node types).
    #[arg(long, env = "COMPOSER_QUEUES", value_delimiter = ',')]
    pub queues: Vec<String>,
    /// Tasks executed at once.
    #[arg(long, env = "COMPOSER_WORKER_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
    /// Lease length; renewed every third of it.
    #[arg(long, env = "COMPOSER_LEASE_TTL", default_value = "30s", value_parser = composer_core::duration::parse)]
    pub lease_ttl: Duration,
    /// A message delivered more often than this is reported FAILED ("max
    /// deliveries exceeded") instead of being run again.
    #[arg(long, env = "COMPOSER_MAX_DELIVERIES", default_value_t = 5)]
    pub max_deliveries: u64,
    /// How often stalled messages (idle longer than the lease TTL) are reclaimed.
    #[arg(long, env = "COMPOSER_RECLAIM_INTERVAL", default_value = "10s", value_parser = composer_core::duration::parse)]
    pub reclaim_interval: Duration,
    /// Address ranges the HTTP node may never connect to (CIDRs, comma-separated), checked on the resolved
    /// address of every connection and redirect.
    #[arg(long, env = "COMPOSER_HTTP_DENY", value_delimiter = ',', default_value = crate::egress::DEFAULT_DENY)]
    pub http_deny: Vec<String>,
    /// When set, the only address ranges the HTTP node may connect to (CIDRs, comma-separated).
    #[arg(long, env = "COMPOSER_HTTP_ALLOW", value_delimiter = ',')]
    pub http_allow: Vec<String>,
    /// Longest request timeout an HTTP node may ask for.
    #[arg(long, env = "COMPOSER_HTTP_MAX_TIMEOUT", default_value = "5m", value_parser = composer_core::duration::parse)]
    pub http_max_timeout: Duration,
    /// Serve the worker's `/metrics` and `/healthz` on this address (off when unset).
    #[arg(id = "worker_listen", long = "worker-listen", value_name = "ADDR", env = "COMPOSER_WORKER_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// The bearer token `/metrics` takes when set (it names workflows and
    /// queues); `/healthz` stays open for a liveness probe.
    #[arg(
        id = "worker_metrics_token",
        long = "worker-metrics-token",
        env = "COMPOSER_METRICS_TOKEN",
        hide_env_values = true
    )]
    pub metrics_token: Option<String>,
    /// Offer, with each report, to run the next task it makes ready (eager
    /// dispatch): the coordinator leases it to this worker in the report's
    /// commit and answers with it, instead of sending it through a stream.
    /// Offered only while nothing read waits for a slot here, or when the
    /// report's priority is higher than that of everything read that waits.
    #[arg(long, env = "COMPOSER_WORKER_EAGER", default_value_t = true, action = clap::ArgAction::Set)]
    pub eager: bool,
    /// How long one XREADGROUP blocks when there is nothing to do.
    #[arg(skip = Duration::from_secs(2))]
    pub block: Duration,
    #[arg(skip = 8usize)]
    pub db_pool_size: usize,
    /// How long a report is retried across coordinators before the message
    /// is left for redelivery.
    #[arg(skip = Duration::from_secs(60))]
    pub report_deadline: Duration,
}

impl Config {
    /// The defaults, on the given services, reporting to `coordinator_urls`.
    pub fn new(database_url: impl Into<String>, redis_url: impl Into<String>, coordinator_urls: Vec<String>) -> Config {
        let mut c: Config = defaults();
        c.database.url = database_url.into();
        c.redis.url = redis_url.into();
        c.options.coordinator_urls = coordinator_urls;
        c
    }

    /// The configuration from `COMPOSER_*` variables alone (and defaults),
    /// for a program of one's own that runs custom node types.
    pub fn from_env() -> Result<Config, ConfigError> {
        #[derive(clap::Parser)]
        struct FromEnv {
            #[command(flatten)]
            config: Config,
        }
        use clap::Parser;
        let parsed = FromEnv::try_parse_from(["worker"]).map_err(|e| {
            let message = e.to_string();
            ConfigError::new("environment", "COMPOSER_*", message.trim().trim_start_matches("error: ").to_string())
        })?;
        parsed.config.validated()
    }

    /// Checks the configuration and normalizes it (blank values are unset),
    /// or names the flag and variable of the first value that cannot work.
    pub fn validated(mut self) -> Result<Config, ConfigError> {
        self.database.required()?;
        self.redis.required()?;
        self.worker_token = non_empty(&self.worker_token);
        let o = &mut self.options;
        o.coordinator_urls =
            o.coordinator_urls.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect();
        o.queues = o.queues.iter().map(|q| q.trim().to_string()).filter(|q| !q.is_empty()).collect();
        if o.coordinator_urls.is_empty() {
            return Err(ConfigError::new(
                "--coordinator-urls",
                "COMPOSER_COORDINATOR_URLS",
                "is empty: the worker needs at least one coordinator to report to",
            ));
        }
        if o.id.trim().is_empty() {
            return Err(ConfigError::new("--worker-id", "COMPOSER_WORKER_ID", "must not be blank"));
        }
        if o.concurrency == 0 {
            return Err(ConfigError::new("--concurrency", "COMPOSER_WORKER_CONCURRENCY", "must be at least 1"));
        }
        if o.lease_ttl < Duration::from_millis(300) {
            return Err(ConfigError::new("--lease-ttl", "COMPOSER_LEASE_TTL", "must be at least 300ms"));
        }
        if o.reclaim_interval.is_zero() {
            return Err(ConfigError::new(
                "--reclaim-interval",
                "COMPOSER_RECLAIM_INTERVAL",
                "must be greater than zero",
            ));
        }
        if o.max_deliveries == 0 {
            return Err(ConfigError::new("--max-deliveries", "COMPOSER_MAX_DELIVERIES", "must be at least 1"));
        }
        self.egress()?;
        if self.options.http_max_timeout.is_zero() {
            return Err(ConfigError::new(
                "--http-max-timeout",
                "COMPOSER_HTTP_MAX_TIMEOUT",
                "must be greater than zero",
            ));
        }
        Ok(self)
    }

    /// The HTTP node's egress policy, or which list is malformed.
    pub fn egress(&self) -> Result<crate::egress::Policy, ConfigError> {
        let deny = crate::egress::parse_list(&self.options.http_deny)
            .map_err(|e| ConfigError::new("--http-deny", "COMPOSER_HTTP_DENY", e))?;
        let allow = crate::egress::parse_list(&self.options.http_allow)
            .map_err(|e| ConfigError::new("--http-allow", "COMPOSER_HTTP_ALLOW", e))?;
        Ok(crate::egress::Policy { deny, allow })
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = host.trim();
    let short = Uuid::now_v7().simple().to_string();
    format!("{}-{}-{}", if host.is_empty() { "worker" } else { host }, std::process::id(), &short[short.len() - 6..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = Config::new("postgres://db", "redis://r", vec!["http://c".into()]);
        assert_eq!(c.options.concurrency, 32);
        assert_eq!(c.options.lease_ttl, Duration::from_secs(30));
        assert_eq!(c.options.max_deliveries, 5);
        assert_eq!(c.options.block, Duration::from_secs(2));
        assert_eq!(c.max_payload, 1024 * 1024);
        assert_eq!(c.redis.prefix, "composer:");
        assert!(!c.options.id.is_empty());
        assert!(c.validated().is_ok());
    }

    #[test]
    fn no_coordinator_names_the_flag() {
        let c = Config::new("postgres://db", "redis://r", vec![" ".into()]);
        let e = c.validated().unwrap_err();
        assert_eq!((e.flag, e.env), ("--coordinator-urls", "COMPOSER_COORDINATOR_URLS"));
    }

    #[test]
    fn zero_concurrency_names_the_variable() {
        let mut c = Config::new("postgres://db", "redis://r", vec!["http://c".into()]);
        c.options.concurrency = 0;
        assert_eq!(c.validated().unwrap_err().env, "COMPOSER_WORKER_CONCURRENCY");
    }
}
