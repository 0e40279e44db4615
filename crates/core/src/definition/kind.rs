//! What each node type is and what the engine may do with it. A new kind
//! is added here (its [`Traits`] and how its config is read), in the state
//! machine's handler that starts it, and in the docs.

use std::time::Duration;

use serde_json::{Map, Value};

use super::check::{is_expression, validate_name, ValidationError};
use super::spec::NodeSpec;
use crate::duration;
use crate::expr::Template;

/// What the engine does with a node.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// An HTTP call, run by a worker.
    Http,
    /// A timer held in PostgreSQL; no process waits.
    Wait(WaitFor),
    /// Waits for an external event `(event, key)`, at most `timeout`.
    WaitForEvent { event: String, key: Template, timeout: Option<Duration>, default_output: Option<Value> },
    /// A pure data mapping, evaluated by the coordinator; never dispatched.
    Transform { output: Template },
    /// A user-defined type, run by a worker that registered a handler for it.
    Custom,
    /// One task per element of a list computed at run time.
    Map(MapConfig),
    /// A child run of another workflow (or this one); its output is the
    /// node's output. `version: None` is the latest when the node starts.
    SubWorkflow { workflow: String, version: Option<i32> },
    /// Fails the run with its message (an unhandled failure of its own).
    Fail { message: Template, code: String },
    /// A child run of a workflow, again and again, until a condition holds.
    Loop(LoopConfig),
    /// Waits for people to decide ([`super::approval`]).
    Approval(super::approval::ApprovalConfig),
}

/// A LOOP node: a child run of `workflow` per iteration (its input
/// evaluated with `.iteration.index` and `.previous` bound), until `until`
/// (over `.iteration: {index, output}`) is true, at most `max_iterations`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopConfig {
    pub until: crate::expr::Expr,
    pub max_iterations: u32,
    /// Between an iteration's end and the next one's start.
    pub delay: Option<Duration>,
}

/// Most iterations a LOOP may have (`loop_max_iterations`).
pub const LOOP_MAX_ITERATIONS: u32 = 100_000;

/// What the engine may do with a node of one kind: the one place that says
/// it, so that the validator, the state machine, the engine and the API agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traits {
    /// Sent to a worker on the node's queue; a worker reports its result.
    pub dispatched: bool,
    /// An attempt may fail and be tried again: after its backoff a timer
    /// starts the next attempt (held while the run is paused, started by
    /// the resume).
    pub retried: bool,
    /// `timeout` bounds one attempt (its timer fails the attempt).
    pub timed: bool,
    /// Has items, one task each (MAP).
    pub has_items: bool,
    /// Its attempt is a child run (SUB_WORKFLOW).
    pub has_child: bool,
    /// Waits for a timer or an event, held in PostgreSQL.
    pub waits: bool,
    /// May be the node a MAP runs per item.
    pub per_item: bool,
}

const NO_TRAITS: Traits = Traits {
    dispatched: false,
    retried: false,
    timed: false,
    has_items: false,
    has_child: false,
    waits: false,
    per_item: false,
};

/// A worker's node: HTTP, and every custom type.
const DISPATCHED: Traits = Traits { dispatched: true, retried: true, timed: true, per_item: true, ..NO_TRAITS };

/// The built-in types by name, with their traits; any other valid name is a
/// custom type, run by a worker.
pub const BUILT_IN: [(&str, Traits); 9] = [
    ("HTTP", DISPATCHED),
    ("WAIT", Traits { waits: true, ..NO_TRAITS }),
    ("WAIT_FOR_EVENT", Traits { waits: true, ..NO_TRAITS }),
    ("TRANSFORM", Traits { per_item: true, ..NO_TRAITS }),
    ("MAP", Traits { has_items: true, ..NO_TRAITS }),
    ("SUB_WORKFLOW", Traits { retried: true, timed: true, has_child: true, per_item: true, ..NO_TRAITS }),
    ("FAIL", NO_TRAITS),
    ("LOOP", Traits { retried: true, has_child: true, ..NO_TRAITS }),
    ("APPROVAL", Traits { waits: true, ..NO_TRAITS }),
];

