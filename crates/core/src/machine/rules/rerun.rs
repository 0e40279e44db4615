//! Rerun: an operator runs the run again from some of its steps (a MAP's
//! items too); they and what follows them are reset.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::rules::reset::Reset;
use crate::machine::state::{renew_idempotency_key, Machine};
use crate::machine::transition::{Ignore, IgnoreKind};

impl Machine<'_> {
    /// Runs the run again from `tasks`: each node's task and everything
    /// after it is reset (open ones with it: their workers lose the lease,
    /// children are cancelled) and runs again as it becomes ready; a MAP's
    /// item runs again in its MAP, and what comes after the MAP is reset.
    /// With `input`, the run goes on with that input.
    pub(super) fn on_rerun(
        &mut self,
        tasks: &[Uuid],
        input: Option<Value>,
        allow_completed: bool,
    ) -> Result<(), Ignore> {
        self.require_rerunnable(allow_completed)?;
        let found = self.rerun_steps(tasks)?;
        let (reset, names) = self.reset_for_rerun(&found);
        self.tr.log(HistoryKind::RunRerun, json!({"from": names, "input_changed": input.is_some()}));
        if let Some(input) = input {
            self.run.input = input;
            self.tr.input_changed = true;
        }
        if self.run.status.is_terminal() {
            self.set_run(RunStatus::Running, None, None);
        }
        self.remove_reset(&reset);
        for t in found {
            if self.run.tasks[t].item.is_some() && !self.run.tasks[t].removed {
                self.rerun_item(t);
            }
        }
        self.route();
        Ok(())
    }

    /// A run reruns once it has started; a SUCCEEDED one only when the
    /// operator allows it.
    fn require_rerunnable(&self, allow_completed: bool) -> Result<(), Ignore> {
        match self.run.status {
            RunStatus::Queued => Err(Ignore(IgnoreKind::NotDue, "the run has not started".into())),
            RunStatus::Succeeded if !allow_completed => Err(Ignore(
                IgnoreKind::RunFinished,
                "the run SUCCEEDED: rerun it with allow_completed (the CLI's --allow-completed) to run it again".into(),
            )),
            _ => Ok(()),
        }
    }

    /// The steps a rerun names, each of this run; an item of a MAP that
    /// reduces cannot be taken out of its MAP's value.
    fn rerun_steps(&mut self, tasks: &[Uuid]) -> Result<Vec<usize>, Ignore> {
        if tasks.is_empty() {
            return Err(Ignore(IgnoreKind::UnknownTask, "a rerun names at least one step".into()));
        }
        let mut found = Vec::with_capacity(tasks.len());
        for &id in tasks {
            found.push(self.find(id)?);
        }
        for &t in &found {
            if let Some(item) = self.run.tasks[t].item {
                let m = self.map_task(item.map).ok_or_else(|| {
                    Ignore(IgnoreKind::UnknownTask, format!("item {} has no MAP in this run", self.run.tasks[t].id))
                })?;
                if matches!(self.map_config(m).collect, crate::definition::Collect::Reduce { .. }) {
                    return Err(Ignore(
                        IgnoreKind::NotDispatched,
                        "an item of a MAP that reduces cannot be rerun alone: rerun the MAP".into(),
                    ));
                }
            }
        }
        Ok(found)
    }

    /// What a rerun from `found` resets: each step's node and what follows
    /// it, and for an item what follows its MAP (the MAP stays); with the
    /// steps' names, for the history.
    fn reset_for_rerun(&mut self, found: &[usize]) -> (Reset, Vec<Value>) {
        let mut reset = Reset::none(self.wf);
        let mut names = Vec::new();
        for &t in found {
            let task = &self.run.tasks[t];
            names.push(json!(task.node_id(&self.wf.nodes[task.node])));
            match task.item {
                Some(item) => {
                    if let Some(m) = self.map_task(item.map) {
                        reset.after(self.wf, self.run.tasks[m].node);
                    }
                }
                None => {
                    reset.node(task.node);
                    reset.after(self.wf, task.node);
                }
            }
        }
        (reset, names)
    }

    /// A MAP's item runs again (a new attempt, QUEUED for a slot): its MAP
    /// counts it as to come again, and opens again if it had ended.
    fn rerun_item(&mut self, t: usize) {
        let Some(item) = self.run.tasks[t].item else { return };
        let Some(m) = self.map_task(item.map) else { return };
        let was = self.run.tasks[t].state;
        if let Some(p) = &mut self.run.tasks[m].progress {
            match was {
                TaskState::Completed => p.completed = p.completed.saturating_sub(1),
                TaskState::Failed | TaskState::Cancelled | TaskState::Skipped => p.failed = p.failed.saturating_sub(1),
                TaskState::Queued => p.queued = p.queued.saturating_sub(1),
                _ => p.open = p.open.saturating_sub(1),
            }
            p.queued += 1;
        }
        let task = &mut self.run.tasks[t];
        task.state = TaskState::Queued;
        task.begin_next_attempt();
        task.output = None;
        task.wake_at = None;
        renew_idempotency_key(task);
        self.tr.touch(t);
        let map = &mut self.run.tasks[m];
        if map.state.is_terminal() {
            map.reopen();
            map.output = None;
        }
        self.tr.touch(m);
        self.maps.queued = None;
        if !self.maps.dirty.contains(&m) {
            self.maps.dirty.push(m);
        }
    }
}
