//! Approvals: the APPROVAL steps waiting for people (an inbox: mine, my
//! groups', all), one approval with its votes, and a person's decision.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use composer_core::definition::approval::Answer;
pub use composer_core::definition::approval::Vote as ApprovalVote;
use composer_core::schema;

/// An APPROVAL step: what it asks, of whom, and the votes so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Approval {
    pub run_id: Uuid,
    /// The APPROVAL node: with the run, what names the approval.
    pub node: String,
    pub workflow: String,
    pub version: i32,
    /// `WAITING` while it waits for a decision; `COMPLETED` (approved),
    /// `FAILED` (rejected, or no decision in time) or `CANCELLED` after.
    pub state: String,
    pub attempt: i32,
    pub prompt: String,
    pub assignees: Assignees,
    /// `"any"`, `"all"` or a count.
    #[schema(value_type = schema::JsonValue)]
    pub quorum: Value,
    /// Approvals it takes.
    pub needed: u32,
    /// The JSON Schema an approval's `data` must match, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub form: Option<Value>,
    /// When it fails (or escalates) without a decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<DateTime<Utc>>,
    /// Whether its deadline passed and it escalated.
    pub escalated: bool,
    /// The votes on this attempt, oldest first.
    pub votes: Vec<ApprovalVote>,
    /// The step's output once approved: `{decision, decided_by, data, votes}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub output: Option<Value>,
    /// Why it failed: who rejected it, or the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it began to wait, or last changed.
    pub updated_at: DateTime<Utc>,
}

/// Who may decide an approval.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Assignees {
    pub people: Vec<String>,
    /// Groups of the sign-in (the identity provider's): any member may decide.
    pub groups: Vec<String>,
}

/// A page of approvals, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<Approval>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `POST /v1/approvals/{run_id}/{node}/decide`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"answer": "approve", "data": {"amount": 120}, "comment": "within budget"}))]
pub struct DecideRequest {
    pub answer: Answer,
    /// The form's data; an approval's must match the step's `form`.
    /// `{}` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = schema::JsonValue)]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2000, pattern = "^[^\\u0000]*$")]
    pub comment: Option<String>,
    /// An administrator deciding for this person, whom the approval names
    /// (recorded as theirs, made by the administrator); only the `admin`
    /// scope may. A group's member decides for themselves.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "as")]
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$")]
    pub on_behalf_of: Option<String>,
}
