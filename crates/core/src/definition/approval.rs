//! An APPROVAL node: a step that waits for people to decide. Its config
//! names a prompt, who may decide (people and groups), how many approvals
//! it takes (the quorum), a form (a JSON Schema) an approval's data must
//! match, a deadline (then it fails), and an escalation (more people
//! may decide from some time on, told so). The step's attempt keeps the request, evaluated when
//! it starts, as its input: what the inbox shows and the votes are judged
//! by. One rejection rejects; the quorum's last approval approves.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::check::{positive_duration, validate_name, ValidationError};
use super::hooks::Deadline;
use super::input_schema::{InputSchema, Mismatch};

/// Most people and groups one approval names, escalation included
/// (`approval_max_assignees`).
pub const MAX_ASSIGNEES: usize = 100;
/// Longest name of a person or group, in characters.
pub const MAX_ASSIGNEE_CHARS: usize = 256;
/// Longest prompt, in characters (`approval_max_prompt`).
pub const MAX_PROMPT_CHARS: usize = 4000;
/// Longest comment a vote may carry, in characters.
pub const MAX_COMMENT_CHARS: usize = 2000;
/// Largest `data` a vote may carry, as JSON bytes (`approval_max_vote_data`):
/// an approval's output holds its decider's.
pub const MAX_VOTE_DATA: usize = 64 * 1024;

/// An APPROVAL node's config, compiled: what is not evaluated per run.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalConfig {
    pub quorum: Quorum,
    /// What an approval's `data` must match.
    pub form: Option<InputSchema>,
    /// How long the step waits for a decision (from its start); forever
    /// without it.
    pub timeout: Option<Duration>,
    /// The run `notify` starts when the step is assigned (and escalated).
    pub notify: Option<Deadline>,
}

/// How many approvals decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quorum {
    /// One.
    Any,
    /// Every person named (no group: a group's members are not known).
    All,
    /// This many different people.
    Count(u32),
}

impl Quorum {
    fn to_json(self) -> Value {
        match self {
            Quorum::Any => json!("any"),
            Quorum::All => json!("all"),
            Quorum::Count(n) => json!(n),
        }
    }
}

/// A person's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Answer {
    Approve,
    Reject,
}

impl Answer {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Approve => "approve",
            Answer::Reject => "reject",
        }
    }
}

/// The names a list of a request holds (`assignees.people`, `…groups`);
/// none when it is not a list.
pub fn names(list: &Value) -> Vec<String> {
    list.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)).collect()
}

/// One person's vote on an approval, as stored and as its output shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = ApprovalVote))]
pub struct Vote {
    pub person: String,
    pub answer: Answer,
    /// The form's data (an approval's must match the form).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// The administrator who decided for `person`, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    pub at: DateTime<Utc>,
}

/// Why a vote may not be cast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The person is not among the assignees (by name or group).
    NotAssignee(String),
    /// The person voted on this attempt already.
    Decided(String),
    /// Its data does not match the form, or its comment is too long.
    Invalid(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotAssignee(why) | Refusal::Decided(why) | Refusal::Invalid(why) => f.write_str(why),
        }
    }
}

/// What a vote did to its approval.
#[derive(Debug, Clone, PartialEq)]
pub enum Tally {
    /// Recorded; the quorum is not met yet.
    Open,
    /// The quorum approved: the step's output.
    Approved(Value),
    /// Rejected: the message of the step's failure.
    Rejected(String),
}

