//! The audit log: append-only (a trigger refuses UPDATE and DELETE). A
//! change writes its `requested` row before it is made and its `answered`
//! row after, both under one request id; a reader sees them as one entry.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::{Client, Result};

/// What a request asked, recorded before it is acted on.
pub struct Requested<'a> {
    pub request_id: Uuid,
    pub actor: &'a str,
    pub key_id: Option<Uuid>,
    pub source: &'a str,
    pub method: &'a str,
    pub route: &'a str,
    pub path: &'a str,
    pub body: Option<&'a Value>,
}

pub async fn requested(client: &Client, r: &Requested<'_>) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "INSERT INTO audit_log (request_id, answered, actor, key_id, source, method, route, path, body)
             VALUES ($1, false, $2, $3, $4, $5, $6, $7, $8)",
        )
        .await?;
    client
        .execute(&stmt, &[&r.request_id, &r.actor, &r.key_id, &r.source, &r.method, &r.route, &r.path, &r.body])
        .await?;
    Ok(())
}

/// Records the answer to a request whose `requested` row was written.
pub async fn answered(client: &Client, request_id: Uuid, status: u16, result: Option<&Value>) -> Result<()> {
    let stmt = client
        .prepare_cached(
            "INSERT INTO audit_log (request_id, answered, actor, key_id, source, method, route, path, body, status)
             SELECT request_id, true, actor, key_id, source, method, route, path, $3, $2
             FROM audit_log WHERE request_id = $1 AND NOT answered",
        )
        .await?;
    client.execute(&stmt, &[&request_id, &i32::from(status), &result]).await?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct EntryRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub key_id: Option<Uuid>,
    pub source: String,
    pub method: String,
    pub route: String,
    pub path: String,
    pub request: Option<Value>,
    pub status: Option<i32>,
    pub result: Option<Value>,
}

/// A page of entries older than `before`, newest first, optionally of one
/// actor: each request with its answer, when it has one.
pub async fn page(client: &Client, before: Option<i64>, actor: Option<&str>, limit: i64) -> Result<Vec<EntryRow>> {
    let rows = client
        .query(
            "SELECT q.id, q.at, q.actor, q.key_id, q.source, q.method, q.route, q.path, q.body AS request,
                    a.status, a.body AS result
             FROM audit_log q
             LEFT JOIN audit_log a ON a.request_id = q.request_id AND a.answered
             WHERE NOT q.answered AND ($1::bigint IS NULL OR q.id < $1) AND ($2::text IS NULL OR q.actor = $2)
             ORDER BY q.id DESC LIMIT $3",
            &[&before, &actor, &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(EntryRow {
                id: r.try_get("id")?,
                at: r.try_get("at")?,
                actor: r.try_get("actor")?,
                key_id: r.try_get("key_id")?,
                source: r.try_get("source")?,
                method: r.try_get("method")?,
                route: r.try_get("route")?,
                path: r.try_get("path")?,
                request: r.try_get("request")?,
                status: r.try_get("status")?,
                result: r.try_get("result")?,
            })
        })
        .collect()
}