/// The traits of a node type by name.
pub fn traits_of(node_type: &str) -> Traits {
    BUILT_IN.iter().find(|(name, _)| *name == node_type).map_or(DISPATCHED, |(_, t)| *t)
}

impl NodeKind {
    /// What the engine may do with this kind of node.
    pub fn traits(&self) -> Traits {
        match self.built_in() {
            Some(name) => traits_of(name),
            None => DISPATCHED,
        }
    }

    /// The type name of a built-in kind; `None` for a custom type.
    pub fn built_in(&self) -> Option<&'static str> {
        Some(match self {
            NodeKind::Http => "HTTP",
            NodeKind::Wait(_) => "WAIT",
            NodeKind::WaitForEvent { .. } => "WAIT_FOR_EVENT",
            NodeKind::Transform { .. } => "TRANSFORM",
            NodeKind::Map(_) => "MAP",
            NodeKind::SubWorkflow { .. } => "SUB_WORKFLOW",
            NodeKind::Fail { .. } => "FAIL",
            NodeKind::Loop(_) => "LOOP",
            NodeKind::Approval(_) => "APPROVAL",
            NodeKind::Custom => return None,
        })
    }

    /// Reads a node's config into its kind. A MAP also gives back the node
    /// its items run, for the caller to compile as a node of its own. The
    /// caller has refused a field the type's config does not take
    /// ([`super::config::check_known`]).
    pub(super) fn compile(
        at: &str,
        n: &NodeSpec,
        config: &Value,
    ) -> Result<(NodeKind, Option<NodeSpec>), ValidationError> {
        let kind = match n.node_type.as_str() {
            "HTTP" => {
                validate_http(at, config)?;
                NodeKind::Http
            }
            "WAIT" => NodeKind::Wait(compile_wait(at, config)?),
            "WAIT_FOR_EVENT" => compile_wait_for_event(at, config)?,
            "SUB_WORKFLOW" => compile_sub_workflow(at, config)?,
            "TRANSFORM" => compile_transform(at, config)?,
            "FAIL" => compile_fail(at, &n.id, config)?,
            "LOOP" => compile_loop(at, config)?,
            "APPROVAL" => NodeKind::Approval(super::approval::compile(at, config)?),
            "MAP" => return compile_map(at, n),
            other => {
                validate_name(&format!("{at}.type"), other)?;
                NodeKind::Custom
            }
        };
        Ok((kind, None))
    }

    /// The expressions of its config that the kind itself evaluates (beyond
    /// the node's templated config), for what the node reads.
    pub(super) fn sources(&self) -> Vec<&str> {
        match self {
            NodeKind::Wait(WaitFor::Until(t))
            | NodeKind::Transform { output: t }
            | NodeKind::Fail { message: t, .. } => t.sources(),
            NodeKind::WaitForEvent { key, .. } => key.sources(),
            NodeKind::Map(m) => m.items.sources(),
            NodeKind::Loop(l) => vec![l.until.source()],
            _ => Vec::new(),
        }
    }
}

/// How deep SUB_WORKFLOWs may nest (`sub_workflow_max_depth`): a run at this
/// depth cannot start a child.
pub const SUB_WORKFLOW_MAX_DEPTH: i32 = 32;

/// Most items one MAP may have (`map_max_items`). Items are created as the
/// MAP needs them, a chunk at a time, so no transaction grows with this.
pub const MAP_MAX_ITEMS: usize = 1_000_000;

/// Items of a MAP in flight at once when it names no `max_concurrency`
/// (`map_default_concurrency`): every item of most MAPs, and a bound on the
/// dispatched work of a very large one.
pub const MAP_DEFAULT_CONCURRENCY: u32 = 10_000;

