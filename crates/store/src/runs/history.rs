//! A run's history (`run_events`) as the API reads it: its lines, and the
//! edges they record the engine took.

use chrono::{DateTime, Utc};
use composer_core::machine::HistoryKind;
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Error, Result};

#[derive(Debug, Clone)]
pub struct HistoryRow {
    pub seq: i64,
    pub kind: HistoryKind,
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
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get("type")?;
            Ok(HistoryRow {
                seq: r.try_get("seq")?,
                kind: HistoryKind::parse(&kind).ok_or_else(|| Error::Corrupt(format!("history kind {kind:?}")))?,
                payload: r.try_get("payload")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .collect()
}

/// The edges the engine took in a run, as its history records them (the
/// first line of a task says which edges it came by): `(task, from, to)`
/// by node id.
pub async fn taken_edges(client: &Client, run_id: Uuid) -> Result<Vec<(Uuid, String, String)>> {
    let stmt = client
        .prepare_cached(
            "SELECT (payload ->> 'task_id')::uuid, v ->> 'from', payload ->> 'node_id'
               FROM run_events, jsonb_array_elements(payload -> 'via') AS v
              WHERE run_id = $1 AND payload ? 'via' AND jsonb_typeof(payload -> 'via') = 'array'
              LIMIT 100000",
        )
        .await?;
    let rows = client.query(&stmt, &[&run_id]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect()
}
