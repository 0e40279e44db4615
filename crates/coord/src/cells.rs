//! Namespaces as cells. A coordinator serves each namespace with a cell of
//! its own: a [`Shared`] whose connections reach that namespace's schema
//! alone (`search_path`), whose Redis keys have a prefix of their own, and
//! whose engine and loops work that namespace only. No query, index,
//! stream or loop is shared between namespaces, so none can mix them up:
//! the door (`http::door`) picks a request's cell, and everything past it
//! is the code a single-namespace coordinator runs. `default` is the cell
//! the coordinator started with, on the schema it always used.
//!
//! Every coordinator keeps a cell for each active namespace, looking at the
//! registry every [`LOOK_EVERY`] (and at once for a request naming one it
//! has not started): a namespace created on one coordinator is served by
//! all, and one being deleted stops being served by all, before its schema
//! is dropped [`DROP_AFTER`] later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use composer_store::namespaces::{self, NamespaceRow, DEFAULT};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use futures_util::future::BoxFuture;

use crate::cell::{prepare, start_cell, Error};
use crate::http::door::{Created, Found, Namespaces};
use crate::http::ApiError;
use crate::shared::Shared;

/// How often a coordinator reads the registry of namespaces.
pub const LOOK_EVERY: Duration = Duration::from_secs(5);

/// How long after a namespace is marked for deletion its schema is
/// dropped: every coordinator has stopped serving it by then (three looks).
pub const DROP_AFTER: Duration = Duration::from_secs(15);

/// One namespace's cell.
pub struct Cell {
    pub shared: Arc<Shared>,
    /// Every route of the HTTP interface, on this cell's state.
    pub router: axum::Router,
    stop: CancellationToken,
    tasks: Mutex<tokio::task::JoinSet<()>>,
}

/// The cells of one coordinator.
pub struct Cells {
    default: Arc<Shared>,
    shutdown: CancellationToken,
    open: Mutex<HashMap<String, Arc<Cell>>>,
}

impl Cells {
    pub fn new(default: Arc<Shared>, shutdown: CancellationToken) -> Arc<Cells> {
        Arc::new(Cells { default, shutdown, open: Mutex::default() })
    }

    /// The default namespace's state: the registry, keys, sessions.
    pub fn default_shared(&self) -> &Arc<Shared> {
        &self.default
    }

    /// The cell of namespace `name` (not `default`), started when it is
    /// active and this coordinator has no cell for it yet.
    async fn find_cell(&self, name: &str) -> Result<Found, Error> {
        if let Some(cell) = self.open.lock().await.get(name) {
            return Ok(Found::Routes(cell.router.clone()));
        }
        let client = composer_store::client(&self.default.pool).await?;
        match namespaces::get(&client, name).await? {
            Some(row) if row.state == "active" => Ok(Found::Routes(self.open_cell(&row).await?.router.clone())),
            Some(row) if row.state == "deleting" => Ok(Found::Deleting),
            _ => Ok(Found::Missing),
        }
    }

    /// Starts the cell of `row`, unless another call just did.
    async fn open_cell(&self, row: &NamespaceRow) -> Result<Arc<Cell>, Error> {
        let mut open = self.open.lock().await;
        if let Some(cell) = open.get(&row.name) {
            return Ok(cell.clone());
        }
        let cell = Arc::new(self.start(row).await?);
        open.insert(row.name.clone(), cell.clone());
        tracing::info!(namespace = %row.name, "serving namespace");
        Ok(cell)
    }

    /// A cell for `row`, on its schema: migrated (a namespace created by a
    /// coordinator of an older build gets this build's migrations).
    async fn start(&self, row: &NamespaceRow) -> Result<Cell, Error> {
        let pool = self.pool_of(row)?;
        let base = &self.default.config;
        prepare(base, &pool).await?;
        let mut config = (**base).clone();
        config.redis.prefix = format!("{}ns{}:", base.redis.prefix, row.id);
        let stop = self.shutdown.child_token();
        let mut tasks = tokio::task::JoinSet::new();
        let traces = self.default.engine.traces().cloned();
        let shared = start_cell(&row.name, config, pool, traces, Some(&self.default), &stop, &mut tasks).await?;
        let router = crate::http::routes(shared.clone());
        Ok(Cell { shared, router, stop, tasks: Mutex::new(tasks) })
    }

    /// A pool whose connections reach `row`'s schema alone.
    fn pool_of(&self, row: &NamespaceRow) -> Result<composer_store::Pool, Error> {
        let c = &self.default.config;
        Ok(composer_store::connect_in(&c.database.url, row.schema().as_deref(), c.db_pool_size, c.db_timeout)?)
    }

