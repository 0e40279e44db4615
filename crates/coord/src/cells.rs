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

use composer_store::namespaces::{self, NamespaceRow, Quotas, Usage, DEFAULT};
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

/// Deletes a namespace marked for deletion: its offloaded values first
/// (storage away leaves it to a later look, not objects no schema names),
/// then its schema and row.
async fn finish_delete(default: &Shared, row: &NamespaceRow) -> Result<(), Error> {
    let mut config = (*default.config).clone();
    config.archive_dir = Some(dir_of(row));
    crate::cell::payloads_of(&config, &row.name)?.drop_all().await.map_err(Error::Offload)?;
    let mut client = composer_store::client(&default.pool).await?;
    namespaces::finish_delete(&mut client, row).await?;
    tracing::info!(namespace = %row.name, "namespace deleted with its data");
    Ok(())
}

/// A namespace's directory in object storage (its archive, its offloaded
/// values): by its name and id, so a namespace made again with the same
/// name starts empty.
fn dir_of(row: &NamespaceRow) -> String {
    format!("{}-{}", row.name, row.id)
}

/// One namespace's cell.
pub struct Cell {
    /// Its namespace's registry id: a namespace deleted and made again
    /// under the same name is another namespace, with another cell.
    id: i64,
    pub shared: Arc<Shared>,
    /// Every route of the HTTP interface, on this cell's state.
    pub router: axum::Router,
    stop: CancellationToken,
    tasks: Mutex<tokio::task::JoinSet<()>>,
}

/// A name's cell: started once, however many requests ask for it meanwhile.
type Slot = Arc<tokio::sync::OnceCell<Arc<Cell>>>;

