//! Runs and tasks: the engine's locked read ([`lock_many`]) and set-based
//! write ([`write_transitions`]), plus the reads behind the API.
//!
//! Every change to a run happens in a transaction that first takes the run
//! row's lock (`SELECT … FOR UPDATE`), so events for one run apply one after
//! another on any number of coordinators, while different runs proceed in
//! parallel.

use chrono::{DateTime, Utc};
use composer_core::definition::Workflow;
use composer_core::machine::{self, RunStatus, TaskState, Transition};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::dispatch::{dispatch_insert, DispatchParams};
use crate::{Client, Error, Result, Transaction};

/// Channel notified when a commit adds outbox rows.
pub const OUTBOX_CHANNEL: &str = "composer_outbox";
/// Channel notified with a run id when that run reaches a terminal status.
pub const RUN_DONE_CHANNEL: &str = "composer_run_done";

#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: Uuid,
    pub workflow_definition_id: Uuid,
    pub workflow_name: String,
    pub workflow_version: i32,
    pub status: RunStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

const RUN_COLUMNS: &str = "id, workflow_definition_id, workflow_name, workflow_version, status, input, output, \
                           error, idempotency_key, created_at, updated_at, finished_at";

impl RunRow {
    fn from_row(r: &Row) -> Result<RunRow> {
        let status: String = r.get(4);
        Ok(RunRow {
            id: r.get(0),
            workflow_definition_id: r.get(1),
            workflow_name: r.get(2),
            workflow_version: r.get(3),
            status: RunStatus::parse(&status).ok_or_else(|| Error::Corrupt(format!("run status {status:?}")))?,
            input: r.get(5),
            output: r.get(6),
            error: r.get(7),
            idempotency_key: r.get(8),
            created_at: r.get(9),
            updated_at: r.get(10),
            finished_at: r.get(11),
        })
    }
}

#[derive(Debug, Clone)]
pub struct TaskRow {
    pub run_id: Uuid,
    pub id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub queue: Option<String>,
    pub state: TaskState,
    pub attempt: i32,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub wake_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub event_name: Option<String>,
    pub event_key: Option<String>,
}

const TASK_COLUMNS: &str = "run_id, id, node_id, node_type, queue, state, attempt, input_json, output_json, error, \
                            lease_owner, lease_expires_at, wake_at, started_at, finished_at, created_at, updated_at, \
                            event_name, event_key";

impl TaskRow {
    fn from_row(r: &Row) -> Result<TaskRow> {
        let state: String = r.get(5);
        Ok(TaskRow {
            run_id: r.get(0),
            id: r.get(1),
            node_id: r.get(2),
            node_type: r.get(3),
            queue: r.get(4),
            state: TaskState::parse(&state).ok_or_else(|| Error::Corrupt(format!("task state {state:?}")))?,
            attempt: r.get(6),
            input: r.get(7),
            output: r.get(8),
            error: r.get(9),
            lease_owner: r.get(10),
            lease_expires_at: r.get(11),
            wake_at: r.get(12),
            started_at: r.get(13),
            finished_at: r.get(14),
            created_at: r.get(15),
            updated_at: r.get(16),
            event_name: r.get(17),
            event_key: r.get(18),
        })
    }
}

/// How dispatches are addressed: `<prefix>tasks:<queue>.<shard>` over `shards`.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub prefix: String,
    pub shards: i64,
}

/// A run about to be inserted.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    pub id: Uuid,
    pub workflow_definition_id: Uuid,
    pub workflow_name: &'a str,
    pub workflow_version: i32,
    pub input: &'a Value,
    pub idempotency_key: Option<&'a str>,
}

