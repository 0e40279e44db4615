//! The worker runtime, and the SDK a user's own program uses to run custom
//! node types:
//!
//! ```no_run
//! # async fn demo() -> Result<(), composer_worker::Error> {
//! use composer_worker::{Config, Worker, TaskError};
//! let mut worker = Worker::new(Config::new("postgres://…", "redis://…", vec!["http://127.0.0.1:8080".into()]));
//! worker.handle("resize-image", |_ctx, input| async move {
//!     let width = input["width"].as_u64().ok_or_else(|| TaskError::fatal("width is required"))?;
//!     Ok(serde_json::json!({"resized_to": width / 2}))
//! });
//! worker.run(tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```
//!
//! Each message goes: lease (PostgreSQL) → execute while renewing the lease
//! every ttl/3 → report to a coordinator (failing over between them) → XACK.
//! A lost lease cancels the execution and discards its result; a report that
//! cannot be delivered leaves the message unacknowledged for redelivery.

mod http;
mod report;
mod runtime;
pub mod secrets;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use runtime::Stats;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error(transparent)]
    Stream(#[from] composer_stream::Error),
    #[error("invalid worker configuration: {0}")]
    Config(String),
}

/// How a worker connects and behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lease owner and consumer name; unique per worker process.
    pub id: String,
    pub database_url: String,
    pub redis_url: String,
    pub redis_prefix: String,
    pub coordinator_urls: Vec<String>,
    pub worker_token: Option<String>,
    /// Queues to read; by default the queues of the registered node types.
    pub queues: Option<Vec<String>>,
    /// Tasks executed at once.
    pub concurrency: usize,
    pub lease_ttl: Duration,
    /// How long one XREADGROUP blocks when there is nothing to do.
    pub block: Duration,
    pub db_pool_size: usize,
    /// Largest HTTP response body an HTTP node accepts.
    pub max_payload: usize,
    /// How long a report is retried across coordinators before the message
    /// is left for redelivery.
    pub report_deadline: Duration,
    /// A message delivered more often than this is reported FAILED ("max
    /// deliveries exceeded") instead of being run again.
    pub max_deliveries: u64,
    /// How often stalled messages (idle longer than the lease TTL) are reclaimed.
    pub reclaim_interval: Duration,
}

impl Config {
    pub fn new(database_url: impl Into<String>, redis_url: impl Into<String>, coordinator_urls: Vec<String>) -> Config {
        Config {
            id: default_worker_id(),
            database_url: database_url.into(),
            redis_url: redis_url.into(),
            redis_prefix: "composer:".into(),
            coordinator_urls,
            worker_token: None,
            queues: None,
            concurrency: 32,
            lease_ttl: Duration::from_secs(30),
            block: Duration::from_secs(2),
            db_pool_size: 8,
            max_payload: 1024 * 1024,
            report_deadline: Duration::from_secs(60),
            max_deliveries: 5,
            reclaim_interval: Duration::from_secs(10),
        }
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = host.trim();
    let short = Uuid::now_v7().simple().to_string();
    format!("{}-{}-{}", if host.is_empty() { "worker" } else { host }, std::process::id(), &short[short.len() - 6..])
}

/// What a handler knows about the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub task_id: Uuid,
    pub run_id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub attempt: i32,
    /// Cancelled when the lease is lost (taken over, or the run cancelled):
    /// a long handler should stop early; its result is discarded anyway.
    pub cancelled: CancellationToken,
}

/// A failed attempt. Retryable failures are retried by the node's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    pub message: String,
    pub retryable: bool,
}

impl TaskError {
    pub fn retryable(message: impl Into<String>) -> TaskError {
        TaskError { message: message.into(), retryable: true }
    }

    pub fn fatal(message: impl Into<String>) -> TaskError {
        TaskError { message: message.into(), retryable: false }
    }
}

type Handler = Arc<dyn Fn(TaskContext, Value) -> BoxFuture<'static, Result<Value, TaskError>> + Send + Sync>;

struct Registration {
    queue: String,
    handler: Handler,
}

/// A worker: registered handlers plus the runtime that feeds them.
pub struct Worker {
    config: Config,
    handlers: HashMap<String, Registration>,
}

impl Worker {
    /// A worker with the built-in HTTP executor registered.
    pub fn new(config: Config) -> Worker {
        let mut w = Worker { config, handlers: HashMap::new() };
        let client = http::client();
        let max = w.config.max_payload;
        w.handle("HTTP", move |ctx, input| http::execute(client.clone(), ctx, input, max));
        w
    }

    /// Registers `handler` for nodes of `node_type`, read from the default
    /// queue of that type (its name in lower case).
    pub fn handle<F, Fut>(&mut self, node_type: &str, handler: F) -> &mut Worker
    where
        F: Fn(TaskContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, TaskError>> + Send + 'static,
    {
        let queue = node_type.to_ascii_lowercase();
        self.handle_on_queue(node_type, &queue, handler)
    }

    /// Registers `handler` for nodes of `node_type` that name `queue`.
    pub fn handle_on_queue<F, Fut>(&mut self, node_type: &str, queue: &str, handler: F) -> &mut Worker
    where
        F: Fn(TaskContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, TaskError>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |ctx, input| Box::pin(handler(ctx, input)));
        self.handlers.insert(node_type.to_string(), Registration { queue: queue.to_string(), handler });
        self
    }

    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// Runs until `shutdown`, then stops reading, lets in-flight tasks finish
    /// (up to the lease TTL) and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        runtime::run(self, shutdown, Stats::default()).await
    }

    /// Like [`Worker::run`], counting what happens in `stats` (for tests and
    /// benchmarks).
    pub async fn run_with_stats(self, shutdown: CancellationToken, stats: Stats) -> Result<(), Error> {
        runtime::run(self, shutdown, stats).await
    }
}
