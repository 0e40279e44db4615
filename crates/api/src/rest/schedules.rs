//! Schedules and their backfills.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use composer_core::{schedule, schema};

/// A schedule as the API shows it: its spec, and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ScheduleView {
    #[serde(flatten)]
    #[schema(inline)]
    pub spec: schedule::ScheduleSpec,
    pub paused: bool,
    /// The next five fire times (none while paused).
    pub next_fire_times: Vec<DateTime<Utc>>,
    pub last_run_id: Option<Uuid>,
    /// Why the latest fire time started no run, when it could not: its
    /// workflow is not registered, or the definition refused the run (its
    /// tags or keys did not evaluate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire_error: Option<String>,
    /// Backfilled fire times waiting to start (a paused schedule holds them).
    #[serde(default)]
    pub backfill_queued: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `POST /v1/schedules/{id}/backfill`: start the runs the schedule would
/// have started at its fire times in `[from, to)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The first fire time included.
    pub from: DateTime<Utc>,
    /// The end of the range, not included; at most now.
    pub to: DateTime<Utc>,
    /// What each fire time does while a run of the schedule is open; `allow` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<schedule::BackfillOverlap>,
}

/// What a backfill queued: the timer loop starts the runs (each with
/// `trigger.fire_time` and `trigger.backfill`), unless the schedule is paused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct BackfillQueued {
    #[schema(value_type = schema::Name)]
    pub schedule: String,
    /// Fire times of the cron in the range.
    pub fire_times: u64,
    /// Of those, queued now.
    pub queued: u64,
    /// Of those, started, queued or buffered before (asked for again): nothing new.
    pub already: u64,
    pub first_fire_time: Option<DateTime<Utc>>,
    pub last_fire_time: Option<DateTime<Utc>>,
    pub overlap: schedule::BackfillOverlap,
    /// The schedule is paused: the queued fire times start once it is resumed.
    pub paused: bool,
}

/// `GET /v1/schedules`: by id; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SchedulePage {
    pub schedules: Vec<ScheduleView>,
    pub next_after: Option<String>,
}
