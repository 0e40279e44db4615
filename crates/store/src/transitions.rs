//! The engine's write: what the transitions of a batch of runs changed, as
//! one set-based statement per table, pipelined in one round trip inside the
//! caller's transaction (which holds the runs' locks).
//!
//! Each statement has a builder that owns its columns: the vectors it binds,
//! the `push` that fills them from the state machine's types, and its SQL.
//! Adding a column to a table means changing one builder.

use chrono::{DateTime, Utc};
use composer_core::definition::{Node, Workflow};
use composer_core::machine::{self, HistoryEntry, TaskState, Transition};
use composer_core::trace::RunTrace;
use serde_json::Value;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::outbox::{Outbound, OutboxInserts};
use crate::{Result, Transaction};

pub use crate::limits::LIMITS_CHANNEL;
pub use crate::outbox::{Order, OUTBOX_CHANNEL};
/// Channel notified with a run id when that run reaches a terminal status.
pub const RUN_DONE_CHANNEL: &str = "composer_run_done";

/// One run's changes, for [`write_transitions`].
pub struct Change<'a> {
    pub wf: &'a Workflow,
    pub run: &'a machine::Run,
    pub tr: &'a Transition,
    /// The run's definition id and version, for its dispatch messages.
    pub definition: (Uuid, i32),
    /// The `traceparent` the run was started under, for its messages'.
    pub traceparent: Option<&'a str>,
    /// Its priority and fairness key, for its messages' streams.
    pub order: Order<'a>,
    /// Tasks it dispatches that go to a worker with this commit, leased,
    /// instead of through the outbox and a stream.
    pub eager: &'a [Eager],
    /// Tasks that were PENDING when the run was read: written only if they
    /// still are (a poll leases a PENDING task without the run's lock), or
    /// the write fails with [`crate::Error::Moved`].
    pub pending_at_read: &'a [Uuid],
    /// Its values written as references to objects instead of themselves.
    pub offloaded: &'a Offloaded,
}

/// The values of a change that storage writes as references to objects
/// (offloaded, written before the commit) instead of themselves: the run's
/// input and output, and its tasks' by index in the run.
#[derive(Debug, Default, Clone)]
pub struct Offloaded {
    pub run_input: Option<Value>,
    pub run_output: Option<Value>,
    pub inputs: std::collections::HashMap<usize, Value>,
    pub outputs: std::collections::HashMap<usize, Value>,
}

impl Offloaded {
    pub fn is_empty(&self) -> bool {
        self.run_input.is_none() && self.run_output.is_none() && self.inputs.is_empty() && self.outputs.is_empty()
    }

    fn input<'a>(&'a self, i: usize, t: &'a machine::Task) -> &'a Value {
        self.inputs.get(&i).unwrap_or(&t.input)
    }

    fn output<'a>(&'a self, i: usize, t: &'a machine::Task) -> Option<&'a Value> {
        self.outputs.get(&i).or(t.output.as_ref())
    }
}

/// A dispatched task leased in the commit that dispatches it, to the
/// worker whose report made it ready (eager dispatch): written RUNNING
/// under `owner`'s lease, with no outbox row. A worker that never gets
/// the answer loses it when the lease expires, like any other.
#[derive(Debug, Clone)]
pub struct Eager {
    /// The task, by its index in the run.
    pub task: usize,
    pub owner: String,
    pub lease: std::time::Duration,
}

/// What [`write_transitions`] wrote that its caller sends on.
#[derive(Debug, Default)]
pub struct ToSend {
    /// The outbox rows, with their messages, for a writer that publishes
    /// them itself.
    pub outbound: Vec<Outbound>,
    /// The tasks leased eagerly ([`Change::eager`]).
    pub eager: Vec<EagerLease>,
}

/// A task leased eagerly: its message, and the queue it would have gone to.
#[derive(Debug, Clone)]
pub struct EagerLease {
    pub dispatch: composer_api::wire::Dispatch,
    pub queue: String,
    /// Its run's priority now (not the report's word for it).
    pub priority: u8,
}

