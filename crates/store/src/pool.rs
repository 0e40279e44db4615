//! Connections: the pool every role uses, a connection of our own, and
//! the session settings our statements are planned for.

use std::time::Duration;

use deadpool_postgres::{Object as Client, Pool};

use crate::error::{Error, Result};
use crate::tls;

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
    connect_in(url, None, max_size, timeout)
}

/// [`connect`], with every session's `search_path` set to `schema` alone
/// when there is one (a namespace's schema, [`crate::namespaces`]): its
/// statements, unqualified, then reach that schema's tables and no other's.
pub fn connect_in(url: &str, schema: Option<&str>, max_size: usize, timeout: Duration) -> Result<Pool> {
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
    if let Some(schema) = schema {
        // A schema name we made ([`crate::namespaces::schema_name`]): letters,
        // digits and underscores, nothing to quote or escape.
        options = format!("{options} -c search_path={schema}");
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

/// How the server this pool reaches replicates its commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// Standbys streaming from it now.
    pub standbys: i64,
    /// Whether a commit waits for a standby (`synchronous_standby_names`
    /// set and `synchronous_commit` on, `remote_write` or `remote_apply`).
    pub synchronous: bool,
}

impl Replication {
    /// Whether a failover to a standby can lose acknowledged commits.
    pub fn can_lose_commits(&self) -> bool {
        self.standbys > 0 && !self.synchronous
    }
}

/// Reads how the server replicates (`pg_stat_replication` and the settings).
pub async fn replication(pool: &Pool) -> Result<Replication> {
    let client = client(pool).await?;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_stat_replication),
                    current_setting('synchronous_standby_names') <> ''
                    AND current_setting('synchronous_commit') NOT IN ('off', 'local')",
            &[],
        )
        .await?;
    Ok(Replication { standbys: row.get(0), synchronous: row.get(1) })
}
