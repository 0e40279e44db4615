//! Replays: the triggers of recorded events run again, a batch of events
//! at a time by any coordinator.
//!
//! Safe on many coordinators at once: a replay is claimed for a while
//! ([`claim`], renewed with each event), and each event is replayed in a
//! commit of its own that locks the replay's row ([`lock_for`]: its cursor
//! is still before the event), locks the event's row ([`lock_event`]),
//! records the runs it starts in `event_runs` ([`record`]) and moves the
//! cursor ([`looked_at`]): an event is replayed once, and a workflow with a
//! run for it is not started again, by this replay after a crash or by
//! another.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::triggers::EventRun;
use crate::{Client, Result, Transaction};

/// A replay as stored.
#[derive(Debug, Clone)]
pub struct ReplayRow {
    pub id: Uuid,
    pub filter: Value,
    pub actor: String,
    pub reason: Option<String>,
    pub status: String,
    pub matched: i64,
    pub looked_at: i64,
    pub started: i64,
    pub failed: i64,
    /// The last event sequence number looked at (0 before the first).
    pub cursor: i64,
    /// The newest event when the replay was made.
    pub until_seq: i64,
    /// Passing failures of the event after the cursor.
    pub tries: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, filter, actor, reason, status, matched, looked_at, started, failed, cursor, until_seq, \
                       tries, last_error, created_at, updated_at, finished_at";

impl ReplayRow {
    fn from_row(r: &tokio_postgres::Row) -> Result<ReplayRow> {
        Ok(ReplayRow {
            id: r.try_get("id")?,
            filter: r.try_get("filter")?,
            actor: r.try_get("actor")?,
            reason: r.try_get("reason")?,
            status: r.try_get("status")?,
            matched: r.try_get("matched")?,
            looked_at: r.try_get("looked_at")?,
            started: r.try_get("started")?,
            failed: r.try_get("failed")?,
            cursor: r.try_get("cursor")?,
            until_seq: r.try_get("until_seq")?,
            tries: r.try_get("tries")?,
            last_error: r.try_get("last_error")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            finished_at: r.try_get("finished_at")?,
        })
    }
}

/// Which events a replay looks at.
#[derive(Debug, Clone, Copy)]
pub struct EventFilter<'a> {
    pub name: Option<&'a str>,
    pub key: Option<&'a str>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub failed_only: bool,
}

/// The filter's condition on `event_log e`, its parameters from `$1`.
const MATCHES: &str = "e.received_at >= $1 AND e.received_at < $2
    AND ($3::text IS NULL OR e.name = $3) AND ($4::text IS NULL OR e.key = $4)
    AND (NOT $5 OR EXISTS (SELECT 1 FROM event_runs r WHERE r.event_seq = e.seq AND r.run_id IS NULL))";