/// How a write's outbox rows go out, for [`write_transitions`].
#[derive(Debug, Clone, Copy)]
pub enum Publish {
    /// The outbox enqueuers publish them: the rows are due at once, and
    /// `notify` sends NOTIFY for them (needed when no enqueuer runs in the
    /// writing process).
    ByEnqueuer { notify: bool },
    /// The writer publishes them right after its commit (see
    /// [`write_transitions`]'s answer); the rows fall due for the enqueuers
    /// only after `grace`, the safety net for a writer that dies first.
    ByWriter { grace: std::time::Duration },
}

/// Writes what transitions of any number of runs changed: the runs, new and
/// changed tasks, outbox rows for dispatches, history, and notifications,
/// and deletes the outbox rows `published` names (their messages are on
/// their streams). Nothing is visible until the caller commits. `shards` is
/// the stream shard count.
pub async fn write_transitions(
    tx: &Transaction<'_>,
    changes: &[Change<'_>],
    shards: i32,
    publish: Publish,
    published: &[i64],
) -> Result<ToSend> {
    let mut statements = Statements::default();
    for change in changes {
        statements.add(change);
    }
    statements.wake_listeners(publish);
    statements.execute(tx, shards, publish, published).await
}

/// Every statement of one write, filled change by change: one builder per
/// statement, and the tasks leased eagerly, which need none.
#[derive(Default)]
struct Statements<'a> {
    runs: RunUpdates<'a>,
    new_tasks: TaskInserts<'a>,
    changed_tasks: TaskUpdates<'a>,
    outbox: OutboxInserts<'a>,
    history: HistoryInserts<'a>,
    notify: Notifications,
    cancels: ItemCancels,
    removed: TaskDeletes,
    sources: SourceWrites,
    limits: crate::limits::LimitWrites,
    eager: Vec<EagerLease>,
}

impl<'a> Statements<'a> {
    /// One run's changes, each to the builders of the statements that write it.
    fn add(&mut self, change: &Change<'a>) {
        self.add_map_lists(change);
        self.add_run(change);
        self.add_new_tasks(change);
        self.add_changed_tasks(change);
        self.add_item_cancels(change);
        self.add_dispatches(change);
        self.add_retry_after(change);
        self.add_history(change);
    }

    /// The lists of MAPs that create their items a chunk at a time.
    fn add_map_lists(&mut self, &Change { run, tr, .. }: &Change<'a>) {
        for (m, first, list) in &tr.sources {
            self.sources.push(run.id, run.tasks[*m].id, *first, list);
        }
    }

    fn add_run(&mut self, &Change { wf, run, tr, offloaded, .. }: &Change<'a>) {
        if !(tr.run_changed || tr.input_changed) {
            return;
        }
        self.runs.push(run, tr.input_changed, offloaded);
        // A resumed run's held steps may go again.
        if run.status == machine::RunStatus::Running && wf.nodes.iter().any(|n| !n.limits.is_empty()) {
            self.limits.wake();
        }
        if run.status.is_terminal() {
            self.notify.push(RUN_DONE_CHANNEL, run.id.to_string());
        }
    }

    fn add_new_tasks(&mut self, &Change { wf, run, tr, eager, offloaded, .. }: &Change<'a>) {
        for &i in tr.created.iter().filter(|&&i| !run.tasks[i].removed) {
            let (node, task) = (&wf.nodes[run.tasks[i].node], &run.tasks[i]);
            let values = (offloaded.input(i, task), offloaded.output(i, task));
            self.new_tasks.push(run.id, node, task, values, eager.iter().find(|e| e.task == i));
        }
    }

