//! Workflows in code: a typed builder of the same definitions the JSON
//! language writes. The builder makes a [`WorkflowSpec`] — the engine stays
//! declarative (runs pinned to a version, `simulate`, "why is it
//! waiting?") — and installs the typed steps' handlers on a [`Worker`].
//!
//! ```
//! use composer_worker::workflow::{Mocks, WorkflowBuilder};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { id: String, amount: u64 }
//! #[derive(Serialize, Deserialize)]
//! struct Charge { charge_id: String }
//!
//! let mut wf = WorkflowBuilder::new("order");
//! let order = wf.input::<Order>();
//! let charge = wf.step("charge", order, |_ctx, o: Order| async move {
//!     Ok(Charge { charge_id: format!("ch-{}", o.id) })
//! });
//! if let Some(node) = wf.node_mut(&charge) {
//!     node.queue = Some("payments".into());
//! }
//! let receipt = wf.step("receipt", charge.output(), |_ctx, c: Charge| async move { Ok(c.charge_id) });
//! wf.set_output(receipt.output().template());
//! // Edges come from what a step reads: order -> charge -> receipt.
//! assert_eq!(wf.spec().edges.len(), 1);
//!
//! // Offline, through the engine's own state machine; mocks are functions.
//! let mut mocks = Mocks::new();
//! mocks.on(&charge, |o: Order| Ok(Charge { charge_id: format!("mock-{}", o.id) }));
//! mocks.on(&receipt, |c: Charge| Ok(c.charge_id));
//! let report = wf.simulate(serde_json::json!({"id": "o1", "amount": 5}), &mut mocks).unwrap();
//! assert_eq!(report.output, Some(serde_json::json!("mock-o1")));
//! ```
//!
//! A step reads what its handler takes, so a step's output type flows to
//! the steps that read it, and a mismatch does not compile:
//!
//! ```compile_fail,E0631
//! use composer_worker::workflow::WorkflowBuilder;
//! let mut wf = WorkflowBuilder::new("order");
//! let amount = wf.input::<u64>();
//! // A handler of text given a number: a type error, not a failed run.
//! wf.step("shout", amount, |_ctx, s: String| async move { Ok(s.to_uppercase()) });
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;

use composer_core::definition::{EdgeOn, EdgeSpec, NodeSpec, ValidationError, Workflow, WorkflowSpec};
use composer_core::simulate::{Ask, Options, Outcome, Report};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::{TaskContext, TaskError, Worker};

/// A value of a run as a step reads it: the run's input, a node's output,
/// or a field of one — a `${ … }` template, typed by what it holds.
pub struct Ref<T> {
    /// The jq path (`.input`, `.nodes.charge.output.id`).
    path: String,
    /// The node it is the output of, for the edge a reader needs.
    node: Option<String>,
    _holds: PhantomData<fn() -> T>,
}

impl<T> Clone for Ref<T> {
    fn clone(&self) -> Self {
        Ref { path: self.path.clone(), node: self.node.clone(), _holds: PhantomData }
    }
}

impl<T> Ref<T> {
    fn new(path: String, node: Option<String>) -> Self {
        Ref { path, node, _holds: PhantomData }
    }

    /// A field of this value (`charge.output().field::<String>("id")`):
    /// its type is the caller's word, as a field of JSON is.
    pub fn field<U>(&self, name: &str) -> Ref<U> {
        let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        let path = if plain { format!("{}.{name}", self.path) } else { format!("{}[{}]", self.path, json!(name)) };
        Ref::new(path, self.node.clone())
    }

    /// The value as the language writes it: `${ .nodes.charge.output }`.
    pub fn template(&self) -> Value {
        Value::String(format!("${{ {} }}", self.path))
    }

    /// The jq path alone (`.nodes.charge.output`), for an expression.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// What a step reads: one [`Ref`], or a tuple of them; its handler takes
/// the values they hold, in the same shape.
pub trait Reads {
    /// The values the handler is given.
    type Values: DeserializeOwned + Send + 'static;
    /// The step's input template.
    fn input(&self) -> Value;
    /// The nodes whose outputs it reads.
    fn nodes(&self) -> Vec<String>;
}

impl<A: DeserializeOwned + Send + 'static> Reads for Ref<A> {
    type Values = A;
    fn input(&self) -> Value {
        self.template()
    }
    fn nodes(&self) -> Vec<String> {
        self.node.iter().cloned().collect()
    }
}

