//! The workflow language: a named DAG of nodes joined by edges.
//!
//! - [`spec`]: the definition as written (JSON), before validation.
//! - [`check`]: [`ValidationError`] and the checks every part shares.
//! - [`kind`]: what each node type is and may do: the one place that
//!   describes a kind ([`NodeKind::traits`]) and reads its config.
//! - [`config`]: each built-in type's config, field by field: what takes an
//!   expression, what is required; the schema is generated from it.
//! - [`node`]: a validated node: its kind, queue, retry policy, timeout.
//! - [`limit`]: a node's limits on its steps across runs (rates,
//!   concurrencies, named limits), as written and compiled.
//! - [`input_schema`]: a workflow's JSON Schema of its runs' input,
//!   compiled at registration and checked at every start.
//! - `hooks`: the runs a run's end starts (`on_failure`, `on_success`,
//!   `on_end`) and those its deadlines start, compiled; `updates`: the
//!   updates a waiting step accepts, and its decision on one.
//! - [`approval`]: an APPROVAL node's config, the request its step keeps,
//!   and how a vote is judged and counted.
//! - `trigger`: a workflow's triggers and their flow control, compiled.
//! - [`start`]: what a definition decides of a new run from its input:
//!   its tags, concurrency key and fairness key, in one scope of it.
//! - `located`: reading a part of a definition with serde so that an
//!   error names the field at fault by its whole path.
//!
//! [`Workflow::parse`] turns user JSON into a validated, indexed [`Workflow`]
//! or a [`ValidationError`] that names the node and field at fault. The
//! engine compiles each definition version once and caches it.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde_json::Value;

use crate::expr::{Expr, OneScope, Sandbox, Template};
use input_schema::InputSchema;

pub mod approval;
mod check;
pub mod config;
mod hooks;
pub mod input_schema;
mod kind;
pub mod limit;
pub mod located;
mod node;
mod spec;
mod trigger;
mod updates;

pub use check::{check_name, check_path_segment, ValidationError, MAX_ID_LEN};
pub use hooks::{Deadline, Ends, Hook, HookKind, MAX_DEADLINES};
pub use kind::{
    is_error_code, traits_of, Collect, LoopConfig, MapConfig, NodeKind, Tolerated, Traits, WaitFor, BUILT_IN,
    HTTP_METHODS, LOOP_MAX_ITERATIONS, MAP_DEFAULT_CONCURRENCY, MAP_MAX_ITEMS, MAX_ERROR_CODE_LEN,
    MIN_COLLECTED_ITEM_BYTES, SUB_WORKFLOW_MAX_DEPTH,
};
pub use node::{default_queue, Node, RetryPolicy, MAX_RETRY_ATTEMPTS, MAX_RETRY_MULTIPLIER};
pub use spec::{
    BatchSpec, ConcurrencySpec, DeadlineSpec, DeadlineStartSpec, DebounceSpec, Delivery, EdgeOn, EdgeSpec, Excess,
    HookSpec, NodeSpec, On429, OnFailureSpec, RetrySpec, SingletonMode, ThrottleSpec, TriggerSpec, UpdateSpec,
    WorkflowSpec,
};
use trigger::compile_triggers;
pub use trigger::{Fired, Flow, Flowed, Trigger, MAX_EVENT_KEY, MAX_EVENT_NAME, MAX_TRIGGERS};
pub use updates::{scope as update_scope, Decision, Update, MAX_REFUSAL_CHARS, MAX_UPDATES};

use check::positive_duration;
mod start;
pub(crate) use check::validate_name;
use node::compile_node;
pub(crate) use spec::read;
use spec::{node_path, parse_spec};
use start::compile_tags;
pub use start::{
    is_tag_key, tag_value, StartKeyError, StartKeys, MAX_CONCURRENCY_KEY, MAX_FAIRNESS_KEY, MAX_TAGS, MAX_TAG_VALUE,
};

/// Upper bounds that keep one definition from exhausting the engine.
pub const MAX_NODES: usize = 10_000;
pub const MAX_EDGES: usize = 50_000;

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
    pub fn key_of(&self, sb: &Sandbox, input: &Value) -> Result<String, String> {
        start::concurrency_key(self.key.as_ref(), sb, &OneScope::new("input", input))
    }
}