    fn add_changed_tasks(&mut self, &Change { wf, run, tr, eager, pending_at_read, offloaded, .. }: &Change<'a>) {
        for &i in &tr.updated {
            let task = &run.tasks[i];
            // Any change ends the attempt that held (or waited for) its limits.
            if !wf.nodes[task.node].limits.is_empty() {
                self.limits.release(task.id, tr.reported.contains(&i));
            }
            match task.removed {
                true => self.removed.push(run.id, task.id),
                false => {
                    let values = (offloaded.input(i, task), offloaded.output(i, task));
                    self.changed_tasks.push(
                        run.id,
                        task,
                        values,
                        eager.iter().find(|e| e.task == i),
                        pending_at_read.contains(&task.id),
                    )
                }
            }
            // A MAP that ended (or was reset) has no items left to create.
            if task.progress.is_some_and(|p| p.total > composer_core::machine::ITEM_CHUNK)
                && (task.removed || task.state.is_terminal())
            {
                self.sources.forget(run.id, task.id);
            }
        }
    }

    /// The open items of MAPs that ended, cancelled (or deleted, with a
    /// MAP that was reset) in SQL.
    fn add_item_cancels(&mut self, &Change { wf, run, tr, .. }: &Change<'a>) {
        for &i in &tr.cancel_items {
            if wf.nodes.iter().any(|n| n.item_of == Some(run.tasks[i].node) && !n.limits.is_empty()) {
                self.limits.cancel_items_of(run.id, run.tasks[i].id);
            }
            match run.tasks[i].removed {
                true => self.removed.push_items_of(run.id, run.tasks[i].id),
                false => self.cancels.push(run.id, run.tasks[i].id),
            }
        }
    }

    /// A task dispatched and finished within one batch is not sent; one
    /// with limits waits for the limiter; an eager one goes to its worker
    /// with the answer; the others go through the outbox.
    fn add_dispatches(
        &mut self,
        &Change { wf, run, tr, definition, traceparent, order, eager, offloaded, .. }: &Change<'a>,
    ) {
        let trace = RunTrace::of(run.id, traceparent);
        for &i in tr.dispatch.iter().filter(|&&i| run.tasks[i].state == TaskState::Pending) {
            let (node, task) = (&wf.nodes[run.tasks[i].node], &run.tasks[i]);
            let input = offloaded.input(i, task);
            match (task.limit_keys.is_empty(), eager.iter().any(|e| e.task == i)) {
                (true, true) => self.eager.push(EagerLease {
                    dispatch: crate::outbox::dispatch_of(run.id, definition, node, task, input, &trace),
                    queue: node.dispatch_queue().to_string(),
                    priority: order.priority,
                }),
                (true, false) => self.outbox.push(run.id, definition, node, (task, input), &trace, order),
                (false, _) => self.limits.hold(run.id, node, task),
            }
        }
    }

    /// The keys a target's `Retry-After` holds.
    fn add_retry_after(&mut self, &Change { run, tr, .. }: &Change<'a>) {
        for &(i, until) in &tr.limit_holds {
            self.limits.retry_after(&run.tasks[i].limit_keys, until);
        }
    }

    fn add_history(&mut self, &Change { run, tr, .. }: &Change<'a>) {
        for h in &tr.history {
            self.history.push(run.id, h);
        }
    }

    /// NOTIFY the outbox enqueuers (when they publish and no enqueuer runs
    /// here) and the limiter, when there is work for them.
    fn wake_listeners(&mut self, publish: Publish) {
        if matches!(publish, Publish::ByEnqueuer { notify: true }) && !self.outbox.is_empty() {
            self.notify.push(OUTBOX_CHANNEL, String::new());
        }
        if !self.limits.is_empty() {
            self.notify.push(LIMITS_CHANNEL, String::new());
        }
    }

