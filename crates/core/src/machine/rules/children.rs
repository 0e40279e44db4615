//! A SUB_WORKFLOW's child run ended: its attempt ends with it.

use serde_json::Value;
use uuid::Uuid;

use crate::definition::NodeKind;
use crate::machine::codes;
use crate::machine::lifecycle::RunStatus;
use crate::machine::state::Machine;
use crate::machine::task::Failure;
use crate::machine::transition::{Ignore, IgnoreKind};
use crate::machine::DEPTH_LIMIT;

impl Machine<'_> {
    /// The guard on a child's end: a result's ([`Self::reportable`]), and
    /// for a LOOP, the iteration it is at.
    pub(super) fn child_reportable(&self, task_id: Uuid, attempt: i32, iteration: u32) -> Result<usize, Ignore> {
        let t = self.reportable(task_id, attempt)?;
        if self.run.tasks[t].iteration.unwrap_or(0) != iteration {
            return Err(Ignore(
                IgnoreKind::StaleAttempt,
                format!(
                    "stale child: iteration {iteration}, the loop is at {}",
                    self.run.tasks[t].iteration.unwrap_or(0)
                ),
            ));
        }
        Ok(t)
    }

    /// A SUB_WORKFLOW attempt ends with its child: the child's output, or a
    /// failure naming the child (retryable: the retry policy starts a new
    /// child). A child that could not start fails the node for good.
    pub(super) fn on_child_finished(
        &mut self,
        t: usize,
        child: Option<Uuid>,
        status: RunStatus,
        output: Option<Value>,
        error: Option<&str>,
    ) -> Result<(), Ignore> {
        if !self.wf.nodes[self.run.tasks[t].node].kind.traits().has_child {
            return Err(Ignore(IgnoreKind::NotDispatched, "not a SUB_WORKFLOW task".into()));
        }
        match (child, status) {
            (_, RunStatus::Queued | RunStatus::Running | RunStatus::Paused) => {
                Err(Ignore(IgnoreKind::NotDue, format!("the child run is {status}, not finished")))
            }
            (Some(_), RunStatus::Succeeded)
                if matches!(self.wf.nodes[self.run.tasks[t].node].kind, NodeKind::Loop(_)) =>
            {
                self.iteration_done(t, output.unwrap_or(Value::Null));
                Ok(())
            }
            (Some(_), RunStatus::Succeeded) => {
                self.complete_within_share(t, output.unwrap_or(Value::Null));
                Ok(())
            }
            (Some(child), _) => {
                let why = error.map(|e| format!(": {e}")).unwrap_or_default();
                // A child that failed on the nesting limit would fail again:
                // retrying it at every level would multiply the runs.
                let retryable = !error.is_some_and(|e| e.contains(DEPTH_LIMIT));
                let mut failure = Failure::fatal(codes::CHILD_FAILED, format!("child run {child} {status}{why}"));
                failure.info.retryable = retryable;
                self.fail_attempt(t, failure);
                Ok(())
            }
            (None, _) => {
                let why = error.unwrap_or("the child run could not start");
                self.fail_attempt(t, Failure::fatal(codes::CHILD_NOT_STARTED, why));
                Ok(())
            }
        }
    }
}