macro_rules! reads_tuple {
    ($($t:ident $i:tt),+) => {
        impl<$($t: DeserializeOwned + Send + 'static),+> Reads for ($(Ref<$t>,)+) {
            type Values = ($($t,)+);
            fn input(&self) -> Value {
                Value::Array(vec![$(self.$i.template()),+])
            }
            fn nodes(&self) -> Vec<String> {
                let mut n = Vec::new();
                $(n.extend(self.$i.node.iter().cloned());)+
                n
            }
        }
    };
}
reads_tuple!(A 0);
reads_tuple!(A 0, B 1);
reads_tuple!(A 0, B 1, C 2);
reads_tuple!(A 0, B 1, C 2, D 3);
reads_tuple!(A 0, B 1, C 2, D 3, E 4);

/// A typed step: its id, what its handler takes (`I`) and gives (`O`).
pub struct Step<I, O> {
    id: String,
    _types: PhantomData<fn(I) -> O>,
}

impl<I, O> Step<I, O> {
    /// The node's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its output, for the steps that read it.
    pub fn output(&self) -> Ref<O> {
        Ref::new(format!(".nodes.{}.output", self.id), Some(self.id.clone()))
    }
}

type Install = Box<dyn Fn(&mut Worker) + Send + Sync>;

/// The field of a typed step's config (and so of its input) that holds
/// what it reads: `{"input": "${ .nodes.charge.output }"}`, or an array
/// for a tuple of reads.
pub const STEP_INPUT: &str = "input";

/// A workflow being declared: its definition, and its steps' handlers.
pub struct WorkflowBuilder {
    spec: WorkflowSpec,
    installs: Vec<Install>,
}

impl WorkflowBuilder {
    /// An empty workflow named `name`.
    pub fn new(name: &str) -> Self {
        WorkflowBuilder {
            spec: WorkflowSpec {
                name: name.to_string(),
                description: None,
                input_schema: None,
                nodes: Vec::new(),
                edges: Vec::new(),
                output: None,
                timeout: None,
                concurrency: None,
                on_failure: None,
                on_success: None,
                on_end: None,
                deadlines: Vec::new(),
                tags: None,
                triggers: None,
                priority: None,
                fairness_key: None,
            },
            installs: Vec::new(),
        }
    }

    /// The run's input, as a value of `T`.
    pub fn input<T>(&self) -> Ref<T> {
        Ref::new(".input".into(), None)
    }

    /// The JSON Schema (2020-12) every start's input is checked against.
    pub fn set_input_schema(&mut self, schema: Value) -> &mut Self {
        self.spec.input_schema = Some(schema);
        self
    }

    /// The input schema made from the input's type, `T`, which derives
    /// `utoipa::ToSchema` beside serde's traits ([`schema_of`]).
    pub fn set_input_type<T: utoipa::ToSchema>(&mut self) -> &mut Self {
        self.set_input_schema(schema_of::<T>())
    }

    /// The run's output: a template over `{input, nodes}` (a [`Ref`]'s, or any).
    pub fn set_output(&mut self, output: Value) -> &mut Self {
        self.spec.output = Some(output);
        self
    }

    /// Every other field of the definition (description, timeout,
    /// concurrency, on_failure, on_success, on_end, tags, triggers, priority, fairness_key).
    pub fn spec_mut(&mut self) -> &mut WorkflowSpec {
        &mut self.spec
    }

    /// The definition as built.
    pub fn spec(&self) -> &WorkflowSpec {
        &self.spec
    }

    /// The definition as JSON: what `POST /v1/workflows` takes.
    pub fn definition(&self) -> Value {
        serde_json::to_value(&self.spec).unwrap_or(Value::Null)
    }

    /// A step of type `id` (its node id too) run by `handler`, which is
    /// given what `reads` holds; an edge from every node it reads.
    pub fn step<R, O, F, Fut>(&mut self, id: &str, reads: R, handler: F) -> Step<R::Values, O>
    where
        R: Reads,
        O: Serialize + DeserializeOwned + Send + 'static,
        F: Fn(TaskContext, R::Values) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
    {
        let node = NodeSpec {
            id: id.to_string(),
            node_type: id.to_string(),
            queue: None,
            config: json!({ STEP_INPUT: reads.input() }),
            retry: None,
            timeout: None,
            delivery: None,
            limits: Vec::new(),
            deadlines: Vec::new(),
            updates: Vec::new(),
        };
        self.add(node, &reads.nodes());
        let node_type = id.to_string();
        self.installs.push(Box::new(move |worker: &mut Worker| {
            let handler = handler.clone();
            worker.handle(&node_type, move |ctx, input| {
                let handler = handler.clone();
                async move {
                    let values: R::Values = serde_json::from_value(input[STEP_INPUT].clone())
                        .map_err(|e| TaskError::fatal(format!("the step's input is not what it reads: {e}")))?;
                    let out = handler(ctx, values).await?;
                    serde_json::to_value(out).map_err(|e| TaskError::fatal(format!("the step's output: {e}")))
                }
            });
        }));
        Step { id: id.to_string(), _types: PhantomData }
    }

