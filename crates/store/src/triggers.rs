//! Runs started by events: which workflows have a trigger for an event name
//! ([`set_for_workflow`], kept by registration), and the event log — each
//! event recorded once by its id ([`log_event`]) with the runs its triggers
//! started in the same commit ([`record_run`]).

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// Makes `events` the event names `workflow`'s triggers listen to (its
/// latest version's), inside the transaction registering that version.
pub async fn set_for_workflow(tx: &Transaction<'_>, workflow: &str, events: &[String]) -> Result<()> {
    tx.execute("DELETE FROM event_triggers WHERE workflow_name = $1", &[&workflow]).await?;
    tx.execute(
        "INSERT INTO event_triggers (event_name, workflow_name)
         SELECT DISTINCT e, $1 FROM unnest($2::text[]) AS e",
        &[&workflow, &events],
    )
    .await?;
    Ok(())
}

/// The workflows with a trigger for events named `name`, by name.
pub async fn workflows_for(client: &impl deadpool_postgres::GenericClient, name: &str) -> Result<Vec<String>> {
    let rows = client
        .query("SELECT workflow_name FROM event_triggers WHERE event_name = $1 ORDER BY workflow_name", &[&name])
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// An event as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    pub name: &'a str,
    pub event_id: &'a str,
    pub key: &'a str,
    pub payload: &'a Value,
    /// `api`, or `webhook:NAME`.
    pub source: &'a str,
}

/// Records an event; its sequence number, or `None` when an event of that
/// name and id was recorded before (a concurrent one waits for the first's
/// commit and then finds it).
pub async fn log_event(tx: &Transaction<'_>, e: NewEvent<'_>) -> Result<Option<i64>> {
    let row = tx
        .query_opt(
            "INSERT INTO event_log (name, event_id, key, payload, source) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name, event_id) DO NOTHING RETURNING seq",
            &[&e.name, &e.event_id, &e.key, e.payload, &e.source],
        )
        .await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}

/// What a trigger did with an event: the run it started, or why none.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRun {
    pub workflow: String,
    pub trigger: i32,
    pub run_id: Option<Uuid>,
    pub error: Option<String>,
    /// The replay that started the run or last tried to (`None`: the sending).
    pub replayed_by: Option<Uuid>,
    /// The trigger's flow control that took the event (`debounce`, `batch`,
    /// `throttle`, `singleton`), and for one that started no run (yet), why.
    pub flow: Option<String>,
    pub flow_note: Option<String>,
}

/// Records what trigger `trigger` of `workflow` did with event `seq`.
pub async fn record_run(tx: &Transaction<'_>, seq: i64, run: &EventRun) -> Result<()> {
    tx.execute(
        "INSERT INTO event_runs (event_seq, workflow_name, trigger_index, run_id, error, flow, flow_note)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT DO NOTHING",
        &[&seq, &run.workflow, &run.trigger, &run.run_id, &run.error, &run.flow, &run.flow_note],
    )
    .await?;
    Ok(())
}

/// Counts the waiting steps an event completed when it was sent. Added to
/// what is counted already: a step that began to wait meanwhile may have
/// taken the event and been counted ([`crate::events::consume_buffered`]).
pub async fn add_delivered(client: &Client, seq: i64, delivered: i32) -> Result<()> {
    client.execute("UPDATE event_log SET delivered = delivered + $2 WHERE seq = $1", &[&seq, &delivered]).await?;
    Ok(())
}

/// A recorded event with what its triggers did.
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    pub seq: i64,
    pub name: String,
    pub event_id: String,
    pub key: String,
    /// `None` when larger than [`MAX_LISTED_PAYLOAD`].
    pub payload: Option<Value>,
    pub payload_bytes: i32,
    pub source: String,
    pub delivered: i32,
    pub received_at: DateTime<Utc>,
    pub runs: Vec<EventRun>,
}

/// Largest payload a list of events carries, in bytes of its JSON text;
/// a larger one is left out (`payload_bytes` says how large it is).
pub const MAX_LISTED_PAYLOAD: i32 = 64 * 1024;

const KEY: &str = composer_core::storable::OFFLOADED_KEY;

