//! The workflow language: a named DAG of nodes joined by edges.
//!
//! [`Workflow::parse`] turns user JSON into a validated, indexed [`Workflow`]
//! or a [`ValidationError`] that names the node and field at fault. The
//! engine compiles each definition version once and caches it.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::duration;
use crate::expr::{Expr, Template};

/// Upper bounds that keep one definition from exhausting the engine.
/// The queue of a node type that names none: its name in lower case.
pub fn default_queue(node_type: &str) -> String {
    node_type.to_ascii_lowercase()
}

pub const MAX_NODES: usize = 10_000;
pub const MAX_EDGES: usize = 50_000;
pub const MAX_ID_LEN: usize = 128;

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
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10_000))]
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<EdgeSpec>>))]
    pub edges: Vec<EdgeSpec>,
    /// The run's output, a template over `{input, nodes, run}`; by default the
    /// completed leaf nodes' outputs keyed by node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::JsonValue>))]
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

/// Most runs a concurrency limit may allow at once (`concurrency_max`).
pub const CONCURRENCY_MAX: u32 = 100_000;

/// A definition's limit on its open runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    /// What the limit is per (`${ .input.customer_id }`); one limit for the
    /// whole workflow without it.
    pub key: Option<Template>,
    pub max: u32,
}

impl Concurrency {
    /// The key of a run with `input`: text, `""` without a key template.
    pub fn key_of(&self, input: &Value) -> Result<String, String> {
        let Some(key) = &self.key else { return Ok(String::new()) };
        match key.eval(&json!({"input": input})) {
            Ok(Value::String(s)) if s.len() <= MAX_CONCURRENCY_KEY => Ok(s),
            Ok(Value::String(_)) => Err(format!("concurrency.key: longer than {MAX_CONCURRENCY_KEY} bytes")),
            Ok(Value::Number(n)) => Ok(n.to_string()),
            Ok(other) => Err(format!("concurrency.key: must be a string or a number, got {other}")),
            Err(e) => Err(format!("concurrency.key: {e}")),
        }
    }
}

/// Longest concurrency key, in bytes.
pub const MAX_CONCURRENCY_KEY: usize = 512;

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
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_.-]{1,128}$"))]
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
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::whole::opt_int")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1s"))]
    pub initial_backoff: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[^\\u0000]*$", example = "1m"))]
    pub max_backoff: Option<String>,
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
}

/// Why a definition was refused: `path` locates the problem
/// (`nodes[charge].config.url`), `message` says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValidationError {
    pub path: String,
    pub message: String,
}

impl ValidationError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { path: path.into(), message: message.into() }
    }
}

/// How a failed attempt is retried: `max_attempts` in all, waiting
/// `initial_backoff * multiplier^(attempt-1)`, capped at `max_backoff`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub multiplier: f64,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// Three attempts, 1 s then 2 s apart: enough to ride out a blip without
    /// hiding a broken endpoint for long.
    fn default() -> Self {
        Self {
            max_attempts: 3,
            initial_backoff: Duration::from_secs(1),
            multiplier: 2.0,
            max_backoff: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `failed_attempt + 1`.
    pub fn backoff(&self, failed_attempt: u32) -> Duration {
        let exp = failed_attempt.saturating_sub(1).min(64) as i32;
        let ms = self.initial_backoff.as_millis() as f64 * self.multiplier.powi(exp);
        let capped = ms.min(self.max_backoff.as_millis() as f64).max(0.0);
        Duration::from_millis(capped as u64)
    }
}

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
}

/// How deep SUB_WORKFLOWs may nest (`sub_workflow_max_depth`): a run at this
/// depth cannot start a child.
pub const SUB_WORKFLOW_MAX_DEPTH: i32 = 32;

/// Most items one MAP may have (`map_max_items`): a MAP's items are created
/// in one transaction, so this bounds that transaction.
pub const MAP_MAX_ITEMS: usize = 100_000;

/// A MAP node: `items` evaluates to a list; each element runs the node
/// template (`wf.nodes[template]`) with `.item` and `.index` bound.
#[derive(Debug, Clone, PartialEq)]
pub struct MapConfig {
    pub items: Template,
    /// Items in flight at once; `None` is all of them.
    pub max_concurrency: Option<u32>,
    /// `on_item_failure: "continue"`: a failed item's entry is
    /// `{"error": …}` and the MAP still completes.
    pub continue_on_failure: bool,
    /// The index in [`Workflow::nodes`] of the node each item runs.
    pub template: usize,
}

/// How long a WAIT node waits.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitFor {
    Duration(Duration),
    /// A timestamp (RFC 3339 text, or unix seconds) computed at run time.
    Until(Template),
}

/// A validated node with everything the engine needs precomputed.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: String,
    pub node_type: String,
    pub kind: NodeKind,
    /// The stream family this node is dispatched to (`None` for nodes the
    /// coordinator resolves itself, such as WAIT).
    pub queue: Option<String>,
    pub config: Value,
    /// `config` with its `${ … }` expressions compiled.
    pub template: Template,
    /// Node indices this node's expressions and incoming conditions read;
    /// `None` when they may read any node.
    pub reads: Option<Vec<usize>>,
    pub retry: RetryPolicy,
    /// The longest one attempt may take (dispatched nodes only).
    pub timeout: Option<Duration>,
    /// For a MAP's item template, the index of its MAP node. Templates come
    /// after the user's nodes in [`Workflow::nodes`], with no edges.
    pub item_of: Option<usize>,
}

