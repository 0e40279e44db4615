//! What a retry and a rerun do to the steps they run again: a task taken
//! out of the run, or started again at its next attempt.

use serde_json::json;

use crate::definition::Workflow;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::TaskState;
use crate::machine::state::Machine;

/// The nodes whose tasks a retry or a rerun takes out of the run, to run
/// again as they become ready.
pub(super) struct Reset(Vec<bool>);

impl Reset {
    /// No node of `wf`.
    pub(super) fn none(wf: &Workflow) -> Reset {
        Reset(vec![false; wf.nodes.len()])
    }

    /// `node` itself.
    pub(super) fn node(&mut self, node: usize) {
        self.0[node] = true;
    }

    /// Every node after `node` (not `node` itself).
    pub(super) fn after(&mut self, wf: &Workflow, node: usize) {
        for (n, below) in wf.downstream(node).into_iter().enumerate() {
            self.0[n] |= below;
        }
    }

    pub(super) fn holds(&self, node: usize) -> bool {
        self.0[node]
    }
}

impl Machine<'_> {
    /// Takes out of the run the tasks of the nodes `reset` holds (a MAP's
    /// items go with their MAP).
    pub(super) fn remove_reset(&mut self, reset: &Reset) {
        for t in 0..self.run.tasks.len() {
            let task = &self.run.tasks[t];
            if task.item.is_none() && !task.removed && reset.holds(task.node) {
                self.remove(t);
            }
        }
    }

    /// Takes a task out of the run (its node runs again when it becomes
    /// ready): a MAP's items with it, and a child run is cancelled (after the
    /// commit). Its row is deleted; its history stays.
    pub(super) fn remove(&mut self, t: usize) {
        let id = self.run.tasks[t].id;
        let payload = self.task_payload(t, json!({}));
        for i in 0..self.run.tasks.len() {
            if self.run.tasks[i].item.is_some_and(|item| item.map == id) {
                self.run.tasks[i].removed = true;
                self.run.tasks[i].state = TaskState::Cancelled;
            }
        }
        if self.run.tasks[t].progress.is_some() && !self.tr.cancel_items.contains(&t) {
            self.tr.cancel_items.push(t);
        }
        let task = &mut self.run.tasks[t];
        task.removed = true;
        task.state = TaskState::Cancelled;
        task.wake_at = None;
        self.tr.touch(t);
        self.maps = crate::machine::state::Maps::default();
        self.tr.log(HistoryKind::TaskReset, payload);
    }

    /// Starts a task's next attempt afresh (a LOOP from its first
    /// iteration; a MAP runs again the items that did not complete).
    pub(super) fn restart(&mut self, t: usize) {
        if self.run.tasks[t].progress.is_some() {
            self.restart_map(t);
            return;
        }
        let task = &mut self.run.tasks[t];
        task.begin_next_attempt();
        task.output = None;
        task.wake_at = None;
        // A loop's new execution starts from its first iteration.
        task.iteration = None;
        self.tr.touch(t);
        let mut ctx = None;
        self.start(t, &mut ctx);
    }
}
