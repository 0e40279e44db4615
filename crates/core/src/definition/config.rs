//! Each built-in node type's `config`, field by field: what each field takes
//! (a plain value, a template with `${ … }` expressions, a bare jq
//! expression, the node a MAP runs), whether it is required, and the JSON
//! Schema of its plain form. The one description of a config: validation
//! refuses the fields it does not name ([`check_known`]), the node's
//! template compiles exactly the fields it marks as templates
//! ([`compile_template`]), and `composer workflow schema` is generated
//! from it, each field that takes an expression marked
//! `x-composer-expression`.

use serde_json::{json, Map, Value};

use super::check::ValidationError;
use super::kind::{LOOP_MAX_ITERATIONS, MAP_MAX_ITEMS};
use crate::expr::Template;

/// What a field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// A plain value: a `${` in it is text, never evaluated (or refused by
    /// the field's own check).
    Value,
    /// A template: any string in it may hold `${ … }` expressions,
    /// evaluated when the node starts.
    Template,
    /// One bare jq expression (no `${ }`), evaluated by the kind.
    Jq,
    /// The node a MAP runs per item: a node of its own.
    Node,
}

impl Takes {
    /// The schema annotation of a field that takes an expression.
    pub fn annotation(self) -> Option<&'static str> {
        match self {
            Takes::Template => Some("template"),
            Takes::Jq => Some("jq"),
            Takes::Value | Takes::Node => None,
        }
    }
}

/// The name of the schema annotation on every field that takes an expression:
/// `"template"` or `"jq"`.
pub const EXPRESSION_MARK: &str = "x-composer-expression";

/// One field of a config.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub takes: Takes,
    pub required: bool,
    /// The JSON Schema of the field's plain form (a template may also be
    /// any string with an expression in it).
    pub schema: fn() -> Value,
    pub doc: &'static str,
}

/// A built-in type's config.
#[derive(Debug, Clone, Copy)]
pub struct KindConfig {
    pub name: &'static str,
    pub doc: &'static str,
    pub fields: &'static [Field],
    /// At most one of these fields, and at least one (WAIT's duration or until).
    pub one_of: &'static [&'static str],
}

impl KindConfig {
    pub fn field(&self, name: &str) -> Option<&'static Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

const fn field(name: &'static str, takes: Takes, required: bool, schema: fn() -> Value, doc: &'static str) -> Field {
    Field { name, takes, required, schema, doc }
}

/// People or groups: names, each a template.
fn names() -> Value {
    json!({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 256}, EXPRESSION_MARK: "template"})
}

fn assignees() -> Value {
    json!({"type": "object", "properties": {"people": names(), "groups": names()}, "additionalProperties": false,
           "examples": [{"people": ["${ .input.manager }"], "groups": ["finance"]}]})
}

fn escalation() -> Value {
    let mut after = duration();
    after[EXPRESSION_MARK] = json!("template");
    json!({"type": "object", "properties": {"after": after, "people": names(), "groups": names()},
           "required": ["after"], "additionalProperties": false,
           "examples": [{"after": "4h", "people": ["${ .input.director }"]}]})
}

fn any() -> Value {
    json!({})
}

fn text() -> Value {
    json!({"type": "string", "pattern": "^[^\\u0000]*$"})
}

/// A duration as `duration::parse` reads it: whole numbers with units, summed.
fn duration() -> Value {
    json!({"type": "string", "pattern": "^\\s*([0-9]+(ms|s|m|h|d))+\\s*$", "examples": ["1s", "1h30m"]})
}

/// As `schema::Name` says it (a test holds them equal).
fn name() -> Value {
    json!({"type": "string", "pattern": "^(\\.{0,2}[A-Za-z0-9_-]|\\.{3})[A-Za-z0-9_.-]*$",
           "minLength": 1, "maxLength": 128, "examples": ["echo"]})
}

fn version() -> Value {
    json!({"type": "integer", "minimum": 1})
}

fn on_parent_close() -> Value {
    json!({"enum": ["cancel", "abandon"], "description": "What becomes of the child when the node stops waiting for it"})
}