/// Most items of a MAP that gathers every output (`collect: "all"`) may
/// have, by the payload limit: each keeps at least this many bytes of it.
pub const MIN_COLLECTED_ITEM_BYTES: usize = 64;

/// A MAP node: `items` evaluates to a list; each element runs the node
/// template (`wf.nodes[template]`) with `.item` and `.index` bound.
#[derive(Debug, Clone, PartialEq)]
pub struct MapConfig {
    pub items: Template,
    /// Items in flight at once; `None` is all of them.
    pub max_concurrency: Option<u32>,
    /// How many items may fail for good with the MAP still completing.
    pub tolerated: Tolerated,
    /// What the MAP's output is made of.
    pub collect: Collect,
    /// The index in [`Workflow::nodes`] of the node each item runs.
    pub template: usize,
}

/// A MAP's tolerance of failed items (`on_item_failure`, `tolerated_failures`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerated {
    /// At most this many (`on_item_failure: "fail"` is 0).
    Count(u32),
    /// At most this share of the items, in percent.
    Percent(f64),
    /// Any number (`on_item_failure: "continue"`).
    All,
}

impl Tolerated {
    /// Whether `failed` of `total` items is more than the MAP tolerates.
    pub fn exceeded(self, failed: u32, total: u32) -> bool {
        match self {
            Tolerated::Count(n) => failed > n,
            Tolerated::Percent(p) => failed as f64 > total as f64 * p / 100.0,
            Tolerated::All => false,
        }
    }
}

/// A MAP's output (`collect`).
#[derive(Debug, Clone, PartialEq)]
pub enum Collect {
    /// Every item's output, in the order of `items` (a failed item's entry
    /// `{"error": …}`); each item may use its share of the payload limit.
    All,
    /// `{count, succeeded, failed}`: the items stay readable, paged.
    None,
    /// A jq reduction over `{acc, item: {index, state, output, error}}`,
    /// applied to each item as it ends (in the order they end), from `init`.
    Reduce { init: Value, with: crate::expr::Expr },
}

/// How long a WAIT node waits.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitFor {
    Duration(Duration),
    /// A timestamp (RFC 3339 text, or unix seconds) computed at run time.
    Until(Template),
}

/// A MAP: `items`, `max_concurrency`, `on_item_failure` and the item
/// template `node` (`type`, `config`, `queue`, `retry`, `timeout`).
fn compile_map(at: &str, n: &NodeSpec) -> Result<(NodeKind, Option<NodeSpec>), ValidationError> {
    for (name, set) in [("retry", n.retry.is_some()), ("timeout", n.timeout.is_some()), ("queue", n.queue.is_some())] {
        if set {
            return Err(ValidationError::new(
                format!("{at}.{name}"),
                format!("a MAP has no {name} of its own: set it on config.node, which each item runs"),
            ));
        }
    }
    let config = match &n.config {
        Value::Object(m) => m,
        _ => return Err(ValidationError::new(format!("{at}.config"), "must be an object with items and node")),
    };
    let items = map_items(at, config)?;
    let max_concurrency = map_concurrency(at, config)?;
    let tolerated = map_tolerated(at, config)?;
    let collect = map_collect(at, config)?;
    let spec = item_node(at, n, config)?;
    let kind = NodeKind::Map(MapConfig { items, max_concurrency, tolerated, collect, template: usize::MAX });
    Ok((kind, Some(spec)))
}

/// The path of a field of the config of the node at `at`.
fn config_field(at: &str, name: &str) -> String {
    format!("{at}.config.{name}")
}

/// A MAP's `items`: a list, or an expression that makes one.
fn map_items(at: &str, config: &Map<String, Value>) -> Result<Template, ValidationError> {
    let field = config_field(at, "items");
    match config.get("items") {
        Some(v) if v.is_array() || is_expression(v) => {
            Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("{field}{p}"), m))
        }
        Some(_) => Err(ValidationError::new(field, "must be a list or an expression such as \"${ .input.orders }\"")),
        None => Err(ValidationError::new(field, "is required")),
    }
}