    /// A node as the JSON language writes it (HTTP, TRANSFORM, WAIT,
    /// WAIT_FOR_EVENT, APPROVAL, MAP, LOOP, SUB_WORKFLOW, FAIL, or a type another
    /// worker runs), after the nodes `after` names: its output is JSON.
    pub fn node(&mut self, node: NodeSpec, after: &[&str]) -> Ref<Value> {
        let id = node.id.clone();
        let after: Vec<String> = after.iter().map(|s| s.to_string()).collect();
        self.add(node, &after);
        Ref::new(format!(".nodes.{id}.output"), Some(id))
    }

    /// The node `step` made, to set what the builder does not (queue,
    /// retry, timeout, delivery, limits, a config of its own).
    /// `None` for a step of another builder.
    pub fn node_mut<I, O>(&mut self, step: &Step<I, O>) -> Option<&mut NodeSpec> {
        self.spec.nodes.iter_mut().find(|n| n.id == step.id)
    }

    /// An edge; `on` is `success` unless given, `when` a condition.
    pub fn edge(&mut self, from: &str, to: &str, on: Option<EdgeOn>, when: Option<&str>) -> &mut Self {
        self.spec.edges.retain(|e| !(e.from == from && e.to == to && e.on.is_none() && e.when.is_none()));
        self.spec.edges.push(EdgeSpec { from: from.into(), to: to.into(), on, when: when.map(str::to_string) });
        self.order_edges();
        self
    }

    /// Edges in the order of their nodes (by source, then target), however
    /// they were declared: one workflow, one definition.
    fn order_edges(&mut self) {
        let at = |id: &str| self.spec.nodes.iter().position(|n| n.id == id).unwrap_or(usize::MAX);
        let mut keyed: Vec<(usize, usize, EdgeSpec)> =
            self.spec.edges.drain(..).map(|e| (at(&e.from), at(&e.to), e)).collect();
        keyed.sort_by_key(|(from, to, _)| (*from, *to));
        self.spec.edges = keyed.into_iter().map(|(_, _, e)| e).collect();
    }

    fn add(&mut self, node: NodeSpec, after: &[String]) {
        let to = node.id.clone();
        self.spec.nodes.push(node);
        for from in after {
            if !self.spec.edges.iter().any(|e| &e.from == from && e.to == to) {
                self.spec.edges.push(EdgeSpec { from: from.clone(), to: to.clone(), on: None, when: None });
            }
        }
        self.order_edges();
    }

    /// The definition checked as the server checks it (every node, edge,
    /// expression and the input schema), compiled.
    pub fn check(&self) -> Result<Workflow, ValidationError> {
        let spec = self.spec.clone();
        composer_core::expr::on_eval_stack(move || Workflow::new(spec))
            .map_err(|e| ValidationError::new("$", e))
            .and_then(|r| r)
    }

    /// Registers the typed steps' handlers on `worker`.
    pub fn install(&self, worker: &mut Worker) {
        for install in &self.installs {
            install(worker);
        }
    }

    /// Runs the workflow offline through the engine's own state machine
    /// (`composer workflow simulate`'s): each attempt a worker would run is
    /// answered by `mocks` (a step without one gets `{}`); a start whose
    /// input does not match the input schema is refused.
    pub fn simulate(&self, input: Value, mocks: &mut Mocks) -> Result<Report, String> {
        let wf = self.check().map_err(|e| e.to_string())?;
        if let Some(schema) = &wf.input_schema {
            schema.check(&input).map_err(|m| format!("no run: workflow {:?}: {m}", wf.spec.name))?;
        }
        let opts = Options { input, ..Default::default() };
        let mocks = &mut *mocks;
        composer_core::expr::sandboxed(std::time::Instant::now, |sb| {
            composer_core::simulate::simulate_asking(sb, &wf, &opts, &mut |a: &Ask<'_>| mocks.answer(a))
        })
    }
}

type Mock = Box<dyn FnMut(Value) -> Result<Value, TaskError> + Send>;

/// A test's answers for the attempts a worker would run, by node id (or a
/// MAP item's key, `ship[2]`): ordinary functions of the step's input.
#[derive(Default)]
pub struct Mocks {
    by_key: HashMap<String, Mock>,
}

impl Mocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// `step`'s attempts answered by `f`, typed as the step is: given
    /// what the step reads, as its handler is.
    pub fn on<I, O, F>(&mut self, step: &Step<I, O>, mut f: F) -> &mut Self
    where
        I: DeserializeOwned,
        O: Serialize,
        F: FnMut(I) -> Result<O, TaskError> + Send + 'static,
    {
        self.by_key.insert(
            step.id.clone(),
            Box::new(move |input| {
                let i: I =
                    serde_json::from_value(input[STEP_INPUT].clone()).map_err(|e| TaskError::fatal(e.to_string()))?;
                serde_json::to_value(f(i)?).map_err(|e| TaskError::fatal(e.to_string()))
            }),
        );
        self
    }