/// A key computed when a run is created, from its input alone.
fn input_only_template(field: &str, k: &str) -> Result<Template, ValidationError> {
    if k.contains(".nodes") || k.contains(".secrets") {
        return Err(ValidationError::new(field, "is computed when the run is created: it can read .input only"));
    }
    Template::compile(&Value::String(k.to_string())).map_err(|(_, m)| ValidationError::new(field, m))
}

#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// The condition under which the edge is active (its source ended as
    /// `on` says).
    pub when: Option<Expr>,
    /// Which end of its source the edge follows.
    pub on: EdgeOn,
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
    /// What every run's input is checked against when the run is created.
    pub input_schema: Option<InputSchema>,
    /// The longest a run may take.
    pub timeout: Option<Duration>,
    /// The limit on open runs.
    pub concurrency: Option<Concurrency>,
    /// The runs a run's end starts (`on_failure`, `on_success`, `on_end`).
    pub hooks: Vec<Hook>,
    /// The runs a run that has not ended some time after its start starts.
    pub deadlines: Vec<Deadline>,
    /// Every run's tags, by key, evaluated over `{input}` when it starts.
    pub tags: Vec<(String, Template)>,
    /// The events that start runs of it.
    pub triggers: Vec<Trigger>,
    /// Its runs' priority unless a start gives one ([`crate::priority`]).
    pub priority: u8,
    /// Whose work a run is, over `{input}`.
    pub fairness_key: Option<Template>,
    /// Whether every expression it has is simple ([`crate::expr::is_simple`]:
    /// no recursion, loop or costly native, so its time is bounded by its
    /// input's size): applying its events may then skip the evaluation
    /// threads a hostile expression needs.
    pub simple: bool,
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
    input_schema: Option<InputSchema>,
    timeout: Option<Duration>,
    concurrency: Option<Concurrency>,
    hooks: Vec<Hook>,
    deadlines: Vec<Deadline>,
    tags: Vec<(String, Template)>,
    triggers: Vec<Trigger>,
    fairness_key: Option<Template>,
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
        let (built, simple) =
            crate::expr::noting_simplicity(|| match crate::expr::together(|| Workflow::build(&spec)) {
                Ok(Ok(parts)) => Ok(parts),
                Ok(Err(e)) => Err(e),
                Err(_) => Workflow::build(&spec),
            });
        built.map(|parts| Workflow { simple, ..Workflow::assemble(spec, parts) })
    }

    fn assemble(spec: WorkflowSpec, parts: Parts) -> Workflow {
        let Parts {
            nodes,
            edges,
            incoming,
            outgoing,
            topo_order,
            output,
            input_schema,
            timeout,
            concurrency,
            hooks,
            deadlines,
            tags,
            triggers,
            fairness_key,
            index,
        } = parts;
        let priority = spec.priority.unwrap_or(crate::priority::DEFAULT);
        Workflow {
            spec,
            nodes,
            edges,
            incoming,
            outgoing,
            topo_order,
            output,
            input_schema,
            timeout,
            concurrency,
            hooks,
            deadlines,
            tags,
            triggers,
            priority,
            fairness_key,
            simple: false,
            index,
        }
    }

    fn build(spec: &WorkflowSpec) -> Result<Parts, ValidationError> {
        let (mut nodes, templates, index) = compile_nodes(spec)?;
        let Graph { edges, mut incoming, mut outgoing } = compile_edges(spec, &index)?;
        let topo_order = topological_order(spec, &edges, &incoming, &outgoing)?;
        for (i, node) in nodes.iter_mut().enumerate() {
            node.reads = reads_of(node, &incoming[i], &edges, &index);
            node.reads_input = sources_of(node, &incoming[i], &edges).into_iter().any(crate::expr::reads_input);
        }
        // Item templates go after the user's nodes; a MAP reads what its
        // template reads (the items' inputs are evaluated in its scope).
        for (map, template) in templates {
            let reads = reads_of(&template, &[], &edges, &index);
            nodes[map].reads_input |= sources_of(&template, &[], &edges).into_iter().any(crate::expr::reads_input);
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
            Some(t) => Some(positive_duration("timeout", t)?),
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
                    Some(k) => Some(input_only_template("concurrency.key", k)?),
                };
                Some(Concurrency { key, max: c.max })
            }
        };
        let (hooks, deadlines) = hooks::compile_hooks_and_deadlines(spec)?;
        let tags = compile_tags(spec.tags.as_ref())?;
        let input_schema = spec.input_schema.as_ref().map(|s| InputSchema::compile(s, "input_schema")).transpose()?;
        let triggers = compile_triggers(spec.triggers.as_deref(), input_schema.as_ref())?;
        let fairness_key = match &spec.fairness_key {
            None => None,
            Some(k) => Some(input_only_template("fairness_key", k)?),
        };
        Ok(Parts {
            nodes,
            edges,
            incoming,
            outgoing,
            topo_order,
            output,
            input_schema,
            timeout,
            concurrency,
            hooks,
            deadlines,
            tags,
            triggers,
            fairness_key,
            index,
        })
    }

    pub fn node_index(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// Whether a failure of `node` is handled: it has a `failure` or
    /// `always` edge, so it does not fail the run.
    pub fn handles_failure(&self, node: usize) -> bool {
        self.outgoing[node].iter().any(|&e| self.edges[e].on != EdgeOn::Success)
    }

    /// Every node reachable from `node` by its outgoing edges, not itself.
    pub fn downstream(&self, node: usize) -> Vec<bool> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack: Vec<usize> = self.outgoing[node].iter().map(|&e| self.edges[e].to).collect();
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut seen[n], true) {
                stack.extend(self.outgoing[n].iter().map(|&e| self.edges[e].to));
            }
        }
        seen
    }

    /// Whether a run of it can create MAP items (it has a MAP node).
    pub fn has_items(&self) -> bool {
        self.nodes.iter().any(|n| n.kind.traits().has_items)
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
        if matches!(spec.nodes[from].node_type.as_str(), "FAIL") {
            return Err(ValidationError::new(
                format!("{at}.from"),
                format!("{:?} is a FAIL node, which ends the run: it has no outgoing edges", e.from),
            ));
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
        g.edges.push(Edge { from, to, when, on: e.on.unwrap_or_default() });
    }
    Ok(g)
}

