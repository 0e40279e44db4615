//! Why a run is where it is, step by step (`GET /v1/runs/{id}/explain`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::machine::{RunStatus, TaskState};
use composer_core::schema;

/// `GET /v1/runs/{id}/explain`: why the run is where it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Explain {
    pub run_id: Uuid,
    pub status: RunStatus,
    /// In words.
    pub summary: String,
    /// Each open step and what it waits for.
    pub nodes: Vec<NodeWait>,
    /// For a QUEUED run: its concurrency key, its open runs, the runs queued before it.
    #[schema(value_type = schema::JsonValue)]
    pub detail: Value,
}

/// What one open step waits for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NodeWait {
    pub node_id: String,
    pub state: TaskState,
    /// `worker`, `limit`, `child_run`, `items`, `event`, `retry`, `timer`, `paused`, `operator`.
    pub waiting_for: String,
    /// In words.
    pub reason: String,
    /// The same as data: the queue and its backlog and readers, the retry
    /// time, the event and whether one is buffered, the child run, …
    #[schema(value_type = schema::JsonValue)]
    pub detail: Value,
}
