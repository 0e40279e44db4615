//! Bulk jobs: one control action applied to every run a filter matches.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::machine::RunStatus;
use composer_core::schema;

/// Which runs a bulk action is for: every field given must hold.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::Name>)]
    pub workflow: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// Runs with every one of these tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::TagFilter>)]
    pub tags: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
}

/// What a bulk job does to each run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BulkAction {
    Cancel,
    Retry,
    Pause,
    Resume,
    Rerun,
    /// Moves runs to another version (started by `POST /v1/workflows/{name}/migrate`).
    Migrate,
}

impl BulkAction {
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Cancel => "cancel",
            BulkAction::Retry => "retry",
            BulkAction::Pause => "pause",
            BulkAction::Resume => "resume",
            BulkAction::Rerun => "rerun",
            BulkAction::Migrate => "migrate",
        }
    }
}

/// `POST /v1/runs/bulk`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"filter": {"workflow": "order", "status": "FAILED", "tags": {"customer": "42"}},
                          "action": "retry", "reason": "the bank is back", "dry_run": true}))]
pub struct BulkRequest {
    pub filter: BulkFilter,
    pub action: BulkAction,
    /// With `rerun`: the steps each run runs again from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<schema::Name>>)]
    pub from: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
    /// Only count the runs the filter matches.
    #[serde(default)]
    pub dry_run: bool,
}

/// A dry run's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct BulkDryRun {
    /// Runs the filter matches now (counted up to 1,000,000).
    pub matched: i64,
}

/// A bulk job and how it stands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct BulkJobView {
    pub id: Uuid,
    pub action: BulkAction,
    pub filter: BulkFilter,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<String>>,
    /// A migrate job's versions and mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrate: Option<MigrateTarget>,
    /// RUNNING, SUCCEEDED (every matching run looked at) or CANCELLED.
    pub status: String,
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Runs the filter matched when the job was created.
    pub matched: i64,
    /// Runs looked at so far, of which it acted on `acted_on`; the others'
    /// state refused the action (a retry of a run that had not failed).
    pub looked_at: i64,
    pub acted_on: i64,
    pub refused: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// What a migrate job moves runs to, as its job shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MigrateTarget {
    pub from_version: i32,
    pub to_version: i32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub map: BTreeMap<String, String>,
}