impl Workflow {
    /// The templates a new run's creation evaluates over its input: its
    /// tags, concurrency key and fairness key.
    pub fn start_templates(&self) -> impl Iterator<Item = &Template> {
        self.tags
            .iter()
            .map(|(_, t)| t)
            .chain(self.concurrency.as_ref().and_then(|c| c.key.as_ref()))
            .chain(self.fairness_key.as_ref())
    }

    /// A new run's tags, fairness key and concurrency key, from its input
    /// (and the start's `given` tags), in one scope of the input
    /// (converted once, if read); the error names the field.
    pub fn start_keys(
        &self,
        sb: &Sandbox,
        input: &Value,
        given: Option<&serde_json::Map<String, Value>>,
    ) -> Result<StartKeys, StartKeyError> {
        let templates = start::StartTemplates {
            tags: &self.tags,
            fairness_key: self.fairness_key.as_ref(),
            concurrency_key: self.concurrency.as_ref().map(|c| c.key.as_ref()),
        };
        start::start_keys(templates, sb, &OneScope::new("input", input), given)
    }

    /// A new run's fairness key, from its input: `None` when the definition
    /// names none.
    pub fn fairness_key_of(&self, sb: &Sandbox, input: &Value) -> Result<Option<String>, String> {
        start::fairness_key(self.fairness_key.as_ref(), sb, &OneScope::new("input", input))
    }

    /// A new run's tags: the definition's, evaluated over `{input}`, then
    /// `given` (the start's), which wins on a key both have.
    pub fn tags_of(
        &self,
        sb: &Sandbox,
        input: &Value,
        given: Option<&serde_json::Map<String, Value>>,
    ) -> Result<Option<Value>, String> {
        start::tags(&self.tags, sb, &OneScope::new("input", input), given)
    }
}

/// The nodes `node`'s expressions and incoming conditions read, sorted;
/// `None` when an expression may read any node.
fn reads_of(node: &Node, incoming: &[usize], edges: &[Edge], index: &HashMap<String, usize>) -> Option<Vec<usize>> {
    let mut reads = Vec::new();
    for src in sources_of(node, incoming, edges) {
        reads.extend(crate::expr::node_refs(src)?.iter().filter_map(|id| index.get(id).copied()));
    }
    reads.sort_unstable();
    reads.dedup();
    Some(reads)
}