/// A MAP's `max_concurrency`: from 1 to [`MAP_MAX_ITEMS`], or all at once.
fn map_concurrency(at: &str, config: &Map<String, Value>) -> Result<Option<u32>, ValidationError> {
    match config.get("max_concurrency") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(c) if (1..=MAP_MAX_ITEMS as u64).contains(&c) => Ok(Some(c as u32)),
            _ => Err(ValidationError::new(
                config_field(at, "max_concurrency"),
                format!("must be a whole number from 1 to {MAP_MAX_ITEMS}"),
            )),
        },
    }
}

/// The failed items a MAP tolerates: none by default, every one with
/// `on_item_failure: "continue"`, or `tolerated_failures` (not both).
fn map_tolerated(at: &str, config: &Map<String, Value>) -> Result<Tolerated, ValidationError> {
    let continue_on_failure = match config.get("on_item_failure") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "fail" => false,
        Some(Value::String(s)) if s == "continue" => true,
        Some(_) => {
            return Err(ValidationError::new(config_field(at, "on_item_failure"), "must be \"fail\" or \"continue\""))
        }
    };
    let field = config_field(at, "tolerated_failures");
    match (config.get("tolerated_failures"), continue_on_failure) {
        (None | Some(Value::Null), false) => Ok(Tolerated::Count(0)),
        (None | Some(Value::Null), true) => Ok(Tolerated::All),
        (Some(_), true) => Err(ValidationError::new(
            field,
            "on_item_failure: \"continue\" tolerates every failure already; give one or the other",
        )),
        (Some(v), false) => tolerated_failures(v).map_err(|m| ValidationError::new(field, m)),
    }
}

/// A MAP's `collect`: every output (the default), none, or a reduction.
fn map_collect(at: &str, config: &Map<String, Value>) -> Result<Collect, ValidationError> {
    match config.get("collect") {
        None | Some(Value::Null) => Ok(Collect::All),
        Some(Value::String(s)) if s == "all" => Ok(Collect::All),
        Some(Value::String(s)) if s == "none" => Ok(Collect::None),
        Some(Value::Object(r)) => map_reduction(at, r),
        Some(_) => Err(ValidationError::new(
            config_field(at, "collect"),
            "must be \"all\", \"none\" or {\"reduce\": \"<jq>\", \"init\": <value>}",
        )),
    }
}

/// `collect: {reduce, init}`: a bare jq expression over
/// `{acc, item}`, and the accumulator it starts from.
fn map_reduction(at: &str, r: &Map<String, Value>) -> Result<Collect, ValidationError> {
    for key in r.keys() {
        if key != "reduce" && key != "init" {
            return Err(ValidationError::new(
                config_field(at, &format!("collect.{key}")),
                "unknown field (expected reduce, init)",
            ));
        }
    }
    let field = config_field(at, "collect.reduce");
    let with = match r.get("reduce") {
        Some(Value::String(src)) if !src.contains("${") && !src.contains(".secrets") => {
            crate::expr::Expr::compile(src).map_err(|m| ValidationError::new(field, m))?
        }
        _ => {
            return Err(ValidationError::new(
                field,
                "is required: a bare jq expression over {acc, item: {index, state, output, error}}, \
                 such as \".acc + .item.output.body.amount\"",
            ))
        }
    };
    Ok(Collect::Reduce { init: r.get("init").cloned().unwrap_or(Value::Null), with })
}

