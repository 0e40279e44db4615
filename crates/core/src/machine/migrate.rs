//! Moving an open run to another version of its workflow.
//!
//! [`plan`] decides from the two definitions and the run's steps whether
//! the run can move, and says what would change: every step it has
//! (started, waiting or ended) goes to a step of the new version (of the
//! same id, or the one the mapping names), of the same type, whose
//! predecessors in the new version have all ended in the run — so no step
//! that has started would have had to wait for one that has not run, and
//! nothing ended runs again. [`move_run`] renames the run's steps to the
//! new version's nodes; the engine then applies [`Event::Migrate`] under
//! the new version, which records the move and starts what the new
//! version readies (a step added after one that has ended).
//!
//! [`Event::Migrate`]: crate::machine::Event::Migrate

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::lifecycle::{RunStatus, TaskState};
use super::run::Run;
use crate::definition::{NodeKind, Workflow};

/// Old node id → new node id; a step whose node it does not name keeps its id.
pub type Mapping = BTreeMap<String, String>;

/// Whether a run can move, and what would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Plan {
    /// Why the run cannot move; empty when it can.
    pub reasons: Vec<String>,
    /// Each step the run has, with the new version's step it becomes.
    pub steps: Vec<StepMove>,
    /// The new version's steps the run has not reached and the old version
    /// lacks: they run when the run reaches them.
    pub added: Vec<String>,
    /// The old version's steps the run has not reached and the new version
    /// lacks (none maps to them): they will not run.
    pub dropped: Vec<String>,
}

