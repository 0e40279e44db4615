//! Moving open runs to another version of their workflow: a dry run's
//! verdict per run, or a bulk job that moves the movable ones.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use composer_core::machine::migrate::Plan;
use composer_core::machine::RunStatus;
use composer_core::schema;

use super::bulk::BulkFilter;

/// `POST /v1/workflows/{name}/migrate`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"from_version": 1, "to_version": 2, "map": {"charge": "charge_card"},
                          "reason": "v1 charges twice", "dry_run": true}))]
pub struct MigrateRequest {
    /// The version whose open runs move.
    #[schema(minimum = 1)]
    pub from_version: i32,
    /// The version they move to (a version of the same workflow).
    #[schema(minimum = 1)]
    pub to_version: i32,
    /// Which of those runs: every field given must hold (its `workflow`,
    /// when given, must be the path's). Every open run of the version without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<BulkFilter>,
    /// A step of `from_version` → the step of `to_version` it becomes; a
    /// step not named keeps its id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = BTreeMap<schema::Name, schema::Name>)]
    pub map: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
    /// Only say, for each run, whether it can move and what would change.
    #[serde(default)]
    pub dry_run: bool,
}

/// A dry run's answer: a verdict for each open run it looked at.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MigrateDryRun {
    pub from_version: i32,
    pub to_version: i32,
    /// Of the runs looked at, how many can move and how many cannot.
    pub movable: i64,
    pub unmovable: i64,
    /// Oldest first, at most 1,000.
    pub runs: Vec<RunVerdict>,
    /// More runs match than were looked at: the job looks at them all.
    pub truncated: bool,
}

/// Whether one run can move, and what would change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RunVerdict {
    pub run_id: Uuid,
    pub status: RunStatus,
    pub movable: bool,
    #[serde(flatten)]
    pub plan: Plan,
}