impl Node {
    /// The queue a dispatch of this node goes to. Only HTTP and custom nodes
    /// are dispatched, and theirs is always resolved at validation; the
    /// fallback keeps this total.
    pub fn dispatch_queue(&self) -> &str {
        self.queue.as_deref().unwrap_or(&self.node_type)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// The condition under which the edge is active (its source COMPLETED).
    pub when: Option<Expr>,
}

/// A parsed and validated definition, indexed for the state machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub spec: WorkflowSpec,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    /// Incoming edge indices per node.
    pub incoming: Vec<Vec<usize>>,
    /// Outgoing edge indices per node.
    pub outgoing: Vec<Vec<usize>>,
    /// Node indices in an order where every edge points forward.
    pub topo_order: Vec<usize>,
    /// The run's output template, when the definition declares one.
    pub output: Option<Template>,
    /// The longest a run may take.
    pub timeout: Option<Duration>,
    /// The limit on open runs.
    pub concurrency: Option<Concurrency>,
    index: HashMap<String, usize>,
}

/// A compiled definition before it takes ownership of its spec.
struct Parts {
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    incoming: Vec<Vec<usize>>,
    outgoing: Vec<Vec<usize>>,
    topo_order: Vec<usize>,
    output: Option<Template>,
    timeout: Option<Duration>,
    concurrency: Option<Concurrency>,
    index: HashMap<String, usize>,
}

impl Workflow {
    /// Parses and validates a definition from JSON.
    pub fn parse(json: &Value) -> Result<Workflow, ValidationError> {
        Self::new(parse_spec(json)?)
    }

    /// Validates a spec and indexes it.
    pub fn new(spec: WorkflowSpec) -> Result<Workflow, ValidationError> {
        check_sizes(&spec)?;
        // Every expression of the definition in one jq program (the standard
        // library compiled once); when that fails, compiling them one by one
        // names the expression that does.
        match crate::expr::together(|| Workflow::build(&spec)) {
            Ok(Ok(parts)) => Ok(Workflow::assemble(spec, parts)),
            Ok(Err(e)) => Err(e),
            Err(_) => Workflow::build(&spec).map(|parts| Workflow::assemble(spec, parts)),
        }
    }

    fn assemble(spec: WorkflowSpec, parts: Parts) -> Workflow {
        let Parts { nodes, edges, incoming, outgoing, topo_order, output, timeout, concurrency, index } = parts;
        Workflow { spec, nodes, edges, incoming, outgoing, topo_order, output, timeout, concurrency, index }
    }

    fn build(spec: &WorkflowSpec) -> Result<Parts, ValidationError> {
        let (mut nodes, templates, index) = compile_nodes(spec)?;
        let Graph { edges, mut incoming, mut outgoing } = compile_edges(spec, &index)?;
        let topo_order = topological_order(spec, &edges, &incoming, &outgoing)?;
        for (i, node) in nodes.iter_mut().enumerate() {
            node.reads = reads_of(node, &incoming[i], &edges, &index);
        }
        // Item templates go after the user's nodes; a MAP reads what its
        // template reads (the items' inputs are evaluated in its scope).
        for (map, template) in templates {
            let reads = reads_of(&template, &[], &edges, &index);
            let at = nodes.len();
            if let NodeKind::Map(m) = &mut nodes[map].kind {
                m.template = at;
            }
            nodes[map].reads = match (nodes[map].reads.take(), reads) {
                (Some(mut a), Some(b)) => {
                    a.extend(b);
                    a.sort_unstable();
                    a.dedup();
                    Some(a)
                }
                _ => None,
            };
            nodes.push(Node { item_of: Some(map), ..template });
            incoming.push(Vec::new());
            outgoing.push(Vec::new());
        }
        let output = match &spec.output {
            Some(v) => Some(Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("output{p}"), m))?),
            None => None,
        };
        let timeout = match &spec.timeout {
            None => None,
            Some(t) => match duration::parse(t) {
                Ok(d) if d.is_zero() => return Err(ValidationError::new("timeout", "must be greater than zero")),
                Ok(d) => Some(d),
                Err(e) => return Err(ValidationError::new("timeout", e)),
            },
        };
        let concurrency = match &spec.concurrency {
            None => None,
            Some(c) => {
                if !(1..=CONCURRENCY_MAX).contains(&c.max) {
                    return Err(ValidationError::new(
                        "concurrency.max",
                        format!("must be a whole number from 1 to {CONCURRENCY_MAX}"),
                    ));
                }
                let key = match &c.key {
                    None => None,
                    Some(k) if k.contains(".nodes") || k.contains(".secrets") => {
                        return Err(ValidationError::new(
                            "concurrency.key",
                            "is computed when the run is created: it can read .input only",
                        ))
                    }
                    Some(k) => Some(
                        Template::compile(&Value::String(k.clone()))
                            .map_err(|(_, m)| ValidationError::new("concurrency.key", m))?,
                    ),
                };
                Some(Concurrency { key, max: c.max })
            }
        };
        Ok(Parts { nodes, edges, incoming, outgoing, topo_order, output, timeout, concurrency, index })
    }

    pub fn node_index(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// A leaf has no outgoing edges; the run's output is its leaves' outputs.
    /// (A MAP's item template is no leaf: it is not a node of the graph.)
    pub fn is_leaf(&self, node: usize) -> bool {
        self.outgoing[node].is_empty() && self.nodes[node].item_of.is_none()
    }

    /// The MAP node `id` names and its item template's index.
    pub fn map_template(&self, map_id: &str) -> Option<usize> {
        match &self.nodes[self.node_index(map_id)?].kind {
            NodeKind::Map(m) => Some(m.template),
            _ => None,
        }
    }
}

