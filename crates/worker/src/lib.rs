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
//!
//! - [`Worker`] (`worker`): handlers, registered by node type; `task`: what a
//!   handler is given and answers; `runtime`: the read → lease → execute →
//!   report loop; `report`: reports to coordinators with failover; `http`:
//!   the built-in HTTP executor behind [`egress`]'s policy, following the
//!   redirects `redirect` allows; [`secrets`]: `${ .secrets.NAME }`
//!   resolved, bound to hosts and scrubbed, in every encoding [`scrub`]
//!   finds; `listen`: `/metrics` and `/healthz`; `config`: the settings;
//!   `error`: why it stops.

mod config;
pub mod egress;
mod error;
mod http;
mod listen;
mod redirect;
mod report;
mod runtime;
pub mod scrub;
pub mod secrets;
mod task;
mod worker;

pub use config::{Config, Options};
pub use error::Error;
pub use runtime::Stats;
pub use task::{TaskContext, TaskError};
pub use worker::Worker;