impl Plan {
    pub fn movable(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// One step of the run, and the step of the new version it becomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepMove {
    pub from: String,
    /// `None` when the new version has no step for it (the run cannot move).
    pub to: Option<String>,
    pub state: TaskState,
}

/// Whether `run` (on `old`) can move to `new` under `map`, and what would
/// change. Only the run's own steps are looked at (a MAP's items go with
/// their MAP; a child run keeps its own version).
pub fn plan(old: &Workflow, new: &Workflow, run: &Run, map: &Mapping) -> Plan {
    let mut p = Plan::default();
    if run.status.is_terminal() {
        p.reasons.push(format!("the run is {}: only an open run moves", run.status));
    }
    for (from, to) in map {
        if old.node_index(from).is_none_or(|n| old.nodes[n].item_of.is_some()) {
            p.reasons.push(format!("the mapping names `{from}`, which the run's version has no step of"));
        }
        if new.node_index(to).is_none_or(|n| new.nodes[n].item_of.is_some()) {
            p.reasons.push(format!("the mapping names `{to}`, which the new version has no step of"));
        }
    }
    if run.status == RunStatus::Queued && old.spec.concurrency != new.spec.concurrency {
        p.reasons.push("the run waits for a concurrency slot, and the new version's concurrency differs".to_string());
    }
    if let Some(schema) = &new.input_schema {
        if let Err(e) = schema.check(&run.input) {
            p.reasons.push(format!("the run's input does not fit the new version's input_schema: {e}"));
        }
    }
    let steps: Vec<(usize, TaskState)> =
        run.tasks.iter().filter(|t| t.item.is_none() && !t.removed).map(|t| (t.node, t.state)).collect();
    let mut taken: HashMap<usize, &str> = HashMap::new();
    let mut target: Vec<Option<usize>> = vec![None; old.nodes.len()];
    for &(node, state) in &steps {
        let from = old.nodes[node].id.as_str();
        let to = map.get(from).map_or(from, String::as_str);
        let found = new.node_index(to).filter(|&n| new.nodes[n].item_of.is_none());
        p.steps.push(StepMove { from: from.to_string(), to: found.map(|_| to.to_string()), state });
        let Some(n) = found else {
            p.reasons.push(format!("step `{from}` is {state} and the new version has no step `{to}`: map it to one"));
            continue;
        };
        if let Some(other) = taken.insert(n, from) {
            p.reasons.push(format!("steps `{other}` and `{from}` would both become `{to}`"));
        }
        if let Some(why) = incompatible(old, node, new, n, state) {
            p.reasons.push(format!("step `{from}` is {state}, and {why}"));
        }
        target[node] = Some(n);
    }
    waits_for_none_not_run(old, new, &steps, &target, &mut p);
    what_changes(old, new, map, &target, &mut p);
    p
}

/// Refuses a step whose new version's predecessors have not all ended in
/// the run: it would have had to wait for one that has not run.
fn waits_for_none_not_run(
    old: &Workflow,
    new: &Workflow,
    steps: &[(usize, TaskState)],
    target: &[Option<usize>],
    p: &mut Plan,
) {
    // What a step that has started read must have ended in the new version too.
    let ended: Vec<bool> = {
        let mut ended = vec![false; new.nodes.len()];
        for &(node, state) in steps {
            if let (Some(n), true) = (target[node], state.is_terminal()) {
                ended[n] = true;
            }
        }
        ended
    };
    for &(node, state) in steps {
        let Some(n) = target[node] else { continue };
        for &e in &new.incoming[n] {
            let pred = new.edges[e].from;
            if !ended[pred] {
                p.reasons.push(format!(
                    "step `{}` is {state}, and the new version puts `{}` before it, which has not ended in this run",
                    old.nodes[node].id, new.nodes[pred].id
                ));
            }
        }
    }
}

/// The new version's steps the run will reach that the old version lacks,
/// and the old version's steps it had not reached that are gone.
fn what_changes(old: &Workflow, new: &Workflow, map: &Mapping, target: &[Option<usize>], p: &mut Plan) {
    let reached: Vec<bool> = {
        let mut reached = vec![false; new.nodes.len()];
        target.iter().flatten().for_each(|&n| reached[n] = true);
        reached
    };
    let mapped_to: Vec<&str> = map.values().map(String::as_str).collect();
    for (i, n) in new.nodes.iter().enumerate().filter(|(_, n)| n.item_of.is_none()) {
        if !reached[i] && old.node_index(&n.id).is_none() && !mapped_to.contains(&n.id.as_str()) {
            p.added.push(n.id.clone());
        }
    }
    for (i, n) in old.nodes.iter().enumerate().filter(|(_, n)| n.item_of.is_none()) {
        let to = map.get(&n.id).unwrap_or(&n.id);
        if target[i].is_none() && new.node_index(to).is_none() {
            p.dropped.push(n.id.clone());
        }
    }
}

/// Why old node `o`, whose step is in `state`, cannot become new node `n`:
/// another type, a MAP of items of another type, a failure the new version
/// does not handle; and for a step not ended (sent, waiting, its slots held
/// under the old node's rules), another delivery, queue or limits, or a
/// wait for something else.
fn incompatible(old: &Workflow, o: usize, new: &Workflow, n: usize, state: TaskState) -> Option<String> {
    let (a, b) = (&old.nodes[o], &new.nodes[n]);
    if a.node_type != b.node_type {
        return Some(format!("the new version's `{}` is a {} step, not a {}", b.id, b.node_type, a.node_type));
    }
    if let (NodeKind::Map(x), NodeKind::Map(y)) = (&a.kind, &b.kind) {
        // Its items, sent or not, as the MAP stands.
        if let Some(why) = incompatible(old, x.template, new, y.template, state) {
            return Some(format!("its items: {why}"));
        }
    }
    if state == TaskState::Failed && old.handles_failure(o) && !new.handles_failure(n) {
        return Some(format!("the new version's `{}` has no failure edge to go on by", b.id));
    }
    if state.is_terminal() {
        return None;
    }
    let waits = matches!(a.kind, NodeKind::Wait(_) | NodeKind::WaitForEvent { .. });
    if a.at_most_once != b.at_most_once {
        Some(format!("the new version's `{}` is delivered otherwise (at_most_once)", b.id))
    } else if a.dispatch_queue() != b.dispatch_queue() {
        Some(format!("the new version's `{}` is on queue {:?}, not {:?}", b.id, b.dispatch_queue(), a.dispatch_queue()))
    } else if a.limits != b.limits {
        Some(format!("the new version's `{}` has other limits", b.id))
    } else if waits && a.config != b.config {
        Some(format!("the new version's `{}` waits for something else", b.id))
    } else {
        None
    }
}

/// Renames `run`'s steps (and the MAP items it holds) to `new`'s nodes when
/// [`plan`] says it can move; returns the renamed nodes' ids (old → new,
/// those that differ) for storage. Nothing is changed when it cannot.
pub fn move_run(old: &Workflow, new: &Workflow, run: &mut Run, map: &Mapping) -> Result<Vec<(String, String)>, Plan> {
    let plan = plan(old, new, run, map);
    if !plan.movable() {
        return Err(plan);
    }
    let index = |id: &str| new.node_index(map.get(id).map_or(id, String::as_str));
    let mut renamed = Vec::new();
    // Every task, removed ones too (their rows are deleted, but what
    // reads them in this transaction indexes the new version's nodes).
    let mut nodes = Vec::with_capacity(run.tasks.len());
    for t in &run.tasks {
        let node = &old.nodes[t.node];
        let moved = match node.item_of {
            None => index(&node.id),
            Some(m) => index(&old.nodes[m].id).and_then(|m| match &new.nodes[m].kind {
                NodeKind::Map(x) => Some(x.template),
                _ => None,
            }),
        };
        nodes.push(moved.ok_or_else(|| {
            let mut refused = plan.clone();
            refused.reasons.push(format!("step `{}` has no step of the new version to become", node.id));
            refused
        })?);
    }
    for (t, node) in run.tasks.iter_mut().zip(nodes) {
        t.node = node;
    }
    for s in &plan.steps {
        match &s.to {
            Some(to) if *to != s.from => renamed.push((s.from.clone(), to.clone())),
            _ => {}
        }
    }
    Ok(renamed)
}
