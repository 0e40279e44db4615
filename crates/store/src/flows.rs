//! A trigger's flow control per key (`trigger_flows`): one row per
//! (workflow, trigger, key), locked by the transaction that records an
//! event of the key ([`lock`], an upsert) or by the timer loop's when it is
//! due ([`lock_due`], `SKIP LOCKED`), and written back ([`save`]) in the
//! commit that starts the runs it decided. The events a key holds are rows
//! of their own (`trigger_flow_events`), so that each event adds one row
//! rather than rewriting the key's whole list. Runs a singleton cancels are
//! kept in `trigger_cancels` from that commit until they are cancelled.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Result, Transaction};

/// A trigger's key: the row's primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowKey {
    pub workflow: String,
    pub trigger: i32,
    /// The trigger's event name.
    pub event: String,
    pub key: String,
}

/// What a key holds, as its row keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub opened_at: DateTime<Utc>,
    pub due_at: DateTime<Utc>,
    pub count: i32,
    /// `[{seq, event_id, input, idempotency_key?}]`, in the order the key
    /// took them in.
    pub events: Value,
}

/// A key's row, locked.
#[derive(Debug, Clone)]
pub struct Locked {
    /// The transaction's clock (the database's): every coordinator's
    /// decisions about a key are timed by the one clock.
    pub now: DateTime<Utc>,
    /// How its events were held when it was last written.
    pub hold: Option<Value>,
    pub held: Option<Held>,
    pub last_run: Option<Uuid>,
}

/// The locked row `r` of `k`, with the events it holds. They are read by a
/// statement of their own, once the row is locked: a statement sees what
/// was committed when it began, so the one that waited for the lock would
/// not see the rows the transaction it waited for added or deleted (the
/// row itself it sees as that transaction left it).
async fn locked(tx: &Transaction<'_>, k: &FlowKey, r: &tokio_postgres::Row) -> Result<Locked> {
    let opened_at: Option<DateTime<Utc>> = r.try_get("opened_at")?;
    let due_at: Option<DateTime<Utc>> = r.try_get("due_at")?;
    let held = match (opened_at, due_at) {
        (Some(opened_at), Some(due_at)) => {
            let events = tx
                .query_one(
                    "SELECT coalesce(jsonb_agg(event ORDER BY pos), '[]') FROM trigger_flow_events
                      WHERE workflow_name = $1 AND trigger_index = $2 AND event_name = $3 AND key = $4",
                    &[&k.workflow, &k.trigger, &k.event, &k.key],
                )
                .await?
                .try_get(0)?;
            Some(Held { opened_at, due_at, count: r.try_get("count")?, events })
        }
        _ => None,
    };
    Ok(Locked { now: r.try_get("now")?, hold: r.try_get("hold")?, held, last_run: r.try_get("last_run")? })
}

/// `now`: when the lock was had (a transaction that waited for it times
/// the key from then, not from its own start).
const COLUMNS: &str = "clock_timestamp() AS now, hold, opened_at, due_at, count, last_run";

/// Locks `k`'s row for the transaction, made empty when the key has none.
pub async fn lock(tx: &Transaction<'_>, k: &FlowKey) -> Result<Locked> {
    // An upsert locks the row whether it was there or not, and waits for a
    // delete under way: two events of a key are worked one after the other.
    let row = tx
        .query_one(
            &format!(
                "INSERT INTO trigger_flows (workflow_name, trigger_index, event_name, key) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (workflow_name, trigger_index, event_name, key) DO UPDATE SET key = EXCLUDED.key
                 RETURNING {COLUMNS}"
            ),
            &[&k.workflow, &k.trigger, &k.event, &k.key],
        )
        .await?;
    locked(tx, k, &row).await
}

/// Keys whose time has come, oldest first, up to `limit`.
pub async fn due(client: &Client, limit: i64) -> Result<Vec<FlowKey>> {
    let rows = client
        .query(
            "SELECT workflow_name, trigger_index, event_name, key FROM trigger_flows
              WHERE due_at <= now() ORDER BY due_at LIMIT $1",
            &[&limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(FlowKey { workflow: r.try_get(0)?, trigger: r.try_get(1)?, event: r.try_get(2)?, key: r.try_get(3)? })
        })
        .collect()
}

