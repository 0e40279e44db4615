//! `/v1/approvals`: the APPROVAL steps waiting for people — an inbox (the
//! caller's, their groups', every one), one approval with its votes — and
//! a person's decision.
//!
//! A decision is a vote the engine applies under the run's lock, reading
//! the votes cast before it in the same transaction and writing this one
//! with the history line that records it (and the step's completion or
//! failure when it decides): a person votes once per attempt, and an
//! approval is decided once, whichever coordinator takes the vote and
//! whatever dies.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use composer_api::{Approval, ApprovalList, ApprovalVote, Assignees, DecideRequest, Scope};
use composer_archive::payloads::Payloads;
use composer_core::definition::approval::{self, Refusal, Vote};
use composer_core::definition::NodeKind;
use composer_core::machine::Event;
use composer_store::approvals::{ApprovalRow, Inbox};
use composer_store::Pool;
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::extract::{json_size, run_id, Body, Limit, Path, Query};
use crate::access::Principal;
use crate::config::Config;
use crate::engine::{By, Control, Engine, EventRequest};

/// Most approvals one page lists.
pub const MAX_APPROVAL_PAGE: i64 = 500;

/// Which approvals an inbox lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum View {
    /// Those the caller may decide: naming them, or a group of theirs.
    #[default]
    Mine,
    /// Those assigned to a group of the caller's.
    Groups,
    /// Every waiting approval.
    All,
}

/// `GET /v1/approvals`'s query.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct InboxQuery {
    /// `mine` (the default), `groups` or `all`.
    #[param(inline)]
    view: Option<View>,
    /// The previous page's next_cursor.
    #[param(pattern = "^[0-9]{1,15}~[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    cursor: Option<String>,
    /// 1 to 500 (default 50).
    #[param(value_type = Option<i32>, minimum = 1, maximum = 500)]
    limit: Option<Limit>,
}

/// List waiting approvals.
///
/// The APPROVAL steps waiting for a decision, newest first: those the caller may decide (`mine`:
/// naming them, or a group of theirs at the sign-in), those assigned to a group of theirs
/// (`groups`), or every one (`all`).
#[utoipa::path(
    get, path = "/v1/approvals", operation_id = "listApprovals", tag = "approvals",
    params(InboxQuery),
    responses((status = 200, description = "a page of waiting approvals, newest first", body = ApprovalList))
)]
pub(crate) async fn list_approvals(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Extension(by): Extension<Principal>,
    Query(q): Query<InboxQuery>,
) -> ApiResult<Json<ApprovalList>> {
    let limit = Limit::or(q.limit, 50);
    if limit > MAX_APPROVAL_PAGE {
        return Err(ApiError::bad_request(format!("limit must be 1 to {MAX_APPROVAL_PAGE}")));
    }
    let after = q.cursor.as_deref().map(cursor).transpose()?;
    let (rows, next) = inbox(&pool, engine.payloads(), &by, q.view.unwrap_or_default(), (after, limit)).await?;
    let next_cursor = next.map(|(at, id)| format!("{}~{id}", at.timestamp_micros().max(0)));
    Ok(Json(ApprovalList { approvals: rows.into_iter().map(approval_view).collect(), next_cursor }))
}

/// A page's cursor: the last approval's `updated_at` (Unix microseconds)
/// and task id.
fn cursor(text: &str) -> ApiResult<(DateTime<Utc>, uuid::Uuid)> {
    let parsed = text
        .split_once('~')
        .and_then(|(at, id)| Some((DateTime::from_timestamp_micros(at.parse().ok()?)?, id.parse().ok()?)));
    parsed.ok_or_else(|| ApiError::bad_request("cursor: not one a page of approvals gave"))
}

/// `by`'s inbox in `view`: a page of waiting approvals after `after`, each
/// request read back if it was offloaded, and where the next page starts.
pub(crate) async fn inbox(
    pool: &Pool,
    payloads: &Payloads,
    by: &Principal,
    view: View,
    (after, limit): (Option<(DateTime<Utc>, uuid::Uuid)>, i64),
) -> ApiResult<(Vec<ApprovalRow>, Option<(DateTime<Utc>, uuid::Uuid)>)> {
    let inbox = Inbox {
        person: (view == View::Mine).then_some(by.name.as_str()),
        groups: &by.groups,
        all: view == View::All,
        after,
        limit,
    };
    let client = composer_store::client(pool).await?;
    let mut rows = composer_store::approvals::inbox(&client, &inbox).await?;
    let next = (rows.len() as i64 == limit).then(|| rows.last().map(|r| (r.updated_at, r.task_id))).flatten();
    for row in &mut rows {
        resolved(payloads, row).await?;
    }
    // An offloaded request was matched by its row: judged now it is read.
    let person = if view == View::Mine { by.name.as_str() } else { "" };
    let groups = if view == View::All { Vec::new() } else { by.groups.clone() };
    rows.retain(|r| view == View::All || approval::may_decide(&r.request, person, &groups));
    Ok((rows, next))
}

