//! The REST API's request and response bodies, shared by the coordinator
//! that serves them and by every client (the CLI, the bench, the test kit),
//! so a field is named in one place.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::machine::{ErrorInfo, HistoryKind, MapProgress, RunStatus, TaskState};
use composer_core::{schedule, schema, whole};

/// `POST /v1/runs`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"workflow": "example", "input": {"name": "Ada"}}))]
pub struct StartRun {
    #[schema(value_type = schema::Name)]
    pub workflow: String,
    /// The latest version without it.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1)]
    pub version: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub input: Option<Value>,
    /// A second start with the same key returns the first run (200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub idempotency_key: Option<String>,
    /// Tags of the run, `{key: text}`, besides its definition's (these win
    /// on a key both have); at most 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::RunTags>)]
    pub tags: Option<serde_json::Map<String, Value>>,
    /// Its priority, 1 (served first) to 5 (last), instead of its definition's.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 5)]
    pub priority: Option<u8>,
}

/// `PUT /v1/runs/{id}/priority`: the run's new priority.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPriority {
    /// 1 (served first) to 5 (last).
    #[serde(deserialize_with = "whole::int")]
    #[schema(minimum = 1, maximum = 5)]
    pub priority: u8,
}

/// The body of a control action (cancel, retry, pause, resume): why, for
/// the run's history (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlRun {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

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
}

impl BulkAction {
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Cancel => "cancel",
            BulkAction::Retry => "retry",
            BulkAction::Pause => "pause",
            BulkAction::Resume => "resume",
            BulkAction::Rerun => "rerun",
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
}

/// How a webhook's deliveries are signed: HMAC-SHA256 with the webhook's secret.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookScheme {
    /// `Stripe-Signature: t=TIMESTAMP,v1=HEX[,v1=HEX]` over `TIMESTAMP.BODY`; the
    /// timestamp must be within the tolerance.
    Stripe,
    /// `X-Hub-Signature-256: sha256=HEX` over the body (no timestamp: a
    /// delivery is named by a digest of its body, so a replay is the same event).
    Github,
}

/// A webhook: `POST /v1/webhooks/{name}` turns each delivery whose signature
/// holds into an event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    #[schema(value_type = schema::Name)]
    pub name: String,
    pub scheme: WebhookScheme,
    /// The name of the signing secret: each coordinator reads it from its
    /// environment variable `COMPOSER_WEBHOOK_SECRET_<secret>`; it is never
    /// stored or shown.
    #[schema(pattern = "^[A-Z0-9_]{1,64}$")]
    pub secret: String,
    /// How far a delivery's signed timestamp may be from now (`stripe`):
    /// `"5m"` by default, at most `"1h"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,9}(ms|s|m|h)$")]
    pub tolerance: Option<String>,
    /// The event, a template over `{body, headers}` (the body as JSON, the
    /// headers by lower-case name) yielding `{name, key?, id?, payload?}`. By
    /// default `{name: <the webhook's name>, id: <the delivery's id>, payload: .body}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub event: Option<Value>,
}

/// A webhook as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct WebhookView {
    #[serde(flatten)]
    #[schema(inline)]
    pub spec: WebhookSpec,
    /// Where the other service sends its deliveries: this path, on the
    /// address by which it reaches a coordinator.
    pub url: String,
    /// Whether this coordinator has the secret's variable set (deliveries
    /// are refused with 503 until it has).
    pub secret_set: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/webhooks`: every webhook, by name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
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
}

/// A trigger that matched an event but started no run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct TriggerFailure {
    #[schema(value_type = schema::Name)]
    pub workflow: String,
    pub trigger: i32,
    pub error: String,
}

/// A run; `tasks` only where one run is asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RunView {
    pub id: Uuid,
    pub workflow: String,
    pub version: i32,
    pub workflow_id: Uuid,
    pub status: RunStatus,
    /// Absent in lists: read the run for its input and output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Its tags, `{key: text}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::HashMap<String, String>>)]
    pub tags: Option<Value>,
    /// What started the run when not an API call: `{"schedule", "fire_time"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Value>,
    /// A SUB_WORKFLOW's child run: the run and task that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    /// A LOOP's child run: the iteration it is (from 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_iteration: Option<i32>,
    /// A failure handler's run: the run whose end started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handles_run_id: Option<Uuid>,
    /// The failure handler runs this run's ends started (where one run is
    /// asked for), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_handler_run_ids: Option<Vec<Uuid>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<TaskView>>,
    /// The OpenTelemetry trace its spans go to (32 hex digits): its own id,
    /// or the trace of the `traceparent` it was started under. (Read as
    /// empty from a coordinator older than traces.)
    #[serde(default)]
    #[schema(required = true, pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
    /// 1 (served first) to 5 (last): its steps' and its queued start's.
    /// (Read as 3 from a coordinator older than priorities.)
    #[serde(default = "default_priority")]
    #[schema(required = true, minimum = 1, maximum = 5)]
    pub priority: u8,
    /// Whose work it is: runs and steps of different keys take turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
}

fn default_priority() -> u8 {
    composer_core::priority::DEFAULT
}

