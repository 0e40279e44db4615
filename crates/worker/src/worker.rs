//! [`Worker`]: registered handlers plus the runtime that feeds them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::Error;
use crate::http;
use crate::runtime::{self, Stats};
use crate::task::{Handler, Registration, TaskContext, TaskError};
use composer_api::in_process::InProcessApi;

/// A worker: registered handlers plus the runtime that feeds them.
pub struct Worker {
    config: Config,
    handlers: HashMap<String, Registration>,
    local: Option<Arc<dyn InProcessApi>>,
}

impl Worker {
    /// A worker with the built-in HTTP executor registered.
    pub fn new(config: Config) -> Worker {
        let mut w = Worker { config, handlers: HashMap::new(), local: None };
        // A malformed list fails `run` (validation) before any task runs.
        let policy = w.config.egress().unwrap_or_default();
        let http = http::Http::new(policy, w.config.max_payload, w.config.options.egress.http_max_timeout);
        w.handle(http::NODE_TYPE, move |ctx, input| http.clone().execute(ctx, input));
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

    /// Talks to the coordinator in this process through `api`, instead of
    /// over HTTP to the configured URLs.
    pub fn in_process(mut self, api: Arc<dyn InProcessApi>) -> Worker {
        self.local = Some(api);
        self
    }

    /// A coordinator's own HTTP executor: the built-in HTTP node with
    /// `slots` at once, reading no secret (`config`'s egress rules and
    /// payload limit apply), through `api` (`Running::http_executor`) —
    /// which hands it only HTTP calls that read none. Its id names it as
    /// the coordinator's in a step's lease.
    pub fn coordinators_http(mut config: Config, api: Arc<dyn InProcessApi>, slots: usize) -> Worker {
        let o = &mut config.options;
        o.id = format!("coordinator-{}", o.id);
        o.queues = vec![composer_core::definition::default_queue(http::NODE_TYPE)];
        o.concurrency = slots;
        // Its polls are handed work only while they wait: four, each for a
        // quarter of the slots, so that while one is answered (and until
        // it waits again) the others still wait.
        o.pollers = 4;
        o.poll_max = (slots / 4).max(1);
        o.urgent_slots = 0;
        o.eager = true;
        o.listen = None;
        o.secrets = crate::secrets::Source::Nothing;
        Worker::new(config).in_process(api)
    }

    pub fn id(&self) -> &str {
        &self.config.options.id
    }

    /// Runs until `shutdown`, then stops reading, lets in-flight tasks finish
    /// (up to the lease TTL) and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        runtime::run(self.config, self.handlers, self.local, shutdown, Stats::default()).await
    }

    /// Like [`Worker::run`], counting what happens in `stats` (for tests and
    /// benchmarks).
    pub async fn run_with_stats(self, shutdown: CancellationToken, stats: Stats) -> Result<(), Error> {
        runtime::run(self.config, self.handlers, self.local, shutdown, stats).await
    }
}