/// The cells of one coordinator.
pub struct Cells {
    default: Arc<Shared>,
    shutdown: CancellationToken,
    open: Mutex<HashMap<String, Slot>>,
    /// Names the registry lacked lately, and when it was read: a request
    /// naming one is answered without a query for [`LOOK_EVERY`].
    missing: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Namespaces whose deletion this coordinator is finishing (their
    /// objects going), in tasks of their own: a look does not wait for them.
    dropping: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Most names [`Cells`] remembers as missing; past it, the oldest go.
const MISSING_KEPT: usize = 10_000;

impl Cells {
    pub fn new(default: Arc<Shared>, shutdown: CancellationToken) -> Arc<Cells> {
        Arc::new(Cells {
            default,
            shutdown,
            open: Mutex::default(),
            missing: std::sync::Mutex::default(),
            dropping: Arc::default(),
        })
    }

    /// The default namespace's state: the registry, keys, sessions.
    pub fn default_shared(&self) -> &Arc<Shared> {
        &self.default
    }

    /// The state of namespace `name` on this coordinator, when it serves it.
    async fn shared_of(&self, name: &str) -> Option<Arc<Shared>> {
        match name == DEFAULT {
            true => Some(self.default.clone()),
            false => self.started(name).await.map(|c| c.shared.clone()),
        }
    }

    /// The started cell of namespace `name`, if there is one.
    async fn started(&self, name: &str) -> Option<Arc<Cell>> {
        let slot = self.open.lock().await.get(name).cloned()?;
        slot.get().cloned()
    }

    /// The cell of namespace `name` (not `default`), started when it is
    /// active and this coordinator has no cell for it yet.
    async fn find_cell(&self, name: &str) -> Result<Found, Error> {
        if let Some(cell) = self.started(name).await {
            return Ok(Found::Routes(cell.router.clone()));
        }
        if self.missing.lock().unwrap_or_else(|p| p.into_inner()).get(name).is_some_and(|at| at.elapsed() < LOOK_EVERY)
        {
            return Ok(Found::Missing);
        }
        let client = composer_store::client(&self.default.pool).await?;
        match namespaces::get(&client, name).await? {
            Some(row) if row.state == "active" => Ok(Found::Routes(self.open_cell(&row).await?.router.clone())),
            Some(row) if row.state == "deleting" => Ok(Found::Deleting),
            _ => {
                let mut missing = self.missing.lock().unwrap_or_else(|p| p.into_inner());
                if missing.len() >= MISSING_KEPT {
                    missing.retain(|_, at| at.elapsed() < LOOK_EVERY);
                }
                if missing.len() < MISSING_KEPT {
                    missing.insert(name.to_string(), std::time::Instant::now());
                }
                Ok(Found::Missing)
            }
        }
    }

    /// Starts the cell of `row`, once: a request for another namespace does
    /// not wait for it, and one for this namespace waits for the one start.
    async fn open_cell(&self, row: &NamespaceRow) -> Result<Arc<Cell>, Error> {
        let slot = {
            let mut open = self.open.lock().await;
            let stale = open.get(&row.name).and_then(|s| s.get()).is_some_and(|c| c.id != row.id);
            if stale {
                drop(open);
                self.close(&row.name).await;
                open = self.open.lock().await;
            }
            open.entry(row.name.clone()).or_default().clone()
        };
        let cell = slot
            .get_or_try_init(|| async {
                let cell = Arc::new(self.start(row).await?);
                tracing::info!(namespace = %row.name, "serving namespace");
                Ok::<_, Error>(cell)
            })
            .await?;
        Ok(cell.clone())
    }

    /// A cell for `row`, on its schema: migrated (a namespace created by a
    /// coordinator of an older build gets this build's migrations).
    async fn start(&self, row: &NamespaceRow) -> Result<Cell, Error> {
        let pool = self.pool_of(row).await?;
        let base = &self.default.config;
        prepare(base, &pool).await?;
        let mut config = (**base).clone();
        config.redis.prefix = format!("{}ns{}:", base.redis.prefix, row.id);
        config.archive_dir = Some(dir_of(row));
        let stop = self.shutdown.child_token();
        let mut tasks = tokio::task::JoinSet::new();
        let traces = self.default.engine.traces().cloned();
        let shared = start_cell(&row.name, config, pool, traces, Some(&self.default), &stop, &mut tasks).await?;
        shared.quotas.set(row.quotas);
        let router = crate::http::routes(shared.clone());
        Ok(Cell { id: row.id, shared, router, stop, tasks: Mutex::new(tasks) })
    }

    /// A pool whose connections reach `row`'s schema alone, once one of
    /// them has shown that they do: a pooler in front of PostgreSQL that
    /// drops the connection's startup options (PgBouncer's
    /// `ignore_startup_parameters = options`) would leave every namespace
    /// on the default one's tables.
    async fn pool_of(&self, row: &NamespaceRow) -> Result<composer_store::Pool, Error> {
        let c = &self.default.config;
        let schema = row.schema().unwrap_or_default();
        let pool = composer_store::connect_in(&c.database.url, Some(&schema), c.db_pool_size, c.db_timeout)?;
        let client = composer_store::client(&pool).await?;
        let path: String = client.query_one("SHOW search_path", &[]).await.map_err(composer_store::Error::from)?.get(0);
        if path != schema {
            return Err(Error::Store(composer_store::Error::Config(format!(
                "namespace {}: its connections' search_path is {path:?}, not {schema}: does a pooler between \
                 Composer and PostgreSQL drop the startup option that sets it?",
                row.name
            ))));
        }
        Ok(pool)
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
        prepare(&self.default.config, &self.pool_of(&row).await?).await?;
        match namespaces::activate(&client, name).await? {
            Some(row) if new => Ok(Created::New(row)),
            Some(row) => Ok(Created::Exists(row)),
            None => Ok(Created::Deleting),
        }
    }

    /// Marks namespace `name` for deletion and stops serving it here.
    async fn delete_namespace(&self, name: &str) -> Result<Option<NamespaceRow>, Error> {
        let mut client = composer_store::client(&self.default.pool).await?;
        let Some((row, revoked)) = namespaces::begin_delete(&mut client, name).await? else { return Ok(None) };
        for key in revoked {
            self.default.keys.forget(key);
        }
        self.close(name).await;
        Ok(Some(row))
    }

    /// Stops the cell of `name`, if there is one, and waits for its tasks.
    async fn close(&self, name: &str) {
        let slot = self.open.lock().await.remove(name);
        if let Some(cell) = slot.and_then(|s| s.get().cloned()) {
            cell.stop.cancel();
            let mut tasks = cell.tasks.lock().await;
            while tasks.join_next().await.is_some() {}
            tracing::info!(namespace = %name, "no longer serving namespace");
        }
    }

    /// One look at the registry: cells started for active namespaces and
    /// stopped for the others; schemas dropped once [`DROP_AFTER`] has passed.
    async fn look(&self) -> Result<(), Error> {
        let client = composer_store::client(&self.default.pool).await?;
        // Every row, however many there are (the limit is checked at creation only).
        let rows = namespaces::list(&client, i64::MAX).await?;
        let open: Vec<String> = self.open.lock().await.keys().cloned().collect();
        for name in open {
            let id = self.started(&name).await.map(|c| c.id);
            if !rows.iter().any(|r| r.name == name && r.state == "active" && id.is_none_or(|id| id == r.id)) {
                self.close(&name).await;
            }
        }
        for row in rows.iter().filter(|r| r.state == "active") {
            if row.name == DEFAULT {
                self.default.quotas.set(row.quotas);
                continue;
            }
            match self.open_cell(row).await {
                Ok(cell) => cell.shared.quotas.set(row.quotas),
                Err(e) => tracing::warn!(namespace = %row.name, error = %e, "cannot serve namespace"),
            }
        }
        self.missing.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, at| at.elapsed() < LOOK_EVERY);
        for row in namespaces::due_for_deletion(&client, DROP_AFTER).await? {
            if self.dropping.lock().unwrap_or_else(|p| p.into_inner()).insert(row.name.clone()) {
                let (default, dropping) = (self.default.clone(), self.dropping.clone());
                crate::metrics::spawn(async move {
                    if let Err(e) = finish_delete(&default, &row).await {
                        tracing::warn!(namespace = %row.name, error = %e, "deleting a namespace failed; a later look tries again");
                    }
                    dropping.lock().unwrap_or_else(|p| p.into_inner()).remove(&row.name);
                });
            }
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
            for cell in open.values().filter_map(|s| s.get()) {
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

    fn set_quotas<'a>(
        &'a self,
        name: &'a str,
        quotas: Quotas,
    ) -> BoxFuture<'a, Result<Option<NamespaceRow>, ApiError>> {
        Box::pin(async move {
            let client = composer_store::client(&self.default.pool).await?;
            let row = namespaces::set_quotas(&client, name, &quotas).await?;
            if row.is_some() {
                // Here at once; on the other coordinators at their next look.
                if let Some(shared) = self.shared_of(name).await {
                    shared.quotas.set(quotas);
                }
            }
            Ok(row)
        })
    }

    fn usage<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Usage>, ApiError>> {
        Box::pin(async move {
            let Some(shared) = self.shared_of(name).await else { return Ok(None) };
            let client = composer_store::client(&shared.pool).await?;
            Ok(Some(namespaces::usage(&client).await?))
        })
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