    /// Creates namespace `name` (or finishes its creation): its row, its
    /// schema migrated, then active; answers its row.
    async fn create_namespace(&self, name: &str, description: &str, actor: &str) -> Result<Created, Error> {
        let client = composer_store::client(&self.default.pool).await?;
        let most = self.default.config.max_namespaces;
        if namespaces::get(&client, name).await?.is_none() && namespaces::count(&client).await? >= most {
            return Ok(Created::TooMany);
        }
        let (row, new) = namespaces::begin_create(&client, name, description, actor).await?;
        match row.state.as_str() {
            "deleting" => return Ok(Created::Deleting),
            "active" => return Ok(Created::Exists(row)),
            _ => {}
        }
        let schema = row.schema().unwrap_or_default();
        namespaces::create_schema(&client, &schema).await?;
        prepare(&self.default.config, &self.pool_of(&row)?).await?;
        match namespaces::activate(&client, name).await? {
            Some(row) if new => Ok(Created::New(row)),
            Some(row) => Ok(Created::Exists(row)),
            None => Ok(Created::Deleting),
        }
    }

    /// Marks namespace `name` for deletion and stops serving it here.
    async fn delete_namespace(&self, name: &str) -> Result<Option<NamespaceRow>, Error> {
        let client = composer_store::client(&self.default.pool).await?;
        let row = namespaces::begin_delete(&client, name).await?;
        if row.is_some() {
            self.close(name).await;
        }
        Ok(row)
    }

    /// Stops the cell of `name`, if there is one, and waits for its tasks.
    async fn close(&self, name: &str) {
        let cell = self.open.lock().await.remove(name);
        if let Some(cell) = cell {
            cell.stop.cancel();
            let mut tasks = cell.tasks.lock().await;
            while tasks.join_next().await.is_some() {}
            tracing::info!(namespace = %name, "no longer serving namespace");
        }
    }

    /// One look at the registry: cells started for active namespaces and
    /// stopped for the others; schemas dropped once [`DROP_AFTER`] has passed.
    async fn look(&self) -> Result<(), Error> {
        let mut client = composer_store::client(&self.default.pool).await?;
        let rows = namespaces::list(&client, self.default.config.max_namespaces + 1).await?;
        for row in rows.iter().filter(|r| r.name != DEFAULT && r.state == "active") {
            if let Err(e) = self.open_cell(row).await {
                tracing::warn!(namespace = %row.name, error = %e, "cannot serve namespace");
            }
        }
        let open: Vec<String> = self.open.lock().await.keys().cloned().collect();
        for name in open {
            if !rows.iter().any(|r| r.name == name && r.state == "active") {
                self.close(&name).await;
            }
        }
        for row in namespaces::due_for_deletion(&client, DROP_AFTER).await? {
            namespaces::finish_delete(&mut client, &row).await?;
            tracing::info!(namespace = %row.name, "namespace deleted with its data");
        }
        Ok(())
    }

    /// Stops every cell and waits for their tasks (the coordinator stops).
    pub async fn stop_all(&self) {
        let names: Vec<String> = self.open.lock().await.keys().cloned().collect();
        for name in names {
            self.close(&name).await;
        }
    }

    /// Aborts every cell's tasks at once.
    pub fn abort_all(&self) {
        if let Ok(open) = self.open.try_lock() {
            for cell in open.values() {
                if let Ok(mut tasks) = cell.tasks.try_lock() {
                    tasks.abort_all();
                }
            }
        }
    }
}

impl Namespaces for Cells {
    fn find<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Found, ApiError>> {
        Box::pin(async move { self.find_cell(name).await.map_err(unavailable) })
    }

    fn create<'a>(
        &'a self,
        name: &'a str,
        description: &'a str,
        actor: &'a str,
    ) -> BoxFuture<'a, Result<Created, ApiError>> {
        Box::pin(async move { self.create_namespace(name, description, actor).await.map_err(unavailable) })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NamespaceRow>, ApiError>> {
        Box::pin(async move { self.delete_namespace(name).await.map_err(unavailable) })
    }
}

/// A cell that could not be reached or started: its storage is away.
fn unavailable(e: Error) -> ApiError {
    match e {
        Error::Store(e) => ApiError::from(e),
        other => ApiError::Unavailable(other.to_string()),
    }
}

/// Looks at the registry every [`LOOK_EVERY`] until the coordinator stops.
pub async fn keep(cells: Arc<Cells>, shutdown: CancellationToken) {
    loop {
        if let Err(e) = cells.look().await {
            tracing::warn!(error = %e, "reading the namespaces failed; will retry");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}
