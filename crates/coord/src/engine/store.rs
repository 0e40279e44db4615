//! The engine's seam with storage: what its logic asks of the transaction
//! an event (or a new run) is applied in. PostgreSQL's transaction serves it
//! in production ([`Tx`]); the unit tests give a store in memory, so the
//! engine's logic is tested without a database (and against one by the
//! integration tests).

use std::future::Future;

use composer_archive::payloads::Payloads;
use composer_core::definition::Workflow;
use composer_core::machine;
use composer_store::definitions::DefinitionRow;
use composer_store::runs::{self, Items, NewRun, RunRow};
use composer_store::Transaction;
use serde_json::Value;
use uuid::Uuid;

type StoreResult<T> = Result<T, composer_store::Error>;

/// What the engine's logic needs from one transaction.
pub trait RunStore: Sync {
    /// Items of MAP `map` (of every MAP of the run for [`Items::Held`]) that
    /// are not in `held`, in the state machine's form.
    fn load_items(
        &self,
        wf: &Workflow,
        run_id: Uuid,
        map: Option<Uuid>,
        which: Items,
        held: &[Uuid],
    ) -> impl Future<Output = StoreResult<Vec<machine::Task>>> + Send;

    /// Up to `limit` items of MAP `map` by index after `after`, in the
    /// state machine's form.
    fn item_page(
        &self,
        wf: &Workflow,
        run_id: Uuid,
        map: Uuid,
        after: i32,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<machine::Task>>> + Send;

    /// Takes an event `(name, key)` that arrived before its waiter, for
    /// `task_id`: at most one waiter gets each event.
    fn take_buffered_event(
        &self,
        name: &str,
        key: &str,
        task_id: Uuid,
    ) -> impl Future<Output = StoreResult<Option<Value>>> + Send;

    /// Serializes admissions under one concurrency key until the commit.
    fn lock_concurrency_key(&self, workflow: &str, key: &str) -> impl Future<Output = StoreResult<()>> + Send;

    /// Open runs under the key, and whether any waits QUEUED.
    fn concurrency_usage(&self, workflow: &str, key: &str) -> impl Future<Output = StoreResult<(i64, bool)>> + Send;

    fn insert_run(&self, run: &NewRun<'_>) -> impl Future<Output = StoreResult<RunRow>> + Send;

    /// Inserts RUNNING runs in one statement; their rows in the order given.
    fn insert_runs(&self, runs: &[NewRun<'_>]) -> impl Future<Output = StoreResult<Vec<RunRow>>> + Send;

    /// MAP items the run tree of `root` has created so far.
    fn tree_items_used(&self, root: Uuid) -> impl Future<Output = StoreResult<i64>> + Send;

    /// Elements `from..from + count` of a MAP's list.
    fn load_sources(
        &self,
        run_id: Uuid,
        map: Uuid,
        from: u32,
        count: u32,
    ) -> impl Future<Output = StoreResult<Vec<Value>>> + Send;

    /// The node tasks of `nodes` (node ids) of a run loaded in part, but for
    /// those in `held`, in the state machine's form.
    fn load_nodes(
        &self,
        wf: &Workflow,
        run_id: Uuid,
        nodes: &[&str],
        held: &[Uuid],
    ) -> impl Future<Output = StoreResult<Vec<machine::Task>>> + Send;

    /// Reads every value `run` left unread ([`machine::Run::unread`]): its
    /// input, its tasks' inputs and outputs that are references.
    fn read_unread(&self, run: &mut machine::Run) -> impl Future<Output = StoreResult<()>> + Send;

    /// A definition by name: `version`, or the latest.
    fn definition(
        &self,
        name: &str,
        version: Option<i32>,
    ) -> impl Future<Output = StoreResult<Option<DefinitionRow>>> + Send;
}

/// A PostgreSQL transaction as the engine's store, and where offloaded
/// values are: rows are read back whole, and a new run's input too large
/// for its row is written as an object first.
pub struct Tx<'a, 'b>(pub &'a Transaction<'b>, pub &'a Payloads);

/// Whether one of `values` is a reference to an object.
fn refers<'v>(values: impl IntoIterator<Item = &'v Value>) -> bool {
    values.into_iter().any(|v| composer_archive::payloads::Ref::of(v).is_some())
}

/// Object storage as a transaction that holds runs' locks reads and writes
/// it: each of these lets the transaction sit idle as long as a read or a
/// write of an object may take ([`Transaction::allow_object_io`]) before
/// the first that does, so a large value on slow storage is not cut off by
/// the session's idle limit. In a transaction, objects are read and
/// written through these alone.
impl Tx<'_, '_> {
    /// Before reading values back: the idle limit raised if one of them
    /// is a reference ([`refers`]).
    async fn before_reading(&self, refers: bool) -> StoreResult<()> {
        match refers {
            true => self.0.allow_object_io().await,
            false => Ok(()),
        }
    }

    pub async fn resolve(&self, value: &mut Value) -> StoreResult<()> {
        self.before_reading(refers([&*value])).await?;
        crate::payloads::resolve(self.1, value).await.map(drop)
    }

    pub async fn resolve_run(&self, run: &mut RunRow, read: &mut crate::payloads::ReadFrom) -> StoreResult<()> {
        self.before_reading(refers(std::iter::once(&run.input).chain(&run.output))).await?;
        crate::payloads::resolve_run(self.1, run, read).await
    }

    pub async fn resolve_task(&self, t: &mut runs::TaskRow, read: &mut crate::payloads::ReadFrom) -> StoreResult<()> {
        self.before_reading(refers(std::iter::once(&t.input).chain(&t.output))).await?;
        crate::payloads::resolve_task(self.1, t, read).await
    }

    pub async fn resolve_tasks(&self, tasks: &mut [runs::TaskRow]) -> StoreResult<()> {
        self.before_reading(refers(tasks.iter().flat_map(|t| std::iter::once(&t.input).chain(&t.output)))).await?;
        crate::payloads::resolve_tasks(self.1, tasks).await
    }

    /// [`Payloads::offload`], in this transaction.
    pub async fn offload(
        &self,
        run: Uuid,
        value: &Value,
        had: Option<&composer_archive::payloads::Ref>,
    ) -> StoreResult<Option<Value>> {
        if !self.1.offloads(run, value) {
            return Ok(None);
        }
        self.0.allow_object_io().await?;
        self.1.offload_now(run, value, had).await.map_err(crate::payloads::store_error)
    }
}

impl RunStore for Tx<'_, '_> {
    async fn read_unread(&self, run: &mut machine::Run) -> StoreResult<()> {
        self.resolve(&mut run.input).await?;
        for t in &mut run.tasks {
            self.resolve(&mut t.input).await?;
            if let Some(output) = &mut t.output {
                self.resolve(output).await?;
            }
        }
        run.unread = false;
        Ok(())
    }

    async fn load_items(
        &self,
        wf: &Workflow,
        run_id: Uuid,
        map: Option<Uuid>,
        which: Items,
        held: &[Uuid],
    ) -> StoreResult<Vec<machine::Task>> {
        let mut rows = runs::load_items(self.0, run_id, map, which, held).await?;
        self.resolve_tasks(&mut rows).await?;
        rows.into_iter().map(|row| runs::to_machine_task(wf, row)).collect()
    }

    async fn item_page(
        &self,
        wf: &Workflow,
        run_id: Uuid,
        map: Uuid,
        after: i32,
        limit: i64,
    ) -> StoreResult<Vec<machine::Task>> {
        // Inside the transaction (which holds the run's lock): the API's page.
        let mut rows = runs::items(self.0, run_id, map, after, limit).await?;
        self.resolve_tasks(&mut rows).await?;
        rows.into_iter().map(|row| runs::to_machine_task(wf, row)).collect()
    }

    async fn load_nodes(
        &self,
        wf: &Workflow,
        run_id: Uuid,
        nodes: &[&str],
        held: &[Uuid],
    ) -> StoreResult<Vec<machine::Task>> {
        let mut rows = runs::load_nodes(self.0, run_id, nodes, held).await?;
        self.resolve_tasks(&mut rows).await?;
        rows.into_iter().map(|row| runs::to_machine_task(wf, row)).collect()
    }

    async fn take_buffered_event(&self, name: &str, key: &str, task_id: Uuid) -> StoreResult<Option<Value>> {
        let mut payload = composer_store::events::consume_buffered(self.0, name, key, task_id).await?;
        if let Some(payload) = &mut payload {
            self.resolve(payload).await?;
        }
        Ok(payload)
    }

    async fn lock_concurrency_key(&self, workflow: &str, key: &str) -> StoreResult<()> {
        runs::lock_concurrency_key(self.0, workflow, key).await
    }

    async fn concurrency_usage(&self, workflow: &str, key: &str) -> StoreResult<(i64, bool)> {
        runs::concurrency_usage(self.0, workflow, key).await
    }

    async fn tree_items_used(&self, root: Uuid) -> StoreResult<i64> {
        composer_store::trees::items_used(self.0, root).await
    }

    async fn insert_run(&self, run: &NewRun<'_>) -> StoreResult<RunRow> {
        let Some(written) = self.offload(run.id, run.input, None).await? else {
            return runs::insert_run(self.0, run).await;
        };
        let mut row = runs::insert_run(self.0, &NewRun { input: &written, ..run.clone() }).await?;
        // The state machine sees the input itself.
        row.input = run.input.clone();
        Ok(row)
    }

    async fn insert_runs(&self, new: &[NewRun<'_>]) -> StoreResult<Vec<RunRow>> {
        let mut written: Vec<Option<Value>> = Vec::with_capacity(new.len());
        for run in new {
            written.push(self.offload(run.id, run.input, None).await?);
        }
        if written.iter().all(Option::is_none) {
            return runs::insert_runs(self.0, new).await;
        }
        let stored: Vec<NewRun<'_>> = new
            .iter()
            .zip(&written)
            .map(|(run, w)| NewRun { input: w.as_ref().unwrap_or(run.input), ..run.clone() })
            .collect();
        let mut rows = runs::insert_runs(self.0, &stored).await?;
        for (row, run) in rows.iter_mut().zip(new) {
            row.input = run.input.clone();
        }
        Ok(rows)
    }

    async fn definition(&self, name: &str, version: Option<i32>) -> StoreResult<Option<DefinitionRow>> {
        composer_store::definitions::by_name(&**self.0, name, version).await
    }

    async fn load_sources(&self, run_id: Uuid, map: Uuid, from: u32, count: u32) -> StoreResult<Vec<Value>> {
        runs::load_sources(self.0, run_id, map, from, count).await
    }
}