/// How many events `f` matches now, counted up to `cap`.
pub async fn count(client: &Client, f: &EventFilter<'_>, cap: i64) -> Result<i64> {
    let row = client
        .query_one(
            &format!("SELECT count(*) FROM (SELECT 1 FROM event_log e WHERE {MATCHES} LIMIT $6) AS m"),
            &[&f.from, &f.to, &f.name, &f.key, &f.failed_only, &cap],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// The sequence numbers of the next `limit` events `f` matches after
/// `after` and up to `until`, oldest first.
pub async fn next(client: &Client, f: &EventFilter<'_>, after: i64, until: i64, limit: i64) -> Result<Vec<i64>> {
    let rows = client
        .query(
            &format!(
                "SELECT e.seq FROM event_log e WHERE {MATCHES} AND e.seq > $6 AND e.seq <= $7
                  ORDER BY e.seq LIMIT $8"
            ),
            &[&f.from, &f.to, &f.name, &f.key, &f.failed_only, &after, &until, &limit],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// A replay to create.
pub struct NewReplay<'a> {
    pub filter: &'a Value,
    pub actor: &'a str,
    pub reason: Option<&'a str>,
}

/// Creates a RUNNING replay of the events `f` matches, up to the newest
/// recorded now (later ones are not its), counted up to `cap` in the same
/// statement.
pub async fn create(client: &Client, f: &EventFilter<'_>, r: &NewReplay<'_>, cap: i64) -> Result<ReplayRow> {
    let row = client
        .query_one(
            &format!(
                "WITH top AS (SELECT coalesce(max(seq), 0) AS seq FROM event_log),
                      matched AS (SELECT count(*) AS n FROM (SELECT 1 FROM event_log e, top
                                   WHERE {MATCHES} AND e.seq <= top.seq LIMIT $6) AS m)
                 INSERT INTO event_replays (id, filter, actor, reason, status, matched, until_seq)
                 SELECT $7, $8, $9, $10, 'RUNNING', matched.n, top.seq FROM top, matched
                 RETURNING {COLUMNS}"
            ),
            &[&f.from, &f.to, &f.name, &f.key, &f.failed_only, &cap, &Uuid::now_v7(), r.filter, &r.actor, &r.reason],
        )
        .await?;
    ReplayRow::from_row(&row)
}

pub async fn get(client: &Client, id: Uuid) -> Result<Option<ReplayRow>> {
    let row = client.query_opt(&format!("SELECT {COLUMNS} FROM event_replays WHERE id = $1"), &[&id]).await?;
    row.as_ref().map(ReplayRow::from_row).transpose()
}

/// Cancels a RUNNING replay (waiting for an event being replayed to be
/// committed); the replay as it now stands, or `None` when there is none.
pub async fn cancel(client: &Client, id: Uuid) -> Result<Option<ReplayRow>> {
    client
        .execute(
            "UPDATE event_replays SET status = 'CANCELLED', updated_at = now(), finished_at = now()
              WHERE id = $1 AND status = 'RUNNING'",
            &[&id],
        )
        .await?;
    get(client, id).await
}

/// How long a claim holds a replay for one coordinator without an event
/// replayed: past it, another may take the replay over.
pub const CLAIM: std::time::Duration = std::time::Duration::from_secs(15);

/// Claims a RUNNING replay nobody holds (or whose holder stopped renewing
/// its claim) for [`CLAIM`], in one statement: no transaction stays open
/// while its events are replayed.
pub async fn claim(client: &Client) -> Result<Option<ReplayRow>> {
    let row = client
        .query_opt(
            &format!(
                "UPDATE event_replays SET claimed_until = now() + make_interval(secs => $1)
                  WHERE id = (SELECT id FROM event_replays
                               WHERE status = 'RUNNING' AND (claimed_until IS NULL OR claimed_until < now())
                               ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING {COLUMNS}"
            ),
            &[&CLAIM.as_secs_f64()],
        )
        .await?;
    row.as_ref().map(ReplayRow::from_row).transpose()
}

/// Locks replay `id` in `tx` for the replay of event `seq`: true while it
/// is RUNNING and its cursor is before `seq` (false: cancelled, or the
/// event was replayed by another coordinator that took the replay over).
pub async fn lock_for(tx: &Transaction<'_>, id: Uuid, seq: i64) -> Result<bool> {
    let row = tx
        .query_opt(
            "SELECT 1 FROM event_replays WHERE id = $1 AND status = 'RUNNING' AND cursor < $2 FOR NO KEY UPDATE",
            &[&id, &seq],
        )
        .await?;
    Ok(row.is_some())
}

/// Moves replay `id`'s cursor past event `seq`, counting what replaying
/// it did, and renews the claim (in the event's transaction, after
/// [`lock_for`]; or in one of its own for an event counted failed).
pub async fn looked_at(
    client: &Transaction<'_>,
    id: Uuid,
    seq: i64,
    started: i64,
    failed: i64,
    error: Option<&str>,
) -> Result<()> {
    client
        .execute(
            "UPDATE event_replays
                SET cursor = $2, looked_at = looked_at + 1, started = started + $3, failed = failed + $4,
                    last_error = coalesce($5, last_error), tries = 0, updated_at = now(),
                    claimed_until = now() + make_interval(secs => $6)
              WHERE id = $1 AND cursor < $2",
            &[&id, &seq, &started, &failed, &error, &CLAIM.as_secs_f64()],
        )
        .await?;
    Ok(())
}

/// Records a passing failure of the event after replay `id`'s cursor and
/// lets the replay go (any coordinator takes it again after `wait`); the
/// tries so far.
pub async fn passing_failure(client: &Client, id: Uuid, error: &str, wait: std::time::Duration) -> Result<i32> {
    let row = client
        .query_opt(
            "UPDATE event_replays SET tries = tries + 1, last_error = $2, updated_at = now(),
                    claimed_until = now() + make_interval(secs => $3)
              WHERE id = $1 RETURNING tries",
            &[&id, &error, &wait.as_secs_f64()],
        )
        .await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
}

/// Ends replay `id` (every event it covers looked at), or lets it go for
/// another batch: its claim released either way.
pub async fn release(client: &Client, id: Uuid, done: bool) -> Result<()> {
    client
        .execute(
            "UPDATE event_replays
                SET claimed_until = NULL, updated_at = now(),
                    status = CASE WHEN $2 THEN 'SUCCEEDED' ELSE status END,
                    finished_at = CASE WHEN $2 THEN now() ELSE finished_at END
              WHERE id = $1 AND status = 'RUNNING'",
            &[&id, &done],
        )
        .await?;
    Ok(())
}

/// Locks event `seq` for the rest of the transaction (a sending of it
/// committed, so its row is there unless forgotten since): false when it
/// was forgotten. Replays of the same event wait for each other here.
pub async fn lock_event(tx: &Transaction<'_>, seq: i64) -> Result<bool> {
    Ok(tx.query_opt("SELECT 1 FROM event_log WHERE seq = $1 FOR UPDATE", &[&seq]).await?.is_some())
}

/// What event `seq`'s triggers have done so far, read under its lock.
pub async fn runs_of(tx: &Transaction<'_>, seq: i64) -> Result<Vec<EventRun>> {
    let rows = tx
        .query(
            "SELECT workflow_name, trigger_index, run_id, error, replayed_by, flow, flow_note
               FROM event_runs WHERE event_seq = $1",
            &[&seq],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(EventRun {
                workflow: r.try_get(0)?,
                trigger: r.try_get(1)?,
                run_id: r.try_get(2)?,
                error: r.try_get(3)?,
                replayed_by: r.try_get(4)?,
                flow: r.try_get(5)?,
                flow_note: r.try_get(6)?,
            })
        })
        .collect()
}

/// Records what a replay did with trigger `run.trigger` of event `seq`:
/// its run (with the replay that started it, `run.replayed_by`), or why
/// none, over an earlier failure (never over a run).
pub async fn record(tx: &Transaction<'_>, seq: i64, run: &EventRun) -> Result<()> {
    tx.execute(
        "INSERT INTO event_runs (event_seq, workflow_name, trigger_index, run_id, error, replayed_by, flow, flow_note)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (event_seq, workflow_name, trigger_index) DO UPDATE
            SET run_id = EXCLUDED.run_id, error = EXCLUDED.error, replayed_by = EXCLUDED.replayed_by,
                flow = EXCLUDED.flow, flow_note = EXCLUDED.flow_note
          WHERE event_runs.run_id IS NULL",
        &[&seq, &run.workflow, &run.trigger, &run.run_id, &run.error, &run.replayed_by, &run.flow, &run.flow_note],
    )
    .await?;
    Ok(())
}

/// Deletes replays that ended more than `older_than` ago.
pub async fn cleanup(client: &Client, older_than: std::time::Duration) -> Result<u64> {
    Ok(client
        .execute(
            "DELETE FROM event_replays WHERE status <> 'RUNNING' AND finished_at < now() - make_interval(secs => $1)",
            &[&older_than.as_secs_f64()],
        )
        .await?)
}