/// Deserializes a spec, naming the node whose fields are wrong.
fn parse_spec(json: &Value) -> Result<WorkflowSpec, ValidationError> {
    let obj =
        json.as_object().ok_or_else(|| ValidationError::new("$", "a workflow definition must be a JSON object"))?;
    for key in obj.keys() {
        if !matches!(key.as_str(), "name" | "description" | "nodes" | "edges" | "output" | "timeout" | "concurrency") {
            return Err(ValidationError::new(
                key.as_str(),
                "unknown field (expected name, description, nodes, edges, output, timeout, concurrency)",
            ));
        }
    }
    let name = match obj.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ValidationError::new("name", "must be a string")),
        None => return Err(ValidationError::new("name", "is required")),
    };
    let description = match obj.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ValidationError::new("description", "must be a string")),
    };
    let raw_nodes = match obj.get("nodes") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ValidationError::new("nodes", "must be an array")),
        None => return Err(ValidationError::new("nodes", "is required")),
    };
    let mut nodes = Vec::with_capacity(raw_nodes.len());
    for (i, raw) in raw_nodes.iter().enumerate() {
        let id = raw.get("id").and_then(Value::as_str).unwrap_or("");
        object_or_null(raw, &node_path(i, id))?;
        if let Some(retry) = raw.get("retry") {
            object_or_null(retry, &format!("{}.retry", node_path(i, id)))?;
        }
        let node: NodeSpec =
            serde_json::from_value(raw.clone()).map_err(|e| ValidationError::new(node_path(i, id), e.to_string()))?;
        nodes.push(node);
    }
    let edges = match obj.get("edges") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            let mut edges = Vec::with_capacity(a.len());
            for (i, raw) in a.iter().enumerate() {
                object_or_null(raw, &format!("edges[{i}]"))?;
                let edge: EdgeSpec = serde_json::from_value(raw.clone())
                    .map_err(|e| ValidationError::new(format!("edges[{i}]"), e.to_string()))?;
                edges.push(edge);
            }
            edges
        }
        Some(_) => return Err(ValidationError::new("edges", "must be an array")),
    };
    let output = obj.get("output").filter(|v| !v.is_null()).cloned();
    let timeout = match obj.get("timeout") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ValidationError::new("timeout", "must be a duration string such as \"1h\"")),
    };
    let concurrency = match obj.get("concurrency") {
        None | Some(Value::Null) => None,
        Some(c) => Some(object_or_null(c, "concurrency").and_then(|()| {
            serde_json::from_value(c.clone())
                .map_err(|e| ValidationError::new("concurrency", format!("{e} (expected {{key?, max}})")))
        })?),
    };
    Ok(WorkflowSpec { name, description, nodes, edges, output, timeout, concurrency })
}

/// Serde reads a struct from an array of its fields too (`"retry": []`):
/// a definition's objects must be written as objects.
fn object_or_null(v: &Value, path: &str) -> Result<(), ValidationError> {
    match v {
        Value::Object(_) | Value::Null => Ok(()),
        _ => Err(ValidationError::new(path, "must be an object")),
    }
}

fn node_path(i: usize, id: &str) -> String {
    if id.is_empty() {
        format!("nodes[{i}]")
    } else {
        format!("nodes[{id}]")
    }
}

/// Whether `name` is a valid workflow, node, queue or schedule name (the
/// API refuses filters that could name nothing).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    validate_name(what, name).map_err(|e| e.to_string())
}

/// Names and ids end up in stream keys, URLs and logs: keep them plain.
pub(crate) fn validate_name(path: &str, name: &str) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(ValidationError::new(path, "must not be empty"));
    }
    if name.len() > MAX_ID_LEN {
        return Err(ValidationError::new(path, format!("must be at most {MAX_ID_LEN} characters")));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        return Err(ValidationError::new(path, format!("{name:?} may contain only letters, digits, '_', '-' and '.'")));
    }
    Ok(())
}