/// `config` of an APPROVAL node at `at`. `prompt` and `assignees` (and
/// `escalate`) are templates the node's template evaluates when it starts.
pub(super) fn compile(at: &str, config: &Value) -> Result<ApprovalConfig, ValidationError> {
    let field = |name: &str| format!("{at}.config.{name}");
    match config.get("prompt") {
        Some(Value::String(_) | Value::Number(_)) => {}
        Some(_) => return Err(ValidationError::new(field("prompt"), "must be text (a template)")),
        None => return Err(ValidationError::new(field("prompt"), "is required")),
    }
    let assignees = match config.get("assignees") {
        Some(a @ Value::Object(_)) => a,
        Some(Value::String(s)) if s.contains("${") => &Value::Null,
        _ => {
            return Err(ValidationError::new(
                field("assignees"),
                "is required: {\"people\": [...], \"groups\": [...]}, or an expression that makes one",
            ))
        }
    };
    for name in ["prompt", "assignees", "escalate"] {
        if config.get(name).is_some_and(|v| v.to_string().contains(".secrets")) {
            return Err(ValidationError::new(field(name), "an approval, shown to people, cannot read secrets"));
        }
    }
    let quorum = match config.get("quorum") {
        None | Some(Value::Null) => Quorum::Any,
        Some(Value::String(s)) if s == "any" => Quorum::Any,
        Some(Value::String(s)) if s == "all" => Quorum::All,
        Some(Value::Number(n)) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= 1 && (n as usize) <= MAX_ASSIGNEES => Quorum::Count(n),
            _ => return Err(ValidationError::new(field("quorum"), format!("a count from 1 to {MAX_ASSIGNEES}"))),
        },
        Some(_) => return Err(ValidationError::new(field("quorum"), "must be \"any\", \"all\" or a count")),
    };
    if quorum == Quorum::All && literal_groups(assignees) {
        return Err(ValidationError::new(
            field("quorum"),
            "\"all\" counts the people named; a group's members are not known (give a count instead)",
        ));
    }
    literal_assignees(&field, assignees, config.get("escalate"), quorum)?;
    let form = match config.get("form") {
        None | Some(Value::Null) => None,
        Some(s @ Value::Object(_)) => Some(InputSchema::compile(s, &field("form"))?),
        Some(_) => return Err(ValidationError::new(field("form"), "must be a JSON Schema object")),
    };
    let duration = |name: &str, v: Option<&Value>| match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(t)) => positive_duration(&field(name), t).map(Some),
        Some(_) => Err(ValidationError::new(field(name), "must be a duration such as \"24h\"")),
    };
    let timeout = duration("timeout", config.get("timeout"))?;
    match config.get("escalate") {
        None | Some(Value::Null) => {}
        // An expression that makes one, checked when the step starts.
        Some(Value::String(t)) if t.contains("${") => {}
        Some(Value::Object(e)) => {
            if let Some(other) = e.keys().find(|k| !matches!(k.as_str(), "people" | "groups" | "after")) {
                return Err(ValidationError::new(format!("{}.{other}", field("escalate")), "is not a field of it"));
            }
            if quorum == Quorum::All && literal_groups(&Value::Object(e.clone())) {
                return Err(ValidationError::new(field("escalate.groups"), "\"all\" cannot count a group"));
            }
            match e.get("after") {
                Some(Value::String(t)) if t.contains("${") => {}
                after => {
                    let Some(after) = duration("escalate.after", after)? else {
                        return Err(ValidationError::new(field("escalate.after"), "is required: when more may decide"));
                    };
                    if timeout.is_some_and(|t| t <= after) {
                        return Err(ValidationError::new(field("escalate.after"), "must come before the timeout"));
                    }
                }
            }
        }
        Some(_) => {
            return Err(ValidationError::new(field("escalate"), "must be {\"after\": ..., \"people\"?, \"groups\"?}"))
        }
    }
    let notify = config.get("notify").map(|n| notify(&field("notify"), n)).transpose()?;
    Ok(ApprovalConfig { quorum, form, timeout, notify })
}

