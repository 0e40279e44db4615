//! What an operator sends to mend a run: run it again from some steps,
//! end a step by hand, say how an IN_DOUBT attempt ended.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use composer_core::schema;

/// `POST /v1/runs/{id}/rerun`: run again from these steps.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
// `greet`: the node of the document's example workflow, so that the example
// reruns a real step of a run of it.
#[schema(example = json!({"from": ["greet"], "reason": "the greeting was wrong"}))]
pub struct RerunRun {
    /// Node ids (a MAP item: `ship_each[3]`): each and everything after it
    /// runs again.
    #[schema(min_items = 1, max_items = 100)]
    pub from: Vec<String>,
    /// The run's new input (default: the one it has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub input: Option<Value>,
    /// A SUCCEEDED run is rerun only with this.
    #[serde(default)]
    pub allow_completed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// `POST /v1/runs/{id}/tasks/{node}/complete`: end a step with this output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"output": {"id": "ch_1"}, "reason": "charged by hand"}))]
pub struct CompleteStep {
    #[schema(value_type = schema::JsonValue)]
    pub output: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// `POST /v1/runs/{id}/tasks/{node}/resolve`: how an IN_DOUBT attempt ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"outcome": "completed", "output": {"charge_id": "ch_1"}}))]
pub struct ResolveTask {
    pub outcome: ResolveOutcome,
    /// With `completed`: the step's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub output: Option<Value>,
    /// With `failed`: the step's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 65536, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// What became of an IN_DOUBT attempt.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResolveOutcome {
    /// It took effect: the step completes with `output`.
    Completed,
    /// It did not, for good: the step fails with `error`.
    Failed,
    /// Send it again: a new attempt, under the same idempotency key.
    Retry,
}
