//! The worker runtime, and the SDK a user's own program uses to run custom
//! node types:
//!
//! ```no_run
//! # async fn demo() -> Result<(), composer_worker::Error> {
//! use composer_worker::{Config, Worker, TaskError};
//! let mut worker = Worker::new(Config::from_env()?);
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

mod config;
pub mod egress;
mod http;
mod listen;
mod report;
mod runtime;
pub mod secrets;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use config::{Config, Options};
pub use runtime::Stats;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error(transparent)]
    Stream(#[from] composer_stream::Error),
    #[error("invalid worker configuration: {0}")]
    Config(#[from] composer_config::ConfigError),
    #[error("cannot listen on {addr} (COMPOSER_WORKER_LISTEN): {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
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
        // A malformed list fails `run` (validation) before any task runs.
        let policy = w.config.egress().unwrap_or_default();
        let http = http::Http::new(policy, w.config.max_payload, w.config.options.http_max_timeout);
        w.handle("HTTP", move |ctx, input| http.clone().execute(ctx, input));
        w
    }

    /// Registers `handler` for nodes of `node_type`, read from the default
    /// queue of that type (its name in lower case).
    pub fn handle<F, Fut>(&mut self, node_type: &str, handler: F) -> &mut Worker
    where
        F: Fn(TaskContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, TaskError>> + Send + 'static,
    {
        let queue = composer_core::definition::default_queue(node_type);
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
        &self.config.options.id
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
