//! Timers and waits: a due timer (a WAIT, an event's timeout, a retry's
//! backoff, an attempt's deadline), an awaited event, the run's deadline.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::definition::NodeKind;
use crate::machine::codes;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::state::Machine;
use crate::machine::task::Failure;
use crate::machine::transition::{Ignore, IgnoreKind};

impl Machine<'_> {
    /// A due timer ends a WAIT, times out a WAIT_FOR_EVENT or an attempt,
    /// starts a LOOP's next iteration, or ends a retry backoff by
    /// dispatching the next attempt.
    pub(super) fn on_timer_fired(&mut self, task_id: Uuid) -> Result<(), Ignore> {
        self.require_active()?;
        let t = self.find(task_id)?;
        let task = &self.run.tasks[t];
        if matches!(task.state, TaskState::Pending | TaskState::Running) {
            return self.attempt_timed_out(t);
        }
        if task.state != TaskState::Waiting {
            return Err(Ignore(IgnoreKind::NotWaiting, format!("task is {}, not WAITING", task.state)));
        }
        if task.wake_at.is_some_and(|w| w > self.now) {
            return Err(Ignore(IgnoreKind::NotDue, "timer is not due yet".into()));
        }
        match &self.wf.nodes[task.node].kind {
            NodeKind::Wait(_) => self.finish(t, TaskState::Completed, Some(json!({})), None),
            NodeKind::WaitForEvent { default_output: Some(out), .. } => {
                self.finish(t, TaskState::Completed, Some(out.clone()), None)
            }
            NodeKind::WaitForEvent { event, timeout, default_output: None, .. } => {
                let key = task.event.as_ref().map(|(_, k)| k.as_str()).unwrap_or("");
                let after = timeout.map(crate::duration::format).unwrap_or_default();
                let error = format!("timed out after {after} waiting for event {event:?} with key {key:?}");
                self.finish(t, TaskState::Failed, None, Some(Failure::fatal(codes::EVENT_TIMEOUT, error)));
            }
            NodeKind::Approval(_) => return self.approval_timed_out(t),
            // A LOOP's delay ran out: its next iteration starts (held while
            // the run is paused, like a retry).
            NodeKind::Loop(_) if task.error.is_none() && self.run.status == RunStatus::Paused => {
                self.run.tasks[t].wake_at = None;
                self.tr.touch(t);
                return Ok(());
            }
            NodeKind::Loop(_) if task.error.is_none() => {
                self.start_iteration(t);
                return Ok(());
            }
            // A retry's backoff ran out while the run is paused: the retry
            // is held (no timer left, so none fires again) until it resumes.
            kind if kind.traits().retried && self.run.status == RunStatus::Paused => {
                self.run.tasks[t].wake_at = None;
                self.tr.touch(t);
                return Ok(());
            }
            kind if kind.traits().retried => {
                let task = &mut self.run.tasks[t];
                task.attempt += 1;
                task.wake_at = None;
                self.tr.touch(t);
                self.dispatch(t);
                return Ok(());
            }
            _ => {
                let node_type = &self.wf.nodes[task.node].node_type;
                return Err(Ignore(IgnoreKind::NotWaiting, format!("a {node_type} task has no timer")));
            }
        }
        self.route();
        Ok(())
    }

    /// A dispatched attempt past its node's timeout fails (retryably); the
    /// worker holding it loses its lease at the next renewal.
    fn attempt_timed_out(&mut self, t: usize) -> Result<(), Ignore> {
        let task = &self.run.tasks[t];
        let node = &self.wf.nodes[task.node];
        let (Some(limit), Some(deadline)) = (node.timeout, task.wake_at) else {
            return Err(Ignore(IgnoreKind::NotWaiting, format!("task is {}, not WAITING", task.state)));
        };
        if deadline > self.now {
            return Err(Ignore(IgnoreKind::NotDue, "the attempt's deadline has not passed".into()));
        }
        let error =
            format!("attempt {} timed out after {} (the node's timeout)", task.attempt, crate::duration::format(limit));
        self.fail_attempt(t, Failure::retryable(codes::TIMEOUT, error));
        Ok(())
    }

    /// The event a WAIT_FOR_EVENT waits for came: it completes with its payload.
    pub(super) fn on_event_received(&mut self, task_id: Uuid, payload: Value) -> Result<(), Ignore> {
        self.require_active()?;
        let t = self.find(task_id)?;
        let task = &self.run.tasks[t];
        if task.state != TaskState::Waiting || task.event.is_none() {
            return Err(Ignore(IgnoreKind::NotWaiting, format!("task is {}, not waiting for an event", task.state)));
        }
        self.finish(t, TaskState::Completed, Some(payload), None);
        self.route();
        Ok(())
    }

    /// Past the definition's `timeout`: open tasks are cancelled (a worker
    /// holding one stops at its next renewal) and the run fails.
    pub(super) fn on_run_timed_out(&mut self) -> Result<(), Ignore> {
        self.require_active()?;
        match self.run.deadline {
            Some(d) if d <= self.now => {}
            _ => return Err(Ignore(IgnoreKind::NotDue, "the run's deadline has not passed".into())),
        }
        for t in 0..self.run.tasks.len() {
            if !self.run.tasks[t].state.is_terminal() {
                self.finish(t, TaskState::Cancelled, None, None);
            }
        }
        let after = self.wf.timeout.map(crate::duration::format).unwrap_or_default();
        self.set_run(RunStatus::Failed, None, Some(format!("run timed out after {after}")));
        Ok(())
    }
}