/// Inserts a RUNNING run; the caller applies RunStarted in the same transaction.
pub async fn insert_run(tx: &Transaction<'_>, run: &NewRun<'_>) -> Result<RunRow> {
    let stmt = tx
        .prepare_cached(&format!(
            "INSERT INTO workflow_runs (id, workflow_definition_id, workflow_name, workflow_version, status, input, idempotency_key)
             VALUES ($1, $2, $3, $4, 'RUNNING', $5, $6) RETURNING {RUN_COLUMNS}"
        ))
        .await?;
    let row = tx
        .query_one(
            &stmt,
            &[
                &run.id,
                &run.workflow_definition_id,
                &run.workflow_name,
                &run.workflow_version,
                run.input,
                &run.idempotency_key,
            ],
        )
        .await?;
    RunRow::from_row(&row)
}

/// The state machine's view of a run.
pub fn to_machine(wf: &Workflow, run: &RunRow, tasks: &[TaskRow]) -> Result<machine::Run> {
    let tasks = tasks
        .iter()
        .map(|t| {
            let node = wf.node_index(&t.node_id).ok_or_else(|| {
                Error::Corrupt(format!("task {} names node {:?}, unknown to its workflow version", t.id, t.node_id))
            })?;
            Ok(machine::Task {
                id: t.id,
                node,
                state: t.state,
                attempt: t.attempt,
                input: t.input.clone(),
                output: t.output.clone(),
                error: t.error.clone(),
                wake_at: t.wake_at,
                finished_at: t.finished_at,
                event: t.event_name.clone().zip(t.event_key.clone()),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(machine::Run {
        id: run.id,
        status: run.status,
        input: run.input.clone(),
        output: run.output.clone(),
        error: run.error.clone(),
        tasks,
    })
}

/// One run's changes, for [`write_transitions`].
pub struct Change<'a> {
    pub wf: &'a Workflow,
    pub meta: &'a RunRow,
    pub run: &'a machine::Run,
    pub tr: &'a Transition,
}

/// Writes what transitions of any number of runs changed: the runs, new and
/// changed tasks, outbox rows for dispatches, history, and notifications —
/// each one set-based statement over all runs, all pipelined in one round
/// trip. Nothing is visible until the caller commits. `notify_outbox` sends
/// NOTIFY for new outbox rows (needed when no enqueuer runs in this process).
pub async fn write_transitions(
    tx: &Transaction<'_>,
    changes: &[Change<'_>],
    dispatch: &DispatchConfig,
    notify_outbox: bool,
) -> Result<()> {
    let mut run_ids = Vec::new();
    let mut run_statuses = Vec::new();
    let mut run_outputs = Vec::new();
    let mut run_errors = Vec::new();

    let mut new_runs = Vec::new();
    let mut new_ids = Vec::new();
    let mut new_nodes = Vec::new();
    let mut new_types = Vec::new();
    let mut new_queues = Vec::new();
    let mut new_states = Vec::new();
    let mut new_attempts = Vec::new();
    let mut new_inputs = Vec::new();
    let mut new_wake = Vec::new();
    let mut new_finished = Vec::new();
    let mut new_outputs = Vec::new();
    let mut new_errors = Vec::new();
    let mut new_event_names = Vec::new();
    let mut new_event_keys = Vec::new();

    let mut upd_runs = Vec::new();
    let mut upd_ids = Vec::new();
    let mut upd_states = Vec::new();
    let mut upd_attempts = Vec::new();
    let mut upd_outputs = Vec::new();
    let mut upd_errors = Vec::new();
    let mut upd_wake = Vec::new();
    let mut upd_finished = Vec::new();
    let mut upd_inputs = Vec::new();
    let mut upd_event_keys = Vec::new();

    let mut dsp_runs = Vec::new();
    let mut dsp_defs = Vec::new();
    let mut dsp_versions = Vec::new();
    let mut dsp_ids = Vec::new();
    let mut dsp_nodes = Vec::new();
    let mut dsp_types = Vec::new();
    let mut dsp_queues = Vec::new();
    let mut dsp_attempts = Vec::new();
    let mut dsp_inputs = Vec::new();

    let mut hist_runs = Vec::new();
    let mut hist_kinds = Vec::new();
    let mut hist_payloads = Vec::new();

    let mut channels: Vec<&str> = Vec::new();
    let mut payloads: Vec<String> = Vec::new();

    for Change { wf, meta, run, tr } in changes {
        if tr.run_changed {
            run_ids.push(run.id);
            run_statuses.push(run.status.as_str());
            run_outputs.push(run.output.as_ref());
            run_errors.push(run.error.as_deref());
            if run.status.is_terminal() {
                channels.push(RUN_DONE_CHANNEL);
                payloads.push(run.id.to_string());
            }
        }
        for &i in &tr.created {
            let t = &run.tasks[i];
            let node = &wf.nodes[t.node];
            new_runs.push(run.id);
            new_ids.push(t.id);
            new_nodes.push(node.id.as_str());
            new_types.push(node.node_type.as_str());
            new_queues.push(node.queue.as_deref());
            new_states.push(t.state.as_str());
            new_attempts.push(t.attempt);
            new_inputs.push(&t.input);
            new_wake.push(t.wake_at);
            new_finished.push(t.finished_at);
            new_outputs.push(t.output.as_ref());
            new_errors.push(t.error.as_deref());
            new_event_names.push(t.event.as_ref().map(|e| e.0.as_str()));
            new_event_keys.push(t.event.as_ref().map(|e| e.1.as_str()));
        }
        for &i in &tr.updated {
            let t = &run.tasks[i];
            upd_runs.push(run.id);
            upd_ids.push(t.id);
            upd_states.push(t.state.as_str());
            upd_attempts.push(t.attempt);
            upd_outputs.push(t.output.as_ref());
            upd_errors.push(t.error.as_deref());
            upd_wake.push(t.wake_at);
            upd_finished.push(t.finished_at);
            upd_inputs.push(&t.input);
            upd_event_keys.push(t.event.as_ref().map(|e| e.1.as_str()));
        }
        // A task dispatched and finished within one batch is not sent.
        for &i in tr.dispatch.iter().filter(|&&i| run.tasks[i].state == TaskState::Pending) {
            let t = &run.tasks[i];
            let node = &wf.nodes[t.node];
            dsp_runs.push(run.id);
            dsp_defs.push(meta.workflow_definition_id);
            dsp_versions.push(meta.workflow_version);
            dsp_ids.push(t.id);
            dsp_nodes.push(node.id.as_str());
            dsp_types.push(node.node_type.as_str());
            dsp_queues.push(node.queue.as_deref());
            dsp_attempts.push(t.attempt);
            dsp_inputs.push(&t.input);
        }
        for h in &tr.history {
            hist_runs.push(run.id);
            hist_kinds.push(h.kind);
            hist_payloads.push(&h.payload);
        }
    }
    if notify_outbox && !dsp_ids.is_empty() {
        channels.push(OUTBOX_CHANNEL);
        payloads.push(String::new());
    }

    let update_runs = async {
        if run_ids.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE workflow_runs r
                    SET status = u.status, output = u.output, error = u.error, updated_at = now(),
                        finished_at = CASE WHEN u.status = 'RUNNING' THEN NULL ELSE now() END
                   FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::text[]) AS u(id, status, output, error)
                  WHERE r.id = u.id",
            )
            .await?;
        tx.execute(&stmt, &[&run_ids, &run_statuses, &run_outputs, &run_errors]).await
    };
    let insert_tasks = async {
        if new_ids.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "INSERT INTO task_instances
                    (run_id, id, node_id, node_type, queue, state, attempt, input_json, wake_at, finished_at,
                     output_json, error, event_name, event_key)
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[],
                                      $7::int4[], $8::jsonb[], $9::timestamptz[], $10::timestamptz[],
                                      $11::jsonb[], $12::text[], $13::text[], $14::text[])",
            )
            .await?;
        tx.execute(
            &stmt,
            &[
                &new_runs,
                &new_ids,
                &new_nodes,
                &new_types,
                &new_queues,
                &new_states,
                &new_attempts,
                &new_inputs,
                &new_wake,
                &new_finished,
                &new_outputs,
                &new_errors,
                &new_event_names,
                &new_event_keys,
            ],
        )
        .await
    };
    // The engine never hands a task to a worker itself, so every change it
    // writes ends any lease: a terminal task, or a new attempt to dispatch.
    let update_tasks = async {
        if upd_ids.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE task_instances t
                    SET state = u.state, attempt = u.attempt, output_json = u.output, error = u.error,
                        wake_at = u.wake_at, finished_at = u.finished_at, input_json = u.input,
                        event_key = u.event_key,
                        lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
                   FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int4[], $5::jsonb[], $6::text[],
                               $7::timestamptz[], $8::timestamptz[], $9::jsonb[], $10::text[])
                        AS u(run_id, id, state, attempt, output, error, wake_at, finished_at, input, event_key)
                  WHERE t.run_id = u.run_id AND t.id = u.id",
            )
            .await?;
        tx.execute(
            &stmt,
            &[
                &upd_runs,
                &upd_ids,
                &upd_states,
                &upd_attempts,
                &upd_outputs,
                &upd_errors,
                &upd_wake,
                &upd_finished,
                &upd_inputs,
                &upd_event_keys,
            ],
        )
        .await
    };
    let insert_outbox = async {
        if dsp_ids.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "{} FROM unnest($3::uuid[], $4::uuid[], $5::int4[], $6::uuid[], $7::text[], $8::text[], $9::text[],
                            $10::int4[], $11::jsonb[])
                     AS t(run_id, workflow_definition_id, workflow_version, id, node_id, node_type, queue,
                          attempt, input_json),
                   LATERAL (SELECT t.workflow_definition_id, t.workflow_version) r",
            dispatch_insert(&DispatchParams { shards: "$1", prefix: "$2" })
        );
        let stmt = tx.prepare_cached(&sql).await?;
        tx.execute(
            &stmt,
            &[
                &dispatch.shards,
                &dispatch.prefix,
                &dsp_runs,
                &dsp_defs,
                &dsp_versions,
                &dsp_ids,
                &dsp_nodes,
                &dsp_types,
                &dsp_queues,
                &dsp_attempts,
                &dsp_inputs,
            ],
        )
        .await
    };
    let insert_history = async {
        if hist_kinds.is_empty() {
            return Ok(0);
        }
        let stmt = tx
            .prepare_cached(
                "INSERT INTO run_events (run_id, type, payload) SELECT * FROM unnest($1::uuid[], $2::text[], $3::jsonb[])",
            )
            .await?;
        tx.execute(&stmt, &[&hist_runs, &hist_kinds, &hist_payloads]).await
    };
    let notify = async {
        if channels.is_empty() {
            return Ok(0);
        }
        let stmt = tx.prepare_cached("SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS n(c, p)").await?;
        tx.execute(&stmt, &[&channels, &payloads]).await
    };
    tokio::try_join!(update_runs, insert_tasks, update_tasks, insert_outbox, insert_history, notify)?;
    Ok(())
}

