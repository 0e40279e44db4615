//! Who may call what: API keys and their scopes, and the audit log of
//! every change made through the API.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::{schema, whole};

/// What a key may do. Every route of the API needs exactly one scope (the
/// OpenAPI document names it as the operation's `x-composer-scope`);
/// `admin` holds every scope but `tasks:work` and `metrics:read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum Scope {
    /// Read runs, their steps, logs and history, definitions, schedules,
    /// webhooks, limits, events and bulk jobs.
    #[serde(rename = "read")]
    Read,
    /// Start runs and act on them: cancel, retry, pause, resume, priority,
    /// rerun, complete a step, resolve, bulk actions.
    #[serde(rename = "runs:control")]
    RunsControl,
    /// Register workflow definitions.
    #[serde(rename = "workflows:write")]
    WorkflowsWrite,
    /// Send events.
    #[serde(rename = "events:send")]
    EventsSend,
    /// Create, change, trigger, backfill and delete schedules.
    #[serde(rename = "schedules:write")]
    SchedulesWrite,
    /// Create and delete webhooks.
    #[serde(rename = "webhooks:write")]
    WebhooksWrite,
    /// Set and delete limits.
    #[serde(rename = "limits:write")]
    LimitsWrite,
    /// Decide the approvals assigned to you, or to a group of yours (an
    /// administrator may decide for an assignee, recorded as such).
    #[serde(rename = "approvals:decide")]
    ApprovalsDecide,
    /// Work queues as a worker: poll, heartbeat, log, complete, fail (only
    /// the key's queues, when it names some).
    #[serde(rename = "tasks:work")]
    TasksWork,
    /// Read `/metrics`.
    #[serde(rename = "metrics:read")]
    MetricsRead,
    /// Every scope under `/v1` but `tasks:work`, keys and the audit log
    /// included: working queues and reading `/metrics` are roles of their own.
    #[serde(rename = "admin")]
    Admin,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub const ALL: [Scope; 11] = [
        Scope::Read,
        Scope::RunsControl,
        Scope::WorkflowsWrite,
        Scope::EventsSend,
        Scope::SchedulesWrite,
        Scope::WebhooksWrite,
        Scope::LimitsWrite,
        Scope::ApprovalsDecide,
        Scope::TasksWork,
        Scope::MetricsRead,
        Scope::Admin,
    ];

    /// The scope's name, as keys, answers and the document spell it.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::RunsControl => "runs:control",
            Scope::WorkflowsWrite => "workflows:write",
            Scope::EventsSend => "events:send",
            Scope::SchedulesWrite => "schedules:write",
            Scope::WebhooksWrite => "webhooks:write",
            Scope::LimitsWrite => "limits:write",
            Scope::ApprovalsDecide => "approvals:decide",
            Scope::TasksWork => "tasks:work",
            Scope::MetricsRead => "metrics:read",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `POST /v1/keys`: a new key. The key itself is made by the coordinator
/// and shown once, in the answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "billing-deployer", "scopes": ["workflows:write", "runs:control"], "expires_in": "90d"}))]
pub struct CreateKey {
    /// Who the key is: the actor that runs' history and the audit log name.
    #[schema(value_type = schema::Name)]
    pub name: String,
    #[schema(min_items = 1, max_items = 11)]
    pub scopes: Vec<Scope>,
    /// With `tasks:work`: the only queues the key may poll (any, when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<schema::Name>>, min_items = 1, max_items = 32)]
    pub queues: Option<Vec<String>>,
    /// How long the key lasts, in one unit (`"90d"`, `"12h"`); it never
    /// expires when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,6}(s|m|h|d)$")]
    pub expires_in: Option<String>,
    /// The only namespace the key may act in (every namespace, when left
    /// out). A key bound to a namespace may create only keys bound to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::NamespaceName>)]
    pub namespace: Option<String>,
}

/// A key as the API shows it: never the key itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct KeyView {
    pub id: Uuid,
    pub name: String,
    pub scopes: Vec<Scope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
    /// Who created it.
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked: it is refused from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// The only namespace it may act in; every namespace when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `POST /v1/keys`'s answer: the key, this once. Only its hash is kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct KeyCreated {
    #[serde(flatten)]
    #[schema(inline)]
    pub view: KeyView,
    /// The bearer token: `Authorization: Bearer <key>`. Shown only now.
    pub key: String,
}

/// `GET /v1/keys`: every key, newest first, revoked ones too.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyView>,
}

/// One change made through the API (or the UI), written before the change
/// is made; its `status` is the answer's, or absent when none was given
/// (the coordinator stopped in between).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The key's name (or the environment token's, or `anonymous`).
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<Uuid>,
    /// The address the request came from.
    pub source: String,
    pub method: String,
    /// The route (`/v1/schedules/{id}`) and the path it was called with.
    pub route: String,
    pub path: String,
    /// What was asked: the request's body (JSON, or a form's fields), past
    /// 64 KiB only its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub request: Option<Value>,
    /// The answer's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// What the change left, as the answer said (absent for errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub result: Option<Value>,
}

/// `GET /v1/audit`: a page of the audit log, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<i64>,
}

/// `POST /v1/namespaces`: a namespace to create.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "billing", "description": "the billing team's workflows"}))]
pub struct CreateNamespace {
    #[schema(value_type = schema::NamespaceName)]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub description: String,
}

/// A namespace: its own workflows, runs, schedules, webhooks, limits,
/// events, bulk jobs, queues and audit log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NamespaceView {
    pub name: String,
    pub description: String,
    /// `active`, or `deleting` (its data is being dropped).
    pub state: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub quotas: NamespaceQuotas,
    /// What it uses of them (`GET /v1/namespaces/{name}` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<NamespaceUsage>,
}

/// A namespace's quotas (`PUT /v1/namespaces/{name}/quotas`); a quota left
/// out is none. A change past one is a 429 naming it, with `Retry-After`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"open_runs": 10000, "starts_per_second": 50, "schedules": 100, "limits": 50, "stored_bytes": 10737418240_i64}))]
pub struct NamespaceQuotas {
    /// Runs queued, running or paused at once; a start past it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    pub open_runs: Option<i64>,
    /// Runs started from outside a run (the API, schedules, triggers) in one second, across coordinators.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    pub starts_per_second: Option<i64>,
    /// Schedules; a new one past it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000_i64)]
    pub schedules: Option<i64>,
    /// Limit keys with values; a new one past it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000_i64)]
    pub limits: Option<i64>,
    /// Bytes the namespace's tables and indexes hold (runs, outputs, logs,
    /// history); past it, starts, new schedules and new limits are refused.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "whole::opt_int")]
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    pub stored_bytes: Option<i64>,
}

/// What a namespace uses of each quota, read when asked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NamespaceUsage {
    pub open_runs: i64,
    pub schedules: i64,
    pub limits: i64,
    pub stored_bytes: i64,
}

/// `GET /v1/namespaces`: `default` first, then by name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct NamespaceList {
    pub namespaces: Vec<NamespaceView>,
}