    /// The attempts of node (or item) `key` answered by `f`, untyped.
    pub fn on_json(
        &mut self,
        key: &str,
        f: impl FnMut(Value) -> Result<Value, TaskError> + Send + 'static,
    ) -> &mut Self {
        self.by_key.insert(key.to_string(), Box::new(f));
        self
    }

    fn answer(&mut self, a: &Ask<'_>) -> Option<Outcome> {
        let f = match self.by_key.get_mut(a.key) {
            Some(f) => f,
            None => self.by_key.get_mut(a.node)?,
        };
        Some(match f(a.input.clone()) {
            Ok(v) => Outcome::Output(v),
            Err(e) => Outcome::Fail { error: e.message, retryable: e.retryable },
        })
    }
}

/// The JSON Schema (2020-12) of `T`, from its `#[derive(utoipa::ToSchema)]`
/// (whose OpenAPI 3.1 schemas are JSON Schema): the types it names are
/// `$defs`, referred to as `#/$defs/NAME`.
pub fn schema_of<T: utoipa::ToSchema>() -> Value {
    let mut named = Vec::new();
    T::schemas(&mut named);
    let mut root = serde_json::to_value(T::schema()).unwrap_or_else(|_| json!({}));
    if !named.is_empty() {
        let defs: serde_json::Map<String, Value> = named
            .into_iter()
            .map(|(name, schema)| (name, serde_json::to_value(schema).unwrap_or_else(|_| json!({}))))
            .collect();
        root["$defs"] = Value::Object(defs);
    }
    local_refs(&mut root);
    root
}

/// `#/components/schemas/X` (OpenAPI's place) as `#/$defs/X`.
fn local_refs(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get_mut("$ref") {
                if let Some(name) = r.strip_prefix("#/components/schemas/") {
                    *r = format!("#/$defs/{name}");
                }
            }
            o.values_mut().for_each(local_refs);
        }
        Value::Array(a) => a.iter_mut().for_each(local_refs),
        _ => {}
    }
}

/// A node the engine runs, or another worker's type, as the JSON language
/// writes it: set the rest (`retry`, `timeout`, …) on what it returns.
pub fn engine_node(id: &str, node_type: &str, config: Value) -> NodeSpec {
    NodeSpec {
        id: id.to_string(),
        node_type: node_type.to_string(),
        queue: None,
        config,
        retry: None,
        timeout: None,
        delivery: None,
        limits: Vec::new(),
        deadlines: Vec::new(),
        updates: Vec::new(),
    }
}

/// What registering a definition answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub version: i32,
    /// False when the definition was a registered version already.
    pub created: bool,
}

/// Registers `definition` with the coordinator at `url` (with the API
/// token, which may write definitions; a worker token only works queues):
/// idempotent by content, so every start of a worker may call it.
/// `version` declares which version it is meant to be (refused by name
/// when that version is registered with another definition).
pub async fn register(
    url: &str,
    api_token: Option<&str>,
    definition: &Value,
    version: Option<i32>,
) -> Result<Registered, String> {
    let http = reqwest::Client::new();
    let path = match version {
        Some(v) => format!("{}/v1/workflows?version={v}", url.trim_end_matches('/')),
        None => format!("{}/v1/workflows", url.trim_end_matches('/')),
    };
    let mut request = http.post(&path).json(definition);
    if let Some(token) = api_token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| format!("registering at {url}: {e}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let why = body["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| body.to_string());
        return Err(format!("registering {}: {status}: {why}", definition["name"]));
    }
    let version = body["version"].as_i64().and_then(|v| i32::try_from(v).ok()).unwrap_or(0);
    Ok(Registered { version, created: status.as_u16() == 201 })
}
