//! A definition as the user writes it, read from JSON: unknown fields are
//! refused, and an object written as an array is refused too.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::check::ValidationError;
use super::located;

/// A definition as the user writes it. Unknown fields are refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", schema(example = json!({
    "name": "example",
    "nodes": [{"id": "greet", "type": "TRANSFORM", "config": {"output": {"greeting": "hello ${ .input.name }"}}}]
})))]
pub struct WorkflowSpec {
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12) of the run's input: every start is
    /// checked against it (a start the API takes answers 400 naming where
    /// the input does not match). Local `$ref`s only; `format` is not
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::JsonSchemaDocument>))]
    pub input_schema: Option<Value>,
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10_000))]
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<EdgeSpec>>))]
    pub edges: Vec<EdgeSpec>,
    /// The run's output, a template over `{input, nodes, run}`; by default the
    /// completed leaf nodes' outputs keyed by node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub output: Option<Value>,
    /// How long a whole run may take, from its start; past it the run fails
    /// and its open tasks are cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1h"))]
    pub timeout: Option<String>,
    /// At most `max` runs open at once (per value of `key`, an expression
    /// over `{input}`); the others wait QUEUED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,
    /// A run of another workflow started when a run of this one ends FAILED
    /// (and, if `on` says so, CANCELLED), in the same commit as that end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailureSpec>,
    /// A run of another workflow started when a run of this one ends
    /// SUCCEEDED, in the same commit as that end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<HookSpec>,
    /// A run of another workflow started when a run of this one ends,
    /// however it ends (SUCCEEDED, FAILED or CANCELLED), in the same commit
    /// as that end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_end: Option<HookSpec>,
    /// Runs of other workflows started when a run has not ended `after` its
    /// start: each fires once, and changes nothing of the run (an SLA's
    /// warning, not a timeout).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub deadlines: Vec<DeadlineSpec>,
    /// Tags of every run, `{key: text or an expression over {input}}`, to
    /// find runs by (`GET /v1/runs?tag.customer=42`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::DefinitionTags>))]
    pub tags: Option<serde_json::Map<String, Value>>,
    /// Events that start a run of this workflow (its latest version's
    /// triggers apply): each recorded event of that name starts one run per
    /// trigger whose `when` holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_items = 16))]
    pub triggers: Option<Vec<TriggerSpec>>,
    /// Its runs' priority, 1 (served first) to 5 (last); 3 by default. A
    /// start may give another; MAP items and child runs have their run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 5))]
    pub priority: Option<u8>,
    /// Whose work a run is (`${ .input.tenant }`, an expression over
    /// `{input}`): the steps and queued runs of different keys take turns,
    /// so one key's backlog does not hold up another's. A child run without
    /// one of its own has its parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub fairness_key: Option<String>,
}

/// A trigger: the runs an event starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TriggerSpec {
    /// The event's name (`order.created`).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256, pattern = "^[^\\u0000]*$"))]
    pub event: String,
    /// A jq condition over `{event: {id, name, key, payload}}`; every event of
    /// the name without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub when: Option<String>,
    /// The run's input, a template over `{event}`; `${ .event.payload }` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub input: Option<Value>,
    /// The run's idempotency key, text or a template over `{event}`: a
    /// second event with the same key finds the first run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub idempotency_key: Option<String>,
    /// The key its flow control counts by (`debounce`, `batch`, `throttle`,
    /// `singleton`): text or a template over `{event}`; the event's key by
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub key: Option<String>,
    /// One run for a burst of events of a key: it starts `period` after the
    /// burst's last event, with that event (or, `leading`, at its first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<DebounceSpec>,
    /// One run for up to `max_size` events of a key, or for those that came
    /// within `max_wait` of the first: its input is the list of their inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchSpec>,
    /// At most `count` runs per `period` for a key; the rest are queued for
    /// the next periods, or dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<ThrottleSpec>,
    /// At most one running run of the trigger per key: a new event while one
    /// runs starts nothing (`skip`), or cancels it and starts (`cancel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub singleton: Option<SingletonMode>,
}

