//! The worker's configuration: every flag, its `COMPOSER_*` variable and its
//! default, written once here. `composer worker` takes all of it; `composer
//! dev` takes [`Options`] and shares the worker token with its coordinator.
//! A worker needs no database or Redis: it talks only to coordinators.

use std::time::Duration;

use composer_config::{defaults, non_empty, ConfigError, DEFAULT_MAX_PAYLOAD};
use uuid::Uuid;

/// Most slots a worker may have of each kind (`--concurrency`,
/// `--urgent-slots`): each is a task and its heartbeats in flight.
pub const MAX_WORKER_SLOTS: usize = 10_000;

/// How a worker connects and behaves.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    /// Bearer token for the coordinators' task API (`/v1/tasks/...`).
    #[arg(long, env = "COMPOSER_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,
    /// The namespace whose queues the worker works (`default` when left out).
    #[arg(long = "namespace", env = "COMPOSER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Largest HTTP response body an HTTP node accepts, in bytes.
    #[arg(long, env = "COMPOSER_MAX_PAYLOAD", default_value_t = DEFAULT_MAX_PAYLOAD)]
    pub max_payload: usize,
    #[command(flatten)]
    pub options: Options,
}

/// What only a worker has (`composer dev` takes these beside its coordinator's).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Coordinators to poll and report to, comma-separated; calls fail over between them.
    #[arg(long, env = "COMPOSER_COORDINATOR_URLS", value_delimiter = ',')]
    pub coordinator_urls: Vec<String>,
    /// Lease owner; unique per worker process (default: host-pid-random).
    #[arg(long = "worker-id", env = "COMPOSER_WORKER_ID", default_value_t = default_worker_id(),
          hide_default_value = true)]
    pub id: String,
    /// Queues to read, comma-separated (default: those of the registered node types).
    #[arg(long, env = "COMPOSER_QUEUES", value_delimiter = ',')]
    pub queues: Vec<String>,
    /// Tasks executed at once.
    #[arg(long, env = "COMPOSER_WORKER_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
    /// Slots besides `--concurrency` that run only steps of priority 1 or 2,
    /// polled for on their own: such a step never waits for a backlog's
    /// step to end and free a slot.
    #[arg(long, env = "COMPOSER_WORKER_URGENT_SLOTS", default_value_t = 0)]
    pub urgent_slots: usize,
    #[command(flatten)]
    pub egress: Egress,
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
    /// Ask, with each result, to run the next task it makes ready (eager
    /// dispatch): the coordinator leases it to this worker in the result's
    /// commit and answers with it, instead of sending it through a stream.
    /// Asked only while a slot is free here, or when the run is more urgent
    /// than every task the last poll saw waiting.
    #[arg(long, env = "COMPOSER_WORKER_EAGER", default_value_t = true, action = clap::ArgAction::Set)]
    pub eager: bool,
    /// Where `${ .secrets.NAME }` is read from: the environment, or (for a
    /// coordinator's own HTTP executor) nowhere.
    #[arg(skip = crate::secrets::Source::Environment)]
    pub secrets: crate::secrets::Source,
    /// Polls in flight at once: one waits for the coordinator while the
    /// other takes the slots that free meanwhile.
    #[arg(skip = 2_usize)]
    pub pollers: usize,
    /// Most tasks one poll asks for (at most the task API's 100).
    #[arg(skip = 100_usize)]
    pub poll_max: usize,
    /// How long one poll waits for a task when there is nothing to do.
    #[arg(skip = Duration::from_secs(2))]
    pub poll_wait: Duration,
    /// How long a result is retried across coordinators before it is given
    /// up (the lease expires and the attempt goes to the next poller).
    #[arg(skip = Duration::from_secs(60))]
    pub report_deadline: Duration,
}

