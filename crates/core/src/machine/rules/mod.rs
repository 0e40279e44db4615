//! The rules: how each event moves a run's tasks. [`Machine::on`] only
//! routes an event to its handler; each family of event has a room, and
//! the steps they share (start, route, finish) have theirs.
//!
//! - `guards`: what an event must find before it changes anything.
//! - `context`: what a run loaded in part holds, what expressions see.
//! - `start`: the run's start, a ready node's task created and started.
//! - `route`: which nodes became ready, and whether the run ended.
//! - `finish`: a task's end and the run's status, with their history.
//! - `report`: a worker's report: completed, failed, in doubt.
//! - `timers`: timers and waits, and the run's deadline.
//! - `control`: cancel, pause, resume, and retry of a failed run.
//! - `reset`: what a retry and a rerun do to the steps they run again.
//! - `children`: a SUB_WORKFLOW's child run ended.
//! - `loops`: LOOP, an iteration at a time.
//! - `approvals`: APPROVAL, a person's vote and the step's deadline.
//! - `rerun`: an operator reruns the run from some of its steps.
//! - `repair`: an operator completes a step or resolves one in doubt.
//! - `migrate`: the run, its steps renamed, goes on under another version.
//!
//! MAP's rules are in `machine::map`.

use crate::machine::event::Event;
use crate::machine::state::Machine;
use crate::machine::transition::Ignore;

mod approvals;
mod children;
mod context;
mod control;
mod finish;
mod guards;
mod loops;
mod migrate;
mod repair;
mod report;
mod rerun;
mod reset;
mod route;
mod start;
mod timers;

impl Machine<'_> {
    /// Applies `event` by its handler; an event that changes nothing says why.
    pub(in crate::machine) fn on(&mut self, event: Event) -> Result<(), Ignore> {
        match event {
            Event::RunStarted => self.on_run_started(),
            Event::TaskCompleted { task_id, attempt, output } => self.on_task_completed(task_id, attempt, output),
            Event::TaskFailed { task_id, attempt, error, retryable, code, status, retry_after } => {
                let failure = report::failure_reported(error, retryable, code, status, retry_after);
                self.on_task_failed(task_id, attempt, failure)
            }
            Event::TaskInDoubt { task_id, attempt, reason } => self.on_task_in_doubt(task_id, attempt, reason),
            Event::TimerFired { task_id } => self.on_timer_fired(task_id),
            Event::EventReceived { task_id, payload } => self.on_event_received(task_id, payload),
            Event::RunTimedOut => self.on_run_timed_out(),
            Event::CancelRun => self.on_cancel(),
            Event::RetryRun => self.on_retry(),
            Event::PauseRun => self.on_pause(),
            Event::ResumeRun => self.on_resume(),
            Event::ResolveTask { task_id, resolution } => self.on_resolve(task_id, resolution),
            Event::RerunFrom { tasks, input, allow_completed } => self.on_rerun(&tasks, input, allow_completed),
            Event::CompleteTask { task_id, output } => self.on_complete(task_id, output),
            Event::ItemsLoaded { task_id } => self.on_items_loaded(task_id),
            Event::ItemsCollected { task_id, output } => self.on_items_collected(task_id, output),
            Event::SourcesLoaded { task_id, from, items } => self.on_sources_loaded(task_id, from, items),
            Event::ChildFinished { task_id, attempt, iteration, child, status, output, error } => {
                let t = self.child_reportable(task_id, attempt, iteration)?;
                self.on_child_finished(t, child, status, output, error.as_deref())
            }
            Event::Migrate { from_version, to_version, map, .. } => self.on_migrate(from_version, to_version, map),
            Event::ApprovalVote { task_id, attempt, vote, groups, earlier } => {
                self.on_approval_vote(task_id, attempt, *vote, &groups, &earlier)
            }
        }
    }
}