/// The node each item of the MAP `n` runs (`config.node`): it takes the
/// MAP's id, and is of a type an item may be (not a MAP).
fn item_node(at: &str, n: &NodeSpec, config: &Map<String, Value>) -> Result<NodeSpec, ValidationError> {
    let node_at = config_field(at, "node");
    let raw = match config.get("node") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ValidationError::new(node_at, "must be an object (the node each item runs)")),
        None => return Err(ValidationError::new(node_at, "is required")),
    };
    if raw.contains_key("id") {
        return Err(ValidationError::new(
            config_field(at, "node.id"),
            format!("an item has no id of its own: items are {}[0], {}[1], …", n.id, n.id),
        ));
    }
    let mut with_id = raw.clone();
    with_id.insert("id".into(), Value::String(n.id.clone()));
    let spec: NodeSpec = super::spec::read(&node_at, &Value::Object(with_id))?;
    let per_item = traits_of(&spec.node_type);
    if per_item.has_items {
        return Err(ValidationError::new(
            format!("{node_at}.type"),
            "a MAP cannot run a MAP per item; call a workflow that maps instead (SUB_WORKFLOW)",
        ));
    }
    if !per_item.per_item {
        return Err(ValidationError::new(
            format!("{node_at}.type"),
            format!(
                "{} is not supported per item: an item is HTTP, TRANSFORM, SUB_WORKFLOW or a custom type",
                spec.node_type
            ),
        ));
    }
    Ok(spec)
}

/// Longest error code (a FAIL node's `code`, a worker's report).
pub const MAX_ERROR_CODE_LEN: usize = 64;

/// Whether `code` is a plain error code: 1 to 64 of `a-z`, `0-9`, `_`, `.`, `-`.
pub fn is_error_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= MAX_ERROR_CODE_LEN
        && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
}

/// `{message?, code?}`: the run's error and the node's error code.
fn compile_fail(at: &str, id: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    let message = match config.get("message") {
        None | Some(Value::Null) => Value::String(format!("the run failed at node {id}")),
        Some(m @ Value::String(_)) => m.clone(),
        Some(_) => return Err(ValidationError::new(format!("{at}.config.message"), "must be text or an expression")),
    };
    let message =
        Template::compile(&message).map_err(|(_, m)| ValidationError::new(format!("{at}.config.message"), m))?;
    let code = match config.get("code") {
        None | Some(Value::Null) => "fail".to_string(),
        Some(Value::String(c)) if is_error_code(c) => c.clone(),
        Some(_) => {
            return Err(ValidationError::new(
                format!("{at}.config.code"),
                format!("must be 1 to {MAX_ERROR_CODE_LEN} of a-z, 0-9, '_', '.' and '-'"),
            ))
        }
    };
    Ok(NodeKind::Fail { message, code })
}

/// `tolerated_failures`: a whole number of items, or a share such as `"5%"`.
fn tolerated_failures(v: &Value) -> Result<Tolerated, String> {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(n) if n <= MAP_MAX_ITEMS as u64 => Ok(Tolerated::Count(n as u32)),
            _ => Err(format!("must be a whole number from 0 to {MAP_MAX_ITEMS}, or a share such as \"5%\"")),
        },
        Value::String(s) => match s.strip_suffix('%').map(|p| p.trim().parse::<f64>()) {
            Some(Ok(p)) if (0.0..=100.0).contains(&p) => Ok(Tolerated::Percent(p)),
            _ => Err(format!("{s:?} is not a share from \"0%\" to \"100%\"")),
        },
        _ => Err("must be a whole number or a share such as \"5%\"".to_string()),
    }
}

fn compile_transform(at: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    let output =
        config.get("output").ok_or_else(|| ValidationError::new(format!("{at}.config.output"), "is required"))?;
    let output =
        Template::compile(output).map_err(|(p, m)| ValidationError::new(format!("{at}.config.output{p}"), m))?;
    Ok(NodeKind::Transform { output })
}