impl Config {
    /// The defaults, polling `coordinator_urls`.
    pub fn new(coordinator_urls: Vec<String>) -> Config {
        let mut c: Config = defaults();
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
        self.worker_token = non_empty(&self.worker_token);
        self.namespace = non_empty(&self.namespace);
        let o = &mut self.options;
        o.coordinator_urls =
            o.coordinator_urls.iter().map(|u| u.trim().to_string()).filter(|u| !u.is_empty()).collect();
        o.queues = o.queues.iter().map(|q| q.trim().to_string()).filter(|q| !q.is_empty()).collect();
        if o.coordinator_urls.is_empty() {
            return Err(ConfigError::new(
                "--coordinator-urls",
                "COMPOSER_COORDINATOR_URLS",
                "is empty: the worker needs at least one coordinator to poll",
            ));
        }
        if let Some(bare) = o.coordinator_urls.iter().find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            return Err(ConfigError::new(
                "--coordinator-urls",
                "COMPOSER_COORDINATOR_URLS",
                format!("{bare:?} is not a URL: a coordinator's URL starts with http:// or https://"),
            ));
        }
        if o.id.trim().is_empty() {
            return Err(ConfigError::new("--worker-id", "COMPOSER_WORKER_ID", "must not be blank"));
        }
        if o.concurrency == 0 {
            return Err(ConfigError::new("--concurrency", "COMPOSER_WORKER_CONCURRENCY", "must be at least 1"));
        }
        for (flag, env, slots) in [
            ("--concurrency", "COMPOSER_WORKER_CONCURRENCY", o.concurrency),
            ("--urgent-slots", "COMPOSER_WORKER_URGENT_SLOTS", o.urgent_slots),
        ] {
            if slots > MAX_WORKER_SLOTS {
                return Err(ConfigError::new(flag, env, format!("{slots} is more than {MAX_WORKER_SLOTS} slots")));
            }
        }
        self.egress()?;
        if self.options.egress.http_max_timeout.is_zero() {
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
        self.options.egress.policy()
    }
}

/// Where the HTTP node may connect and how long it may wait: a worker's,
/// and a coordinator's that runs HTTP steps itself.
#[derive(clap::Args, Debug, Clone)]
pub struct Egress {
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
}

impl Egress {
    /// The connection rules, or the flag and variable of a list that does not parse.
    pub fn policy(&self) -> Result<crate::egress::Policy, ConfigError> {
        let deny = crate::egress::parse_list(&self.http_deny)
            .map_err(|e| ConfigError::new("--http-deny", "COMPOSER_HTTP_DENY", e))?;
        let allow = crate::egress::parse_list(&self.http_allow)
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
    fn a_coordinator_url_without_a_scheme_is_refused_naming_it() {
        let e = Config::new(vec!["http://a".into(), "127.0.0.1:8080".into()]).validated().unwrap_err();
        let said = e.to_string();
        assert!(said.contains("COMPOSER_COORDINATOR_URLS") && said.contains("\"127.0.0.1:8080\""), "{said}");
        assert!(Config::new(vec!["https://a".into()]).validated().is_ok());
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = Config::new(vec!["http://c".into()]);
        assert_eq!(c.options.concurrency, 32);
        assert_eq!(c.options.urgent_slots, 0);
        assert_eq!(c.options.poll_wait, Duration::from_secs(2));
        assert_eq!(c.max_payload, 1024 * 1024);
        assert!(!c.options.id.is_empty());
        assert!(c.validated().is_ok());
    }

    #[test]
    fn no_coordinator_names_the_flag() {
        let c = Config::new(vec![" ".into()]);
        let e = c.validated().unwrap_err();
        assert_eq!((e.flag, e.env), ("--coordinator-urls", "COMPOSER_COORDINATOR_URLS"));
    }

    #[test]
    fn zero_concurrency_names_the_variable() {
        let mut c = Config::new(vec!["http://c".into()]);
        c.options.concurrency = 0;
        assert_eq!(c.validated().unwrap_err().env, "COMPOSER_WORKER_CONCURRENCY");
    }

    #[test]
    fn slots_past_the_limit_name_their_variable() {
        let mut c = Config::new(vec!["http://c".into()]);
        c.options.urgent_slots = MAX_WORKER_SLOTS;
        c.options.concurrency = MAX_WORKER_SLOTS;
        assert!(c.clone().validated().is_ok());
        c.options.urgent_slots = usize::MAX;
        let e = c.clone().validated().unwrap_err();
        assert_eq!(e.env, "COMPOSER_WORKER_URGENT_SLOTS", "{e}");
        assert!(e.to_string().contains("more than 10000"), "{e}");
        c.options.urgent_slots = 0;
        c.options.concurrency = MAX_WORKER_SLOTS + 1;
        assert_eq!(c.validated().unwrap_err().env, "COMPOSER_WORKER_CONCURRENCY");
    }
}