/// The assignees (and the escalation's) when they are written out, with no
/// expression: checked now as a step's start would, so that a definition
/// no run of could ever be decided is refused when it is registered.
fn literal_assignees(
    field: &dyn Fn(&str) -> String,
    assignees: &Value,
    escalate: Option<&Value>,
    quorum: Quorum,
) -> Result<(), ValidationError> {
    if assignees.is_null() || assignees.to_string().contains("${") {
        return Ok(());
    }
    let (people, groups) = self::assignees(&field("assignees"), Some(assignees))
        .map_err(|m| ValidationError::new(field("assignees"), m))?;
    if people.is_empty() && groups.is_empty() {
        return Err(ValidationError::new(field("assignees"), "names no person and no group"));
    }
    let later = match escalate.filter(|e| e.is_object() && !e.to_string().contains("${")) {
        Some(e) => {
            self::assignees(&field("escalate"), Some(e)).map_err(|m| ValidationError::new(field("escalate"), m))?
        }
        None => (Vec::new(), Vec::new()),
    };
    let may = escalate.is_some_and(|e| e.to_string().contains("${"));
    if let (Quorum::Count(n), true, false) = (quorum, groups.is_empty() && later.1.is_empty(), may) {
        if n as usize > people.len() + later.0.len() {
            return Err(ValidationError::new(
                field("quorum"),
                format!("{n} approvals, but only {} people may decide", people.len() + later.0.len()),
            ));
        }
    }
    Ok(())
}

fn literal_groups(assignees: &Value) -> bool {
    matches!(assignees.get("groups"), Some(Value::Array(g)) if !g.is_empty())
        || matches!(assignees.get("groups"), Some(Value::String(_)))
}

/// `notify: {workflow, version?}`: a run of another workflow (an HTTP call
/// to a chat or a mail service, say) started when the step is assigned,
/// and again when it escalates, with `{run, step, approval, link}` as its
/// input. It has no template of its own, so it can read nothing else.
fn notify(at: &str, spec: &Value) -> Result<Deadline, ValidationError> {
    let Some(obj) = spec.as_object() else {
        return Err(ValidationError::new(at, "must be {\"workflow\": ..., \"version\"?: ...}"));
    };
    if let Some(other) = obj.keys().find(|k| !matches!(k.as_str(), "workflow" | "version")) {
        return Err(ValidationError::new(format!("{at}.{other}"), "is not a field of notify"));
    }
    let workflow = obj.get("workflow").and_then(Value::as_str).unwrap_or_default();
    validate_name(&format!("{at}.workflow"), workflow)?;
    let version = match obj.get("version") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64().and_then(|v| i32::try_from(v).ok()) {
            Some(v) if v >= 1 => Some(v),
            _ => return Err(ValidationError::new(format!("{at}.version"), "must be a version number (1 or more)")),
        },
    };
    Ok(Deadline { after: Duration::ZERO, workflow: workflow.to_string(), version, input: None })
}

