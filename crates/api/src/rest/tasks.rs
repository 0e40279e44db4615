//! The task API a worker speaks: poll for leased tasks, heartbeat, then
//! complete or fail each (and take the next with the answer).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::{schema, whole};

use super::runs::default_priority;

/// `POST /v1/tasks/poll`: lease up to `max` tasks of `queues` to
/// `worker_id`, waiting up to `wait` for one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker_id": "resizer-1", "queues": ["images"], "max": 4, "wait": "20s"}))]
pub struct PollTasks {
    /// Who holds the leases: heartbeats, completions and failures name it.
    #[schema(value_type = schema::Name)]
    pub worker_id: String,
    #[schema(value_type = Vec<schema::Name>, min_items = 1, max_items = 32)]
    pub queues: Vec<String>,
    /// At most this many tasks (1 to 100, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 100)]
    pub max: Option<u32>,
    /// Wait up to this long for a task (e.g. `"20s"`; at most `COMPOSER_TASK_POLL_MAX_WAIT`, 60 s by
    /// default, longer is cut to it; default 0: answer at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,5}(ms|s)$")]
    pub wait: Option<String>,
    /// Only tasks sent at this priority or a more urgent one (1 to 5; default 5: any). A worker
    /// polls with `2` for slots it keeps for urgent work, so that a priority-1 or -2 step does not
    /// wait for a backlog's step to free a slot. Such a poll does not look for expired leases or
    /// unacknowledged messages (polls of every priority do), and its `waiting` names only the
    /// priorities it reads.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 5)]
    pub priority_at_most: Option<u8>,
}

/// Tasks leased to a worker by `POST /v1/tasks/poll` (none when none came in time).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TaskBatch {
    pub tasks: Vec<LeasedTask>,
    /// The priorities (1 to 5) at which tasks of the polled queues still
    /// wait after this poll, as far as the coordinator saw; absent when it
    /// does not know. A worker whose slots are all busy may keep one (ask
    /// for a result's `next`) for a run more urgent than all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Vec<u8>>,
}

/// A task leased to a worker: run it, heartbeat while it runs, then
/// complete or fail it, each time naming its `run_id` and `attempt`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LeasedTask {
    pub id: Uuid,
    pub run_id: Uuid,
    pub attempt: i32,
    pub node_id: String,
    pub node_type: String,
    pub queue: String,
    /// The node's evaluated input. Secret references (`${ .secrets.NAME }`)
    /// are left for the worker to resolve from its own environment.
    pub input: Value,
    /// The lease lasts this long from now: heartbeat well within it.
    pub lease_ttl_ms: u64,
    /// The W3C `traceparent` of this attempt's span, for the worker to
    /// continue the trace of the run in what it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")]
    pub traceparent: Option<String>,
    /// The run's priority, 1 (most urgent) to 5. Send it back in the
    /// `composer-priority` header of the task's `complete` or `fail`, so the
    /// result waits for the coordinator's batch at that priority.
    #[serde(default = "default_priority")]
    #[schema(minimum = 1, maximum = 5)]
    pub priority: u8,
    /// When the attempt passed each stage on its way here. Send it back in
    /// the result's `stages`, with `started_at_us` and `finished_at_us` of
    /// the handler, for the attempt's span in the run's trace.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::wire::stage_times")]
    pub stages: Option<crate::wire::StageTimes>,
}

/// The coordinator's answer to a result (`/complete`, `/fail`). An ignored report (duplicate, late,
/// stale) is still a success for the worker: it is done with the task.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ReportAck {
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored: Option<String>,
    /// The tasks leased to the reporting worker with this answer, as its
    /// `next` asked: run each as one a poll leased.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<LeasedTask>,
}

/// `POST /v1/tasks/{id}/heartbeat`: extend the lease.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskHeartbeat {
    #[schema(value_type = schema::Name)]
    pub worker_id: String,
    pub run_id: Uuid,
    #[serde(deserialize_with = "whole::int")]
    pub attempt: i32,
}

/// The lease was extended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LeaseExtended {
    pub lease_ttl_ms: u64,
}

/// `POST /v1/tasks/{id}/complete`: the attempt's output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteTask {
    #[schema(value_type = schema::Name)]
    pub worker_id: String,
    pub run_id: Uuid,
    #[serde(deserialize_with = "whole::int")]
    pub attempt: i32,
    #[serde(default)]
    #[schema(value_type = schema::JsonValue)]
    pub output: Value,
    /// Take the next tasks this result makes ready with the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<TakeNext>,
    /// The leased task's `stages`, with when the handler started and ended
    /// (optional: only the attempt's span in the run's trace shows them).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::wire::stage_times")]
    pub stages: Option<crate::wire::StageTimes>,
}

/// Eager dispatch: up to `max` of the tasks a result makes ready, of
/// `queues`, leased to the reporting worker in the result's own commit and
/// returned in the answer's `next` (instead of through a poll).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"queues": ["images"], "max": 1}))]
pub struct TakeNext {
    #[schema(value_type = Vec<schema::Name>, min_items = 1, max_items = 32)]
    pub queues: Vec<String>,
    /// At most this many (1 to 16, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 16)]
    pub max: Option<u32>,
}

/// `POST /v1/tasks/{id}/fail`: why the attempt failed, and whether a retry may help.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailTask {
    #[schema(value_type = schema::Name)]
    pub worker_id: String,
    pub run_id: Uuid,
    #[serde(deserialize_with = "whole::int")]
    pub attempt: i32,
    #[schema(max_length = 65536, pattern = "^[^\\u0000]*$")]
    pub error: String,
    /// Retry under the node's policy (default); false fails the step for good.
    #[serde(default = "yes")]
    pub retryable: bool,
    /// A stable name for what went wrong, for failure edges to test
    /// (`.nodes.X.error.code`); `task_failed` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
    pub code: Option<String>,
    /// The HTTP status a target answered with, if the failure is one.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 100, maximum = 599)]
    pub status: Option<u16>,
    /// How long the target asked to wait before another try, in
    /// milliseconds (a 429's `Retry-After`; status must be 429). The
    /// node's next attempt waits at least this long, and with
    /// `retry.on_429: respect` its limit keys are held as long.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 0)]
    pub retry_after_ms: Option<u64>,
    /// Take the next tasks this result makes ready (an immediate retry of
    /// this one among them) with the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<TakeNext>,
    /// The leased task's `stages`, with when the handler started and ended
    /// (optional: only the attempt's span in the run's trace shows them).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::wire::stage_times")]
    pub stages: Option<crate::wire::StageTimes>,
}

fn yes() -> bool {
    true
}

/// The longest error a worker may report (`FailTask.error`), in characters.
pub const MAX_ERROR_CHARS: usize = 65_536;

/// Most queues one poll (or a result's `next`) may name.
pub const MAX_POLL_QUEUES: usize = 32;