/// `row` with its request and output read back from where they were
/// offloaded, if they were.
async fn resolved(payloads: &Payloads, row: &mut ApprovalRow) -> ApiResult<()> {
    crate::payloads::resolve(payloads, &mut row.request).await?;
    if let Some(output) = row.output.as_mut() {
        crate::payloads::resolve(payloads, output).await?;
    }
    Ok(())
}

/// Get an approval.
///
/// The APPROVAL step `node` of run `run_id`, in any state: what it asks, of whom, its votes, and
/// once decided its output or why it failed.
#[utoipa::path(
    get, path = "/v1/approvals/{run_id}/{node}", operation_id = "getApproval", tag = "approvals",
    params(("run_id" = uuid::Uuid, Path, description = "the run"), ("node" = composer_core::schema::Name, Path, description = "the APPROVAL node")),
    responses(
        (status = 200, description = "the approval", body = Approval),
        (status = 404, description = "no such run, or no APPROVAL step of that node in it", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn get_approval(
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Path((id, node)): Path<(String, String)>,
) -> ApiResult<Json<Approval>> {
    Ok(Json(approval_view(find((&pool, engine.payloads()), &id, &node).await?)))
}

/// Decide an approval.
///
/// The caller's vote on a waiting APPROVAL step they are an assignee of (named, or in a group of
/// theirs): one rejection rejects it (the step fails, code `approval_rejected`), and the quorum's
/// last approval approves it (the step completes with `{decision, decided_by, data, votes}`). An
/// approval's `data` must match the step's `form`. A person votes once. An administrator may vote
/// for a person it names (`as`), recorded as made by the administrator. Answers the approval after
/// the vote.
#[utoipa::path(
    post, path = "/v1/approvals/{run_id}/{node}/decide", operation_id = "decideApproval", tag = "approvals",
    params(("run_id" = uuid::Uuid, Path, description = "the run"), ("node" = composer_core::schema::Name, Path, description = "the APPROVAL node")),
    request_body = DecideRequest,
    responses(
        (status = 200, description = "the vote was cast: the approval as it stands now", body = Approval),
        (status = 403, description = "the caller is not among its assignees, or `as` without the admin scope", body = composer_api::ErrorBody),
        (status = 404, description = "no such approval", body = composer_api::ErrorBody),
        (status = 409, description = "it is no longer waiting, or this person has decided already", body = composer_api::ErrorBody),
        (status = 422, description = "the data does not match the form, or the comment is too long", body = composer_api::ErrorBody),
    )
)]
pub(crate) async fn decide_approval(
    State(config): State<Arc<Config>>,
    State(pool): State<Pool>,
    State(engine): State<Arc<Engine>>,
    Extension(by): Extension<Principal>,
    Path((id, node)): Path<(String, String)>,
    Body(req): Body<DecideRequest>,
) -> ApiResult<Json<Approval>> {
    Decider { config: &config, pool: &pool, engine: &engine }.decide(&by, (&id, &node), req).await.map(Json)
}

/// What deciding takes: the API's route and the UI's form share it.
pub(crate) struct Decider<'a> {
    pub config: &'a Config,
    pub pool: &'a Pool,
    pub engine: &'a Arc<Engine>,
}

