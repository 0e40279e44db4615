//! LOOP: a child run per iteration until `until` holds; an iteration's
//! end decides the next.

use serde_json::{json, Value};

use crate::definition::NodeKind;
use crate::expr::Scope;
use crate::machine::codes;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::state::{later, Machine};
use crate::machine::task::Failure;

impl Machine<'_> {
    /// A LOOP's iteration ended with `output`: the loop completes when its
    /// `until` holds over `.iteration: {index, output}` (its output
    /// `{output, iterations}`), fails after `max_iterations`, or starts the
    /// next iteration (after its `delay`; held while the run is paused).
    /// Only the last output is kept, so iteration 10,000 costs what the
    /// tenth does.
    pub(super) fn iteration_done(&mut self, t: usize, output: Value) {
        let NodeKind::Loop(config) = &self.wf.nodes[self.run.tasks[t].node].kind else { return };
        let index = self.run.tasks[t].iteration.unwrap_or(0);
        // The run's input only where `until` may read it: it may be large.
        let input = match crate::expr::reads_input(config.until.source()) {
            true => self.input().clone(),
            false => Value::Null,
        };
        let ctx = json!({"input": input, "iteration": {"index": index, "output": output}});
        match config.until.eval_bool(self.sb, &ctx) {
            Err(e) => {
                let failure = Failure::fatal(codes::EXPRESSION, format!("config.until: {e}"));
                self.finish(t, TaskState::Failed, None, Some(failure));
                self.route();
            }
            Ok(true) => {
                let done = json!({"output": output, "iterations": index + 1});
                self.finish(t, TaskState::Completed, Some(done), None);
                self.route();
            }
            Ok(false) if index + 1 >= config.max_iterations => {
                let failure = Failure::fatal(
                    codes::MAX_ITERATIONS,
                    format!("until did not hold after {} iterations (max_iterations)", index + 1),
                );
                self.finish(t, TaskState::Failed, None, Some(failure));
                self.route();
            }
            Ok(false) => {
                let delay = config.delay;
                let task = &mut self.run.tasks[t];
                task.iteration = Some(index + 1);
                task.output = Some(output);
                task.error = None;
                task.error_info = None;
                self.tr.touch(t);
                match (delay, self.run.status) {
                    (None, RunStatus::Running) => self.start_iteration(t),
                    (delay, status) => {
                        let task = &mut self.run.tasks[t];
                        task.state = TaskState::Waiting;
                        // No timer while paused: the resume starts it.
                        task.wake_at = match status {
                            RunStatus::Running => delay.map(|d| later(self.now, d)),
                            _ => None,
                        };
                        let wake_at = task.wake_at;
                        let payload = self.task_payload(t, json!({"wake_at": wake_at, "iteration": index + 1}));
                        self.tr.log(HistoryKind::TaskWaiting, payload);
                    }
                }
            }
        }
    }

    /// Starts the LOOP's current iteration: its child's input evaluated
    /// with `.iteration.index` and `.previous`, then a child run (after the
    /// commit, like a SUB_WORKFLOW's).
    pub(super) fn start_iteration(&mut self, t: usize) {
        self.run.tasks[t].wake_at = None;
        self.tr.touch(t);
        let mut ctx = None;
        self.start(t, &mut ctx);
    }

    /// The input of the child of LOOP task `t`'s current iteration: its
    /// config evaluated in `scope` with `.iteration.index` and `.previous`
    /// (the last iteration's output).
    pub(super) fn iteration_input(&self, t: usize, scope: Option<&Scope>) -> Result<Value, String> {
        let task = &self.run.tasks[t];
        let node = &self.wf.nodes[task.node];
        let index = task.iteration.unwrap_or(0);
        let previous = task.output.clone().unwrap_or(Value::Null);
        scope
            .ok_or_else(|| "no scope".to_string())
            .and_then(|s| s.with(&[("iteration", &json!({"index": index})), ("previous", &previous)]))
            .and_then(|s| node.template.eval_value(self.sb, Some(&s)))
    }
}
