//! PostgreSQL, the source of truth. SQL lives here, one module per table
//! family, each statement with a note on why it is safe to run from many
//! coordinators at once.
//!
//! - [`migrations`]: versioned schema changes, applied under an advisory lock.
//! - [`definitions`]: workflow definitions and their versions.
//! - [`runs`]: runs and tasks — their rows, the engine's locked read, the API's reads.
//! - [`transitions`]: the engine's set-based write of a batch of transitions.
//! - [`leases`]: the worker's lease on a task ([`leases::LeaseManager`]).
//! - [`notifications`]: LISTEN/NOTIFY wake-ups.
//! - [`outbox`]: the transactional outbox between commits and Redis.
//! - [`timers`]: due WAITING tasks.
//! - [`events`]: external events and their buffer.
//! - [`fixtures`]: data and measurements for `composer bench`.
//! - [`partitions`]: monthly partitions ahead and retention behind.
//! - [`stats`]: counts of open work for the metrics gauges.
//! - [`recovery`]: the sweeps that re-dispatch orphaned tasks.

pub mod definitions;
pub mod events;
pub mod fixtures;
pub mod leases;
pub mod migrations;
pub mod notifications;
pub mod outbox;
pub mod partitions;
pub mod recovery;
pub mod runs;
pub mod schedules;
pub mod stats;
pub mod timers;
pub mod tls;
pub mod transitions;

use std::time::Duration;

pub use deadpool_postgres::{Object as Client, Pool, Transaction};
pub use tokio_postgres;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("database unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("invalid database URL: {0}")]
    Config(String),
    #[error("inconsistent data: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Closed(String),
}

impl Error {
    /// True when the database could not be reached (as opposed to a query
    /// that failed): callers answer 503 and retry later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Pool(_) => true,
            Error::Db(e) if e.is_closed() => true,
            Error::Db(e) => match e.code() {
                Some(c) => c.code().starts_with("08") || c.code().starts_with("57P"),
                // No SQLSTATE: the connection failed, or a value did not
                // convert (which is not the database being away).
                None => std::error::Error::source(e).is_none_or(|s| s.is::<std::io::Error>()),
            },
            _ => false,
        }
    }
}

impl Error {
    /// True when repeating the same work cannot succeed: data PostgreSQL
    /// refuses (class 22, e.g. a NUL in text), a constraint (23), a program
    /// limit (54), a stored value we cannot read back, or inconsistent data.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Corrupt(_) => true,
            Error::Db(e) if e.is_closed() => false,
            Error::Db(e) => match e.code() {
                Some(c) => ["22", "23", "54"].iter().any(|class| c.code().starts_with(class)),
                None => std::error::Error::source(e).is_some_and(|s| !s.is::<std::io::Error>()),
            },
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of every session we open (unless the URL's `options` sets
/// them): generic plans (see below), and time limits so that one stuck
/// statement or an abandoned transaction cannot hold run locks for good.
pub const SESSION_SETTINGS: [(&str, &str); 3] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("statement_timeout", "60s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// Opens a connection pool. Connecting is lazy; a pool whose database is down
/// fails each `get` after `timeout` instead of hanging.
pub fn connect(url: &str, max_size: usize, timeout: Duration) -> Result<Pool> {
    let tls::Target { config: mut pg, tls } = tls::parse(url)?;
    // Our statements are prepared once per connection and name a run: with
    // partitioned tables a custom plan is re-made on every execution, while a
    // generic plan prunes partitions at executor start for a fraction of it.
    let mut options = pg.get_options().unwrap_or_default().to_string();
    for (setting, value) in SESSION_SETTINGS {
        if !options.contains(setting) {
            options = format!("{options} -c {setting}={value}");
        }
    }
    pg.options(options.trim());
    let manager = deadpool_postgres::Manager::from_config(
        pg,
        tls,
        deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(max_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .map_err(|e| Error::Config(e.to_string()))
}

/// Checks out a client, or says why the database is unavailable.
pub async fn client(pool: &Pool) -> Result<Client> {
    Ok(pool.get().await?)
}

/// Answers whether the database takes queries (for readiness checks).
pub async fn ping(pool: &Pool) -> Result<()> {
    let client = client(pool).await?;
    client.simple_query("SELECT 1").await?;
    Ok(())
}

/// One connection of our own (outside a pool), TLS as the URL says, and the
/// task that drives it.
pub async fn open(url: &str) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
    let tls::Target { config, tls } = tls::parse(url)?;
    let (client, conn) = config.connect(tls).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((client, driver))
}

/// Creates database `name` on the server behind `admin_url` unless it exists
/// (for `composer dev` and the bench on their embedded server). The name is
/// quoted as an identifier.
pub async fn ensure_database(admin_url: &str, name: &str) -> Result<()> {
    let (client, driver) = open(admin_url).await?;
    let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?.is_some();
    if !exists {
        client.batch_execute(&format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""))).await?;
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}