/// A trigger's `debounce`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DebounceSpec {
    /// The quiet time that ends a burst (`"5s"`).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "5s"))]
    pub period: String,
    /// Start the run at the burst's first event, and drop the rest of the
    /// burst; by default it starts after the burst, with its last event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leading: Option<bool>,
    /// The longest a run is put off by a burst that does not end: it starts
    /// `max_wait` after the burst's first event at the latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1m"))]
    pub max_wait: Option<String>,
}

/// A trigger's `batch`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Most events in one run.
    #[serde(deserialize_with = "crate::whole::int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000, example = 100))]
    pub max_size: i64,
    /// The longest the batch's first event waits for its run (`"10s"`).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "10s"))]
    pub max_wait: String,
}

/// A trigger's `throttle`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ThrottleSpec {
    /// Most runs started per period.
    #[serde(deserialize_with = "crate::whole::int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000, example = 10))]
    pub count: i64,
    /// The period (`"1m"`): it begins at the first run started after the
    /// last one ended.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1m"))]
    pub period: String,
    /// What becomes of an event past the count: `queue` (the default) starts
    /// it in a later period, in order; `drop` starts nothing for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excess: Option<Excess>,
}

/// What a throttle does with an event past its count.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Excess {
    Queue,
    Drop,
}

/// What a singleton trigger does when its key's run is still running.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SingletonMode {
    Skip,
    Cancel,
}

/// `on_failure`: the handler run a failed run starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OnFailureSpec {
    /// The handler's workflow (the latest version when it starts, unless
    /// `version` is given).
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub workflow: String,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub version: Option<i32>,
    /// The handler run's input, a template over `{failed_run: {id, workflow,
    /// status, error, nodes}, input}`; by default `{"failed_run": …}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub input: Option<Value>,
    /// The ends that start the handler: `["FAILED"]` (the default), or
    /// `["FAILED", "CANCELLED"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<crate::schema::HandlerEnd>>, min_items = 1))]
    pub on: Option<Vec<String>>,
}

/// `on_success` and `on_end`: the run a run's end starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    /// The hook's workflow (the latest version when it starts, unless
    /// `version` is given).
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub workflow: String,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub version: Option<i32>,
    /// The hook run's input, a template over `{run: {id, workflow, status,
    /// error, output, nodes}, input}`; by default `{"run": …}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub input: Option<Value>,
}

/// A deadline: the run it starts when a run or a step has not ended
/// `after` its start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DeadlineSpec {
    /// How long after the run's start (or the step's creation) it fires
    /// (`"2h"`), if the run (or step) has not ended by then.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "2h"))]
    pub after: String,
    pub start: DeadlineStartSpec,
}

/// What a deadline starts: a run of a workflow.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DeadlineStartSpec {
    /// Its workflow (the latest version when it fires, unless `version` is given).
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub workflow: String,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub version: Option<i32>,
    /// Its input, a template over `{run: {id, workflow, version, status},
    /// step: {node, state, attempt} (a step's deadline), deadline: {after,
    /// node}, input}`; by default `{"run": …, "step": …, "deadline": …}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub input: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// An expression over `{input}`: one limit per value (one for the
    /// whole workflow without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub key: Option<String>,
    #[serde(deserialize_with = "crate::whole::int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub max: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub id: String,
    /// HTTP, WAIT, WAIT_FOR_EVENT, TRANSFORM, MAP, SUB_WORKFLOW, or a custom
    /// type. A MAP's config is `{items, max_concurrency?, on_item_failure?
    /// (fail|continue), node}`: `items` a list or an expression yielding one,
    /// `node` the node each item runs (HTTP, TRANSFORM, SUB_WORKFLOW or a
    /// custom type, with `.item` and `.index` bound). A SUB_WORKFLOW's config
    /// is `{workflow, version?, input?}`: a child run whose output is the
    /// node's output.
    #[serde(rename = "type")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(\\.{0,2}[A-Za-z0-9_-]|\\.{3})[A-Za-z0-9_.-]*$", min_length = 1, max_length = 128)
    )]
    pub node_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::Name>))]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::JsonObject>))]
    pub config: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// How long one attempt of a dispatched node (HTTP, custom) or a
    /// SUB_WORKFLOW may take, from its start (`"30s"`); the attempt then
    /// fails retryably.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub timeout: Option<String>,
    /// `at_least_once` (the default: an attempt whose worker died is run
    /// again) or `at_most_once` (HTTP and custom nodes: an attempt whose
    /// outcome is unknown is never sent again by itself; it waits IN_DOUBT
    /// for an operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Limits on this node's steps across runs, MAP items and coordinators
    /// (HTTP and custom nodes, at most 4): each a key with a `rate`
    /// (`"25/1s"`, `burst`) or a `concurrency`, or neither for a named
    /// limit set at run time (`PUT /v1/limits/{key}`). A step a limit holds
    /// waits, not dispatched, until the limit lets it go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<super::limit::LimitSpec>,
    /// Runs of other workflows started when this node's step has not ended
    /// `after` it was created (retries and waits included): each fires
    /// once, and changes nothing of the run. A MAP's `config.node` has none
    /// (set them on the MAP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub deadlines: Vec<DeadlineSpec>,
    /// The updates this step accepts while it waits (a WAIT_FOR_EVENT,
    /// at most 8): `POST /v1/runs/{id}/update` with one of these names
    /// completes the step with the update's output, or is refused, and
    /// the caller is answered which.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 8))]
    pub updates: Vec<UpdateSpec>,
}

