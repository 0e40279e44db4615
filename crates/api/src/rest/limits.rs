//! Limits on steps across runs, and why a step waits for them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Why a step waits for its limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HeldView {
    /// The limit key that holds it.
    pub key: String,
    /// `rate` (the bucket is empty), `concurrency` (every slot is taken),
    /// `retry_after` (a target asked for a pause) or `queued` (its turn
    /// comes at the limiter's next pass).
    pub reason: String,
    /// When it may go, where that is known (a rate's next token, a pause's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
}

/// A limit on steps across runs, with its use now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LimitView {
    pub key: String,
    /// `"N/period"`, when it has a rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// `definition` (as the nodes that use it say) or `api` (set by PUT,
    /// which definitions no longer change).
    pub set_by: String,
    /// Tokens in the bucket now (a rate only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<f64>,
    /// Steps of the key sent and not finished.
    pub in_use: i64,
    /// Steps waiting for it.
    pub waiting: i64,
    /// A target's `Retry-After` holds it until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/limits`: limits in key order; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LimitPage {
    pub limits: Vec<LimitView>,
    pub next_after: Option<String>,
}
