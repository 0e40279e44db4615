//! Workflow definitions and their versions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A workflow definition version; `spec` and `versions` where one workflow
/// is asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct DefinitionView {
    pub id: Uuid,
    pub name: String,
    pub version: i32,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<composer_core::definition::WorkflowSpec>)]
    pub spec: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(no_recursion)]
    pub versions: Option<Vec<DefinitionView>>,
    /// More versions: pass it as `?before=` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions_next: Option<i32>,
}

/// `GET /v1/workflows`: the latest version of each.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct WorkflowList {
    pub workflows: Vec<DefinitionView>,
}
