//! `composer bench`'s flags: the workload, its phases and what to compare.
use clap::Args;

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
    /// Instead of K-step workflows: one run of a MAP of this many HTTP items
    /// to the sink; reports items per second and commits per item.
    #[arg(long)]
    pub map: Option<usize>,
    /// The MAP's max_concurrency (default: every item at once).
    #[arg(long)]
    pub map_concurrency: Option<u32>,
    /// Each MAP item's answer carries this many bytes besides (`{"pad": "…"}`,
    /// at most 64 KiB): what `collect: all` gathers grows with it.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub map_item_bytes: u32,
    /// The MAP's collect: all (every item's output) or none (their counts).
    #[arg(long, value_parser = ["all", "none"], default_value = "all")]
    pub collect: String,
    /// Steps of a custom type served by this many task-API pollers
    /// (`/v1/tasks/poll`, in this process over HTTP) instead of HTTP steps.
    #[arg(long)]
    pub task_api: Option<usize>,
    /// Drive the Composer at this URL instead of starting an embedded one.
    #[arg(long)]
    pub target_url: Option<String>,
    /// More `/metrics` to read the step's stages from (a worker's
    /// `--worker-listen` address, as http://host:port/metrics), beside the
    /// target's own.
    #[arg(long = "metrics-url")]
    pub metrics_urls: Vec<String>,
    /// A/B: run this other `composer` binary and this one alternately
    /// (--ab-rounds each) on one PostgreSQL and Redis, each as a separate
    /// coordinator and worker process on a fresh database, and print both
    /// sides' medians and their ratios.
    #[arg(long, value_name = "OTHER_BINARY", conflicts_with_all = ["target_url", "map", "task_api"])]
    pub ab: Option<std::path::PathBuf>,
    /// Runs of each side under --ab.
    #[arg(long, default_value_t = 3)]
    pub ab_rounds: usize,
    /// Its database, for commits per step and the baseline.
    #[arg(long, env = "COMPOSER_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Bearer token of the coordinator at --target-url.
    #[arg(long, env = "COMPOSER_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
}
