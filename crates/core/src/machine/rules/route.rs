//! Routing: after a change, which nodes became ready (and by which
//! edges), and whether the run ended.

use serde_json::{json, Map, Value};

use crate::definition::{NodeKind, Workflow};
use crate::expr::Scope;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::state::Machine;
use crate::storable;

/// How a ready node is entered.
struct Entry {
    /// An edge was taken: the node runs (else it is skipped).
    active: bool,
    /// The edges taken, for its first line of history.
    via: Vec<Value>,
    /// A `when` that failed: the node fails with it.
    edge_error: Option<String>,
}

impl Machine<'_> {
    /// Creates a task for every node that has become ready, in topological
    /// order so that a skip (or a TRANSFORM's result) reaches its successors
    /// in the same pass; then ends the run if nothing is left to do.
    pub(in crate::machine) fn route(&mut self) {
        self.advance_maps();
        // Paused: what finished is recorded, nothing new starts, the run
        // does not end; resuming routes again.
        if self.run.status == RunStatus::Paused {
            return;
        }
        let wf = self.wf;
        let (mut by_node, mut unhandled) = self.tasks_by_node();
        let mut after = self.after_ended();
        for &node in &wf.topo_order {
            // An unhandled failure fails the run: nothing new starts.
            if unhandled {
                break;
            }
            if after.as_ref().is_some_and(|after| !after[node]) {
                continue;
            }
            if by_node[node].is_some() {
                continue;
            }
            if after.is_some() && !self.holds_entry_of(node) {
                continue;
            }
            let mut ctx: Option<Scope> = None;
            let Some(entry) = self.entry(node, &by_node, &mut ctx) else { continue };
            let t = self.enter(node, entry, &mut ctx);
            by_node[node] = Some(t);
            unhandled = self.run.tasks[t].state == TaskState::Failed && !wf.handles_failure(node);
            // What it ended at once (a skip, a TRANSFORM) readies what follows it.
            if let (Some(after), true) = (&mut after, self.run.tasks[t].state.is_terminal()) {
                mark_successors(wf, after, node);
            }
        }
        if !self.tr.missing.is_empty() {
            return;
        }
        self.finish_run_if_done();
    }

    /// Each node's task (not an item's), and whether one of them failed
    /// with no edge to handle it.
    fn tasks_by_node(&self) -> (Vec<Option<usize>>, bool) {
        let mut by_node: Vec<Option<usize>> = vec![None; self.wf.nodes.len()];
        let mut unhandled = false;
        for (i, t) in self.run.tasks.iter().enumerate().filter(|(_, t)| t.item.is_none() && !t.removed) {
            by_node[t.node] = Some(i);
            unhandled |= t.state == TaskState::Failed && !self.wf.handles_failure(t.node);
        }
        (by_node, unhandled)
    }

    /// The nodes a run loaded in part looks at: those after the tasks that
    /// ended in this event. A node becomes ready when its last predecessor
    /// ends, so no other can have. `None` for a run loaded whole, which looks
    /// at every node, as after a retry or a rerun.
    fn after_ended(&self) -> Option<Vec<bool>> {
        let wf = self.wf;
        let mut after = self.run.known.as_ref().map(|_| vec![false; wf.nodes.len()]);
        if let Some(after) = &mut after {
            for &t in self.tr.updated.iter().chain(&self.tr.created) {
                let task = &self.run.tasks[t];
                if task.item.is_none() && !task.removed && task.state.is_terminal() {
                    mark_successors(wf, after, task.node);
                }
            }
        }
        after
    }

    /// In part: whether the node itself (it may have a task not loaded), what
    /// comes into it, and what its expressions read are loaded (naming in
    /// `tr.missing` what is not).
    fn holds_entry_of(&mut self, node: usize) -> bool {
        let wf = self.wf;
        let preds: Vec<usize> = wf.incoming[node].iter().map(|&e| wf.edges[e].from).collect();
        let known = self.require(std::iter::once(node).chain(preds));
        known && self.require_reads(node)
    }

    /// How `node` is entered once every edge into it has its source ended
    /// (`None` while one has not): by the edges whose end it follows and
    /// whose `when` holds, or skipped when none is taken.
    fn entry(&self, node: usize, by_node: &[Option<usize>], ctx: &mut Option<Scope>) -> Option<Entry> {
        let wf = self.wf;
        let mut entry = Entry { active: wf.incoming[node].is_empty(), via: Vec::new(), edge_error: None };
        for &e in &wf.incoming[node] {
            let edge = &wf.edges[e];
            match by_node[edge.from].map(|t| self.run.tasks[t].state) {
                Some(s) if edge.on.follows(s) => match self.taken(node, e, ctx) {
                    Ok(true) => {
                        entry.active = true;
                        entry.via.push(json!({"from": wf.nodes[edge.from].id, "on": edge.on.as_str()}));
                    }
                    Ok(false) => {}
                    Err(error) => entry.edge_error = Some(error),
                },
                Some(s) if s.is_terminal() => {}
                _ => return None,
            }
        }
        Some(entry)
    }

    /// Whether edge `e` into `node`, its source ended as the edge follows,
    /// is taken: its `when`, evaluated in the node's scope, holds.
    fn taken(&self, node: usize, e: usize, ctx: &mut Option<Scope>) -> Result<bool, String> {
        let wf = self.wf;
        let edge = &wf.edges[e];
        let Some(when) = &edge.when else { return Ok(true) };
        let scope = ctx.get_or_insert_with(|| self.scope(node));
        when.eval_bool_in(self.sb, scope)
            .map_err(|m| format!("edge {} -> {}: when: {m}", wf.nodes[edge.from].id, wf.nodes[node].id))
    }

    /// Creates `node`'s task as `entry` says; its first line of history says
    /// which edges it came by.
    fn enter(&mut self, node: usize, entry: Entry, ctx: &mut Option<Scope>) -> usize {
        let logged = self.tr.history.len();
        let t = self.create(node, entry.active, entry.edge_error, ctx);
        if let (Some(first), false) = (self.tr.history.get_mut(logged), entry.via.is_empty()) {
            first.payload["via"] = Value::Array(entry.via);
        }
        t
    }

    pub(super) fn finish_run_if_done(&mut self) {
        if self.run.status != RunStatus::Running || self.run.tasks.iter().any(|t| !t.state.is_terminal()) {
            return;
        }
        // Loaded in part (every open and failed task is here), a run that
        // ends needs its leaves for its output, or every node for an output
        // template or for a hook's input (`on_failure`, `on_success`, `on_end`: its nodes).
        if self.run.known.is_some() {
            let wf = self.wf;
            let fails =
                self.run.tasks.iter().any(|t| {
                    t.state == TaskState::Failed && t.item.is_none() && !t.removed && !wf.handles_failure(t.node)
                });
            let reads: Vec<usize> = match (!wf.hooks.is_empty(), fails, &wf.output) {
                (true, _, _) | (false, false, Some(_)) => wf.topo_order.clone(),
                (false, true, _) => Vec::new(),
                (false, false, None) => wf.topo_order.iter().copied().filter(|&n| wf.is_leaf(n)).collect(),
            };
            if !self.require(reads) {
                return;
            }
        }
        // A failure with a failure or always edge out of it was handled.
        let unhandled = self.run.tasks.iter().find(|t| {
            t.state == TaskState::Failed && t.item.is_none() && !t.removed && !self.wf.handles_failure(t.node)
        });
        if let Some(first) = unhandled {
            let node = &self.wf.nodes[first.node];
            let message = first.error.as_deref().unwrap_or("unknown error");
            let error = match node.kind {
                NodeKind::Fail { .. } => message.to_string(),
                _ => format!("node {:?} failed: {message}", node.id),
            };
            self.set_run(RunStatus::Failed, None, Some(error));
            return;
        }
        if let Some(template) = &self.wf.output {
            let max = self.run.max_payload;
            let stored = match template.is_literal() {
                true => template.eval_value(self.sb, None),
                false => template.eval_value(self.sb, Some(&self.scope_all())),
            };
            let stored = stored.and_then(|v| storable::check(&v, "output", max).map(|()| v));
            match stored {
                Ok(output) => self.set_run(RunStatus::Succeeded, Some(output), None),
                Err(e) => self.set_run(RunStatus::Failed, None, Some(format!("output: {e}"))),
            }
            return;
        }
        let leaves = self.run.tasks.iter().filter(|t| t.state == TaskState::Completed && self.wf.is_leaf(t.node));
        self.note_unread(false, leaves);
        let mut output = Map::new();
        for t in &self.run.tasks {
            if t.state == TaskState::Completed && self.wf.is_leaf(t.node) && !t.removed {
                output.insert(self.wf.nodes[t.node].id.clone(), t.output.clone().unwrap_or(Value::Null));
            }
        }
        let output = Value::Object(output);
        match storable::check(&output, "output", self.run.max_payload) {
            Ok(()) => self.set_run(RunStatus::Succeeded, Some(output), None),
            Err(e) => self.set_run(RunStatus::Failed, None, Some(e)),
        }
    }
}

/// Marks in `after` the nodes that follow `node`.
fn mark_successors(wf: &Workflow, after: &mut [bool], node: usize) {
    for &e in &wf.outgoing[node] {
        after[wf.edges[e].to] = true;
    }
}
