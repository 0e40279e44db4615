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
//! A worker needs only coordinator URLs and the worker token: it speaks the
//! task API, as workers in other languages do. Each task goes: poll (the
//! coordinator leases it) → execute while heartbeating the lease every
//! ttl/3 → complete or fail (failing over between coordinators), whose
//! answer may lease the run's next task to this worker (eager dispatch). A
//! lost lease cancels the execution and discards its result; a result that
//! cannot be delivered is left to the lease's expiry, after which the
//! attempt goes to the next poller.
//!
//! - [`Worker`] (`worker`): handlers, registered by node type; `task`: what a
//!   handler is given and answers; `runtime`: the poll → execute → report
//!   loop; `client`: the task API's calls, with failover; `http`:
//!   the built-in HTTP executor behind [`egress`]'s policy, following the
//!   redirects `redirect` allows; [`secrets`]: `${ .secrets.NAME }`
//!   resolved, bound to hosts and scrubbed, in every encoding [`scrub`]
//!   finds; `listen`: `/metrics` and `/healthz`; `config`: the settings;
//!   `error`: why it stops; [`workflow`]: workflows declared in code, their
//!   typed steps run by a worker.

mod client;
mod config;
pub mod egress;
mod error;
mod http;
mod listen;
mod redirect;
mod runtime;
pub mod scrub;
pub mod secrets;
mod task;
mod worker;
pub mod workflow;

pub use config::{Config, Egress, Options, MAX_WORKER_SLOTS};
pub use error::Error;
pub use runtime::Stats;
pub use task::{TaskContext, TaskError};
pub use worker::Worker;