    /// Sends the statements: the few that must go first one after another,
    /// then the rest pipelined in one round trip.
    async fn execute(self, tx: &Transaction<'_>, shards: i32, publish: Publish, published: &[i64]) -> Result<ToSend> {
        let due_in = match publish {
            Publish::ByEnqueuer { .. } => std::time::Duration::ZERO,
            Publish::ByWriter { grace } => grace,
        };
        // First, while the leases of attempts that end here are still there.
        self.limits.execute(tx).await?;
        // Items the state machine did not hold when their MAP ended:
        // cancelled here, before the changes to the ones it did hold are
        // written.
        self.cancels.execute(tx, &self.changed_tasks.id).await?;
        self.removed.execute(tx).await?;
        self.sources.execute(tx).await?;
        let (a, b, c, outbound, e, f, g) = tokio::join!(
            self.runs.execute(tx),
            self.new_tasks.execute(tx),
            self.changed_tasks.execute(tx),
            self.outbox.execute(tx, shards, due_in),
            self.history.execute(tx),
            self.notify.execute(tx),
            crate::outbox::delete(&**tx, published),
        );
        // The first to fail in the order they were sent gives its error.
        let (outbound, d) = outbound.map_or_else(|e| (Vec::new(), Err(e)), |o| (o, Ok(())));
        crate::error::first_cause([a.map(drop), b.map(drop), c.map(drop), d, e.map(drop), f.map(drop), g.map(drop)])?;
        Ok(ToSend { outbound, eager: self.eager })
    }
}

/// `UPDATE workflow_runs` for runs whose status, output or error changed.
#[derive(Default)]
struct RunUpdates<'a> {
    id: Vec<Uuid>,
    status: Vec<&'static str>,
    output: Vec<Option<&'a Value>>,
    error: Vec<Option<&'a str>>,
    /// A new input (a rerun's), else NULL: the input stays.
    input: Vec<Option<&'a Value>>,
}

impl<'a> RunUpdates<'a> {
    fn push(&mut self, run: &'a machine::Run, input_changed: bool, offloaded: &'a Offloaded) {
        self.id.push(run.id);
        self.status.push(run.status.as_str());
        self.output.push(offloaded.run_output.as_ref().or(run.output.as_ref()));
        self.error.push(run.error.as_deref());
        self.input.push(input_changed.then(|| offloaded.run_input.as_ref().unwrap_or(&run.input)));
    }

    async fn execute(&self, tx: &Transaction<'_>) -> Result<u64> {
        if self.id.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE workflow_runs r
                    SET status = u.status, output = u.output, error = u.error, updated_at = now(),
                        input = coalesce(u.input, r.input),
                        finished_at = CASE WHEN u.status IN ('RUNNING', 'PAUSED') THEN NULL ELSE now() END,
                        -- A retried (or rerun) run gets its whole timeout again.
                        deadline = CASE WHEN r.status IN ('FAILED', 'SUCCEEDED', 'CANCELLED') AND u.status = 'RUNNING'
                                        THEN now() + (r.deadline - r.created_at) ELSE r.deadline END
                   FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::text[], $5::jsonb[])
                        AS u(id, status, output, error, input)
                  WHERE r.id = u.id AND r.id BETWEEN $6 AND $7",
            )
            .await?;
        let (lo, hi) = crate::partitions::span(&self.id);
        Ok(tx.execute(&stmt, &[&self.id, &self.status, &self.output, &self.error, &self.input, &lo, &hi]).await?)
    }
}

/// `INSERT INTO task_instances` for tasks a transition created.
#[derive(Default)]
struct TaskInserts<'a> {
    run_id: Vec<Uuid>,
    id: Vec<Uuid>,
    node_id: Vec<std::borrow::Cow<'a, str>>,
    node_type: Vec<&'a str>,
    queue: Vec<Option<&'a str>>,
    state: Vec<&'static str>,
    attempt: Vec<i32>,
    input: Vec<&'a Value>,
    wake_at: Vec<Option<DateTime<Utc>>>,
    finished_at: Vec<Option<DateTime<Utc>>>,
    output: Vec<Option<&'a Value>>,
    error: Vec<Option<&'a str>>,
    event_name: Vec<Option<&'a str>>,
    event_key: Vec<Option<&'a str>>,
    parent_task_id: Vec<Option<Uuid>>,
    item_index: Vec<Option<i32>>,
    progress: Vec<Option<Value>>,
    error_info: Vec<Option<Value>>,
    iteration: Vec<Option<i32>>,
    at_most_once: Vec<bool>,
    limit_keys: Vec<Option<Value>>,
    /// An eager task's lease (its worker, and for how many seconds). It
    /// runs, and `started_at` is, from when the row is written
    /// (`clock_timestamp()`), not from the transaction's start: a batch
    /// that waited on locks would hand its worker a lease already spent
    /// (and the recovery sweep would give the task to another), and its
    /// start would precede the end of the step the same transaction records.
    lease_owner: Vec<Option<&'a str>>,
    lease_secs: Vec<Option<f64>>,
}