fn statuses() -> Value {
    json!({"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 599}})
}

/// Every built-in type's config; a custom type's is any object, every
/// string of it a template.
pub static KINDS: &[KindConfig] = &[
    KindConfig {
        name: "HTTP",
        doc: "An HTTP call, run by a worker.",
        one_of: &[],
        fields: &[
            field("method", Takes::Template, false, || json!({"enum": super::kind::HTTP_METHODS}), "GET by default"),
            field(
                "url",
                Takes::Template,
                true,
                || json!({"type": "string", "pattern": "^https?://", "examples": ["https://example.com/orders"]}),
                "http:// or https://",
            ),
            field(
                "headers",
                Takes::Template,
                false,
                || json!({"type": "object", "additionalProperties": {"type": "string"}}),
                "request headers",
            ),
            field("body", Takes::Template, false, any, "the request body (JSON)"),
            field("timeout", Takes::Template, false, duration, "how long the call may take"),
            field("accept", Takes::Value, false, statuses, "statuses that are a success besides 2xx"),
            field("retry_statuses", Takes::Value, false, statuses, "statuses that fail the attempt retryably"),
            field("follow_redirects", Takes::Template, false, || json!({"type": "boolean"}), "false by default"),
            field(
                "idempotency_key",
                Takes::Template,
                false,
                || json!({"type": "string", "minLength": 1, "maxLength": 255}),
                "\"per_attempt\", or the Idempotency-Key header's text",
            ),
        ],
    },
    KindConfig {
        name: "WAIT",
        doc: "A timer held in PostgreSQL: `duration`, or `until` a time.",
        one_of: &["duration", "until"],
        fields: &[
            field("duration", Takes::Value, false, duration, "how long to wait"),
            field(
                "until",
                Takes::Template,
                false,
                || json!({"type": ["string", "number"]}),
                "an RFC 3339 time or Unix seconds",
            ),
        ],
    },
    KindConfig {
        name: "WAIT_FOR_EVENT",
        doc: "Waits for an event `(event, key)`.",
        one_of: &[],
        fields: &[
            field(
                "event",
                Takes::Value,
                true,
                || json!({"type": "string", "minLength": 1, "pattern": "^[^\\u0000]*$", "examples": ["order.paid"]}),
                "the event's name",
            ),
            field(
                "key",
                Takes::Template,
                true,
                || json!({"type": ["string", "number"], "examples": ["${ .input.order }"]}),
                "the event's key",
            ),
            field("timeout", Takes::Value, false, duration, "how long to wait; forever without it"),
            field("default_output", Takes::Value, false, any, "the output when the wait times out"),
        ],
    },
    KindConfig {
        name: "APPROVAL",
        doc: "Waits for people to approve or reject.",
        one_of: &[],
        fields: &[
            field(
                "prompt",
                Takes::Template,
                true,
                || json!({"type": "string", "examples": ["Refund ${ .input.amount } to ${ .input.customer }?"]}),
                "what the people deciding read",
            ),
            field("assignees", Takes::Template, true, assignees, "who may decide: people, and groups of the sign-in"),
            field(
                "quorum",
                Takes::Value,
                false,
                || json!({"oneOf": [{"enum": ["any", "all"]}, {"type": "integer", "minimum": 1, "maximum": 100}]}),
                "approvals it takes: any (one), all (every person named) or a count; one rejection rejects",
            ),
            field(
                "form",
                Takes::Value,
                false,
                || json!({"type": "object"}),
                "a JSON Schema an approval's data must match",
            ),
            field(
                "timeout",
                Takes::Value,
                false,
                duration,
                "how long to wait for a decision (then it fails, code approval_timeout); forever without it",
            ),
            field(
                "escalate",
                Takes::Template,
                false,
                escalation,
                "who else may decide from `after` its start on (told again by notify)",
            ),
            field(
                "notify",
                Takes::Value,
                false,
                || {
                    json!({"type": "object", "properties": {"workflow": name(), "version": version()},
                    "required": ["workflow"], "additionalProperties": false})
                },
                "a run of this workflow is started when the step is assigned (and escalated)",
            ),
        ],
    },
    KindConfig {
        name: "TRANSFORM",
        doc: "A data mapping evaluated by the coordinator.",
        one_of: &[],
        fields: &[field(
            "output",
            Takes::Template,
            true,
            || json!({"examples": [{"total": "${ .input.amount }"}]}),
            "the node's output",
        )],
    },
    KindConfig {
        name: "MAP",
        doc: "Runs `node` once per item of `items`.",
        one_of: &[],
        fields: &[
            field(
                "items",
                Takes::Template,
                true,
                || json!({"type": "array", "examples": [[1, 2], "${ .input.orders }"]}),
                "a list, or an expression yielding one",
            ),
            field(
                "max_concurrency",
                Takes::Value,
                false,
                || json!({"type": "integer", "minimum": 1, "maximum": MAP_MAX_ITEMS}),
                "items in flight at once",
            ),
            field("on_item_failure", Takes::Value, false, || json!({"enum": ["fail", "continue"]}), "fail by default"),
            field(
                "tolerated_failures",
                Takes::Value,
                false,
                || {
                    json!({"oneOf": [{"type": "integer", "minimum": 0, "maximum": MAP_MAX_ITEMS},
                                     {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?\\s*%$"}]})
                },
                "items that may fail for good, a number or a share (\"5%\")",
            ),
            field(
                "collect",
                Takes::Value,
                false,
                || {
                    json!({"oneOf": [
                        {"enum": ["all", "none"]},
                        {"type": "object", "additionalProperties": false, "required": ["reduce"], "properties": {
                            "reduce": {"type": "string", "pattern": "^[^\\u0000]*$", EXPRESSION_MARK: "jq",
                                       "description": "jq over {acc, item: {index, state, output, error}}"},
                            "init": {}}}]})
                },
                "what the MAP's output is made of: every output (all), counts (none) or a reduction",
            ),
            field(
                "node",
                Takes::Node,
                true,
                || json!({"examples": [{"type": "TRANSFORM", "config": {"output": "${ .item }"}}]}),
                "the node each item runs",
            ),
        ],
    },
    KindConfig {
        name: "SUB_WORKFLOW",
        doc: "A child run of another workflow; its output is the node's.",
        one_of: &[],
        fields: &[
            field("workflow", Takes::Value, true, name, "the child's workflow"),
            field("version", Takes::Value, false, version, "the latest when the node starts without it"),
            field("input", Takes::Template, false, any, "the child's input"),
            field("on_parent_close", Takes::Value, false, on_parent_close, "cancel by default"),
        ],
    },
    KindConfig {
        name: "FAIL",
        doc: "Fails the run with its message.",
        one_of: &[],
        fields: &[
            field("message", Takes::Template, false, text, "the run's error"),
            field(
                "code",
                Takes::Value,
                false,
                || json!({"type": "string", "pattern": "^[a-z0-9_.-]{1,64}$"}),
                "the node's error code",
            ),
        ],
    },
    KindConfig {
        name: "LOOP",
        doc: "A child run per iteration, until `until` holds.",
        one_of: &[],
        fields: &[
            field("workflow", Takes::Value, true, name, "each iteration's workflow"),
            field("version", Takes::Value, false, version, "the latest when an iteration starts without it"),
            field("input", Takes::Template, false, any, "an iteration's input, with .iteration.index and .previous"),
            field(
                "until",
                Takes::Jq,
                true,
                || json!({"type": "string", "pattern": "^[^\\u0000]*$", "examples": [".iteration.index >= 1"]}),
                "jq over {input, iteration: {index, output}}",
            ),
            field(
                "max_iterations",
                Takes::Value,
                true,
                || json!({"type": "integer", "minimum": 1, "maximum": LOOP_MAX_ITERATIONS, "examples": [3]}),
                "the most iterations",
            ),
            field("delay", Takes::Value, false, duration, "between an iteration's end and the next's start"),
            field("on_parent_close", Takes::Value, false, on_parent_close, "cancel by default"),
        ],
    },
];

/// The fields outside nodes' configs that take an expression, by the
/// schema definition they are in (`$defs` of `composer workflow schema`) and
/// their property; `*` is every property of a map (tags). The definition's
/// own compilers (`definition`, `limit`) read these fields; a test probes
/// every string field of the schema and holds the marks to what compiles.
pub static SPEC_EXPRESSIONS: &[(&str, &str, Takes)] = &[
    ("WorkflowSpec", "output", Takes::Template),
    ("WorkflowSpec", "fairness_key", Takes::Template),
    ("DefinitionTags", "*", Takes::Template),
    ("ConcurrencySpec", "key", Takes::Template),
    ("OnFailureSpec", "input", Takes::Template),
    ("HookSpec", "input", Takes::Template),
    ("DeadlineStartSpec", "input", Takes::Template),
    ("UpdateSpec", "validate", Takes::Jq),
    ("UpdateSpec", "output", Takes::Template),
    ("TriggerSpec", "when", Takes::Jq),
    ("TriggerSpec", "input", Takes::Template),
    ("TriggerSpec", "idempotency_key", Takes::Template),
    ("TriggerSpec", "key", Takes::Template),
    ("EdgeSpec", "when", Takes::Jq),
    ("LimitSpec", "key", Takes::Template),
];

/// The config description of a built-in type; `None` for a custom type.
pub fn of(node_type: &str) -> Option<&'static KindConfig> {
    KINDS.iter().find(|k| k.name == node_type)
}

/// Refuses a field a built-in type's config does not take (`at` is the node's path).
pub(crate) fn check_known(at: &str, node_type: &str, config: &Value) -> Result<(), ValidationError> {
    let Some(kind) = of(node_type) else { return Ok(()) };
    for key in config.as_object().into_iter().flat_map(|m| m.keys()) {
        if kind.field(key).is_none() {
            let names: Vec<&str> = kind.fields.iter().map(|f| f.name).collect();
            return Err(ValidationError::new(
                format!("{at}.config.{key}"),
                format!("unknown field (expected {})", names.join(", ")),
            ));
        }
    }
    Ok(())
}

/// The node's template: the fields of `config` that take a template,
/// compiled; every other field kept as it is written. A custom type's whole
/// config is a template.
pub(crate) fn compile_template(node_type: &str, config: &Value) -> Result<Template, (String, String)> {
    let Some(kind) = of(node_type) else { return Template::compile(config) };
    let Value::Object(fields) = config else { return Template::compile(&Value::Object(Map::new())) };
    let mut parts = Vec::with_capacity(fields.len());
    for (name, value) in fields {
        let part = match kind.field(name).map(|f| f.takes) {
            Some(Takes::Template) => Template::compile(value).map_err(|(p, m)| (format!(".{name}{p}"), m))?,
            _ => Template::Literal(value.clone()),
        };
        parts.push((name.clone(), part));
    }
    Ok(Template::Object(parts))
}
