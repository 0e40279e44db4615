//! The state machine: a pure function from (workflow, run, event, now) to a
//! [`Transition`]. The engine calls [`apply`] under the run lock and writes
//! what it returns; nothing here knows about SQL, Redis or HTTP.
//!
//! Rules:
//! - a result must match the task's current `(task_id, attempt)` while the
//!   task is PENDING or RUNNING; anything else is ignored with a reason, so the
//!   first matching result is applied exactly once;
//! - a node becomes ready when all its predecessors are terminal; it runs if
//!   at least one incoming edge is active (its source COMPLETED), otherwise it
//!   is SKIPPED and the skip propagates;
//! - a failed attempt with attempts left and a retryable error waits for its
//!   backoff (WAITING, `wake_at`), then TimerFired dispatches `attempt + 1`;
//! - once a task has FAILED no new node starts, and the run FAILS when
//!   nothing is active any more; it SUCCEEDS when every task is terminal and
//!   none failed.
//!
//! The vocabulary, each re-exported here:
//! - `lifecycle`: the states of a task ([`TaskState`]) and of a run ([`RunStatus`]).
//! - `task`: a node's [`Task`], a [`Failure`] and its [`ErrorInfo`], a MAP's
//!   [`Item`] and [`MapProgress`].
//! - [`codes`]: the error codes the engine gives.
//! - `run`: the [`Run`] the machine changes, and a child's [`ParentRef`].
//! - `event`: the [`Event`]s that move a run, and a [`Resolution`].
//! - `history`: a [`HistoryEntry`] and its [`HistoryKind`].
//! - `effect`: what the engine does for the machine: an [`Effect`] (a
//!   [`Need`]) in the transaction, an [`AfterCommit`] after it.
//! - `hooks`: what a hook's run (`on_failure`, `on_success`, `on_end`) is
//!   started with, over the run that ended.
//! - `transition`: what an event changed ([`Transition`]), or why it did
//!   not ([`IgnoreKind`]).
//!
//! How an event is applied:
//! - `state`: one event's application, the `Machine` the rules run on.
//! - `rules`: the rules, a room per family of event (start, report,
//!   timers, control, LOOP, rerun, repair, …).
//! - `map`: MAP's rules.
//! - [`migrate`]: whether a run can move to another version of its
//!   workflow, and its steps renamed to the new version's (`migrate_tests`:
//!   its tests).

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::definition::Workflow;
use crate::expr::Sandbox;

pub mod codes;
mod effect;
mod event;
mod history;
mod hooks;
mod lifecycle;
mod map;
pub mod migrate;
mod rules;
mod run;
mod state;
mod task;
mod transition;

pub use effect::{AfterCommit, Effect, Need};
pub use event::{Event, Resolution};
pub use history::{HistoryEntry, HistoryKind};
pub use hooks::{hook_input, hook_scopes};
pub use lifecycle::{RunStatus, TaskState};
pub use map::{collected_entry, ITEMS_PER_EVENT, ITEM_CHUNK};
pub use run::{ParentRef, Run, EVENT_READS, SCOPE_MAX_BYTES};
pub use task::{ErrorInfo, Failure, Item, MapProgress, Task};
pub use transition::{IgnoreKind, Transition};

use state::Machine;

/// Names the nesting limit in the error of a SUB_WORKFLOW that hit it.
pub const DEPTH_LIMIT: &str = "sub_workflow_max_depth";

/// Applies `event` to `run` and returns what changed, evaluating its
/// expressions in `sb`. `new_id` mints task ids (UUIDv7 in production, so a
/// run's tasks sort by creation).
pub fn apply(
    sb: &Sandbox,
    wf: &Workflow,
    run: &mut Run,
    event: Event,
    now: DateTime<Utc>,
    new_id: &mut dyn FnMut() -> Uuid,
) -> Transition {
    let about = transition::Probe::of(&event);
    let read_left = std::cell::Cell::new(run.max_read.saturating_mul(EVENT_READS));
    let mut m = Machine {
        sb,
        wf,
        run,
        now,
        new_id,
        tr: Transition::default(),
        maps: state::Maps::default(),
        unread: std::cell::Cell::new(false),
        read_left,
    };
    let on = m.on(event);
    if on.is_ok() {
        m.keep_sources();
    }
    if m.unread.get() {
        // Whatever it decided, it decided over a reference: void.
        return Transition { unread: true, ..Transition::default() };
    }
    if let Err(reason) = on {
        return Transition::ignore(reason, about);
    }
    m.tr
}

/// What expressions see, as one JSON value, with just the nodes of `tasks`:
/// `{input, nodes: {<id>: {output, state, error?}}, run: {id, workflow}}`
/// (`error` for a FAILED node: `{message, code, retryable, attempts, status?}`).
/// The engine builds it in place ([`scope_of`]); tests compare the two.
#[cfg(test)]
pub(super) fn context_of<'t>(wf: &Workflow, run: &Run, tasks: impl Iterator<Item = &'t Task>) -> Value {
    let mut nodes = serde_json::Map::new();
    for t in tasks.filter(|t| t.item.is_none() && !t.removed) {
        let mut node = json!({"output": t.output, "state": t.state});
        if let Some(error) = t.error_json() {
            node["error"] = error;
        }
        nodes.insert(wf.nodes[t.node].id.clone(), node);
    }
    json!({"input": run.input, "nodes": nodes, "run": {"id": run.id, "workflow": wf.spec.name}})
}