impl Decider<'_> {
    /// `by`'s vote `req` on the approval `node` of run `id`: the approval
    /// after it, or why it was not cast.
    pub(crate) async fn decide(
        &self,
        by: &Principal,
        (id, node): (&str, &str),
        req: DecideRequest,
    ) -> ApiResult<Approval> {
        let row = find((self.pool, self.engine.payloads()), id, node).await?;
        if row.state != "WAITING" {
            let why = row.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
            return Err(ApiError::Conflict(format!("approval {node} of run {} is {}{why}", row.run_id, row.state)));
        }
        let (vote, groups) = vote_of(self.config, by, req)?;
        // The same checks the engine makes, for the status each deserves;
        // the engine's, under the run's lock, are the ones that hold.
        let wf = self.engine.workflow(row.definition).await?;
        let Some(NodeKind::Approval(approval)) = wf.nodes.iter().find(|n| n.id == node).map(|n| &n.kind) else {
            return Err(ApiError::NotFound(format!("node {node} of run {} is not an APPROVAL", row.run_id)));
        };
        let earlier: Vec<Vote> = serde_json::from_value(row.votes.clone()).unwrap_or_default();
        match approval.check(&row.request, &earlier, &vote, &groups) {
            Ok(()) => {}
            Err(Refusal::NotAssignee(why)) => return Err(ApiError::Forbidden(why)),
            Err(Refusal::Decided(why)) => return Err(ApiError::Conflict(why)),
            Err(Refusal::Invalid(why)) => return Err(ApiError::VoteRefused(why)),
        }
        let event = Event::ApprovalVote {
            task_id: row.task_id,
            attempt: row.attempt,
            vote: Box::new(vote),
            groups,
            earlier: Vec::new(),
        };
        let control = Control { actor: by.name.clone(), reason: None };
        let answer = self.engine.handle(EventRequest::new(row.run_id, event).by(By::Operator(control))).await?;
        if let Some(why) = answer.ignored {
            return Err(ApiError::Conflict(format!("the vote was not cast: {why}")));
        }
        Ok(approval_view(find((self.pool, self.engine.payloads()), id, node).await?))
    }
}

/// The approval `node` of run `id`, or a 404.
pub(crate) async fn find((pool, payloads): (&Pool, &Payloads), id: &str, node: &str) -> ApiResult<ApprovalRow> {
    let run = run_id(id)?;
    composer_core::definition::check_name("node", node).map_err(ApiError::bad_request)?;
    let client = composer_store::client(pool).await?;
    let mut row = composer_store::approvals::get(&client, run, node)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("run {run} has no APPROVAL step {node:?}")))?;
    resolved(payloads, &mut row).await?;
    Ok(row)
}

/// The vote `req` asks for, and the groups it is cast in: the caller's
/// own, or (`as`, for an administrator only) a person the approval names,
/// in no group (an administrator cannot vouch for a group's member).
fn vote_of(config: &Config, by: &Principal, req: DecideRequest) -> ApiResult<(Vote, Vec<String>)> {
    let data = req.data.unwrap_or_else(|| json!({}));
    if json_size(&data) > config.max_payload {
        return Err(ApiError::too_large("data", config.max_payload));
    }
    composer_core::storable::check(&data, "data", config.max_payload).map_err(ApiError::bad_request)?;
    let (person, via, groups) = match req.on_behalf_of {
        Some(_) if !by.may(Scope::Admin) => {
            return Err(ApiError::Forbidden(format!(
                "{} may not decide for another (as needs the admin scope)",
                by.name
            )))
        }
        Some(person) => {
            let max = composer_core::definition::approval::MAX_ASSIGNEE_CHARS;
            if person.is_empty() || person.chars().count() > max || person.contains('\0') {
                return Err(ApiError::bad_request(format!("as must be 1 to {max} characters, without NUL")));
            }
            (person, Some(by.name.clone()), Vec::new())
        }
        None => (by.name.clone(), None, by.groups.clone()),
    };
    let vote = Vote { person, answer: req.answer, data, comment: req.comment, via, at: crate::clock::now() };
    Ok((vote, groups))
}

/// An approval as the API shows it.
pub(crate) fn approval_view(row: ApprovalRow) -> Approval {
    let r = &row.request;
    Approval {
        run_id: row.run_id,
        node: row.node_id,
        workflow: row.workflow,
        version: row.version,
        state: row.state,
        attempt: row.attempt,
        prompt: r["prompt"].as_str().unwrap_or_default().to_string(),
        assignees: Assignees {
            people: approval::names(&r["assignees"]["people"]),
            groups: approval::names(&r["assignees"]["groups"]),
        },
        quorum: r["quorum"].clone(),
        needed: r["needed"].as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(1),
        form: r.get("form").filter(|f| !f.is_null()).cloned(),
        due_at: r["due_at"].as_str().and_then(|d| d.parse().ok()),
        escalated: r["escalated"] == true,
        votes: serde_json::from_value::<Vec<ApprovalVote>>(row.votes).unwrap_or_default(),
        output: row.output,
        error: row.error,
        updated_at: row.updated_at,
    }
}