impl ApprovalConfig {
    /// The request a step's attempt keeps as its input, from its config as
    /// evaluated when it starts; the error names the field.
    pub fn request(&self, evaluated: &Value, started: DateTime<Utc>) -> Result<Value, String> {
        let prompt = match evaluated.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            _ => return Err("config.prompt: must be text".into()),
        };
        if prompt.chars().count() > MAX_PROMPT_CHARS || prompt.contains('\0') {
            return Err(format!("config.prompt: at most {MAX_PROMPT_CHARS} characters, without NUL"));
        }
        let (people, groups) = assignees("config.assignees", evaluated.get("assignees"))?;
        let escalation = match evaluated.get("escalate").filter(|e| !e.is_null()) {
            Some(e) => {
                let (p, g) = assignees("config.escalate", Some(e))?;
                let after = match &e["after"] {
                    Value::String(t) => match crate::duration::parse(t) {
                        Ok(d) if !d.is_zero() => d,
                        Ok(_) => return Err("config.escalate.after: must be greater than zero".into()),
                        Err(m) => return Err(format!("config.escalate.after: {m}")),
                    },
                    _ => return Err("config.escalate.after: a duration such as \"4h\" is required".into()),
                };
                if self.timeout.is_some_and(|t| t <= after) {
                    return Err("config.escalate.after: must come before the timeout".into());
                }
                let at = started + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
                Some(json!({"people": p, "groups": g, "at": at}))
            }
            None => None,
        };
        let more = escalation.as_ref().map_or(0, |e| e["people"].as_array().map_or(0, Vec::len));
        let more_groups = escalation.as_ref().map_or(0, |e| e["groups"].as_array().map_or(0, Vec::len));
        if people.len() + groups.len() + more + more_groups > MAX_ASSIGNEES {
            return Err(format!("config.assignees: at most {MAX_ASSIGNEES} people and groups, escalation included"));
        }
        if people.is_empty() && groups.is_empty() {
            return Err("config.assignees: names no person and no group".into());
        }
        let needed = match self.quorum {
            Quorum::Any => 1,
            Quorum::Count(n) => n as usize,
            Quorum::All if groups.is_empty() && more_groups == 0 => people.len(),
            Quorum::All => return Err("config.quorum: \"all\" cannot count a group's members".into()),
        };
        if groups.is_empty() && more_groups == 0 && needed > people.len() + more {
            return Err(format!(
                "config.quorum: {needed} approvals, but only {} people may decide",
                people.len() + more
            ));
        }
        let due_at = self.timeout.map(|d| started + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX));
        let mut r = Map::new();
        r.insert("prompt".into(), json!(prompt));
        r.insert("assignees".into(), json!({"people": people, "groups": groups}));
        r.insert("quorum".into(), self.quorum.to_json());
        r.insert("needed".into(), json!(needed));
        r.insert("form".into(), evaluated.get("form").cloned().unwrap_or(Value::Null));
        r.insert("due_at".into(), json!(due_at));
        r.insert("escalation".into(), escalation.unwrap_or(Value::Null));
        r.insert("escalated".into(), json!(false));
        Ok(Value::Object(r))
    }

    /// Whether `vote`, by a person in `groups`, may be cast on the approval
    /// `request` after the `earlier` votes; why not when it may not.
    pub fn check(&self, request: &Value, earlier: &[Vote], vote: &Vote, groups: &[String]) -> Result<(), Refusal> {
        if !may_decide(request, &vote.person, groups) {
            return Err(Refusal::NotAssignee(format!("{} is not among this approval's assignees", vote.person)));
        }
        if earlier.iter().any(|v| v.person == vote.person) {
            return Err(Refusal::Decided(format!("{} has already decided", vote.person)));
        }
        if vote.comment.as_ref().is_some_and(|c| c.chars().count() > MAX_COMMENT_CHARS || c.contains('\0')) {
            return Err(Refusal::Invalid(format!("comment: at most {MAX_COMMENT_CHARS} characters, without NUL")));
        }
        let size = serde_json::to_string(&vote.data).map_or(usize::MAX, |t| t.len());
        if size > MAX_VOTE_DATA {
            return Err(Refusal::Invalid(format!("data: {size} bytes, over the {MAX_VOTE_DATA} a vote may carry")));
        }
        // The form the step started with (a move to another version keeps it).
        let form = match &request["form"] {
            Value::Null => None,
            f => Some(InputSchema::compile(f, "form").map_err(|e| Refusal::Invalid(format!("the step's form: {e}")))?),
        };
        if let (Answer::Approve, Some(form)) = (vote.answer, &form) {
            form.check(&vote.data).map_err(|m| {
                Refusal::Invalid(match m {
                    Mismatch::At { at, why } if at.is_empty() => format!("data does not match the form: {why}"),
                    Mismatch::At { at, why } => format!("data does not match the form at {at}: {why}"),
                    Mismatch::Limit(why) => format!("data could not be checked against the form: {why}"),
                })
            })?;
        }
        Ok(())
    }

    /// The vote `vote` of a person in `groups` on the approval `request`,
    /// after `earlier` votes: refused (why) when it may not be cast
    /// ([`ApprovalConfig::check`]).
    pub fn tally(&self, request: &Value, earlier: &[Vote], vote: &Vote, groups: &[String]) -> Result<Tally, String> {
        self.check(request, earlier, vote, groups).map_err(|r| r.to_string())?;
        let votes: Vec<&Vote> = earlier.iter().chain([vote]).collect();
        if vote.answer == Answer::Reject {
            let why = vote.comment.as_deref().map(|c| format!(": {c}")).unwrap_or_default();
            return Ok(Tally::Rejected(format!("rejected by {}{why}", vote.person)));
        }
        let approvals = votes.iter().filter(|v| v.answer == Answer::Approve).count();
        let needed = request["needed"].as_u64().unwrap_or(1) as usize;
        if approvals < needed {
            return Ok(Tally::Open);
        }
        // Each vote without its data: the decider's is the output's `data`.
        let votes: Vec<Value> = votes
            .iter()
            .map(|v| {
                let mut v = json!(v);
                if let Some(o) = v.as_object_mut() {
                    o.remove("data");
                }
                v
            })
            .collect();
        Ok(Tally::Approved(json!({
            "decision": "approved",
            "decided_by": vote.person,
            "data": vote.data,
            "votes": votes,
        })))
    }
}