/// Locks `k`'s row if it is still due and no one else holds it.
pub async fn lock_due(tx: &Transaction<'_>, k: &FlowKey) -> Result<Option<Locked>> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT {COLUMNS} FROM trigger_flows
                  WHERE workflow_name = $1 AND trigger_index = $2 AND event_name = $3 AND key = $4
                    AND due_at <= now()
                  FOR UPDATE SKIP LOCKED"
            ),
            &[&k.workflow, &k.trigger, &k.event, &k.key],
        )
        .await?;
    match row {
        Some(row) => Ok(Some(locked(tx, k, &row).await?)),
        None => Ok(None),
    }
}

/// Writes back what `k` holds, and the last run it started; the row goes
/// when it holds nothing and names no run. `kept`: the `seq`s of the events
/// it held when it was locked; only the difference is written.
pub async fn save(
    tx: &Transaction<'_>,
    k: &FlowKey,
    hold: Option<&Value>,
    singleton: Option<&str>,
    held: Option<&Held>,
    last_run: Option<Uuid>,
    kept: &[i64],
) -> Result<()> {
    if held.is_none() && last_run.is_none() {
        tx.execute(
            "DELETE FROM trigger_flows WHERE workflow_name = $1 AND trigger_index = $2 AND event_name = $3 AND key = $4",
            &[&k.workflow, &k.trigger, &k.event, &k.key],
        )
        .await?;
        return Ok(());
    }
    tx.execute(
        "UPDATE trigger_flows SET hold = $5, singleton = $6, opened_at = $7, due_at = $8, count = $9, last_run = $10
          WHERE workflow_name = $1 AND trigger_index = $2 AND event_name = $3 AND key = $4",
        &[
            &k.workflow,
            &k.trigger,
            &k.event,
            &k.key,
            &hold,
            &singleton,
            &held.map(|h| h.opened_at),
            &held.map(|h| h.due_at),
            &held.map_or(0, |h| h.count),
            &last_run,
        ],
    )
    .await?;
    let events = held.and_then(|h| h.events.as_array()).map_or(&[][..], Vec::as_slice);
    save_events(tx, k, events, kept).await
}

/// Deletes the rows of the events `k` no longer holds and adds those of the
/// events it holds now that it did not (`kept`: the ones it held).
async fn save_events(tx: &Transaction<'_>, k: &FlowKey, events: &[Value], kept: &[i64]) -> Result<()> {
    let seq_of = |e: &Value| e.get("seq").and_then(Value::as_i64);
    if let Some(e) = events.iter().find(|e| seq_of(e).is_none()) {
        return Err(crate::Error::Corrupt(format!("a held event with no seq: {e}")));
    }
    let now: HashSet<i64> = events.iter().filter_map(seq_of).collect();
    let gone: Vec<i64> = kept.iter().copied().filter(|s| !now.contains(s)).collect();
    if !gone.is_empty() {
        tx.execute(
            "DELETE FROM trigger_flow_events
              WHERE workflow_name = $1 AND trigger_index = $2 AND event_name = $3 AND key = $4 AND seq = ANY($5)",
            &[&k.workflow, &k.trigger, &k.event, &k.key, &gone],
        )
        .await?;
    }
    // Each new one once: a row already there that `kept` did not name is
    // an error (the primary key's), not passed over.
    let mut seen: HashSet<i64> = kept.iter().copied().collect();
    let added: Vec<&Value> = events.iter().filter(|e| seq_of(e).is_some_and(|s| seen.insert(s))).collect();
    if !added.is_empty() {
        let seqs: Vec<i64> = added.iter().filter_map(|e| seq_of(e)).collect();
        // In the order they are held (`pos`, from a sequence: a later
        // transaction of the key, which waited for this one's lock, takes
        // later numbers).
        tx.execute(
            "INSERT INTO trigger_flow_events (workflow_name, trigger_index, event_name, key, seq, event)
             SELECT $1, $2, $3, $4, s, e FROM unnest($5::bigint[], $6::jsonb[]) WITH ORDINALITY AS a(s, e, i)
              ORDER BY i",
            &[&k.workflow, &k.trigger, &k.event, &k.key, &seqs, &added],
        )
        .await?;
    }
    Ok(())
}