/// [`context_of`] as the expression engine's scope, each value converted
/// where it is rather than copied into the context first: a run's values
/// may be large. Without `input`, its `.input` is `null`: converting the
/// run's input costs its size, so only a scope that may read it holds it.
///
/// The values it holds are charged first: past `run.max_read` in all
/// ([`SCOPE_MAX_BYTES`]), or past what the event's scopes may still
/// convert (`read_left`, [`EVENT_READS`]), nothing is converted and the
/// scope is refused, so each expression evaluated in it fails naming the
/// limit.
pub(super) fn scope_of<'t>(
    wf: &Workflow,
    run: &Run,
    tasks: impl Iterator<Item = &'t Task> + Clone,
    input: bool,
    read_left: &std::cell::Cell<usize>,
) -> crate::expr::Scope {
    use crate::expr::Part;
    let event_left = read_left.get();
    let mut left = run.max_read.min(event_left);
    let input_value = input.then_some(&run.input);
    let outputs = tasks.clone().filter(|t| t.item.is_none() && !t.removed).filter_map(|t| t.output.as_ref());
    for value in input_value.into_iter().chain(outputs) {
        match crate::storable::size_up_to(value, left) {
            Some(size) => left -= size,
            None if run.max_read <= event_left => {
                return crate::expr::Scope::refused(format!(
                    "the run's values it reads (its input and the outputs of the nodes it names) are more than \
                     the {} bytes of JSON one expression's scope may hold",
                    run.max_read
                ))
            }
            None => {
                return crate::expr::Scope::refused(format!(
                    "this event's expressions read more of the run's values than one event may convert ({} \
                     scopes of {} bytes of JSON): read a large value in fewer nodes",
                    EVENT_READS, run.max_read
                ))
            }
        }
    }
    read_left.set(event_left - (run.max_read.min(event_left) - left));
    let mut nodes = Vec::new();
    for t in tasks.filter(|t| t.item.is_none() && !t.removed) {
        let mut node = vec![
            ("output", t.output.as_ref().map_or(Part::Owned(Value::Null), Part::Value)),
            ("state", Part::Owned(json!(t.state))),
        ];
        if let Some(error) = t.error_json() {
            node.push(("error", Part::Owned(error)));
        }
        nodes.push((wf.nodes[t.node].id.as_str(), Part::Object(node)));
    }
    let about = json!({"id": run.id, "workflow": wf.spec.name});
    let context = Part::Object(vec![
        ("input", if input { Part::Value(&run.input) } else { Part::Owned(Value::Null) }),
        ("nodes", Part::Object(nodes)),
        ("run", Part::Owned(about)),
    ]);
    crate::expr::Scope::of(context).unwrap_or_else(crate::expr::Scope::refused)
}

/// What a committed transition owes other runs: the children its
/// SUB_WORKFLOW attempts start, the children they stop waiting for, and,
/// when the run ended, its parent and its concurrency slot. Computed once
/// per commit from the run as it stands then, so that events applied
/// together (a run that ended and was retried in one batch) owe only what
/// their last state owes.
pub fn after_commit(wf: &Workflow, run: &Run, tr: &Transition) -> Vec<AfterCommit> {
    let mut out = Vec::new();
    let mut asked = HashSet::new();
    for &t in &tr.children {
        let task = &run.tasks[t];
        let waits = task.state == TaskState::Running && wf.nodes[task.node].kind.traits().has_child;
        let iteration = task.iteration.unwrap_or(0);
        if waits && !task.removed && asked.insert((task.id, task.attempt, iteration)) {
            out.push(AfterCommit::StartChild { task_id: task.id, attempt: task.attempt, iteration });
        }
    }
    for &t in &tr.updated {
        let task = &run.tasks[t];
        if wf.nodes[task.node].kind.traits().has_child {
            let waiting = task.state == TaskState::Running && !task.removed;
            // An attempt (or iteration) not yet started has no child of its
            // own yet; one started later is waited for. A WAITING task
            // without an error is a LOOP's delay before its next iteration
            // (a retry's wait holds the error of the attempt that ran).
            let started = match task.state {
                TaskState::Pending | TaskState::Queued => false,
                TaskState::Waiting => task.error.is_some(),
                _ => true,
            };
            let current = !waiting && started;
            let iteration = task.iteration.unwrap_or(0);
            // A first attempt's first iteration that just started has no other child.
            if !waiting || task.attempt > 1 || iteration > 0 {
                out.push(AfterCommit::CancelChildren { task_id: task.id, attempt: task.attempt, iteration, current });
            }
        }
    }
    for &m in &tr.cancel_items {
        let task = &run.tasks[m];
        let items_have_children = match &wf.nodes[task.node].kind {
            crate::definition::NodeKind::Map(config) => wf.nodes[config.template].kind.traits().has_child,
            _ => false,
        };
        if items_have_children && task.state.is_terminal() {
            out.push(AfterCommit::CancelItemChildren { map_task_id: task.id });
        }
    }
    for &m in &tr.continue_maps {
        let task = &run.tasks[m];
        if task.state == TaskState::Running && !task.removed {
            out.push(AfterCommit::ContinueMap { task_id: task.id });
        }
    }
    if tr.run_changed && run.status.is_terminal() {
        if let Some(parent) = run.parent {
            let event = Event::ChildFinished {
                task_id: parent.task_id,
                attempt: parent.attempt,
                iteration: parent.iteration,
                child: Some(run.id),
                status: run.status,
                output: run.output.clone(),
                error: run.error.clone(),
            };
            out.push(AfterCommit::NotifyParent { parent_run: parent.run_id, event });
        }
        if let Some(key) = &run.concurrency_key {
            out.push(AfterCommit::FreeSlot { workflow: wf.spec.name.clone(), key: key.clone() });
        }
    }
    out
}

#[cfg(test)]
mod migrate_tests;
#[cfg(test)]
mod tests;