/// An update a waiting step accepts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateSpec {
    /// The update's name, as `POST /v1/runs/{id}/update` gives it.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub name: String,
    /// A jq condition over `{update: {id, name, payload}, input}`: true
    /// accepts the update, false refuses it (with `refusal`), an error
    /// refuses it with the error's message. Every update is accepted
    /// without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub validate: Option<String>,
    /// Why a false `validate` refuses (`refused by validate` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024, pattern = "^[^\\u0000]*$"))]
    pub refusal: Option<String>,
    /// The step's output when it accepts: a template over the same scope;
    /// the update's payload by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::JsonValue))]
    pub output: Option<Value>,
}

/// Whether an attempt may be sent again when its outcome is unknown.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    #[default]
    AtLeastOnce,
    AtMostOnce,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included (1 to 1000; 3 by default).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1s"))]
    pub initial_backoff: Option<String>,
    /// Each backoff is the previous one times this (1 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub multiplier: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1m"))]
    pub max_backoff: Option<String>,
    /// What a 429 answer with `Retry-After` does: `respect` (the default
    /// for a node with a limit) waits that long before the next attempt and
    /// holds the step's limit keys as long; `ignore` retries on the backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_429: Option<On429>,
}

/// What a 429 answer's `Retry-After` does to a node's retries and limits.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum On429 {
    Respect,
    Ignore,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub from: String,
    #[cfg_attr(feature = "openapi", schema(value_type = crate::schema::Name))]
    pub to: String,
    /// A jq expression yielding a boolean: the edge is taken when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$"))]
    pub when: Option<String>,
    /// What of its source the edge follows: `success` (the default: the
    /// source COMPLETED), `failure` (it FAILED for good) or `always` (either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<EdgeOn>,
}

/// Which end of its source an edge follows.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EdgeOn {
    #[default]
    Success,
    Failure,
    Always,
}

impl EdgeOn {
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeOn::Success => "success",
            EdgeOn::Failure => "failure",
            EdgeOn::Always => "always",
        }
    }
}

/// The fields a definition may have.
const FIELDS: [&str; 16] = [
    "name",
    "description",
    "input_schema",
    "nodes",
    "edges",
    "output",
    "timeout",
    "concurrency",
    "on_failure",
    "on_success",
    "on_end",
    "deadlines",
    "tags",
    "triggers",
    "priority",
    "fairness_key",
];