/// Whether run `id` has not ended (and is still there).
pub async fn is_running(tx: &Transaction<'_>, id: Uuid) -> Result<bool> {
    let row = tx
        .query_opt(
            "SELECT 1 FROM workflow_runs WHERE id = $1 AND status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')",
            &[&id],
        )
        .await?;
    Ok(row.is_some())
}

/// Forgets up to `limit` rows that hold nothing and whose last run ended
/// (or is gone): a singleton's key with nothing running.
pub async fn forget_idle(client: &mut Client, limit: i64) -> Result<u64> {
    let tx = client.transaction().await?;
    // Locked first; then looked at again under the lock, by a statement of
    // its own (a fresh snapshot): an event that started a run for the key
    // in between is seen, and its row kept.
    let rows = tx
        .query(
            "SELECT workflow_name, trigger_index, event_name, key FROM trigger_flows WHERE due_at IS NULL
              LIMIT $1 FOR UPDATE SKIP LOCKED",
            &[&limit],
        )
        .await?;
    let (mut workflows, mut triggers, mut events, mut keys) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        workflows.push(r.try_get::<_, String>(0)?);
        triggers.push(r.try_get::<_, i32>(1)?);
        events.push(r.try_get::<_, String>(2)?);
        keys.push(r.try_get::<_, String>(3)?);
    }
    let gone = tx
        .execute(
            "DELETE FROM trigger_flows g
              WHERE (workflow_name, trigger_index, event_name, key) IN
                    (SELECT * FROM unnest($1::text[], $2::int4[], $3::text[], $4::text[]))
                AND g.due_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.id = g.last_run
                                   AND r.status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED'))",
            &[&workflows, &triggers, &events, &keys],
        )
        .await?;
    tx.commit().await?;
    Ok(gone)
}

/// Puts `k` off by `by` when working it failed, so that it does not hold
/// the head of the timer's queue.
pub async fn put_off(client: &Client, k: &FlowKey, by: std::time::Duration) -> Result<()> {
    client
        .execute(
            "UPDATE trigger_flows SET due_at = now() + make_interval(secs => $5)
              WHERE workflow_name = $1 AND trigger_index = $2 AND event_name = $3 AND key = $4
                AND due_at IS NOT NULL",
            &[&k.workflow, &k.trigger, &k.event, &k.key, &by.as_secs_f64()],
        )
        .await?;
    Ok(())
}

/// Notes, in the commit that starts its successor, that run `id` is to be
/// cancelled.
pub async fn cancel_later(tx: &Transaction<'_>, id: Uuid) -> Result<()> {
    tx.execute("INSERT INTO trigger_cancels (run_id) VALUES ($1) ON CONFLICT DO NOTHING", &[&id]).await?;
    Ok(())
}

/// Runs noted to be cancelled more than `older_than` ago (left by a
/// coordinator that died before it cancelled them), up to `limit`.
pub async fn cancels_left(client: &Client, older_than: std::time::Duration, limit: i64) -> Result<Vec<Uuid>> {
    let secs = older_than.as_secs_f64();
    let rows = client
        .query(
            "SELECT run_id FROM trigger_cancels WHERE written_at <= now() - make_interval(secs => $1)
              ORDER BY written_at LIMIT $2",
            &[&secs, &limit],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Run `id` was cancelled (or had ended).
pub async fn cancelled(client: &Client, id: Uuid) -> Result<()> {
    client.execute("DELETE FROM trigger_cancels WHERE run_id = $1", &[&id]).await?;
    Ok(())
}

/// Names, in the record of each of `seqs` for the trigger, the run their
/// events started, or why none did.
pub async fn note_events(
    tx: &Transaction<'_>,
    seqs: &[i64],
    workflow: &str,
    trigger: i32,
    run_id: Option<Uuid>,
    error: Option<&str>,
    note: Option<&str>,
) -> Result<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    tx.execute(
        "UPDATE event_runs SET run_id = $4, error = $5, flow_note = $6
          WHERE event_seq = ANY($1) AND workflow_name = $2 AND trigger_index = $3",
        &[&seqs, &workflow, &trigger, &run_id, &error, &note],
    )
    .await?;
    Ok(())
}