fn compile_wait(at: &str, config: &Value) -> Result<WaitFor, ValidationError> {
    match (config.get("duration"), config.get("until")) {
        (Some(Value::String(s)), None) => duration::parse(s)
            .map(WaitFor::Duration)
            .map_err(|e| ValidationError::new(format!("{at}.config.duration"), e)),
        (Some(_), None) => {
            Err(ValidationError::new(format!("{at}.config.duration"), "must be a duration string such as \"1h\""))
        }
        (None, Some(until)) if !(until.is_string() || until.is_number()) => Err(ValidationError::new(
            format!("{at}.config.until"),
            "must be an RFC 3339 time, Unix seconds or an expression",
        )),
        (None, Some(until)) => Template::compile(until)
            .map(WaitFor::Until)
            .map_err(|(_, m)| ValidationError::new(format!("{at}.config.until"), m)),
        (Some(_), Some(_)) => Err(ValidationError::new(format!("{at}.config"), "give duration or until, not both")),
        (None, None) => Err(ValidationError::new(format!("{at}.config.duration"), "is required (or until)")),
    }
}

fn compile_wait_for_event(at: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    let event = match config.get("event") {
        Some(Value::String(e)) if !e.is_empty() && !e.contains("${") => e.clone(),
        Some(_) => return Err(ValidationError::new(format!("{at}.config.event"), "must be a non-empty name")),
        None => return Err(ValidationError::new(format!("{at}.config.event"), "is required")),
    };
    let key = match config.get("key") {
        Some(k @ (Value::String(_) | Value::Number(_))) => {
            Template::compile(k).map_err(|(_, m)| ValidationError::new(format!("{at}.config.key"), m))?
        }
        Some(_) => return Err(ValidationError::new(format!("{at}.config.key"), "must be a string or an expression")),
        None => return Err(ValidationError::new(format!("{at}.config.key"), "is required")),
    };
    let timeout = match config.get("timeout") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => {
            Some(duration::parse(t).map_err(|e| ValidationError::new(format!("{at}.config.timeout"), e))?)
        }
        Some(_) => {
            return Err(ValidationError::new(format!("{at}.config.timeout"), "must be a duration such as \"7d\""))
        }
    };
    Ok(NodeKind::WaitForEvent { event, key, timeout, default_output: config.get("default_output").cloned() })
}

/// `{workflow, version?, input?, on_parent_close?}`: the workflow is named,
/// not computed, so that a definition says what it calls.
fn compile_sub_workflow(at: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    let (workflow, version) = child_workflow(at, config)?;
    Ok(NodeKind::SubWorkflow { workflow, version })
}

/// `{workflow, version?, input?, until, max_iterations, delay?, on_parent_close?}`.
fn compile_loop(at: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    child_workflow(at, config)?;
    let until = match config.get("until") {
        Some(Value::String(src)) if src.contains("${") => {
            return Err(ValidationError::new(
                format!("{at}.config.until"),
                "is a bare jq condition over .iteration (no ${ }), such as \".iteration.output.done\"",
            ))
        }
        Some(Value::String(src)) if src.contains(".secrets") => {
            return Err(ValidationError::new(format!("{at}.config.until"), "conditions cannot read secrets"))
        }
        Some(Value::String(src)) => {
            crate::expr::Expr::compile(src).map_err(|m| ValidationError::new(format!("{at}.config.until"), m))?
        }
        Some(_) => return Err(ValidationError::new(format!("{at}.config.until"), "must be a jq condition")),
        None => return Err(ValidationError::new(format!("{at}.config.until"), "is required")),
    };
    let max_iterations = match config.get("max_iterations").and_then(Value::as_u64) {
        Some(n) if (1..=LOOP_MAX_ITERATIONS as u64).contains(&n) => n as u32,
        _ => {
            return Err(ValidationError::new(
                format!("{at}.config.max_iterations"),
                format!("is required: a whole number from 1 to {LOOP_MAX_ITERATIONS} (loop_max_iterations)"),
            ))
        }
    };
    let delay = match config.get("delay") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => {
            Some(duration::parse(d).map_err(|e| ValidationError::new(format!("{at}.config.delay"), e))?)
        }
        Some(_) => {
            return Err(ValidationError::new(format!("{at}.config.delay"), "must be a duration such as \"10s\""))
        }
    };
    Ok(NodeKind::Loop(LoopConfig { until, max_iterations, delay }))
}

