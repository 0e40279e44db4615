//! Repair: an operator ends a step with an output (an open one, or a
//! failed one in a failed run), or says how an attempt in doubt ended.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::machine::codes;
use crate::machine::event::Resolution;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::state::Machine;
use crate::machine::task::Failure;
use crate::machine::transition::{Ignore, IgnoreKind};

impl Machine<'_> {
    /// An operator ends a step with `output`: an open one (its worker loses
    /// the lease; a child run is cancelled; a MAP's open items too), or a
    /// failed one, whose failed run then goes on.
    pub(super) fn on_complete(&mut self, task_id: Uuid, output: Value) -> Result<(), Ignore> {
        let t = self.find(task_id)?;
        let state = self.run.tasks[t].state;
        let failed_run = self.run.status == RunStatus::Failed && state == TaskState::Failed;
        if !failed_run {
            self.require_active()?;
            if state.is_terminal() && state != TaskState::Failed {
                return Err(Ignore(IgnoreKind::AlreadyFinished, format!("task is already {state}")));
            }
        }
        if failed_run {
            self.set_run(RunStatus::Running, None, None);
            self.reopen_failed_item(t);
        }
        let task = &mut self.run.tasks[t];
        if task.state == TaskState::Failed {
            // Ended again, this time completed.
            task.state = TaskState::Running;
            task.error = None;
            task.error_info = None;
        }
        self.finish(t, TaskState::Completed, Some(output), None);
        self.route();
        Ok(())
    }

    /// A failed item completed by an operator: its MAP opens again to count
    /// it as completed.
    fn reopen_failed_item(&mut self, t: usize) {
        let Some(item) = self.run.tasks[t].item else { return };
        let Some(m) = self.map_task(item.map) else { return };
        if let Some(p) = &mut self.run.tasks[m].progress {
            p.failed = p.failed.saturating_sub(1);
            p.open += 1;
        }
        self.run.tasks[t].state = TaskState::Running;
        let map = &mut self.run.tasks[m];
        if map.state.is_terminal() {
            map.reopen();
        }
        self.tr.touch(m);
    }

    /// An operator's word on an IN_DOUBT attempt: it completed (with an
    /// output), failed for good, or is to be sent again (a new attempt; held
    /// while the run is paused).
    pub(super) fn on_resolve(&mut self, task_id: Uuid, resolution: Resolution) -> Result<(), Ignore> {
        self.require_active()?;
        let t = self.find(task_id)?;
        if self.run.tasks[t].state != TaskState::InDoubt {
            return Err(Ignore(
                IgnoreKind::NotInDoubt,
                format!("task is {}, only an IN_DOUBT task can be resolved", self.run.tasks[t].state),
            ));
        }
        let (what, detail) = match &resolution {
            Resolution::Completed(_) => ("completed", Value::Null),
            Resolution::Failed(e) => ("failed", json!(e)),
            Resolution::Retry => ("retry", Value::Null),
        };
        let payload = self.task_payload(t, json!({"outcome": what, "error": detail}));
        self.tr.log(HistoryKind::TaskResolved, payload);
        match resolution {
            Resolution::Completed(output) => {
                self.run.tasks[t].error = None;
                self.run.tasks[t].error_info = None;
                self.finish(t, TaskState::Completed, Some(output), None);
                self.route();
            }
            Resolution::Failed(error) => {
                self.finish(t, TaskState::Failed, None, Some(Failure::fatal(codes::RESOLVED, error)));
                self.route();
            }
            Resolution::Retry if self.run.status == RunStatus::Paused => {
                let task = &mut self.run.tasks[t];
                task.state = TaskState::Waiting;
                task.wake_at = None;
                self.tr.touch(t);
            }
            Resolution::Retry => {
                let task = &mut self.run.tasks[t];
                task.attempt += 1;
                task.error = None;
                task.error_info = None;
                self.tr.touch(t);
                self.dispatch(t);
            }
        }
        Ok(())
    }
}