/// Locks the rows of `run_ids` in id order (so two batches cannot deadlock on
/// each other) and loads their tasks, in one round trip.
pub async fn lock_many(tx: &Transaction<'_>, run_ids: &[Uuid]) -> Result<Vec<(RunRow, Vec<TaskRow>)>> {
    let lock_stmt = tx
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = ANY($1) ORDER BY id FOR UPDATE"))
        .await?;
    let tasks_stmt = tx
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM task_instances WHERE run_id = ANY($1) ORDER BY run_id, id"
        ))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&run_ids];
    let (runs, tasks) = tokio::try_join!(tx.query(&lock_stmt, &params), tx.query(&tasks_stmt, &params))?;
    let mut by_run: std::collections::HashMap<Uuid, Vec<TaskRow>> = std::collections::HashMap::new();
    for row in &tasks {
        let t = TaskRow::from_row(row)?;
        by_run.entry(t.run_id).or_default().push(t);
    }
    runs.iter()
        .map(|r| {
            let run = RunRow::from_row(r)?;
            let tasks = by_run.remove(&run.id).unwrap_or_default();
            Ok((run, tasks))
        })
        .collect()
}

/// A run and its tasks, for the API (no lock).
pub async fn get(client: &Client, run_id: Uuid) -> Result<Option<(RunRow, Vec<TaskRow>)>> {
    let run_stmt = client.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = $1")).await?;
    let tasks_stmt = client
        .prepare_cached(&format!("SELECT {TASK_COLUMNS} FROM task_instances WHERE run_id = $1 ORDER BY id"))
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&run_id];
    let (run, tasks) = tokio::try_join!(client.query_opt(&run_stmt, &params), client.query(&tasks_stmt, &params))?;
    let Some(run) = run else { return Ok(None) };
    let tasks = tasks.iter().map(TaskRow::from_row).collect::<Result<Vec<_>>>()?;
    Ok(Some((RunRow::from_row(&run)?, tasks)))
}