/// The expressions evaluated in `node`'s scope: its config's, its kind's,
/// its limits' keys and its incoming edges' conditions.
fn sources_of<'a>(node: &'a Node, incoming: &[usize], edges: &'a [Edge]) -> Vec<&'a str> {
    let mut sources = node.template.sources();
    sources.extend(node.kind.sources());
    sources.extend(node.limits.iter().flat_map(|l| l.key.sources()));
    sources.extend(incoming.iter().filter_map(|&e| edges[e].when.as_ref().map(|w| w.source())));
    sources
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

    fn sb() -> crate::expr::Sandbox {
        crate::expr::Sandbox::for_tests()
    }
    use serde_json::json;

    #[test]
    fn a_trigger_fires_when_its_condition_holds_with_its_input_and_key() {
        let wf =
            Workflow::parse(&json!({"name": "w", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}],
            "triggers": [{"event": "order.created", "when": ".event.payload.total > 10",
                          "input": {"order": "${ .event.payload.id }"}, "idempotency_key": "o-${ .event.payload.id }"},
                         {"event": "order.created"}]}))
            .unwrap();
        let event =
            |total: i64| json!({"id": "e1", "name": "order.created", "key": "", "payload": {"id": 5, "total": total}});
        let fired = wf.triggers[0].fire(&sb(), &event(20)).unwrap().unwrap();
        assert_eq!(fired, Fired { input: json!({"order": 5}), idempotency_key: Some("o-5".into()), flow: None });
        assert_eq!(wf.triggers[0].fire(&sb(), &event(3)).unwrap(), None, "the condition does not hold");
        let plain = wf.triggers[1].fire(&sb(), &event(3)).unwrap().unwrap();
        assert_eq!(
            (plain.input, plain.idempotency_key),
            (json!({"id": 5, "total": 3}), None),
            "the payload by default"
        );
        let odd = Workflow::parse(&json!({"name": "w", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}],
            "triggers": [{"event": "x", "when": ".event.payload"}, {"event": "x", "idempotency_key": "${ .event.payload }"}]}))
        .unwrap();
        let e = odd.triggers[0].fire(&sb(), &json!({"payload": 1})).unwrap_err();
        assert!(e.starts_with("when:") && e.contains("boolean"), "{e}");
        let e = odd.triggers[1].fire(&sb(), &json!({"payload": {"a": 1}})).unwrap_err();
        assert!(e.starts_with("idempotency_key:"), "{e}");
        assert_eq!(
            odd.triggers[1].fire(&sb(), &json!({"payload": 42})).unwrap().unwrap().idempotency_key,
            Some("42".into())
        );
    }

    #[test]
    fn a_priority_and_a_fairness_key_are_read_and_checked() {
        let node = json!([{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]);
        let plain = Workflow::parse(&json!({"name": "w", "nodes": node})).unwrap();
        assert_eq!((plain.priority, plain.fairness_key_of(&sb(), &json!({})).unwrap()), (3, None));
        let wf = Workflow::parse(&json!({"name": "w", "nodes": node, "priority": 1.0,
                                         "fairness_key": "t-${ .input.tenant }"}))
        .unwrap();
        assert_eq!(wf.priority, 1);
        assert_eq!(wf.fairness_key_of(&sb(), &json!({"tenant": 7})).unwrap(), Some("t-7".into()));
        let whole = Workflow::parse(&json!({"name": "w", "nodes": node, "fairness_key": "${ .input.t }"})).unwrap();
        assert_eq!(whole.fairness_key_of(&sb(), &json!({"t": 42})).unwrap(), Some("42".into()));
        assert_eq!(whole.fairness_key_of(&sb(), &json!({})).unwrap(), None, "null: no key");
        assert_eq!(whole.fairness_key_of(&sb(), &json!({"t": ""})).unwrap(), None, "empty: no key");
        let e = whole.fairness_key_of(&sb(), &json!({"t": "a\u{0}b"})).unwrap_err();
        assert!(e.contains("NUL"), "{e}");
        let limited =
            Workflow::parse(&json!({"name": "w", "nodes": node, "concurrency": {"max": 1, "key": "${ .input.t }"}}))
                .unwrap();
        let e = limited.concurrency.unwrap().key_of(&sb(), &json!({"t": "a\u{0}"})).unwrap_err();
        assert!(e.contains("NUL"), "{e}");
        let e = whole.fairness_key_of(&sb(), &json!({"t": [1]})).unwrap_err();
        assert!(e.starts_with("fairness_key:"), "{e}");
        let e = whole.fairness_key_of(&sb(), &json!({"t": "x".repeat(MAX_FAIRNESS_KEY + 1)})).unwrap_err();
        assert!(e.contains("max_fairness_key"), "{e}");
        for (bad, field) in [
            (json!({"priority": 0}), "priority"),
            (json!({"priority": 2.5}), "priority"),
            (json!({"priority": "1"}), "priority"),
            (json!({"fairness_key": 5}), "fairness_key"),
            (json!({"fairness_key": "${ .secrets.K }"}), "fairness_key"),
            (json!({"fairness_key": "${ .nodes.a.output }"}), "fairness_key"),
            (json!({"fairness_key": "${ .input | }"}), "fairness_key"),
        ] {
            let mut spec = json!({"name": "w", "nodes": node});
            spec.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
            let e = Workflow::parse(&spec).unwrap_err();
            assert_eq!(e.path, field, "{bad}: {e}");
        }
    }

    fn http(id: &str) -> Value {
        json!({"id": id, "type": "HTTP", "config": {"url": "http://127.0.0.1/x"}})
    }

    fn err(v: Value) -> ValidationError {
        Workflow::parse(&v).expect_err("should be refused")
    }

    fn map(config: Value) -> Value {
        json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": config}]})
    }

    /// A node's scope holds the run's input only when one of the expressions
    /// evaluated in it (config, kind, limits' keys, incoming conditions, a
    /// MAP's item template) may read it.
    #[test]
    fn a_node_reads_the_input_when_an_expression_evaluated_in_its_scope_may() {
        let item = |url: &str| json!({"type": "HTTP", "config": {"url": url}});
        let wf = Workflow::parse(&json!({"name": "r", "nodes": [
            {"id": "a", "type": "HTTP", "config": {"url": "http://h/${ .input.path }"}},
            {"id": "b", "type": "HTTP", "config": {"url": "http://h/${ .nodes.a.output.next }"}},
            {"id": "c", "type": "HTTP", "config": {"url": "http://h/c"}},
            {"id": "d", "type": "HTTP", "config": {"url": "http://h/d"}},
            {"id": "keyed", "type": "HTTP", "config": {"url": "http://h/${ .nodes.a.output.n }"},
             "limits": [{"key": "${ .input.account }", "concurrency": 1}]},
            {"id": "m1", "type": "MAP", "config": {"items": "${ .nodes.a.output.list }", "node": item("http://h/${ .item }")}},
            {"id": "m2", "type": "MAP", "config": {"items": "${ .nodes.a.output.list }", "node": item("http://h/${ .input.k }")}},
            {"id": "m3", "type": "MAP", "config": {"items": "${ .input.list }", "node": item("http://h/${ .item }")}},
            {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .nodes.a.output | {input: .input} }"}},
            {"id": "u", "type": "TRANSFORM", "config": {"output": "${ . }"}}
        ], "edges": [
            {"from": "a", "to": "b"}, {"from": "a", "to": "c", "when": ".nodes.a.output.ok == true"},
            {"from": "a", "to": "d", "when": ".input.go"}, {"from": "a", "to": "keyed"},
            {"from": "a", "to": "m1"}, {"from": "a", "to": "m2"}, {"from": "a", "to": "m3"},
            {"from": "a", "to": "t"}, {"from": "a", "to": "u"}
        ]}))
        .unwrap();
        let reads = |id: &str| wf.nodes[wf.node_index(id).unwrap()].reads_input;
        for (id, expected) in [
            ("a", true),
            ("b", false),
            ("c", false),
            ("d", true),
            ("keyed", true),
            ("m1", false),
            ("m2", true),
            ("m3", true),
            ("t", false),
            ("u", true),
        ] {
            assert_eq!(reads(id), expected, "{id}");
        }
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
        assert_eq!(m.tolerated, Tolerated::Count(0));
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
        assert_eq!(limit.key_of(&sb(), &json!({"customer": {"id": "c-1"}})), Ok("c-1".into()));
        assert_eq!(limit.key_of(&sb(), &json!({"customer": {"id": 7}})), Ok("7".into()));
        assert!(limit.key_of(&sb(), &json!({"customer": {}})).unwrap_err().contains("must be a string or a number"));
        assert!(limit.key_of(&sb(), &json!({"customer": {"id": "k".repeat(600)}})).unwrap_err().contains("512"));
        let whole = Workflow::parse(&spec(json!({"max": 1}))).unwrap();
        assert_eq!(
            whole.concurrency.unwrap().key_of(&sb(), &json!({})),
            Ok(String::new()),
            "one limit for the workflow"
        );
        for (c, path) in [
            (json!({"max": 0}), "concurrency.max"),
            (json!({"key": "${ .nodes.a.output }", "max": 1}), "concurrency.key"),
            (json!({"key": "${ .input.x", "max": 1}), "concurrency.key"),
            (json!({"max": 1, "per": "x"}), "concurrency.per"),
            (json!({"key": "x"}), "concurrency.max"),
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
    fn failure_handling_is_refused_where_it_cannot_work_naming_the_field() {
        let http = |id: &str| json!({"id": id, "type": "HTTP", "config": {"url": "http://h"}});
        let map = |c: Value| {
            let mut config = json!({"items": [1], "node": {"type": "HTTP", "config": {"url": "http://h"}}});
            config.as_object_mut().unwrap().extend(c.as_object().unwrap().clone());
            json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": config}]})
        };
        let cases = [
            (
                json!({"name": "e", "nodes": [http("a"), http("b")], "edges": [{"from": "a", "to": "b", "on": "maybe"}]}),
                "edges[0].on",
            ),
            (
                json!({"name": "f", "nodes": [{"id": "stop", "type": "FAIL"}, http("b")], "edges": [{"from": "stop", "to": "b"}]}),
                "edges[0].from",
            ),
            (
                json!({"name": "f", "nodes": [{"id": "stop", "type": "FAIL", "config": {"code": "Not A Code"}}]}),
                "nodes[stop].config.code",
            ),
            (
                json!({"name": "h", "nodes": [http("a")], "on_failure": {"workflow": "x", "on": ["SUCCEEDED"]}}),
                "on_failure.on",
            ),
            (
                json!({"name": "h", "nodes": [http("a")], "on_failure": {"workflow": "x", "input": "${ .secrets.K }"}}),
                "on_failure.input",
            ),
            (json!({"name": "h", "nodes": [http("a")], "on_failure": {"workflow": "bad name"}}), "on_failure.workflow"),
            (
                json!({"name": "h", "nodes": [http("a")], "on_success": {"workflow": "x", "on": ["FAILED"]}}),
                "on_success.on",
            ),
            (
                json!({"name": "h", "nodes": [http("a")], "on_end": {"workflow": "x", "input": "${ .secrets.K }"}}),
                "on_end.input",
            ),
            (json!({"name": "h", "nodes": [http("a")], "on_end": {"workflow": "x", "version": 0}}), "on_end.version"),
            (json!({"name": "h", "nodes": [http("a")], "on_success": {"input": {}}}), "on_success.workflow"),
            (
                json!({"name": "d", "nodes": [http("a")], "deadlines": [{"after": "0s", "start": {"workflow": "p"}}]}),
                "deadlines[0].after",
            ),
            (json!({"name": "d", "nodes": [http("a")], "deadlines": [{"after": "1s"}]}), "deadlines[0].start"),
            (
                json!({"name": "d", "nodes": [http("a")], "deadlines": [{"after": "1s", "start": {"workflow": "p", "input": "${ .secrets.K }"}}]}),
                "deadlines[0].start.input",
            ),
            (
                json!({"name": "d", "nodes": [{"id": "a", "type": "WAIT", "config": {"duration": "1s"},
                    "deadlines": [{"after": "1s", "start": {"workflow": "bad name"}}]}]}),
                "nodes[a].deadlines[0].start.workflow",
            ),
            (
                map(json!({"node": {"type": "HTTP", "config": {"url": "http://h"},
                    "deadlines": [{"after": "1s", "start": {"workflow": "p"}}]}})),
                "nodes[each].config.node.deadlines",
            ),
            (
                json!({"name": "d", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}, "delivery": "at_most_once"}]}),
                "nodes[w].delivery",
            ),
            (
                json!({"name": "k", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h", "idempotency_key": ""}}]}),
                "nodes[a].config.idempotency_key",
            ),
            (map(json!({"collect": "some"})), "nodes[each].config.collect"),
            (map(json!({"collect": {"reduce": "${ .acc }"}})), "nodes[each].config.collect.reduce"),
            (map(json!({"tolerated_failures": "120%"})), "nodes[each].config.tolerated_failures"),
            (
                map(json!({"tolerated_failures": 2, "on_item_failure": "continue"})),
                "nodes[each].config.tolerated_failures",
            ),
        ];
        for (spec, path) in cases {
            assert_eq!(err(spec.clone()).path, path, "{spec}");
        }
        let ok = Workflow::parse(&json!({"name": "ok", "nodes": [http("a"), http("b"), http("c")],
            "edges": [{"from": "a", "to": "b", "on": "failure"}, {"from": "a", "to": "c", "on": "always"}],
            "on_failure": {"workflow": "cleanup", "on": ["FAILED", "CANCELLED"]}}))
        .unwrap();
        assert!(ok.handles_failure(0) && !ok.handles_failure(1));
        let ends = Ends { succeeded: false, failed: true, cancelled: true };
        assert!(matches!(&ok.hooks[..], [h] if h.kind == HookKind::OnFailure && h.ends == ends));
    }

    #[test]
    fn a_run_or_a_step_has_at_most_max_deadlines() {
        let d = json!({"after": "1m", "start": {"workflow": "page"}});
        let node = |n: usize| json!({"id": "w", "type": "WAIT", "config": {"duration": "1s"}, "deadlines": vec![d.clone(); n]});
        let def =
            |run: usize, step: usize| json!({"name": "d", "nodes": [node(step)], "deadlines": vec![d.clone(); run]});
        let ok = Workflow::parse(&def(MAX_DEADLINES, MAX_DEADLINES)).unwrap();
        assert_eq!((ok.deadlines.len(), ok.nodes[0].deadlines.len()), (MAX_DEADLINES, MAX_DEADLINES));
        assert_eq!(ok.deadlines[0].after, Duration::from_secs(60));
        let run = Workflow::parse(&def(MAX_DEADLINES + 1, 0)).unwrap_err();
        assert!(run.path == "deadlines" && run.message.contains("MAX_DEADLINES"), "{run:?}");
        let step = Workflow::parse(&def(0, MAX_DEADLINES + 1)).unwrap_err();
        assert_eq!(step.path, "nodes[w].deadlines", "{step:?}");
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
        assert_eq!(e.path, "nodes[a].colour");
        assert!(e.message.contains("unknown field"), "{e}");
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
            respect_429: false,
        };
        let got: Vec<u64> = (1..=5).map(|a| p.backoff(a).as_millis() as u64).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn limits_go_on_the_nodes_a_worker_runs_and_a_node_with_limits_respects_a_429() {
        let wait = json!({"name": "x", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"},
            "limits": [{"key": "k", "concurrency": 1}]}]});
        assert_eq!(err(wait).path, "nodes[w].limits");
        let map = json!({"name": "x", "nodes": [{"id": "m", "type": "MAP", "limits": [{"key": "k"}],
            "config": {"items": [1], "node": {"type": "HTTP", "config": {"url": "http://h"}}}}]});
        assert_eq!(err(map).path, "nodes[m].limits");
        let bad = json!({"name": "x", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"},
            "limits": [{"key": "k", "rate": "fast"}]}]});
        assert_eq!(err(bad).path, "nodes[a].limits[0].rate");
        let wf = Workflow::parse(&json!({"name": "x", "nodes": [
            {"id": "a", "type": "HTTP", "config": {"url": "http://h"}, "limits": [{"key": "k:${ .nodes.b.output.id }"}]},
            {"id": "b", "type": "HTTP", "config": {"url": "http://h"}},
            {"id": "c", "type": "HTTP", "config": {"url": "http://h"}, "retry": {"on_429": "respect"}}],
            "edges": [{"from": "b", "to": "a"}]}))
        .unwrap();
        let (a, b, c) = (&wf.nodes[0], &wf.nodes[1], &wf.nodes[2]);
        assert!(a.retry.respect_429 && !b.retry.respect_429 && c.retry.respect_429);
        assert_eq!(a.reads.as_deref(), Some(&[1][..]), "a key's expression reads what it names");
    }
}
