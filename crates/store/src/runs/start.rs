//! A new run's row: inserted alone (a QUEUED run takes its turn) or many
//! at once (RUNNING only), and the idempotency key that makes a start
//! happen once. The caller applies `RunStarted` in the same transaction.

use chrono::{DateTime, Utc};
use composer_core::machine::RunStatus;
use serde_json::Value;
use uuid::Uuid;

use super::concurrency::{turn_of, NEXT_TURN};
use super::rows::{Parent, RunRow, RUN_COLUMNS};
use crate::{Error, Result, Transaction};

/// A run about to be inserted.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    pub id: Uuid,
    pub workflow_definition_id: Uuid,
    pub workflow_name: &'a str,
    pub workflow_version: i32,
    pub input: &'a Value,
    pub idempotency_key: Option<&'a str>,
    /// When the run times out, if its definition has a `timeout`.
    pub deadline: Option<DateTime<Utc>>,
    pub parent: Option<Parent>,
    pub depth: i32,
    /// QUEUED (over its concurrency limit) or RUNNING.
    pub status: RunStatus,
    pub concurrency_key: Option<&'a str>,
    pub trigger: Option<&'a Value>,
    /// The root of its run tree, for a child run.
    pub root_run_id: Option<Uuid>,
    /// For a failure handler: the run whose end started it.
    pub handles_run_id: Option<Uuid>,
    /// A child its parent never cancels (`on_parent_close: "abandon"`).
    pub abandoned: bool,
    /// Its tags, `{key: value}`.
    pub tags: Option<&'a Value>,
    /// The W3C `traceparent` it continues.
    pub traceparent: Option<&'a str>,
    pub priority: u8,
    pub fairness_key: Option<&'a str>,
}

/// The head of both run inserts: every column a new run is given.
const INSERT_RUN: &str = "INSERT INTO workflow_runs
    (id, workflow_definition_id, workflow_name, workflow_version, status, input, idempotency_key, deadline,
     parent_run_id, parent_task_id, parent_attempt, depth, concurrency_key, trigger, root_run_id,
     handles_run_id, parent_iteration, abandoned, tags, traceparent, priority, fairness_key, fair_turn)";

/// Inserts a RUNNING run; the caller applies RunStarted in the same transaction.
pub async fn insert_run(tx: &Transaction<'_>, run: &NewRun<'_>) -> Result<RunRow> {
    let stmt = tx
        .prepare_cached(&format!(
            "{INSERT_RUN}
             VALUES ($1, $2, $3, $4, $12, $5, $6, $7, $8, $9, $10, $11, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22,
                     CASE WHEN $12 = 'QUEUED' THEN {NEXT_TURN} ELSE 0 END)
             RETURNING {RUN_COLUMNS}"
        ))
        .await?;
    let parent = run.parent;
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
                &run.deadline,
                &parent.map(|p| p.run_id),
                &parent.map(|p| p.task_id),
                &parent.map(|p| p.attempt),
                &run.depth,
                &run.status.as_str(),
                &run.concurrency_key,
                &run.trigger,
                &run.root_run_id,
                &run.handles_run_id,
                &parent.map_or(0, |p| p.iteration),
                &run.abandoned,
                &run.tags,
                &run.traceparent,
                &i16::from(run.priority),
                &run.fairness_key,
                &turn_of(run.priority),
            ],
        )
        .await?;
    RunRow::from_row(&row)
}

