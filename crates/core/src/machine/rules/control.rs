//! The run's controls: cancel, pause, resume, and retry of a failed run.

use serde_json::json;

use crate::definition::NodeKind;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::rules::reset::Reset;
use crate::machine::state::Machine;
use crate::machine::transition::{Ignore, IgnoreKind};

impl Machine<'_> {
    /// Every open step is cancelled (a worker holding one stops at its next
    /// renewal), and the run with them.
    pub(super) fn on_cancel(&mut self) -> Result<(), Ignore> {
        self.require_active()?;
        for t in 0..self.run.tasks.len() {
            if !self.run.tasks[t].state.is_terminal() {
                self.finish(t, TaskState::Cancelled, None, None);
            }
        }
        self.set_run(RunStatus::Cancelled, None, None);
        Ok(())
    }

    /// Steps already started finish; nothing new starts until a resume.
    pub(super) fn on_pause(&mut self) -> Result<(), Ignore> {
        self.require_running()?;
        self.run.status = RunStatus::Paused;
        self.tr.run_changed = true;
        self.tr.log(HistoryKind::RunPaused, json!({}));
        Ok(())
    }

    /// Starts what the pause held back: retries whose backoff ran out while
    /// paused, and nodes that became ready.
    pub(super) fn on_resume(&mut self) -> Result<(), Ignore> {
        if self.run.status != RunStatus::Paused {
            return Err(Ignore(
                IgnoreKind::NotPaused,
                format!("run is {}, only a PAUSED run can be resumed", self.run.status),
            ));
        }
        self.run.status = RunStatus::Running;
        self.tr.run_changed = true;
        self.tr.log(HistoryKind::RunResumed, json!({}));
        for t in 0..self.run.tasks.len() {
            let task = &self.run.tasks[t];
            let held = task.state == TaskState::Waiting
                && task.wake_at.is_none()
                && self.wf.nodes[task.node].kind.traits().retried;
            let next_iteration = matches!(self.wf.nodes[task.node].kind, NodeKind::Loop(_)) && task.error.is_none();
            if held && next_iteration {
                self.start_iteration(t);
            } else if held {
                self.run.tasks[t].attempt += 1;
                self.tr.touch(t);
                self.dispatch(t);
            }
        }
        self.mark_open_maps();
        self.route();
        Ok(())
    }

    /// A FAILED run runs again: its failed steps get a new attempt (a
    /// handled failure's branch is reset), everything else is kept.
    pub(super) fn on_retry(&mut self) -> Result<(), Ignore> {
        if self.run.status != RunStatus::Failed {
            return Err(Ignore(
                IgnoreKind::NotFailed,
                format!("run is {}, only a FAILED run can be retried", self.run.status),
            ));
        }
        self.set_run(RunStatus::Running, None, None);
        let failed: Vec<usize> = (0..self.run.tasks.len())
            .filter(|&t| {
                let task = &self.run.tasks[t];
                task.state == TaskState::Failed && task.item.is_none() && !task.removed
            })
            .collect();
        // A handled failure's branch is reset: it runs again, from the
        // failed node, as the new attempt's outcome decides.
        let mut reset = Reset::none(self.wf);
        for &t in &failed {
            let node = self.run.tasks[t].node;
            if self.wf.handles_failure(node) {
                reset.after(self.wf, node);
            }
        }
        self.remove_reset(&reset);
        for t in failed {
            if !reset.holds(self.run.tasks[t].node) {
                self.restart(t);
            }
        }
        self.route();
        Ok(())
    }
}
