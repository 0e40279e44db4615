//! The coordinator: the public REST API, workers' result reports, the engine
//! that applies events under a run lock, the outbox enqueuer and the
//! background loops. Replicas share nothing but PostgreSQL and Redis; every
//! loop is safe to run on all of them at once.
//!
//! - [`engine`]: `handle(run_id, event)` — one transaction per event.
//! - [`publish`]: puts a commit's dispatches on their streams right after it.
//! - [`outbox`]: publishes the outbox rows nobody published after commit.
//! - [`listener`]: LISTEN/NOTIFY wake-ups for the outbox and run waiters.
//! - [`loops`]: timers (and the other periodic work); [`clock`]: the time
//!   they and the engine read, PostgreSQL's.
//! - [`limits`]: the limiter, which lets steps held by their limits go.
//! - [`bulk`]: bulk jobs at work, a batch at a time.
//! - [`access`]: who a request's token or API key names, and its scopes;
//!   [`oidc`]: signing in to the UI with the company's identity provider.
//! - [`http`]: the HTTP interface: the REST API, the task API, the UI.
//! - [`tasks`]: how the coordinator leases tasks for the task API's workers;
//!   [`in_process`]: that API for a worker in the coordinator's process.
//! - [`definitions`]: the definitions starts name, read in batches and kept.
//! - [`schedules`]: the timer loop's pass that fires schedules, and backfill.
//! - [`triggers`]: events recorded once, starting the runs their triggers start;
//!   [`replay`]: their triggers run again over recorded events, a batch at a time;
//!   `flows`: a trigger's debounce, batch, throttle and singleton at work.
//! - [`webhooks`]: a webhook's spec, signature and transform (the pure part).
//! - [`metrics`]: every count and spawned task in the namespace of the work
//!   that made it.
//! - [`quotas`]: a namespace's quotas at work.
//! - [`archive`]: where runs are archived, and an archived run read back;
//!   [`archiving`]: expired months written there before retention drops them.
//! - [`payloads`]: values kept as objects (offloaded) read back for whoever
//!   runs or shows them; [`step_logs`]: step logs sealed into objects past
//!   the threshold, read back as one log.
//! - [`trace`]: OpenTelemetry traces of runs: the spans a commit ends, and their export.
//! - [`shared`]: what one coordinator's parts share; [`coordinator`]: its
//!   start (in order) and stop; `cell`: the part of it that serves one
//!   namespace, and [`cells`]: a cell for each namespace.
//! - `ui`: the web UI at `/ui`.
//! - [`demo`]: the examples' demo target at `/demo`, for `composer dev`.
//! - [`Config`] (`config`): every setting, its flag, variable and default.

pub mod access;
pub mod archive;
pub mod archiving;
pub mod bulk;
mod cell;
pub mod cells;
pub mod clock;
mod config;
pub mod coordinator;
pub mod definitions;
pub mod demo;
pub mod engine;
mod flows;
pub mod http;
pub mod in_process;
pub mod limits;
pub mod listener;
pub mod loops;
pub mod metrics;
pub mod oidc;
pub mod outbox;
pub mod payloads;
pub mod publish;
pub mod quotas;
pub mod replay;
pub mod schedules;
pub mod shared;
pub mod step_logs;
pub mod tasks;
pub mod trace;
pub mod triggers;
mod ui;
pub mod webhooks;

pub use crate::config::Config;
pub use crate::coordinator::{start, Error, Running};
pub use crate::shared::Shared;