impl<'a> TaskInserts<'a> {
    fn push(
        &mut self,
        run_id: Uuid,
        node: &'a Node,
        t: &'a machine::Task,
        (input, output): (&'a Value, Option<&'a Value>),
        eager: Option<&'a Eager>,
    ) {
        self.run_id.push(run_id);
        self.id.push(t.id);
        self.node_id.push(t.node_id(node));
        self.parent_task_id.push(t.item.map(|i| i.map));
        self.item_index.push(t.item.map(|i| i.index as i32));
        self.progress.push(progress_json(t));
        self.node_type.push(&node.node_type);
        self.queue.push(node.queue.as_deref());
        self.state.push(stored_state(t, eager));
        self.attempt.push(t.attempt);
        self.input.push(input);
        self.wake_at.push(deadline(t));
        self.finished_at.push(t.finished_at);
        self.lease_owner.push(eager.map(|e| e.owner.as_str()));
        self.lease_secs.push(eager.map(|e| e.lease.as_secs_f64()));
        self.output.push(output);
        self.error.push(t.error.as_deref());
        self.event_name.push(t.event.as_ref().map(|e| e.0.as_str()));
        self.event_key.push(t.event.as_ref().map(|e| e.1.as_str()));
        self.error_info.push(error_info_json(t));
        self.iteration.push(iteration(t));
        self.at_most_once.push(node.at_most_once);
        self.limit_keys.push((!t.limit_keys.is_empty()).then(|| Value::from(t.limit_keys.clone())));
    }

    async fn execute(&self, tx: &Transaction<'_>) -> Result<u64> {
        if self.id.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "INSERT INTO task_instances
                    (run_id, id, node_id, node_type, queue, state, attempt, input_json, wake_at, finished_at,
                     output_json, error, event_name, event_key, parent_task_id, item_index, progress, error_info,
                     iteration, at_most_once, limit_keys, lease_owner, lease_expires_at, started_at)
                 SELECT u.run_id, u.id, u.node_id, u.node_type, u.queue, u.state, u.attempt, u.input_json,
                        u.wake_at, u.finished_at, u.output_json, u.error, u.event_name, u.event_key,
                        u.parent_task_id, u.item_index, u.progress, u.error_info, u.iteration, u.at_most_once,
                        u.limit_keys, u.lease_owner, clock_timestamp() + make_interval(secs => u.lease_secs),
                        CASE WHEN u.lease_owner IS NOT NULL THEN clock_timestamp() END
                   FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[],
                               $7::int4[], $8::jsonb[], $9::timestamptz[], $10::timestamptz[],
                               $11::jsonb[], $12::text[], $13::text[], $14::text[], $15::uuid[],
                               $16::int4[], $17::jsonb[], $18::jsonb[], $19::int4[], $20::bool[],
                               $21::jsonb[], $22::text[], $23::float8[])
                        AS u(run_id, id, node_id, node_type, queue, state, attempt, input_json, wake_at,
                             finished_at, output_json, error, event_name, event_key, parent_task_id, item_index,
                             progress, error_info, iteration, at_most_once, limit_keys, lease_owner, lease_secs)",
            )
            .await?;
        let params: [&(dyn ToSql + Sync); 23] = [
            &self.run_id,
            &self.id,
            &self.node_id,
            &self.node_type,
            &self.queue,
            &self.state,
            &self.attempt,
            &self.input,
            &self.wake_at,
            &self.finished_at,
            &self.output,
            &self.error,
            &self.event_name,
            &self.event_key,
            &self.parent_task_id,
            &self.item_index,
            &self.progress,
            &self.error_info,
            &self.iteration,
            &self.at_most_once,
            &self.limit_keys,
            &self.lease_owner,
            &self.lease_secs,
        ];
        Ok(tx.execute(&stmt, &params).await?)
    }
}