/// Compiles a node; a MAP also returns its item template, compiled as a
/// node of its own.
fn compile_node(at: &str, n: &NodeSpec) -> Result<(Node, Option<Node>), ValidationError> {
    if n.node_type.is_empty() {
        return Err(ValidationError::new(format!("{at}.type"), "must not be empty"));
    }
    if n.node_type == "MAP" {
        return compile_map(at, n);
    }
    let config = match &n.config {
        Value::Null => Value::Object(Map::new()),
        v @ Value::Object(_) => v.clone(),
        _ => return Err(ValidationError::new(format!("{at}.config"), "must be an object")),
    };
    let template = Template::compile(&config).map_err(|(p, m)| ValidationError::new(format!("{at}.config{p}"), m))?;
    let retry = compile_retry(&format!("{at}.retry"), n.retry.as_ref())?;
    let queue = match &n.queue {
        Some(q) => {
            validate_name(&format!("{at}.queue"), q)?;
            Some(q.clone())
        }
        None => Some(default_queue(&n.node_type)),
    };
    let kind = match n.node_type.as_str() {
        "HTTP" => {
            validate_http(at, &config)?;
            NodeKind::Http
        }
        "WAIT" => NodeKind::Wait(compile_wait(at, &config)?),
        "WAIT_FOR_EVENT" => compile_wait_for_event(at, &config)?,
        "SUB_WORKFLOW" => compile_sub_workflow(at, &config)?,
        "TRANSFORM" => {
            only_fields(at, &config, &["output"])?;
            let output = config
                .get("output")
                .ok_or_else(|| ValidationError::new(format!("{at}.config.output"), "is required"))?;
            let output = Template::compile(output)
                .map_err(|(p, m)| ValidationError::new(format!("{at}.config.output{p}"), m))?;
            NodeKind::Transform { output }
        }
        other => {
            validate_name(&format!("{at}.type"), other)?;
            NodeKind::Custom
        }
    };
    let dispatched = matches!(kind, NodeKind::Http | NodeKind::Custom);
    let queue = if dispatched { queue } else { None };
    let timeout = match &n.timeout {
        None => None,
        Some(_) if !dispatched && !matches!(kind, NodeKind::SubWorkflow { .. }) => {
            return Err(ValidationError::new(
                format!("{at}.timeout"),
                "only HTTP, custom and SUB_WORKFLOW nodes take a timeout (WAIT_FOR_EVENT has config.timeout)",
            ))
        }
        Some(t) => match duration::parse(t) {
            Ok(d) if d.is_zero() => {
                return Err(ValidationError::new(format!("{at}.timeout"), "must be greater than zero"))
            }
            Ok(d) => Some(d),
            Err(e) => return Err(ValidationError::new(format!("{at}.timeout"), e)),
        },
    };
    let node = Node {
        id: n.id.clone(),
        node_type: n.node_type.clone(),
        kind,
        queue,
        config,
        template,
        reads: None,
        retry,
        timeout,
        item_of: None,
    };
    Ok((node, None))
}

/// A MAP: `items`, `max_concurrency`, `on_item_failure` and the item
/// template `node` (`type`, `config`, `queue`, `retry`, `timeout`).
fn compile_map(at: &str, n: &NodeSpec) -> Result<(Node, Option<Node>), ValidationError> {
    let field = |name: &str| format!("{at}.config.{name}");
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
    only_fields(at, &n.config, &["items", "max_concurrency", "on_item_failure", "node"])?;
    let items = match config.get("items") {
        Some(v) if v.is_array() || is_expression(v) => {
            Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("{}{p}", field("items")), m))?
        }
        Some(_) => {
            return Err(ValidationError::new(
                field("items"),
                "must be a list or an expression such as \"${ .input.orders }\"",
            ))
        }
        None => return Err(ValidationError::new(field("items"), "is required")),
    };
    let max_concurrency = match config.get("max_concurrency") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(c) if (1..=MAP_MAX_ITEMS as u64).contains(&c) => Some(c as u32),
            _ => {
                return Err(ValidationError::new(
                    field("max_concurrency"),
                    format!("must be a whole number from 1 to {MAP_MAX_ITEMS}"),
                ))
            }
        },
    };
    let continue_on_failure = match config.get("on_item_failure") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "fail" => false,
        Some(Value::String(s)) if s == "continue" => true,
        Some(_) => return Err(ValidationError::new(field("on_item_failure"), "must be \"fail\" or \"continue\"")),
    };
    let raw = match config.get("node") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ValidationError::new(field("node"), "must be an object (the node each item runs)")),
        None => return Err(ValidationError::new(field("node"), "is required")),
    };
    if raw.contains_key("id") {
        return Err(ValidationError::new(
            field("node.id"),
            format!("an item has no id of its own: items are {}[0], {}[1], …", n.id, n.id),
        ));
    }
    let mut with_id = raw.clone();
    with_id.insert("id".into(), Value::String(n.id.clone()));
    let spec: NodeSpec = serde_json::from_value(Value::Object(with_id))
        .map_err(|e| ValidationError::new(field("node"), e.to_string()))?;
    let node_at = field("node");
    let (template, _) = match spec.node_type.as_str() {
        "MAP" => {
            return Err(ValidationError::new(
                format!("{node_at}.type"),
                "a MAP cannot run a MAP per item; call a workflow that maps instead (SUB_WORKFLOW)",
            ))
        }
        "WAIT" | "WAIT_FOR_EVENT" => {
            return Err(ValidationError::new(
                format!("{node_at}.type"),
                format!(
                    "{} is not supported per item: an item is HTTP, TRANSFORM, SUB_WORKFLOW or a custom type",
                    spec.node_type
                ),
            ))
        }
        _ => compile_node(&node_at, &spec)?,
    };
    let kind = NodeKind::Map(MapConfig { items, max_concurrency, continue_on_failure, template: usize::MAX });
    let node = Node {
        id: n.id.clone(),
        node_type: n.node_type.clone(),
        kind,
        queue: None,
        config: n.config.clone(),
        template: Template::compile(&json!({})).expect("an empty template compiles"),
        reads: None,
        retry: RetryPolicy::default(),
        timeout: None,
        item_of: None,
    };
    Ok((node, Some(template)))
}

