//! Replay: the triggers of recorded events run again, as a job, once per
//! event and trigger that has no run yet (after a fix to a definition).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::events::TriggerFailure;

/// Which recorded events a replay looks at: those received in
/// `[from, to)`, narrowed by each other field given.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub key: Option<String>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Only events a trigger of which started no run (listed in the
    /// event's `trigger_errors`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed_only: bool,
}

/// `POST /v1/events/replay`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"filter": {"name": "order.created", "from": "2026-12-01T00:00:00Z",
                                     "to": "2026-12-02T00:00:00Z", "failed_only": true},
                          "reason": "the order workflow's trigger is fixed", "dry_run": true}))]
pub struct ReplayRequest {
    pub filter: ReplayFilter,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
    /// Count the events and show what the first of them would start.
    #[serde(default)]
    pub dry_run: bool,
}

/// What replaying one event would do, as a dry run shows it: the runs its
/// triggers, as they are now, would start, and those that would fail.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReplayPreview {
    pub seq: i64,
    pub name: String,
    pub id: String,
    pub received_at: DateTime<Utc>,
    /// Triggers that fire and have no run for the event yet.
    pub would_start: Vec<ReplayTrigger>,
    pub would_fail: Vec<TriggerFailure>,
    /// Why what it would do is not known (its payload could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A trigger, by its workflow and its place in the latest version's
/// `triggers`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReplayTrigger {
    #[schema(value_type = composer_core::schema::Name)]
    pub workflow: String,
    pub trigger: i32,
    /// Its flow control as the latest version has it, when it has one
    /// (`debounce`, `batch`, `throttle` or `singleton`): the event goes
    /// through it, so it may be held, replaced, dropped or skipped rather
    /// than start a run at once (a key holding events keeps the flow it
    /// held them under until it is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
}

/// A dry run's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReplayDryRun {
    /// Events the filter matches now (counted up to 1,000,000).
    pub matched: i64,
    /// What the first (at most 20) of them would start, as many as 10 s
    /// of working it out reach.
    pub preview: Vec<ReplayPreview>,
    /// The oldest an event in the log can be (`COMPOSER_EVENT_LOG_KEPT`
    /// ago): a replay reaches nothing received before it.
    pub kept_since: DateTime<Utc>,
}

/// A replay and how far it got.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ReplayView {
    pub id: Uuid,
    pub filter: ReplayFilter,
    /// RUNNING, SUCCEEDED (every matching event looked at) or CANCELLED.
    pub status: String,
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Events the filter matched when the replay was created (later ones
    /// are not its).
    pub matched: i64,
    /// Events looked at so far.
    pub looked_at: i64,
    /// Runs the replay started.
    pub started: i64,
    /// Triggers that fired and started no run again (the event lists why).
    pub failed: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}
