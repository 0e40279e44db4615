//! Events: what is sent, what it completed and started, and the event log.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::schema;

/// `POST /v1/events`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "approved", "key": "order-42", "payload": {"by": "ada"}}))]
pub struct SendEvent {
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub name: String,
    /// Which waiting runs it is for: those whose `key` evaluated to this
    /// (`""` by default: an event only triggers start runs from).
    #[serde(default)]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub key: String,
    #[serde(default)]
    #[schema(value_type = schema::JsonValue)]
    pub payload: Value,
    /// The sender's id for the event: an event sent again with the same
    /// name and id (within a week) is recorded once and starts nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub id: Option<String>,
}

/// What `POST /v1/events` did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct EventSent {
    /// Waiting tasks the event completed.
    pub matched: usize,
    /// No task waited: the event is kept for one to come.
    pub buffered: bool,
    /// The event's id: the sender's, or one made for it.
    #[serde(default)]
    pub id: String,
    /// Waiting steps the event completed (as `matched`).
    #[serde(default)]
    pub delivered_to_waiters: usize,
    /// The runs its workflows' triggers started (for a duplicate, those the
    /// first sending started).
    #[serde(default)]
    pub started_runs: Vec<TriggeredRun>,
    /// Triggers that matched but started no run, and why.
    #[serde(default)]
    pub trigger_errors: Vec<TriggerFailure>,
    /// An event of this name and id was recorded before: nothing was done again.
    #[serde(default)]
    pub duplicate: bool,
    /// Triggers whose flow control took the event without starting a run
    /// for it now: held for a later run, replaced by a later event, or
    /// dropped, and why.
    #[serde(default)]
    pub held: Vec<TriggerHeld>,
}

/// A recorded event, with what its triggers did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct EventView {
    pub seq: i64,
    pub name: String,
    pub id: String,
    pub key: String,
    /// `null` when `payload_omitted`.
    #[schema(value_type = schema::JsonValue)]
    pub payload: Value,
    /// The payload's size, as JSON text.
    pub payload_bytes: i64,
    /// The payload is over 64 KiB and left out of lists.
    pub payload_omitted: bool,
    /// `api`, or `webhook:NAME`.
    pub source: String,
    pub delivered_to_waiters: i32,
    pub started_runs: Vec<TriggeredRun>,
    pub trigger_errors: Vec<TriggerFailure>,
    /// Triggers whose flow control holds the event, replaced it or dropped
    /// it (once its run starts, the run is in `started_runs`).
    #[serde(default)]
    pub held: Vec<TriggerHeld>,
    pub received_at: DateTime<Utc>,
}

/// `GET /v1/events`: newest first; `next_before` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct EventPage {
    pub events: Vec<EventView>,
    pub next_before: Option<i64>,
}

/// A run an event's trigger started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TriggeredRun {
    #[schema(value_type = schema::Name)]
    pub workflow: String,
    /// The trigger's place in the definition's `triggers`.
    pub trigger: i32,
    pub run_id: Uuid,
    /// The replay that started it (`POST /v1/events/replay`); absent when
    /// the event's sending did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_by: Option<Uuid>,
}

/// What a trigger's flow control did with an event that has no run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TriggerHeld {
    #[schema(value_type = schema::Name)]
    pub workflow: String,
    pub trigger: i32,
    /// `debounce`, `batch`, `throttle` or `singleton`.
    pub flow: String,
    /// What became of the event: held until when, replaced by which event,
    /// or dropped, and why.
    pub note: String,
}

/// A trigger that matched an event but started no run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TriggerFailure {
    #[schema(value_type = schema::Name)]
    pub workflow: String,
    pub trigger: i32,
    pub error: String,
}