/// The workflow (and version) a SUB_WORKFLOW or LOOP calls, and what
/// becomes of its child when the parent stops waiting for it.
fn child_workflow(at: &str, config: &Value) -> Result<(String, Option<i32>), ValidationError> {
    match config.get("on_parent_close") {
        None | Some(Value::Null) => {}
        Some(Value::String(p)) if p == "cancel" || p == "abandon" => {}
        Some(_) => {
            return Err(ValidationError::new(
                format!("{at}.config.on_parent_close"),
                "must be \"cancel\" (the default) or \"abandon\"",
            ))
        }
    }
    let workflow = match config.get("workflow") {
        Some(Value::String(w)) => {
            validate_name(&format!("{at}.config.workflow"), w)?;
            w.clone()
        }
        Some(_) => return Err(ValidationError::new(format!("{at}.config.workflow"), "must be a workflow's name")),
        None => return Err(ValidationError::new(format!("{at}.config.workflow"), "is required")),
    };
    let version = match config.get("version") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(n) if (1..=i32::MAX as i64).contains(&n) => Some(n as i32),
            _ => {
                return Err(ValidationError::new(
                    format!("{at}.config.version"),
                    "must be a version number (1 or more)",
                ))
            }
        },
    };
    Ok((workflow, version))
}

/// The HTTP methods an HTTP node may use.
pub const HTTP_METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

fn validate_http(at: &str, config: &Value) -> Result<(), ValidationError> {
    let field = |name: &str| format!("{at}.config.{name}");
    match config.get("url") {
        Some(u) if is_expression(u) => {}
        Some(Value::String(u)) if u.starts_with("http://") || u.starts_with("https://") => {}
        Some(Value::String(_)) => {
            return Err(ValidationError::new(field("url"), "must start with http:// or https://"))
        }
        Some(_) => return Err(ValidationError::new(field("url"), "must be a string")),
        None => return Err(ValidationError::new(field("url"), "is required")),
    }
    match config.get("method") {
        None => {}
        Some(m) if is_expression(m) => {}
        Some(Value::String(m)) if HTTP_METHODS.contains(&m.to_ascii_uppercase().as_str()) => {}
        Some(_) => {
            return Err(ValidationError::new(field("method"), format!("must be one of {}", HTTP_METHODS.join(", "))))
        }
    }
    if let Some(h) = config.get("headers").filter(|h| !is_expression(h)) {
        let ok = h.as_object().is_some_and(|m| m.values().all(Value::is_string));
        if !ok {
            return Err(ValidationError::new(field("headers"), "must be an object of string values"));
        }
    }
    if let Some(t) = config.get("timeout").filter(|t| !is_expression(t)) {
        let d = t
            .as_str()
            .ok_or_else(|| "must be a duration string such as \"10s\"".to_string())
            .and_then(duration::parse)
            .map_err(|e| ValidationError::new(field("timeout"), e))?;
        if d.is_zero() {
            return Err(ValidationError::new(field("timeout"), "must be greater than zero"));
        }
    }
    match config.get("idempotency_key") {
        None => {}
        Some(k) if is_expression(k) => {}
        Some(Value::String(k)) if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| (0x20..0x7f).contains(&b)) => {}
        Some(_) => {
            return Err(ValidationError::new(
                field("idempotency_key"),
                "must be \"per_attempt\", an expression, or text of 1 to 255 visible characters",
            ))
        }
    }
    if let Some(f) = config.get("follow_redirects").filter(|f| !is_expression(f)) {
        if !f.is_boolean() {
            return Err(ValidationError::new(field("follow_redirects"), "must be true or false"));
        }
    }
    for key in ["accept", "retry_statuses"] {
        if let Some(v) = config.get(key) {
            let ok =
                v.as_array().is_some_and(|a| a.iter().all(|s| s.as_u64().is_some_and(|c| (100..=599).contains(&c))));
            if !ok {
                return Err(ValidationError::new(field(key), "must be an array of HTTP status codes (100-599)"));
            }
        }
    }
    Ok(())
}
