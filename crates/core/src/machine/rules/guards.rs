//! The guards an event passes before it changes anything: the run's
//! status, the task it names, the attempt a result reports on.

use uuid::Uuid;

use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::state::Machine;
use crate::machine::transition::{Ignore, IgnoreKind};

impl Machine<'_> {
    /// Running: nothing paused or ended starts anew.
    pub(super) fn require_running(&self) -> Result<(), Ignore> {
        if self.run.status != RunStatus::Running {
            return Err(Ignore(IgnoreKind::RunFinished, format!("run is {}", self.run.status)));
        }
        Ok(())
    }

    /// Running or paused: what has started may still finish.
    pub(in crate::machine) fn require_active(&self) -> Result<(), Ignore> {
        if self.run.status.is_terminal() {
            return Err(Ignore(IgnoreKind::RunFinished, format!("run is {}", self.run.status)));
        }
        Ok(())
    }

    /// The task `task_id` names, if it is one of this run's.
    pub(in crate::machine) fn find(&self, task_id: Uuid) -> Result<usize, Ignore> {
        self.run.tasks.iter().position(|t| t.id == task_id && !t.removed).ok_or_else(|| {
            Ignore(IgnoreKind::UnknownTask, format!("task {task_id} does not belong to run {}", self.run.id))
        })
    }

    /// The guard on every result: the current attempt of a PENDING or RUNNING task.
    pub(super) fn reportable(&self, task_id: Uuid, attempt: i32) -> Result<usize, Ignore> {
        self.require_active()?;
        let t = self.find(task_id)?;
        let task = &self.run.tasks[t];
        if task.attempt != attempt {
            return Err(Ignore(
                IgnoreKind::StaleAttempt,
                format!("stale report: attempt {attempt}, task is at attempt {}", task.attempt),
            ));
        }
        if !matches!(task.state, TaskState::Pending | TaskState::Running) {
            return Err(Ignore(IgnoreKind::AlreadyFinished, format!("task is already {}", task.state)));
        }
        Ok(t)
    }

    /// A worker's report must be for a task a worker runs: a MAP's own task
    /// or a SUB_WORKFLOW's is RUNNING too, but ends only through its items
    /// or its child run.
    pub(super) fn worker_runs(&self, t: usize) -> Result<(), Ignore> {
        let node = &self.wf.nodes[self.run.tasks[t].node];
        if node.kind.traits().dispatched {
            return Ok(());
        }
        Err(Ignore(IgnoreKind::NotDispatched, format!("a {} task is not run by a worker", node.node_type)))
    }
}