/// A task's `wake_at` as stored: a step its limits hold has no deadline
/// yet (its timeout runs from its admission, which sets one).
fn deadline(t: &machine::Task) -> Option<DateTime<Utc>> {
    match t.state == TaskState::Pending && !t.limit_keys.is_empty() {
        true => None,
        false => t.wake_at,
    }
}

/// A task's state as stored: an eager one is RUNNING under its lease.
fn stored_state(t: &machine::Task, eager: Option<&Eager>) -> &'static str {
    match eager {
        Some(_) => TaskState::Running.as_str(),
        None => t.state.as_str(),
    }
}

/// A LOOP task's iteration as stored.
fn iteration(t: &machine::Task) -> Option<i32> {
    t.iteration.and_then(|i| i32::try_from(i).ok())
}

/// A MAP task's item counts as stored.
fn progress_json(t: &machine::Task) -> Option<Value> {
    t.progress.map(|p| serde_json::to_value(p).expect("counts serialize"))
}

/// What is known of a task's failure besides its message, as stored.
fn error_info_json(t: &machine::Task) -> Option<Value> {
    t.error_info.as_ref().map(|i| serde_json::to_value(i).expect("an error's info serializes"))
}

/// `UPDATE task_instances` for tasks a transition changed. Every change it
/// writes ends any lease (a terminal task, or a new attempt to dispatch),
/// and gives the new attempt of an eager task its worker's.
#[derive(Default)]
struct TaskUpdates<'a> {
    run_id: Vec<Uuid>,
    id: Vec<Uuid>,
    state: Vec<&'static str>,
    attempt: Vec<i32>,
    output: Vec<Option<&'a Value>>,
    error: Vec<Option<&'a str>>,
    wake_at: Vec<Option<DateTime<Utc>>>,
    finished_at: Vec<Option<DateTime<Utc>>>,
    input: Vec<&'a Value>,
    event_key: Vec<Option<&'a str>>,
    progress: Vec<Option<Value>>,
    error_info: Vec<Option<Value>>,
    iteration: Vec<Option<i32>>,
    lease_owner: Vec<Option<&'a str>>,
    lease_secs: Vec<Option<f64>>,
    was_pending: Vec<bool>,
}

impl<'a> TaskUpdates<'a> {
    fn push(
        &mut self,
        run_id: Uuid,
        t: &'a machine::Task,
        (input, output): (&'a Value, Option<&'a Value>),
        eager: Option<&'a Eager>,
        was_pending: bool,
    ) {
        self.run_id.push(run_id);
        self.was_pending.push(was_pending);
        self.id.push(t.id);
        self.state.push(stored_state(t, eager));
        self.lease_owner.push(eager.map(|e| e.owner.as_str()));
        self.lease_secs.push(eager.map(|e| e.lease.as_secs_f64()));
        self.attempt.push(t.attempt);
        self.output.push(output);
        self.error.push(t.error.as_deref());
        self.wake_at.push(deadline(t));
        self.finished_at.push(t.finished_at);
        self.input.push(input);
        self.event_key.push(t.event.as_ref().map(|e| e.1.as_str()));
        self.progress.push(progress_json(t));
        self.error_info.push(error_info_json(t));
        self.iteration.push(iteration(t));
    }

