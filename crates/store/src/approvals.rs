//! APPROVAL steps: the inbox (waiting approvals, by assignee), one
//! approval by its run and node, and the votes on a step's attempt,
//! recorded in the engine's transaction that applies them ([`record`]).

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// An APPROVAL step, with its request (its attempt's input) and votes.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRow {
    pub run_id: Uuid,
    pub task_id: Uuid,
    pub node_id: String,
    pub workflow: String,
    pub version: i32,
    /// The definition version the run is on (its node's config).
    pub definition: Uuid,
    pub state: String,
    pub attempt: i32,
    pub request: Value,
    /// The votes on this attempt, oldest first.
    pub votes: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    /// When it began to wait (or last changed).
    pub updated_at: DateTime<Utc>,
}

/// Which waiting approvals an inbox lists.
#[derive(Debug, Clone, Default)]
pub struct Inbox<'a> {
    /// Those naming this person.
    pub person: Option<&'a str>,
    /// Those naming one of these groups.
    pub groups: &'a [String],
    /// Every one (`person` and `groups` ignored).
    pub all: bool,
    /// After this place in the order (a page's last `updated_at` and task id).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    pub limit: i64,
}

const COLUMNS: &str = "t.run_id, t.id, t.node_id, r.workflow_name, r.workflow_version, t.state, t.attempt, \
     t.input_json, t.output_json, t.error, t.updated_at, \
     (SELECT coalesce(jsonb_agg(v.vote ORDER BY v.created_at), '[]'::jsonb) FROM approval_votes v \
       WHERE v.task_id = t.id AND v.attempt = t.attempt) AS votes, r.workflow_definition_id";

fn row(r: &Row) -> Result<ApprovalRow> {
    Ok(ApprovalRow {
        run_id: r.try_get(0)?,
        task_id: r.try_get(1)?,
        node_id: r.try_get(2)?,
        workflow: r.try_get(3)?,
        version: r.try_get(4)?,
        state: r.try_get(5)?,
        attempt: r.try_get(6)?,
        request: r.try_get(7)?,
        output: r.try_get(8)?,
        error: r.try_get(9)?,
        updated_at: r.try_get(10)?,
        votes: r.try_get(11)?,
        definition: r.try_get(12)?,
    })
}

/// The waiting approvals `inbox` asks for, newest first (by when they
/// last changed, then by task id), and those whose request is offloaded
/// (its assignees not in the row: the caller reads it and judges). Each
/// filter is one the GIN indexes on the assignees serve.
pub async fn inbox(client: &Client, inbox: &Inbox<'_>) -> Result<Vec<ApprovalRow>> {
    const OFFLOADED: &str = "t.input_json ? '$composer_offloaded'";
    let person = inbox.person.unwrap_or("");
    let (at, id) = (inbox.after.map(|a| a.0), inbox.after.map_or(Uuid::nil(), |a| a.1));
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&at, &id, &inbox.limit];
    let filter = match (inbox.all, inbox.person) {
        (true, _) => "true".to_string(),
        (false, Some(_)) => {
            params.extend([&person as &(dyn tokio_postgres::types::ToSql + Sync), &inbox.groups]);
            format!(
                "((t.input_json -> 'assignees' -> 'people') ? $4 \
                  OR (t.input_json -> 'assignees' -> 'groups') ?| $5::text[] OR {OFFLOADED})"
            )
        }
        (false, None) => {
            params.push(&inbox.groups);
            format!("((t.input_json -> 'assignees' -> 'groups') ?| $4::text[] OR {OFFLOADED})")
        }
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
          WHERE t.node_type = 'APPROVAL' AND t.state = 'WAITING' AND {filter}
            AND ($1::timestamptz IS NULL OR (t.updated_at, t.id) < ($1, $2))
          ORDER BY t.updated_at DESC, t.id DESC LIMIT $3"
    );
    let stmt = client.prepare_cached(&sql).await?;
    let rows = client.query(&stmt, &params).await?;
    rows.iter().map(row).collect()
}

const ONE: &str = "FROM task_instances t JOIN workflow_runs r ON r.id = t.run_id
     WHERE t.run_id = $1 AND t.node_id = $2 AND t.node_type = 'APPROVAL' AND t.parent_task_id IS NULL";

/// The APPROVAL step `node_id` of run `run_id`, whatever its state.
pub async fn get(client: &Client, run_id: Uuid, node_id: &str) -> Result<Option<ApprovalRow>> {
    let stmt = client.prepare_cached(&format!("SELECT {COLUMNS} {ONE}")).await?;
    client.query_opt(&stmt, &[&run_id, &node_id]).await?.as_ref().map(row).transpose()
}

/// [`get`], in a transaction.
pub async fn get_in(tx: &Transaction<'_>, run_id: Uuid, node_id: &str) -> Result<Option<ApprovalRow>> {
    let stmt = tx.prepare_cached(&format!("SELECT {COLUMNS} {ONE}")).await?;
    tx.query_opt(&stmt, &[&run_id, &node_id]).await?.as_ref().map(row).transpose()
}

/// The votes on attempt `attempt` of task `task_id`, oldest first (read
/// under the run's lock, so that no other vote lands meanwhile).
pub async fn votes(tx: &Transaction<'_>, task_id: Uuid, attempt: i32) -> Result<Vec<Value>> {
    let rows = tx
        .query(
            "SELECT vote FROM approval_votes WHERE task_id = $1 AND attempt = $2 ORDER BY created_at, person",
            &[&task_id, &attempt],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Deletes the votes of runs that are gone (dropped by retention, or
/// deleted with their namespace's data): a vote lives as long as its run.
pub async fn forget_orphans(client: &Client) -> Result<u64> {
    Ok(client
        .execute(
            "DELETE FROM approval_votes v WHERE NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = v.run_id)",
            &[],
        )
        .await?)
}

/// Records `person`'s vote in the transaction that applies it: false when
/// they voted on this attempt already (nothing is written).
pub async fn record(
    tx: &Transaction<'_>,
    (run_id, task_id, attempt): (Uuid, Uuid, i32),
    person: &str,
    vote: &Value,
) -> Result<bool> {
    let n = tx
        .execute(
            "INSERT INTO approval_votes (task_id, attempt, person, run_id, vote)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            &[&task_id, &attempt, &person, &run_id, vote],
        )
        .await?;
    Ok(n == 1)
}