/// Whether `person`, in `groups`, is among `request`'s assignees.
pub fn may_decide(request: &Value, person: &str, groups: &[String]) -> bool {
    let named = |list: &Value| list.as_array().is_some_and(|l| l.iter().any(|n| n.as_str() == Some(person)));
    let group = |list: &Value| list.as_array().is_some_and(|l| l.iter().any(|g| groups.iter().any(|m| g == m)));
    let a = &request["assignees"];
    named(&a["people"]) || group(&a["groups"])
}

/// When the request's step wakes next: its escalation, until it has
/// escalated, then its deadline (`None`: it waits for ever).
pub fn next_wake(request: &Value) -> Option<DateTime<Utc>> {
    let at = |v: &Value| v.as_str().and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.with_timezone(&Utc));
    match request["escalated"] == false && !request["escalation"].is_null() {
        true => at(&request["escalation"]["at"]),
        false => at(&request["due_at"]),
    }
}

/// The request once escalated: its escalation's people and groups added.
/// `None` when it has none left, or it is not due by `now`.
pub fn escalated(request: &Value, now: DateTime<Utc>) -> Option<Value> {
    if request["escalated"] == true || request["escalation"].is_null() || next_wake(request).is_some_and(|t| t > now) {
        return None;
    }
    let mut r = request.clone();
    for list in ["people", "groups"] {
        let mut names: Vec<Value> = r["assignees"][list].as_array().cloned().unwrap_or_default();
        for n in request["escalation"][list].as_array().into_iter().flatten() {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        r["assignees"][list] = Value::Array(names);
    }
    r["escalated"] = json!(true);
    // "all" is every person named, those the escalation names too.
    if request["quorum"] == "all" {
        r["needed"] = json!(r["assignees"]["people"].as_array().map_or(1, Vec::len));
    }
    Some(r)
}

/// `{people?, groups?}` as evaluated: two lists of names.
fn assignees(at: &str, v: Option<&Value>) -> Result<(Vec<String>, Vec<String>), String> {
    let Some(Value::Object(o)) = v else {
        return Err(format!("{at}: must be {{\"people\": [...], \"groups\": [...]}}"));
    };
    if let Some(other) = o.keys().find(|k| !matches!(k.as_str(), "people" | "groups" | "after")) {
        return Err(format!("{at}.{other}: is not a field of it"));
    }
    let list = |name: &str| -> Result<Vec<String>, String> {
        let names = match o.get(name) {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::String(s)) => vec![Value::String(s.clone())],
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(format!("{at}.{name}: must be a list of names")),
        };
        let mut out: Vec<String> = Vec::with_capacity(names.len());
        for n in names {
            match n {
                Value::String(s) if !s.is_empty() && s.chars().count() <= MAX_ASSIGNEE_CHARS && !s.contains('\0') => {
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
                other => {
                    return Err(format!(
                        "{at}.{name}: {} is not a name (1 to {MAX_ASSIGNEE_CHARS} characters, without NUL)",
                        crate::clipped(&other.to_string(), 100)
                    ))
                }
            }
            if out.len() > MAX_ASSIGNEES {
                return Err(format!("{at}.{name}: at most {MAX_ASSIGNEES} names"));
            }
        }
        Ok(out)
    };
    Ok((list("people")?, list("groups")?))
}

#[cfg(test)]
mod tests;