    /// Fails with [`crate::Error::Moved`] when a task read PENDING was not:
    /// its row is left as it is, and the caller rolls back.
    async fn execute(&self, tx: &Transaction<'_>) -> Result<u64> {
        if self.id.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE task_instances t
                    SET state = u.state, attempt = u.attempt, output_json = u.output, error = u.error,
                        wake_at = u.wake_at, finished_at = u.finished_at, input_json = u.input,
                        event_key = u.event_key, progress = u.progress, error_info = u.error_info,
                        iteration = u.iteration, lease_owner = u.lease_owner,
                        lease_expires_at = clock_timestamp() + make_interval(secs => u.lease_secs),
                        started_at = CASE WHEN u.lease_owner IS NULL THEN t.started_at ELSE clock_timestamp() END,
                        updated_at = now()
                   FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int4[], $5::jsonb[], $6::text[],
                               $7::timestamptz[], $8::timestamptz[], $9::jsonb[], $10::text[], $11::jsonb[],
                               $12::jsonb[], $13::int4[], $14::text[], $15::float8[], $18::bool[])
                        AS u(run_id, id, state, attempt, output, error, wake_at, finished_at, input, event_key,
                             progress, error_info, iteration, lease_owner, lease_secs, was_pending)
                  WHERE t.run_id = u.run_id AND t.id = u.id AND t.run_id BETWEEN $16 AND $17
                    AND (NOT u.was_pending OR t.state = 'PENDING')",
            )
            .await?;
        let (lo, hi) = crate::partitions::span(&self.run_id);
        let params: [&(dyn ToSql + Sync); 18] = [
            &self.run_id,
            &self.id,
            &self.state,
            &self.attempt,
            &self.output,
            &self.error,
            &self.wake_at,
            &self.finished_at,
            &self.input,
            &self.event_key,
            &self.progress,
            &self.error_info,
            &self.iteration,
            &self.lease_owner,
            &self.lease_secs,
            &lo,
            &hi,
            &self.was_pending,
        ];
        let written = tx.execute(&stmt, &params).await?;
        if written < self.id.len() as u64 && self.was_pending.contains(&true) {
            return Err(crate::Error::Moved);
        }
        Ok(written)
    }
}

/// Deletes tasks a retry reset (they run again as new tasks when they
/// become ready), and the items of reset MAPs. Their history stays; a
/// worker holding one loses its lease (the row is gone), and a dispatch
/// still on its way is dropped by the lease.
#[derive(Default)]
struct TaskDeletes {
    run_id: Vec<Uuid>,
    id: Vec<Uuid>,
    items_run_id: Vec<Uuid>,
    map: Vec<Uuid>,
}

impl TaskDeletes {
    fn push(&mut self, run_id: Uuid, id: Uuid) {
        self.run_id.push(run_id);
        self.id.push(id);
    }

    fn push_items_of(&mut self, run_id: Uuid, map: Uuid) {
        self.items_run_id.push(run_id);
        self.map.push(map);
    }

    async fn execute(&self, tx: &Transaction<'_>) -> Result<u64> {
        if self.id.is_empty() && self.map.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "WITH tasks AS (
                    DELETE FROM task_instances t USING unnest($1::uuid[], $2::uuid[]) AS d(run_id, id)
                     WHERE t.run_id = d.run_id AND t.id = d.id RETURNING 1),
                 items AS (
                    DELETE FROM task_instances t USING unnest($3::uuid[], $4::uuid[]) AS m(run_id, map)
                     WHERE t.run_id = m.run_id AND t.parent_task_id = m.map RETURNING 1)
                 SELECT (SELECT count(*) FROM tasks) + (SELECT count(*) FROM items)",
            )
            .await?;
        let row = tx.query_one(&stmt, &[&self.run_id, &self.id, &self.items_run_id, &self.map]).await?;
        Ok(row.try_get::<_, i64>(0)? as u64)
    }
}

/// The lists of MAPs with items still to create (`map_sources`), a chunk
/// to a row, and the lists of MAPs that ended, deleted.
#[derive(Default)]
struct SourceWrites {
    run_id: Vec<Uuid>,
    map_id: Vec<Uuid>,
    chunk: Vec<i32>,
    items: Vec<Value>,
    gone_run: Vec<Uuid>,
    gone_map: Vec<Uuid>,
}

impl SourceWrites {
    fn push(&mut self, run_id: Uuid, map_id: Uuid, first: u32, list: &[Value]) {
        let size = composer_core::machine::ITEM_CHUNK as usize;
        for (k, chunk) in list.chunks(size).enumerate() {
            self.run_id.push(run_id);
            self.map_id.push(map_id);
            self.chunk.push(first as i32 + k as i32);
            self.items.push(Value::Array(chunk.to_vec()));
        }
    }