/// Only the run's status, for cheap polling.
pub async fn status(client: &Client, run_id: Uuid) -> Result<Option<RunStatus>> {
    let stmt = client.prepare_cached("SELECT status FROM workflow_runs WHERE id = $1").await?;
    match client.query_opt(&stmt, &[&run_id]).await? {
        Some(r) => {
            let s: String = r.get(0);
            Ok(Some(RunStatus::parse(&s).ok_or_else(|| Error::Corrupt(format!("run status {s:?}")))?))
        }
        None => Ok(None),
    }
}

#[derive(Debug, Clone)]
pub struct HistoryRow {
    pub seq: i64,
    pub kind: String,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

/// The run's history after `after_seq`, oldest first, at most `limit` entries.
pub async fn history(client: &Client, run_id: Uuid, after_seq: i64, limit: i64) -> Result<Vec<HistoryRow>> {
    let rows = client
        .query(
            "SELECT seq, type, payload, created_at FROM run_events
              WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            &[&run_id, &after_seq, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| HistoryRow { seq: r.get(0), kind: r.get(1), payload: r.get(2), created_at: r.get(3) })
        .collect())
}

/// A page of runs, newest first. `before` is the last id of the previous page
/// (keyset pagination: UUIDv7 ids sort by creation).
pub async fn list(
    client: &Client,
    workflow: Option<&str>,
    status: Option<RunStatus>,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<RunRow>> {
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM workflow_runs
              WHERE ($1::text IS NULL OR workflow_name = $1)
                AND ($2::text IS NULL OR status = $2)
                AND ($3::uuid IS NULL OR id < $3)
              ORDER BY id DESC LIMIT $4"
        ))
        .await?;
    let status = status.map(|s| s.as_str());
    let rows = client.query(&stmt, &[&workflow, &status, &before, &limit]).await?;
    rows.iter().map(RunRow::from_row).collect()
}

/// Serializes starts that share an idempotency key (per workflow) and returns
/// the run already started with it, if any. Call inside the start transaction.
pub async fn lock_idempotency_key(tx: &Transaction<'_>, workflow: &str, key: &str) -> Result<Option<RunRow>> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('composer_idempotency:' || $1 || ':' || $2, 0))",
        &[&workflow, &key],
    )
    .await?;
    let row = tx
        .query_opt(
            &format!(
                "SELECT {RUN_COLUMNS} FROM workflow_runs WHERE workflow_name = $1 AND idempotency_key = $2 LIMIT 1"
            ),
            &[&workflow, &key],
        )
        .await?;
    row.as_ref().map(RunRow::from_row).transpose()
}
