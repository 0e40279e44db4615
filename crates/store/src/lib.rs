//! PostgreSQL, the source of truth. SQL lives here, one module per table
//! family, each statement with a note on why it is safe to run from many
//! coordinators at once.
//!
//! - [`migrations`]: versioned schema changes, applied under an advisory lock.
//! - [`namespaces`]: the registry of namespaces, each but `default` a schema of its own.
//! - [`definitions`]: workflow definitions and their versions.
//! - [`keys`]: API keys, by the hash of their secret; [`audit`]: the
//!   append-only log of changes made through the API.
//! - [`bulk`]: bulk jobs and the runs they acted on.
//! - [`runs`]: runs and tasks — their rows, starts, concurrency queues, child
//!   runs, the engine's locked read, the API's reads (a room for each).
//! - [`transitions`]: the engine's set-based write of a batch of transitions.
//! - [`leases`]: the worker's lease on a task ([`leases::LeaseManager`]).
//! - [`logs`]: step logs, the lines a worker sends for an attempt.
//! - [`notifications`]: LISTEN/NOTIFY wake-ups.
//! - [`outbox`]: the transactional outbox between commits and Redis.
//! - [`timers`]: due WAITING tasks.
//! - [`deadlines`]: a definition's deadlines, armed, disarmed and fired.
//! - [`limits`]: limits on steps across runs: the engine's writes, the
//!   limiter's pass, what operators read and set.
//! - [`events`]: external events and their buffer.
//! - [`fixtures`]: data and measurements for `composer bench`.
//! - [`partitions`]: monthly partitions ahead and retention behind.
//! - [`quarantine`]: what an evaluation killed a coordinator on, never evaluated again.
//! - [`stats`]: counts of open work for the metrics gauges.
//! - [`recovery`]: the sweeps that re-dispatch orphaned tasks.
//! - [`schedules`]: cron schedules and the fires they made.
//! - [`sessions`]: logins to the web UI, by the hash of their id.
//! - [`triggers`]: which workflows listen to an event name, and the event log;
//!   [`replays`]: their triggers run again over recorded events; [`flows`]:
//!   what a trigger's debounce, batch, throttle or singleton holds per key.
//! - [`webhooks`]: webhooks (never their secret).
//! - [`updates`]: updates sent to runs, each answered once by its id.
//! - [`approvals`]: the inbox of waiting APPROVAL steps, and each person's vote.
//! - [`trees`]: what a run tree (a root and its child runs) has created, against its fan-out budget.
//! - [`tls`]: TLS to PostgreSQL as the URL's `sslmode` says.
//! - [`transaction`]: a transaction on a pooled connection ([`begin`]), and one
//!   whose `BEGIN` goes with its first read ([`begin_pipelined`]).
//! - [`pool`]: connection pools and connections; [`error`]: the one error type.

pub mod approvals;
pub mod audit;
pub mod bulk;
pub mod deadlines;
pub mod definitions;
pub mod error;
pub mod events;
pub mod fixtures;
pub mod flows;
pub mod keys;
pub mod leases;
pub mod limits;
pub mod logs;
pub mod migrations;
pub mod namespaces;
pub mod notifications;
pub mod outbox;
pub mod partitions;
pub mod pool;
pub mod quarantine;
pub mod recovery;
pub mod replays;
pub mod runs;
pub mod schedules;
pub mod sessions;
pub mod stats;
pub mod timers;
pub mod tls;
pub mod transaction;
pub mod transitions;
pub mod trees;
pub mod triggers;
pub mod updates;
pub mod webhooks;

pub use deadpool_postgres::{Object as Client, Pool};
pub use tokio_postgres;
pub use transaction::{begin, begin_pipelined, Transaction};

pub use error::{Error, Result};
pub use pool::{client, connect, connect_in, ensure_database, open, ping, replication, Replication, SESSION_SETTINGS};