    fn forget(&mut self, run_id: Uuid, map_id: Uuid) {
        self.gone_run.push(run_id);
        self.gone_map.push(map_id);
    }

    async fn execute(&self, tx: &Transaction<'_>) -> Result<()> {
        if !self.gone_map.is_empty() {
            let stmt = tx
                .prepare_cached(
                    "DELETE FROM map_sources s USING unnest($1::uuid[], $2::uuid[]) AS g(run_id, map_id)
                      WHERE s.run_id = g.run_id AND s.map_id = g.map_id",
                )
                .await?;
            tx.execute(&stmt, &[&self.gone_run, &self.gone_map]).await?;
        }
        if self.map_id.is_empty() {
            return Ok(());
        }
        // A MAP retried afresh writes its list again.
        let stmt = tx
            .prepare_cached(
                "INSERT INTO map_sources (run_id, map_id, chunk, items)
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int4[], $4::jsonb[])
                 ON CONFLICT (run_id, map_id, chunk) DO UPDATE SET items = EXCLUDED.items",
            )
            .await?;
        tx.execute(&stmt, &[&self.run_id, &self.map_id, &self.chunk, &self.items]).await?;
        Ok(())
    }
}

/// Cancels the open items of MAPs that ended, other than the ones the
/// transitions changed themselves (`written`). Their workers lose the lease
/// at the next renewal, as when a run is cancelled.
#[derive(Default)]
struct ItemCancels {
    run_id: Vec<Uuid>,
    map: Vec<Uuid>,
}

impl ItemCancels {
    fn push(&mut self, run_id: Uuid, map: Uuid) {
        self.run_id.push(run_id);
        self.map.push(map);
    }

    async fn execute(&self, tx: &Transaction<'_>, written: &[Uuid]) -> Result<u64> {
        if self.map.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE task_instances t
                    SET state = 'CANCELLED', wake_at = NULL, finished_at = now(),
                        lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
                   FROM unnest($1::uuid[], $2::uuid[]) AS m(run_id, map)
                  WHERE t.run_id = m.run_id AND t.parent_task_id = m.map
                    AND t.state IN ('QUEUED', 'PENDING', 'RUNNING', 'WAITING')
                    AND NOT (t.id = ANY($3))",
            )
            .await?;
        Ok(tx.execute(&stmt, &[&self.run_id, &self.map, &written]).await?)
    }
}

/// `INSERT INTO run_events`: the history lines of the transitions.
#[derive(Default)]
struct HistoryInserts<'a> {
    run_id: Vec<Uuid>,
    kind: Vec<&'static str>,
    payload: Vec<&'a Value>,
}

impl<'a> HistoryInserts<'a> {
    fn push(&mut self, run_id: Uuid, h: &'a HistoryEntry) {
        self.run_id.push(run_id);
        self.kind.push(h.kind.as_str());
        self.payload.push(&h.payload);
    }

    async fn execute(&self, tx: &Transaction<'_>) -> Result<u64> {
        if self.run_id.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "INSERT INTO run_events (run_id, type, payload)
                 SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[])",
            )
            .await?;
        Ok(tx.execute(&stmt, &[&self.run_id, &self.kind, &self.payload]).await?)
    }
}

/// `pg_notify` for every channel and payload, delivered at commit.
#[derive(Default)]
struct Notifications {
    channel: Vec<&'static str>,
    payload: Vec<String>,
}

impl Notifications {
    fn push(&mut self, channel: &'static str, payload: String) {
        self.channel.push(channel);
        self.payload.push(payload);
    }

    async fn execute(&self, tx: &Transaction<'_>) -> Result<u64> {
        if self.channel.is_empty() {
            return Ok(0);
        }
        let stmt = tx.prepare_cached("SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS n(c, p)").await?;
        Ok(tx.execute(&stmt, &[&self.channel, &self.payload]).await?)
    }
}
