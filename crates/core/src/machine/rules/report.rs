//! A worker's report on an attempt: completed, failed (retried after a
//! backoff while attempts are left) or, for an at-most-once attempt,
//! in doubt.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::definition::limit::MAX_RETRY_AFTER;
use crate::machine::codes;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::TaskState;
use crate::machine::state::{later, Machine};
use crate::machine::task::{ErrorInfo, Failure};
use crate::machine::transition::{Ignore, IgnoreKind};

/// The failure a worker reported: its code if it is one ([`codes::TASK_FAILED`]
/// without), and a 429's `Retry-After`, bounded.
pub(super) fn failure_reported(
    error: String,
    retryable: bool,
    code: Option<String>,
    status: Option<u16>,
    retry_after: Option<std::time::Duration>,
) -> Failure {
    let code = code.filter(|c| crate::definition::is_error_code(c));
    let mut failure = Failure::fatal(code.as_deref().unwrap_or(codes::TASK_FAILED), error);
    failure.info.retryable = retryable;
    failure.info.status = status;
    failure.retry_after = retry_after.filter(|_| status == Some(429)).map(|d| d.min(MAX_RETRY_AFTER));
    failure
}

impl Machine<'_> {
    /// The attempt completed: its output is kept (an item's output over its
    /// share of its MAP's fails it instead) and what follows may start.
    pub(super) fn on_task_completed(&mut self, task_id: Uuid, attempt: i32, output: Value) -> Result<(), Ignore> {
        let t = self.reportable(task_id, attempt)?;
        self.worker_runs(t)?;
        self.tr.reported.push(t);
        self.complete_within_share(t, output);
        Ok(())
    }

    /// A retryable failure with attempts left waits for its backoff; any
    /// other failure is final for the task.
    pub(super) fn on_task_failed(&mut self, task_id: Uuid, attempt: i32, failure: Failure) -> Result<(), Ignore> {
        let t = self.reportable(task_id, attempt)?;
        self.worker_runs(t)?;
        self.tr.reported.push(t);
        // The target asked for a pause: its keys wait as long, whatever
        // becomes of this task.
        if let Some(wait) = failure.retry_after.filter(|_| self.wf.nodes[self.run.tasks[t].node].retry.respect_429) {
            if !self.run.tasks[t].limit_keys.is_empty() {
                self.tr.limit_holds.push((t, later(self.now, wait)));
            }
        }
        self.fail_attempt(t, failure);
        Ok(())
    }

    /// A step ends COMPLETED with `output` and the run routes on, unless the
    /// output is over its share of its MAP's collected output: then the
    /// attempt fails.
    pub(super) fn complete_within_share(&mut self, t: usize, output: Value) {
        match self.over_share(t, &output) {
            Some(failure) => self.fail_attempt(t, failure),
            None => {
                self.finish(t, TaskState::Completed, Some(output), None);
                self.route();
            }
        }
    }

    /// The task's current attempt failed (by its worker, its child run or
    /// its timeout).
    pub(super) fn fail_attempt(&mut self, t: usize, mut failure: Failure) {
        let attempt = self.run.tasks[t].attempt;
        let node = &self.wf.nodes[self.run.tasks[t].node];
        // A leased at-most-once attempt that timed out, whose request broke
        // off, or that recovery gave up on while a worker held it, may have
        // taken effect: it is not sent again.
        let unknown = [codes::TIMEOUT, codes::TRANSPORT, codes::IN_DOUBT, codes::MAX_DISPATCHES]
            .contains(&failure.info.code.as_str());
        if node.at_most_once && unknown && self.run.tasks[t].state == TaskState::Running {
            self.in_doubt(t, failure.message);
            return;
        }
        let policy = node.retry;
        if failure.info.retryable && (attempt as i64) < policy.max_attempts as i64 {
            let mut wait = policy.backoff(attempt as u32);
            if let Some(asked) = failure.retry_after.filter(|_| policy.respect_429) {
                wait = wait.max(asked);
            }
            let wake_at = later(self.now, wait);
            let task = &mut self.run.tasks[t];
            task.state = TaskState::Waiting;
            task.wake_at = Some(wake_at);
            let payload = json!({"error": failure.message, "code": failure.info.code, "retry_at": wake_at});
            task.error = Some(failure.message);
            task.error_info = Some(failure.info);
            self.tr.touch(t);
            let payload = self.task_payload(t, payload);
            self.tr.log(HistoryKind::TaskRetryScheduled, payload);
        } else {
            if !failure.info.retryable {
                failure.message.push_str(" (not retryable)");
            }
            self.finish(t, TaskState::Failed, None, Some(failure));
            self.route();
        }
    }

    /// A running at-most-once attempt's lease expired: its outcome is unknown.
    pub(super) fn on_task_in_doubt(&mut self, task_id: Uuid, attempt: i32, reason: String) -> Result<(), Ignore> {
        let t = self.reportable(task_id, attempt)?;
        if !self.wf.nodes[self.run.tasks[t].node].at_most_once || self.run.tasks[t].state != TaskState::Running {
            return Err(Ignore(IgnoreKind::NotDispatched, "not a running at-most-once attempt".into()));
        }
        self.in_doubt(t, reason);
        Ok(())
    }

    /// An at-most-once attempt whose outcome is unknown: it waits IN_DOUBT
    /// (the run with it) until an operator resolves it; pause and cancel
    /// still work.
    pub(super) fn in_doubt(&mut self, t: usize, reason: String) {
        let task = &mut self.run.tasks[t];
        task.state = TaskState::InDoubt;
        task.wake_at = None;
        let payload = json!({"reason": reason});
        task.error = Some(reason);
        task.error_info = Some(ErrorInfo { code: codes::IN_DOUBT.into(), retryable: false, status: None });
        self.tr.touch(t);
        let payload = self.task_payload(t, payload);
        self.tr.log(HistoryKind::TaskInDoubt, payload);
    }
}
