//! A validated node: its kind, where it is dispatched, how it is retried
//! and how long one attempt may take.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::check::{positive_duration, validate_name, ValidationError};
use super::kind::{NodeKind, Traits};
use super::limit::{compile_limits, StepLimit};
use super::spec::{NodeSpec, On429, RetrySpec};
use crate::duration;
use crate::expr::Template;

/// The queue of a node type that names none: its name in lower case.
pub fn default_queue(node_type: &str) -> String {
    node_type.to_ascii_lowercase()
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
    /// Whether any of them may read the run's `.input`
    /// ([`reads_input`](crate::expr::reads_input)); a node's scope holds the
    /// input only then.
    pub reads_input: bool,
    pub retry: RetryPolicy,
    /// The longest one attempt may take (dispatched nodes only).
    pub timeout: Option<Duration>,
    /// For a MAP's item template, the index of its MAP node. Templates come
    /// after the user's nodes in [`Workflow::nodes`], with no edges.
    pub item_of: Option<usize>,
    /// `delivery: "at_most_once"`: an attempt whose outcome is unknown goes
    /// IN_DOUBT instead of being sent again.
    pub at_most_once: bool,
    /// Limits on its steps across runs (dispatched nodes only).
    pub limits: Vec<StepLimit>,
    /// The runs its step starts when it has not ended some time after it
    /// was created (none for a MAP's item template).
    pub deadlines: Vec<super::hooks::Deadline>,
    /// The updates its step accepts while it waits.
    pub updates: Vec<super::updates::Update>,
    /// An HTTP call whose config reads no secret: a coordinator may run
    /// its steps itself (it never holds a secret; a step that reads one
    /// goes to a worker).
    pub coordinator_may_run: bool,
}

impl Node {
    /// The queue a dispatch of this node goes to. Only HTTP and custom nodes
    /// are dispatched, and theirs is always resolved at validation; the
    /// fallback keeps this total.
    pub fn dispatch_queue(&self) -> &str {
        self.queue.as_deref().unwrap_or(&self.node_type)
    }
}

/// Most attempts a retry policy may give a node (`retry.max_attempts`, 1 or more).
pub const MAX_RETRY_ATTEMPTS: u32 = 1000;
/// Largest `retry.multiplier` (1 or more).
pub const MAX_RETRY_MULTIPLIER: f64 = 100.0;

/// How a failed attempt is retried: `max_attempts` in all, waiting
/// `initial_backoff * multiplier^(attempt-1)`, capped at `max_backoff`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub multiplier: f64,
    pub max_backoff: Duration,
    /// A 429's `Retry-After` sets the wait before the next attempt (when
    /// longer than the backoff) and holds the step's limit keys as long.
    pub respect_429: bool,
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
            respect_429: false,
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

/// Compiles a node; a MAP also returns the node its items run, compiled as
/// a node of its own.
pub(super) fn compile_node(at: &str, n: &NodeSpec) -> Result<(Node, Option<Node>), ValidationError> {
    let config = node_config(at, n)?;
    super::config::check_known(at, &n.node_type, &config)?;
    let (kind, per_item) = NodeKind::compile(at, n, &config)?;
    let traits = kind.traits();
    if traits.has_items {
        refuse_what_items_take(at, n)?;
    }
    let template = match traits.has_items {
        // A MAP's config is read by its kind; each item evaluates its node's.
        true => Template::compile(&json!({})).expect("an empty template compiles"),
        false => super::config::compile_template(&n.node_type, &config)
            .map_err(|(p, m)| ValidationError::new(format!("{at}.config{p}"), m))?,
    };
    if !n.limits.is_empty() && !traits.dispatched {
        return Err(ValidationError::new(
            format!("{at}.limits"),
            "only HTTP and custom nodes, which a worker runs, take limits",
        ));
    }
    let limits = compile_limits(at, &n.limits)?;
    // Any mention counts: a secret is `${ .secrets.NAME }` in the config's text.
    let coordinator_may_run = matches!(kind, NodeKind::Http) && !config.to_string().contains(".secrets");
    let updates = super::updates::compile_updates(&format!("{at}.updates"), &kind, &n.updates)?;
    let node = Node {
        id: n.id.clone(),
        node_type: n.node_type.clone(),
        kind,
        retry: node_retry(at, n, &limits)?,
        queue: node_queue(at, n, traits)?,
        timeout: node_timeout(at, n, traits)?,
        at_most_once: at_most_once(at, n, traits)?,
        config: if traits.has_items { n.config.clone() } else { config },
        template,
        reads: None,
        reads_input: true,
        item_of: None,
        limits,
        coordinator_may_run,
        deadlines: super::hooks::compile_deadlines(&format!("{at}.deadlines"), &n.deadlines)?,
        updates,
    };
    let item = match per_item {
        Some(spec) if !spec.deadlines.is_empty() => {
            return Err(ValidationError::new(
                format!("{at}.config.node.deadlines"),
                "a MAP's items have no deadlines of their own: set them on the MAP",
            ))
        }
        Some(spec) => Some(compile_node(&format!("{at}.config.node"), &spec)?.0),
        None => None,
    };
    Ok((node, item))
}

/// A node's `type` and `config` (an object; none is `{}`).
fn node_config(at: &str, n: &NodeSpec) -> Result<Value, ValidationError> {
    if n.node_type.is_empty() {
        return Err(ValidationError::new(format!("{at}.type"), "must not be empty"));
    }
    match &n.config {
        Value::Null => Ok(Value::Object(Map::new())),
        v @ Value::Object(_) => Ok(v.clone()),
        _ if n.node_type == "MAP" => {
            Err(ValidationError::new(format!("{at}.config"), "must be an object with items and node"))
        }
        _ => Err(ValidationError::new(format!("{at}.config"), "must be an object")),
    }
}