fn check_sizes(spec: &WorkflowSpec) -> Result<(), ValidationError> {
    validate_name("name", &spec.name)?;
    if spec.nodes.is_empty() {
        return Err(ValidationError::new("nodes", "a workflow needs at least one node"));
    }
    if spec.nodes.len() > MAX_NODES {
        return Err(ValidationError::new("nodes", format!("at most {MAX_NODES} nodes are allowed")));
    }
    if spec.edges.len() > MAX_EDGES {
        return Err(ValidationError::new("edges", format!("at most {MAX_EDGES} edges are allowed")));
    }
    Ok(())
}

/// The compiled nodes, each MAP's item template with its MAP's index, and
/// the nodes indexed by id (ids must be unique).
type CompiledNodes = (Vec<Node>, Vec<(usize, Node)>, HashMap<String, usize>);

fn compile_nodes(spec: &WorkflowSpec) -> Result<CompiledNodes, ValidationError> {
    let mut index = HashMap::with_capacity(spec.nodes.len());
    let mut nodes = Vec::with_capacity(spec.nodes.len());
    let mut templates = Vec::new();
    for (i, n) in spec.nodes.iter().enumerate() {
        let at = node_path(i, &n.id);
        validate_name(&format!("{at}.id"), &n.id)?;
        if index.insert(n.id.clone(), i).is_some() {
            return Err(ValidationError::new(at, format!("duplicate node id {:?}", n.id)));
        }
        let (node, template) = compile_node(&at, n)?;
        nodes.push(node);
        if let Some(t) = template {
            templates.push((i, t));
        }
    }
    Ok((nodes, templates, index))
}

/// The edges with their conditions compiled, and each node's in and out edges.
struct Graph {
    edges: Vec<Edge>,
    incoming: Vec<Vec<usize>>,
    outgoing: Vec<Vec<usize>>,
}

fn compile_edges(spec: &WorkflowSpec, index: &HashMap<String, usize>) -> Result<Graph, ValidationError> {
    let mut g = Graph {
        edges: Vec::with_capacity(spec.edges.len()),
        incoming: vec![Vec::new(); spec.nodes.len()],
        outgoing: vec![Vec::new(); spec.nodes.len()],
    };
    let mut seen = BTreeSet::new();
    for (i, e) in spec.edges.iter().enumerate() {
        let at = format!("edges[{i}]");
        let from = *index
            .get(&e.from)
            .ok_or_else(|| ValidationError::new(format!("{at}.from"), format!("unknown node {:?}", e.from)))?;
        let to = *index
            .get(&e.to)
            .ok_or_else(|| ValidationError::new(format!("{at}.to"), format!("unknown node {:?}", e.to)))?;
        if !seen.insert((from, to)) {
            return Err(ValidationError::new(at, format!("duplicate edge {:?} -> {:?}", e.from, e.to)));
        }
        let when = match &e.when {
            Some(src) if src.contains(".secrets") => {
                return Err(ValidationError::new(format!("{at}.when"), "conditions cannot read secrets"))
            }
            Some(src) => Some(Expr::compile(src).map_err(|m| ValidationError::new(format!("{at}.when"), m))?),
            None => None,
        };
        g.incoming[to].push(g.edges.len());
        g.outgoing[from].push(g.edges.len());
        g.edges.push(Edge { from, to, when });
    }
    Ok(g)
}

/// The nodes `node`'s expressions and incoming conditions read, sorted;
/// `None` when an expression may read any node.
fn reads_of(node: &Node, incoming: &[usize], edges: &[Edge], index: &HashMap<String, usize>) -> Option<Vec<usize>> {
    let mut sources = node.template.sources();
    match &node.kind {
        NodeKind::Wait(WaitFor::Until(t)) | NodeKind::Transform { output: t } => sources.extend(t.sources()),
        NodeKind::WaitForEvent { key, .. } => sources.extend(key.sources()),
        NodeKind::Map(m) => sources.extend(m.items.sources()),
        _ => {}
    }
    sources.extend(incoming.iter().filter_map(|&e| edges[e].when.as_ref().map(|w| w.source())));
    let mut reads = Vec::new();
    for src in sources {
        reads.extend(crate::expr::node_refs(src)?.iter().filter_map(|id| index.get(id).copied()));
    }
    reads.sort_unstable();
    reads.dedup();
    Some(reads)
}

