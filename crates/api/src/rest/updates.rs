//! Updates: a request sent to a running run, taken by a waiting step that
//! accepts it (validated there) and answered with the step's output or the
//! reason it refused, once per update id.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use composer_core::schema;

/// `POST /v1/runs/{id}/update`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "approve", "payload": {"by": "ada", "amount": 120}, "id": "approve-order-42"}))]
pub struct UpdateRequest {
    /// The update's name: a waiting step whose `updates` names it takes it.
    #[schema(value_type = schema::Name)]
    pub name: String,
    #[serde(default)]
    #[schema(value_type = schema::JsonValue)]
    pub payload: Value,
    /// The caller's id for the update: sent again with the same id, it is
    /// answered what the first sending was, and applied once (one is made
    /// without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub id: Option<String>,
    /// How long to wait for a step that accepts it to be waiting (`10s` by
    /// default, at most `60s`; `0s` answers at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\\u0000]*$", example = "10s")]
    pub timeout: Option<String>,
}

/// What a run's step answered to an update.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct UpdateAnswer {
    pub id: String,
    pub name: String,
    /// The step that took it.
    pub node: String,
    /// True: the step accepted it and completed with `output`; false: it
    /// refused, and `reason` says why.
    pub accepted: bool,
    /// The step's output (absent when refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The update was answered before (this id): nothing was done again.
    pub duplicate: bool,
}