/// Inserts RUNNING runs in one statement and returns their rows in the
/// order given; the caller applies each one's RunStarted in the same
/// transaction. A QUEUED run's turn is read under its concurrency key's lock
/// ([`insert_run`]), so it is refused here.
pub async fn insert_runs(tx: &Transaction<'_>, runs: &[NewRun<'_>]) -> Result<Vec<RunRow>> {
    if let Some(queued) = runs.iter().find(|r| r.status != RunStatus::Running) {
        return Err(Error::Corrupt(format!(
            "run {} is {}, not RUNNING: insert it on its own",
            queued.id, queued.status
        )));
    }
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let stmt = tx
        .prepare_cached(&format!(
            "{INSERT_RUN}
             SELECT u.id, u.definition, u.name, u.version, 'RUNNING', u.input, u.idempotency_key, u.deadline,
                    u.parent_run_id, u.parent_task_id, u.parent_attempt, u.depth, u.concurrency_key, u.trigger,
                    u.root_run_id, u.handles_run_id, u.parent_iteration, u.abandoned, u.tags, u.traceparent,
                    u.priority, u.fairness_key, 0
               FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int4[], $5::jsonb[], $6::text[], $7::timestamptz[],
                           $8::uuid[], $9::uuid[], $10::int4[], $11::int4[], $12::text[], $13::jsonb[], $14::uuid[],
                           $15::uuid[], $16::int4[], $17::bool[], $18::jsonb[], $19::text[], $20::int2[], $21::text[])
                    AS u(id, definition, name, version, input, idempotency_key, deadline, parent_run_id,
                         parent_task_id, parent_attempt, depth, concurrency_key, trigger, root_run_id, handles_run_id,
                         parent_iteration, abandoned, tags, traceparent, priority, fairness_key)
             RETURNING {RUN_COLUMNS}"
        ))
        .await?;
    let column = |f: &dyn Fn(&NewRun<'_>) -> Option<Uuid>| runs.iter().map(f).collect::<Vec<_>>();
    let ids: Vec<Uuid> = runs.iter().map(|r| r.id).collect();
    let definitions: Vec<Uuid> = runs.iter().map(|r| r.workflow_definition_id).collect();
    let names: Vec<&str> = runs.iter().map(|r| r.workflow_name).collect();
    let versions: Vec<i32> = runs.iter().map(|r| r.workflow_version).collect();
    let inputs: Vec<&Value> = runs.iter().map(|r| r.input).collect();
    let keys: Vec<Option<&str>> = runs.iter().map(|r| r.idempotency_key).collect();
    let deadlines: Vec<Option<DateTime<Utc>>> = runs.iter().map(|r| r.deadline).collect();
    let parent_runs = column(&|r| r.parent.map(|p| p.run_id));
    let parent_tasks = column(&|r| r.parent.map(|p| p.task_id));
    let parent_attempts: Vec<Option<i32>> = runs.iter().map(|r| r.parent.map(|p| p.attempt)).collect();
    let depths: Vec<i32> = runs.iter().map(|r| r.depth).collect();
    let concurrency_keys: Vec<Option<&str>> = runs.iter().map(|r| r.concurrency_key).collect();
    let triggers: Vec<Option<&Value>> = runs.iter().map(|r| r.trigger).collect();
    let roots = column(&|r| r.root_run_id);
    let handles = column(&|r| r.handles_run_id);
    let iterations: Vec<i32> = runs.iter().map(|r| r.parent.map_or(0, |p| p.iteration)).collect();
    let abandoned: Vec<bool> = runs.iter().map(|r| r.abandoned).collect();
    let tags: Vec<Option<&Value>> = runs.iter().map(|r| r.tags).collect();
    let traceparents: Vec<Option<&str>> = runs.iter().map(|r| r.traceparent).collect();
    let priorities: Vec<i16> = runs.iter().map(|r| i16::from(r.priority)).collect();
    let fairness_keys: Vec<Option<&str>> = runs.iter().map(|r| r.fairness_key).collect();
    let rows = tx
        .query(
            &stmt,
            &[
                &ids,
                &definitions,
                &names,
                &versions,
                &inputs,
                &keys,
                &deadlines,
                &parent_runs,
                &parent_tasks,
                &parent_attempts,
                &depths,
                &concurrency_keys,
                &triggers,
                &roots,
                &handles,
                &iterations,
                &abandoned,
                &tags,
                &traceparents,
                &priorities,
                &fairness_keys,
            ],
        )
        .await?;
    let mut by_id: std::collections::HashMap<Uuid, RunRow> =
        rows.iter().map(|r| RunRow::from_row(r).map(|row| (row.id, row))).collect::<Result<_>>()?;
    ids.iter().map(|id| by_id.remove(id).ok_or_else(|| Error::Corrupt(format!("run {id} was not inserted")))).collect()
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