fn only_fields(at: &str, config: &Value, allowed: &[&str]) -> Result<(), ValidationError> {
    for key in config.as_object().into_iter().flat_map(|m| m.keys()) {
        if !allowed.contains(&key.as_str()) {
            return Err(ValidationError::new(
                format!("{at}.config.{key}"),
                format!("unknown field (expected {})", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

fn is_expression(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.contains("${"))
}

fn compile_wait_for_event(at: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    only_fields(at, config, &["event", "key", "timeout", "default_output"])?;
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

/// `{workflow, version?, input?}`: the workflow is named, not computed, so
/// that a definition says what it calls.
fn compile_sub_workflow(at: &str, config: &Value) -> Result<NodeKind, ValidationError> {
    only_fields(at, config, &["workflow", "version", "input"])?;
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
    Ok(NodeKind::SubWorkflow { workflow, version })
}

fn compile_retry(at: &str, spec: Option<&RetrySpec>) -> Result<RetryPolicy, ValidationError> {
    let mut policy = RetryPolicy::default();
    let Some(spec) = spec else { return Ok(policy) };
    if let Some(n) = spec.max_attempts {
        if !(1..=1000).contains(&n) {
            return Err(ValidationError::new(format!("{at}.max_attempts"), "must be between 1 and 1000"));
        }
        policy.max_attempts = n;
    }
    if let Some(d) = &spec.initial_backoff {
        policy.initial_backoff =
            duration::parse(d).map_err(|e| ValidationError::new(format!("{at}.initial_backoff"), e))?;
    }
    if let Some(m) = spec.multiplier {
        if !(1.0..=100.0).contains(&m) {
            return Err(ValidationError::new(format!("{at}.multiplier"), "must be between 1 and 100"));
        }
        policy.multiplier = m;
    }
    if let Some(d) = &spec.max_backoff {
        policy.max_backoff = duration::parse(d).map_err(|e| ValidationError::new(format!("{at}.max_backoff"), e))?;
    }
    if policy.max_backoff < policy.initial_backoff {
        policy.max_backoff = policy.initial_backoff;
    }
    Ok(policy)
}

/// The HTTP methods an HTTP node may use.
pub const HTTP_METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

fn validate_http(at: &str, config: &Value) -> Result<(), ValidationError> {
    let field = |name: &str| format!("{at}.config.{name}");
    for key in config.as_object().into_iter().flat_map(|m| m.keys()) {
        let known = ["method", "url", "headers", "body", "timeout", "accept", "retry_statuses", "follow_redirects"];
        if !known.contains(&key.as_str()) {
            return Err(ValidationError::new(field(key), format!("unknown field (expected {})", known.join(", "))));
        }
    }
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

fn compile_wait(at: &str, config: &Value) -> Result<WaitFor, ValidationError> {
    only_fields(at, config, &["duration", "until"])?;
    match (config.get("duration"), config.get("until")) {
        (Some(Value::String(s)), None) => duration::parse(s)
            .map(WaitFor::Duration)
            .map_err(|e| ValidationError::new(format!("{at}.config.duration"), e)),
        (Some(_), None) => {
            Err(ValidationError::new(format!("{at}.config.duration"), "must be a duration string such as \"1h\""))
        }
        (None, Some(until)) => Template::compile(until)
            .map(WaitFor::Until)
            .map_err(|(_, m)| ValidationError::new(format!("{at}.config.until"), m)),
        (Some(_), Some(_)) => Err(ValidationError::new(format!("{at}.config"), "give duration or until, not both")),
        (None, None) => Err(ValidationError::new(format!("{at}.config.duration"), "is required (or until)")),
    }
}

/// Kahn's algorithm; whatever cannot be ordered lies on a cycle.
fn topological_order(
    spec: &WorkflowSpec,
    edges: &[Edge],
    incoming: &[Vec<usize>],
    outgoing: &[Vec<usize>],
) -> Result<Vec<usize>, ValidationError> {
    let mut remaining: Vec<usize> = incoming.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..remaining.len()).filter(|&n| remaining[n] == 0).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(remaining.len());
    while let Some(n) = ready.pop() {
        order.push(n);
        for &e in &outgoing[n] {
            let to = edges[e].to;
            remaining[to] -= 1;
            if remaining[to] == 0 {
                ready.push(to);
            }
        }
    }
    if order.len() == remaining.len() {
        return Ok(order);
    }
    let stuck: Vec<&str> =
        (0..remaining.len()).filter(|&n| remaining[n] > 0).map(|n| spec.nodes[n].id.as_str()).collect();
    Err(ValidationError::new("edges", format!("the edges form a cycle; nodes on or after it: {}", stuck.join(", "))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn http(id: &str) -> Value {
        json!({"id": id, "type": "HTTP", "config": {"url": "http://127.0.0.1/x"}})
    }

    fn err(v: Value) -> ValidationError {
        Workflow::parse(&v).expect_err("should be refused")
    }

    fn map(config: Value) -> Value {
        json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": config}]})
    }

    #[test]
    fn a_map_compiles_its_item_template_as_a_node_outside_the_graph() {
        let wf = Workflow::parse(&json!({"name": "m", "nodes": [
            http("a"),
            {"id": "each", "type": "MAP", "config": {"items": "${ .nodes.a.output.list }", "max_concurrency": 5,
             "node": {"type": "HTTP", "retry": {"max_attempts": 7}, "timeout": "10s",
                      "config": {"url": "http://h/${ .item.id }?from=${ .nodes.a.output.x }"}}}}
        ], "edges": [{"from": "a", "to": "each"}]}))
        .unwrap();
        let each = wf.node_index("each").unwrap();
        let NodeKind::Map(m) = &wf.nodes[each].kind else { panic!("not a MAP") };
        assert_eq!(m.max_concurrency, Some(5));
        assert!(!m.continue_on_failure);
        let template = &wf.nodes[m.template];
        assert_eq!((template.item_of, template.retry.max_attempts), (Some(each), 7));
        assert_eq!(template.timeout, Some(Duration::from_secs(10)));
        assert_eq!(template.queue.as_deref(), Some("http"));
        assert_eq!(wf.nodes[each].reads, Some(vec![0]), "the MAP reads what its items read");
        assert!(wf.is_leaf(each) && !wf.is_leaf(m.template));
        assert!(!wf.topo_order.contains(&m.template));
        assert_eq!(wf.node_index("each[]"), None);
    }

    #[test]
    fn a_sub_workflow_names_its_workflow_and_may_have_a_version_and_a_timeout() {
        let sub =
            |config: Value| json!({"name": "p", "nodes": [{"id": "c", "type": "SUB_WORKFLOW", "config": config}]});
        let wf = Workflow::parse(&sub(json!({"workflow": "billing", "version": 2, "input": {"a": "${ .input.a }"}})))
            .unwrap();
        assert_eq!(wf.nodes[0].kind, NodeKind::SubWorkflow { workflow: "billing".into(), version: Some(2) });
        assert_eq!(wf.nodes[0].queue, None, "not dispatched to workers");
        let mut timed = sub(json!({"workflow": "billing"}));
        timed["nodes"][0]["timeout"] = json!("1h");
        assert_eq!(Workflow::parse(&timed).unwrap().nodes[0].timeout, Some(Duration::from_secs(3600)));
        for (config, path) in [
            (json!({}), "nodes[c].config.workflow"),
            (json!({"workflow": "${ .input.w }"}), "nodes[c].config.workflow"),
            (json!({"workflow": "b", "version": 0}), "nodes[c].config.version"),
            (json!({"workflow": "b", "extra": 1}), "nodes[c].config.extra"),
        ] {
            assert_eq!(err(sub(config.clone())).path, path, "{config}");
        }
    }

    #[test]
    fn a_concurrency_limit_has_a_max_and_a_key_computed_from_the_input_alone() {
        let spec = |c: Value| json!({"name": "c", "concurrency": c, "nodes": [http("a")]});
        let wf = Workflow::parse(&spec(json!({"key": "${ .input.customer.id }", "max": 2}))).unwrap();
        let limit = wf.concurrency.as_ref().unwrap();
        assert_eq!(limit.max, 2);
        assert_eq!(limit.key_of(&json!({"customer": {"id": "c-1"}})), Ok("c-1".into()));
        assert_eq!(limit.key_of(&json!({"customer": {"id": 7}})), Ok("7".into()));
        assert!(limit.key_of(&json!({"customer": {}})).unwrap_err().contains("must be a string or a number"));
        assert!(limit.key_of(&json!({"customer": {"id": "k".repeat(600)}})).unwrap_err().contains("512"));
        let whole = Workflow::parse(&spec(json!({"max": 1}))).unwrap();
        assert_eq!(whole.concurrency.unwrap().key_of(&json!({})), Ok(String::new()), "one limit for the workflow");
        for (c, path) in [
            (json!({"max": 0}), "concurrency.max"),
            (json!({"key": "${ .nodes.a.output }", "max": 1}), "concurrency.key"),
            (json!({"key": "${ .input.x", "max": 1}), "concurrency.key"),
            (json!({"max": 1, "per": "x"}), "concurrency"),
            (json!({"key": "x"}), "concurrency"),
        ] {
            assert_eq!(err(spec(c.clone())).path, path, "{c}");
        }
    }

    #[test]
    fn objects_written_as_arrays_are_refused() {
        // Serde would read `[]` as a struct of absent fields.
        let mut node = http("a");
        node["retry"] = json!([]);
        assert_eq!(err(json!({"name": "w", "nodes": [node]})).path, "nodes[a].retry");
        let e = err(json!({"name": "w", "nodes": [http("a"), http("b")], "edges": [["a", "b"]]}));
        assert_eq!(e.path, "edges[0]");
        assert_eq!(err(json!({"name": "w", "nodes": [http("a")], "concurrency": [1]})).path, "concurrency");
        assert_eq!(err(json!({"name": "w", "nodes": [["a", "HTTP"]]})).path, "nodes[0]");
    }

    #[test]
    fn a_bad_map_is_refused_naming_the_field() {
        let node = json!({"type": "HTTP", "config": {"url": "http://h/x"}});
        let cases = [
            (map(json!({"node": node})), "nodes[each].config.items", "is required"),
            (map(json!({"items": "plain", "node": node})), "nodes[each].config.items", "must be a list"),
            (
                map(json!({"items": [], "node": node, "max_concurrency": 0})),
                "nodes[each].config.max_concurrency",
                "from 1",
            ),
            (
                map(json!({"items": [], "node": node, "on_item_failure": "ignore"})),
                "nodes[each].config.on_item_failure",
                "\"fail\" or \"continue\"",
            ),
            (map(json!({"items": []})), "nodes[each].config.node", "is required"),
            (map(json!({"items": [], "node": node, "extra": 1})), "nodes[each].config.extra", "unknown field"),
            (
                map(json!({"items": [], "node": {"type": "MAP", "config": {}}})),
                "nodes[each].config.node.type",
                "SUB_WORKFLOW",
            ),
            (
                map(json!({"items": [], "node": {"type": "WAIT", "config": {"duration": "1s"}}})),
                "nodes[each].config.node.type",
                "not supported per item",
            ),
            (
                map(json!({"items": [], "node": {"type": "HTTP", "config": {}}})),
                "nodes[each].config.node.config.url",
                "is required",
            ),
            (
                map(json!({"items": [], "node": {"id": "x", "type": "HTTP", "config": {"url": "http://h"}}})),
                "nodes[each].config.node.id",
                "no id",
            ),
        ];
        for (spec, path, message) in cases {
            let e = err(spec.clone());
            assert_eq!(e.path, path, "{spec}");
            assert!(e.message.contains(message), "{spec}: {}", e.message);
        }
        let mut retry_on_map = map(json!({"items": [], "node": node}));
        retry_on_map["nodes"][0]["retry"] = json!({"max_attempts": 2});
        assert_eq!(err(retry_on_map).path, "nodes[each].retry");
    }

    #[test]
    fn accepts_a_diamond() {
        let wf = Workflow::parse(&json!({
            "name": "diamond",
            "nodes": [http("a"), http("b"), http("c"), http("d")],
            "edges": [{"from":"a","to":"b"},{"from":"a","to":"c"},{"from":"b","to":"d"},{"from":"c","to":"d"}]
        }))
        .unwrap();
        assert_eq!(wf.topo_order.first(), Some(&0));
        assert_eq!(wf.topo_order.last(), Some(&3));
        assert_eq!(wf.nodes[0].queue.as_deref(), Some("http"));
        assert!(wf.is_leaf(3) && !wf.is_leaf(0));
    }

    #[test]
    fn refuses_cycles_naming_the_nodes() {
        let e = err(json!({"name":"c","nodes":[http("a"), http("b")],
            "edges":[{"from":"a","to":"b"},{"from":"b","to":"a"}]}));
        assert!(e.message.contains("cycle") && e.message.contains('a') && e.message.contains('b'), "{e}");
    }

    #[test]
    fn refuses_duplicate_ids_unknown_edges_and_empty_names() {
        assert!(err(json!({"name":"d","nodes":[http("a"), http("a")]})).message.contains("duplicate node id"));
        let e = err(json!({"name":"u","nodes":[http("a")],"edges":[{"from":"a","to":"zz"}]}));
        assert_eq!(e.path, "edges[0].to");
        assert!(e.message.contains("zz"));
        assert_eq!(err(json!({"name":"","nodes":[http("a")]})).path, "name");
        assert_eq!(err(json!({"name":"x","nodes":[]})).path, "nodes");
    }

    #[test]
    fn a_node_timeout_is_for_dispatched_nodes_and_a_duration() {
        let ok = Workflow::parse(&json!({"name": "x", "nodes": [{"id": "a", "type": "HTTP",
            "config": {"url": "http://h"}, "timeout": "30s"}]}))
        .unwrap();
        assert_eq!(ok.nodes[0].timeout, Some(Duration::from_secs(30)));
        let e = err(
            json!({"name": "x", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}, "timeout": "5s"}]}),
        );
        assert_eq!(e.path, "nodes[w].timeout");
        let e = err(
            json!({"name": "x", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}, "timeout": "soon"}]}),
        );
        assert_eq!(e.path, "nodes[a].timeout");
    }

    #[test]
    fn an_unknown_function_is_named_with_its_node_and_field() {
        let e = err(json!({"name": "x", "nodes": [http("a"),
            {"id": "t", "type": "TRANSFORM", "config": {"output": {"v": "${ nope_not_here }"}}}]}));
        assert_eq!(e.path, "nodes[t].config.output.v", "{e}");
        assert!(e.message.contains("nope_not_here"), "{e}");
    }

    #[test]
    fn refuses_unknown_fields_and_bad_config_naming_the_node() {
        let e = err(json!({"name":"x","nodes":[{"id":"a","type":"HTTP","config":{"url":"http://h"},"colour":1}]}));
        assert_eq!(e.path, "nodes[a]");
        assert!(e.message.contains("colour"), "{e}");
        let e = err(json!({"name":"x","nodes":[{"id":"a","type":"HTTP","config":{}}]}));
        assert_eq!(e.path, "nodes[a].config.url");
        let e = err(json!({"name":"x","nodes":[{"id":"a","type":"HTTP","config":{"url":"http://h","timeout":"ten"}}]}));
        assert_eq!(e.path, "nodes[a].config.timeout");
        let e = err(json!({"name":"x","nodes":[{"id":"w","type":"WAIT","config":{"duration":"5"}}]}));
        assert_eq!(e.path, "nodes[w].config.duration");
        let e = err(json!({"name":"x","nodes":[http("a")],"extra":true}));
        assert_eq!(e.path, "extra");
        let e = err(json!({"name":"x","nodes":[{"id":"a","type":"HTTP","config":{"url":"http://h"},
            "retry":{"max_attempts":0}}]}));
        assert_eq!(e.path, "nodes[a].retry.max_attempts");
    }

    #[test]
    fn custom_types_go_to_their_lowercase_queue() {
        let wf = Workflow::parse(&json!({"name":"x","nodes":[
            {"id":"r","type":"resize-image"},
            {"id":"q","type":"resize-image","queue":"gpu"},
            {"id":"w","type":"WAIT","config":{"duration":"1s"}}]}))
        .unwrap();
        assert_eq!(wf.nodes[0].kind, NodeKind::Custom);
        assert_eq!(wf.nodes[0].queue.as_deref(), Some("resize-image"));
        assert_eq!(wf.nodes[1].queue.as_deref(), Some("gpu"));
        assert_eq!(wf.nodes[2].queue, None);
        assert_eq!(wf.nodes[2].kind, NodeKind::Wait(WaitFor::Duration(Duration::from_secs(1))));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            multiplier: 2.0,
            max_backoff: Duration::from_millis(500),
        };
        let got: Vec<u64> = (1..=5).map(|a| p.backoff(a).as_millis() as u64).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }
}