/// The event log's columns, the payload whole or (for lists) only when it
/// is at most [`MAX_LISTED_PAYLOAD`].
fn log_columns(whole_payload: bool) -> String {
    // An offloaded payload is listed by its reference's size, and left out.
    let payload = if whole_payload {
        "payload".to_string()
    } else {
        format!(
            "CASE WHEN jsonb_typeof(payload -> '{KEY}') IS DISTINCT FROM 'object'
                   AND octet_length(payload::text) <= {MAX_LISTED_PAYLOAD} THEN payload END"
        )
    };
    format!(
        "seq, name, event_id, key, source, delivered, received_at,
         CASE WHEN jsonb_typeof(payload -> '{KEY}') = 'object'
              THEN least((payload -> '{KEY}' ->> 'bytes')::int8, 2147483647)::int4
              ELSE octet_length(payload::text) END AS payload_bytes,
         {payload} AS payload,
         COALESCE((SELECT jsonb_agg(jsonb_build_object('workflow', r.workflow_name, 'trigger', r.trigger_index,
                                                       'run_id', r.run_id, 'error', r.error,
                                                       'replayed_by', r.replayed_by, 'flow', r.flow,
                                                       'flow_note', r.flow_note)
                                    ORDER BY r.workflow_name, r.trigger_index)
                     FROM event_runs r WHERE r.event_seq = seq), '[]') AS runs"
    )
}

fn logged(r: &Row) -> Result<LoggedEvent> {
    let runs: Value = r.try_get("runs")?;
    let runs = runs
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| EventRun {
                    workflow: x["workflow"].as_str().unwrap_or_default().to_string(),
                    trigger: x["trigger"].as_i64().unwrap_or_default() as i32,
                    run_id: x["run_id"].as_str().and_then(|s| s.parse().ok()),
                    error: x["error"].as_str().map(str::to_string),
                    replayed_by: x["replayed_by"].as_str().and_then(|s| s.parse().ok()),
                    flow: x["flow"].as_str().map(str::to_string),
                    flow_note: x["flow_note"].as_str().map(str::to_string),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(LoggedEvent {
        seq: r.try_get("seq")?,
        name: r.try_get("name")?,
        event_id: r.try_get("event_id")?,
        key: r.try_get("key")?,
        payload: r.try_get("payload")?,
        payload_bytes: r.try_get("payload_bytes")?,
        source: r.try_get("source")?,
        delivered: r.try_get("delivered")?,
        received_at: r.try_get("received_at")?,
        runs,
    })
}

/// The event recorded with name `name` and id `event_id`.
pub async fn find(
    client: &impl deadpool_postgres::GenericClient,
    name: &str,
    event_id: &str,
) -> Result<Option<LoggedEvent>> {
    let row = client
        .query_opt(
            &format!("SELECT {} FROM event_log WHERE name = $1 AND event_id = $2", log_columns(true)),
            &[&name, &event_id],
        )
        .await?;
    row.map(|r| logged(&r)).transpose()
}

/// The event recorded as sequence number `seq`, its payload whole.
pub async fn by_seq(client: &impl deadpool_postgres::GenericClient, seq: i64) -> Result<Option<LoggedEvent>> {
    let row = client.query_opt(&format!("SELECT {} FROM event_log WHERE seq = $1", log_columns(true)), &[&seq]).await?;
    row.map(|r| logged(&r)).transpose()
}

/// The latest events, newest first, before sequence number `before`
/// (optionally of one name or source).
pub async fn recent(
    client: &Client,
    name: Option<&str>,
    source: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<LoggedEvent>> {
    let rows = client
        .query(
            &format!(
                "SELECT {} FROM event_log
                  WHERE ($1::text IS NULL OR name = $1) AND ($2::text IS NULL OR source = $2)
                    AND ($3::int8 IS NULL OR seq < $3)
                  ORDER BY seq DESC LIMIT $4",
                log_columns(false)
            ),
            &[&name, &source, &before, &limit],
        )
        .await?;
    rows.iter().map(logged).collect()
}

/// Forgets events received before `before` (and what their triggers did):
/// an event sent again after that is a new one.
pub async fn forget(client: &Client, before: DateTime<Utc>) -> Result<u64> {
    Ok(client.execute("DELETE FROM event_log WHERE received_at < $1", &[&before]).await?)
}
