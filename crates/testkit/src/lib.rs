//! The test harness. Services come from `COMPOSER_TEST_DATABASE_URL` and
//! `COMPOSER_TEST_REDIS_URL` when set; otherwise one throwaway PostgreSQL and
//! one redis-server per test process, started from the local binaries and
//! stopped at exit. Every test gets its own database and Redis key prefix, so
//! tests run in parallel without seeing each other.
//!
//! - [`services()`] / [`TestDb`] (`services`): where a test's data lives.
//! - [`FakeHttp`] (`fake_http`): an HTTP service that counts calls per path and can fail,
//!   be slow or flaky on demand.
//! - [`Collector`] (`collector`): a real OpenTelemetry collector, and the spans it received.
//! - [`S3Server`] (`s3`): an S3 protocol server (`s3s-fs`) checking signatures, for the archive.
//! - [`Engine`] (`engine`): coordinators and workers in-process, with API helpers and
//!   [`Engine::wait_for_run`].
//! - [`eventually()`] (`eventually`): waiting for what a test expects, with a deadline and
//!   a message naming what did not happen, instead of a fixed sleep.
//! - [`history`]: the history checker: what clients, targets and the database
//!   recorded in a fault scenario, checked against the properties Composer promises.
//! - [`schema`]: the definition schema walked field by field, and the smallest
//!   definition holding a value at a field.

// Test support: a harness that cannot start panics, as a test would.
#![allow(clippy::unwrap_used)]

mod collector;
mod engine;
mod eventually;
mod fake_http;
pub mod history;
mod s3;
pub mod schema;
mod services;

pub use collector::{Collector, ReceivedSpan};
pub use engine::{http_node, Engine, EngineOptions, WorkerHandle};
pub use eventually::{eventually, eventually_blocking, poll_until, Probe};
pub use fake_http::{FakeHttp, Recorded};
pub use s3::S3Server;
pub use services::{replace_db, services, unique_prefix, Services, TestDb};