/// Deserializes a spec, naming the node whose fields are wrong.
pub(crate) fn parse_spec(json: &Value) -> Result<WorkflowSpec, ValidationError> {
    let obj =
        json.as_object().ok_or_else(|| ValidationError::new("$", "a workflow definition must be a JSON object"))?;
    for key in obj.keys() {
        if !FIELDS.contains(&key.as_str()) {
            return Err(ValidationError::new(key.as_str(), format!("unknown field (expected {})", FIELDS.join(", "))));
        }
    }
    let name = match obj.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ValidationError::new("name", "must be a string")),
        None => return Err(ValidationError::new("name", "is required")),
    };
    let description = optional_text(obj, "description", "must be a string")?;
    let input_schema = obj.get("input_schema").filter(|v| !v.is_null()).cloned();
    let nodes = parse_nodes(obj)?;
    let edges = parse_edges(obj)?;
    let output = obj.get("output").filter(|v| !v.is_null()).cloned();
    let timeout = optional_text(obj, "timeout", "must be a duration string such as \"1h\"")?;
    let concurrency = optional_object(obj, "concurrency")?;
    let on_failure = optional_object(obj, "on_failure")?;
    let on_success = optional_object(obj, "on_success")?;
    let on_end = optional_object(obj, "on_end")?;
    let deadlines = optional_object(obj, "deadlines")?.unwrap_or_default();
    let tags = match obj.get("tags") {
        None | Some(Value::Null) => None,
        Some(Value::Object(t)) => Some(t.clone()),
        Some(_) => return Err(ValidationError::new("tags", "must be an object of {key: text or an expression}")),
    };
    let triggers = parse_triggers(obj)?;
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => None,
        Some(p) => Some(crate::priority::parse(p).map_err(|e| ValidationError::new("priority", e))?),
    };
    let fairness_key = optional_text(obj, "fairness_key", "must be text or an expression over {input}")?;
    Ok(WorkflowSpec {
        name,
        description,
        input_schema,
        nodes,
        edges,
        output,
        timeout,
        concurrency,
        on_failure,
        on_success,
        on_end,
        deadlines,
        tags,
        triggers,
        priority,
        fairness_key,
    })
}

/// A definition's field that is text when given; `refused` says what else
/// it must be.
fn optional_text(obj: &Map<String, Value>, field: &str, refused: &str) -> Result<Option<String>, ValidationError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ValidationError::new(field, refused)),
    }
}

/// A definition's field that is an object when given.
fn optional_object<T: DeserializeOwned>(obj: &Map<String, Value>, field: &str) -> Result<Option<T>, ValidationError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(field, v).map(Some),
    }
}

/// Reads the part of a definition at `at`; an error names the field at
/// fault under it (`nodes[a].retry.max_attempts`) and what it expected.
pub(crate) fn read<T: DeserializeOwned>(at: &str, v: &Value) -> Result<T, ValidationError> {
    located::from_value(v).map_err(|e| ValidationError::new(e.under(at), e.message))
}

/// The `nodes`, each read on its own so that an error names the node.
fn parse_nodes(obj: &Map<String, Value>) -> Result<Vec<NodeSpec>, ValidationError> {
    let raw_nodes = match obj.get("nodes") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ValidationError::new("nodes", "must be an array")),
        None => return Err(ValidationError::new("nodes", "is required")),
    };
    let mut nodes = Vec::with_capacity(raw_nodes.len());
    for (i, raw) in raw_nodes.iter().enumerate() {
        let id = raw.get("id").and_then(Value::as_str).unwrap_or("");
        nodes.push(read(&node_path(i, id), raw)?);
    }
    Ok(nodes)
}

/// The `edges` (none when not given).
fn parse_edges(obj: &Map<String, Value>) -> Result<Vec<EdgeSpec>, ValidationError> {
    match obj.get("edges") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().enumerate().map(|(i, raw)| read(&format!("edges[{i}]"), raw)).collect(),
        Some(_) => Err(ValidationError::new("edges", "must be an array")),
    }
}

/// The `triggers`, each named by its index when it is wrong.
fn parse_triggers(obj: &Map<String, Value>) -> Result<Option<Vec<TriggerSpec>>, ValidationError> {
    match obj.get("triggers") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => {
            let triggers = a.iter().enumerate().map(|(i, raw)| read(&format!("triggers[{i}]"), raw));
            triggers.collect::<Result<_, _>>().map(Some)
        }
        Some(_) => Err(ValidationError::new("triggers", "must be an array of {event, when?, input?, ...}")),
    }
}

pub(crate) fn node_path(i: usize, id: &str) -> String {
    if id.is_empty() {
        format!("nodes[{i}]")
    } else {
        format!("nodes[{id}]")
    }
}