/// A MAP takes no `retry`, `timeout`, `queue` or `limits` of its own: its
/// items do, on `config.node`.
fn refuse_what_items_take(at: &str, n: &NodeSpec) -> Result<(), ValidationError> {
    for (name, set) in [
        ("retry", n.retry.is_some()),
        ("timeout", n.timeout.is_some()),
        ("queue", n.queue.is_some()),
        ("limits", !n.limits.is_empty()),
    ] {
        if set {
            return Err(ValidationError::new(
                format!("{at}.{name}"),
                format!("a MAP has no {name} of its own: set it on config.node, which each item runs"),
            ));
        }
    }
    Ok(())
}

/// A node's retry policy; it respects a 429's `Retry-After` as `on_429`
/// says, by default when the node has limits.
fn node_retry(at: &str, n: &NodeSpec, limits: &[StepLimit]) -> Result<RetryPolicy, ValidationError> {
    let mut retry = compile_retry(&format!("{at}.retry"), n.retry.as_ref())?;
    retry.respect_429 = match n.retry.as_ref().and_then(|r| r.on_429) {
        Some(On429::Respect) => true,
        Some(On429::Ignore) => false,
        None => !limits.is_empty(),
    };
    Ok(retry)
}

/// The queue a worker's node is dispatched to: its own, or its type's.
fn node_queue(at: &str, n: &NodeSpec, traits: Traits) -> Result<Option<String>, ValidationError> {
    match (&n.queue, traits.dispatched) {
        (Some(q), _) => {
            validate_name(&format!("{at}.queue"), q)?;
            Ok(traits.dispatched.then(|| q.clone()))
        }
        (None, true) => Ok(Some(default_queue(&n.node_type))),
        (None, false) => Ok(None),
    }
}

/// How long one attempt may take, for the kinds that take a timeout.
fn node_timeout(at: &str, n: &NodeSpec, traits: Traits) -> Result<Option<Duration>, ValidationError> {
    match &n.timeout {
        None => Ok(None),
        Some(_) if !traits.timed => Err(ValidationError::new(
            format!("{at}.timeout"),
            "only HTTP, custom and SUB_WORKFLOW nodes take a timeout (WAIT_FOR_EVENT has config.timeout)",
        )),
        Some(t) => Ok(Some(positive_duration(&format!("{at}.timeout"), t)?)),
    }
}

/// Whether a worker's node is delivered at most once (`delivery`).
fn at_most_once(at: &str, n: &NodeSpec, traits: Traits) -> Result<bool, ValidationError> {
    match n.delivery {
        Some(super::spec::Delivery::AtMostOnce) if !traits.dispatched => Err(ValidationError::new(
            format!("{at}.delivery"),
            "only HTTP and custom nodes, which a worker runs, have a delivery",
        )),
        Some(super::spec::Delivery::AtMostOnce) => Ok(true),
        _ => Ok(false),
    }
}

fn compile_retry(at: &str, spec: Option<&RetrySpec>) -> Result<RetryPolicy, ValidationError> {
    let mut policy = RetryPolicy::default();
    let Some(spec) = spec else { return Ok(policy) };
    if let Some(n) = spec.max_attempts {
        if !(1..=MAX_RETRY_ATTEMPTS).contains(&n) {
            let message = format!("must be between 1 and {MAX_RETRY_ATTEMPTS}");
            return Err(ValidationError::new(format!("{at}.max_attempts"), message));
        }
        policy.max_attempts = n;
    }
    if let Some(d) = &spec.initial_backoff {
        policy.initial_backoff =
            duration::parse(d).map_err(|e| ValidationError::new(format!("{at}.initial_backoff"), e))?;
    }
    if let Some(m) = spec.multiplier {
        if !(1.0..=MAX_RETRY_MULTIPLIER).contains(&m) {
            let message = format!("must be between 1 and {MAX_RETRY_MULTIPLIER}");
            return Err(ValidationError::new(format!("{at}.multiplier"), message));
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::definition::Workflow;

    /// Only an HTTP call that reads no secret may run on a coordinator, and
    /// a MAP's items are judged by their own node.
    #[test]
    fn a_coordinator_may_run_only_http_calls_that_read_no_secret() {
        let spec = json!({"name": "w", "nodes": [
            {"id": "plain", "type": "HTTP", "config": {"url": "http://x/${ .input.a }"}},
            {"id": "secret", "type": "HTTP", "config": {"url": "http://x/", "headers": {"a": "Bearer ${ .secrets.T }"}}},
            {"id": "custom", "type": "charge", "queue": "http"},
            {"id": "shape", "type": "TRANSFORM", "config": {"output": "${ 1 }"}},
            {"id": "each", "type": "MAP", "config": {"items": "${ [1] }",
                "node": {"type": "HTTP", "config": {"url": "http://x/${ .item }"}}}},
            {"id": "each_secret", "type": "MAP", "config": {"items": "${ [1] }",
                "node": {"type": "HTTP", "config": {"url": "http://x/", "body": "${ .secrets.T }"}}}}
        ]});
        let wf = Workflow::parse(&spec).unwrap();
        let may: Vec<(String, bool)> = wf
            .nodes
            .iter()
            .map(|n| (n.item_of.map_or(n.id.clone(), |m| format!("{}[]", wf.nodes[m].id)), n.coordinator_may_run))
            .collect();
        let expected = [
            ("plain", true),
            ("secret", false),
            ("custom", false),
            ("shape", false),
            ("each", false),
            ("each_secret", false),
            ("each[]", true),
            ("each_secret[]", false),
        ];
        let expected: Vec<(String, bool)> = expected.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        assert_eq!(may, expected);
    }
}