impl RunView {
    /// The task of node `node_id`, if one was created.
    pub fn task(&self, node_id: &str) -> Option<&TaskView> {
        self.tasks.as_deref()?.iter().find(|t| t.node_id == node_id)
    }
}

/// One task of a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TaskView {
    pub id: Uuid,
    pub node_id: String,
    pub node_type: String,
    pub state: TaskState,
    pub attempt: i32,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    /// What a failure edge can test of its failure (`.nodes.X.error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_info: Option<ErrorInfo>,
    pub wake_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// A MAP item's MAP task and position (`node_id` is `ship_each[3]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_index: Option<i32>,
    /// A MAP task's item counts: `{total, queued, open, completed, failed}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<MapProgress>,
    /// A PENDING step its limits hold back (not sent to a worker yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldView>,
}

/// Why a step waits for its limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HeldView {
    /// The limit key that holds it.
    pub key: String,
    /// `rate` (the bucket is empty), `concurrency` (every slot is taken),
    /// `retry_after` (a target asked for a pause) or `queued` (its turn
    /// comes at the limiter's next pass).
    pub reason: String,
    /// When it may go, where that is known (a rate's next token, a pause's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
}

/// A limit on steps across runs, with its use now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LimitView {
    pub key: String,
    /// `"N/period"`, when it has a rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// `definition` (as the nodes that use it say) or `api` (set by PUT,
    /// which definitions no longer change).
    pub set_by: String,
    /// Tokens in the bucket now (a rate only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<f64>,
    /// Steps of the key sent and not finished.
    pub in_use: i64,
    /// Steps waiting for it.
    pub waiting: i64,
    /// A target's `Retry-After` holds it until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/limits`: limits in key order; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LimitPage {
    pub limits: Vec<LimitView>,
    pub next_after: Option<String>,
}

/// `GET /v1/runs/{id}/items?node=…`: a MAP's items by index; `next_after`
/// fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ItemPage {
    pub items: Vec<TaskView>,
    pub next_after: Option<i32>,
}

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

/// `GET /v1/runs`: newest first; `next_cursor` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    pub next_cursor: Option<String>,
}

/// One line of a run's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HistoryEntryView {
    pub seq: i64,
    #[serde(rename = "type")]
    pub kind: HistoryKind,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/runs/{id}/events`: oldest first; `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HistoryPage {
    pub events: Vec<HistoryEntryView>,
    pub next_after: Option<i64>,
}

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

/// `POST /v1/tasks/{id}/logs`: lines of the attempt this worker holds the
/// lease of, kept with the attempt (the step's logs in the API and the UI).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskLogs {
    #[schema(value_type = schema::Name)]
    pub worker_id: String,
    pub run_id: Uuid,
    #[serde(deserialize_with = "whole::int")]
    pub attempt: i32,
    /// 1 to 100 lines, each at most 4,096 bytes (a longer one is cut, and
    /// says so); an attempt keeps at most `COMPOSER_TASK_LOG_MAX_BYTES`, a
    /// run `COMPOSER_RUN_LOG_MAX_BYTES`.
    #[schema(min_items = 1, max_items = 100)]
    pub lines: Vec<String>,
}

/// What was kept of the lines sent: those past the attempt's budget are
/// dropped (the log then ends with a line that says so).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LogsAccepted {
    pub accepted: u32,
    pub dropped: u32,
}

/// One line of a step's log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LogLineView {
    pub seq: i32,
    /// The worker that sent it (a lease taken over continues the attempt).
    pub worker_id: String,
    /// When the coordinator stored it.
    pub at: DateTime<Utc>,
    pub line: String,
}

/// How many lines an attempt of a step has.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct AttemptLines {
    pub attempt: i32,
    pub lines: i64,
}

/// `GET /v1/runs/{id}/tasks/{node}/logs`: a page of one attempt's lines
/// (the step's current attempt unless `?attempt=` says), oldest first;
/// `next_after` fetches the next page.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct StepLogs {
    pub attempt: i32,
    /// Every attempt of the step that has lines.
    pub attempts: Vec<AttemptLines>,
    pub lines: Vec<LogLineView>,
    pub next_after: Option<i32>,
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

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, for programs: `invalid_request`, `not_found`, `unauthorized` …
    pub code: String,
    /// For people: names the field or the thing concerned.
    pub message: String,
}

/// The error code of a 404 that means the run (and so its task) does not
/// exist: a worker drops a report only on this code.
pub const RUN_NOT_FOUND: &str = "run_not_found";

/// The error code of a 409 that means the reporting worker does not hold
/// the task's lease (it expired and was taken over, or the task ended): the
/// result will never be applied, so the worker drops it.
pub const LEASE_LOST: &str = "lease_lost";

/// The longest error a worker may report (`FailTask.error`), in characters.
pub const MAX_ERROR_CHARS: usize = 65_536;

/// Most queues one poll (or a result's `next`) may name.
pub const MAX_POLL_QUEUES: usize = 32;

/// Most log lines one call (`POST /v1/tasks/{id}/logs`) may send.
pub const MAX_LOG_LINES: usize = 100;

/// The longest log line a coordinator keeps, in bytes: it cuts a longer
/// one and says so; a worker cuts before it sends.
pub const MAX_LOG_LINE_BYTES: usize = 4096;
