//! Endings: a task's end and the run's status, each with its line of
//! history.

use serde_json::{json, Map, Value};

use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::{RunStatus, TaskState};
use crate::machine::state::Machine;
use crate::machine::task::Failure;

impl Machine<'_> {
    /// A task's line of history: its ids, attempt and state, with `extra`.
    pub(in crate::machine) fn task_payload(&self, t: usize, mut extra: Value) -> Value {
        let task = &self.run.tasks[t];
        let mut base = json!({
            "task_id": task.id,
            "node_id": self.wf.nodes[task.node].id,
            "attempt": task.attempt,
            "state": task.state,
        });
        if let Some(item) = task.item {
            base["node_id"] = json!(task.node_id(&self.wf.nodes[task.node]));
            base["item_index"] = json!(item.index);
        }
        if let (Value::Object(b), Value::Object(e)) = (base, &mut extra) {
            let mut merged: Map<String, Value> = b;
            merged.extend(std::mem::take(e));
            return Value::Object(merged);
        }
        extra
    }

    /// Task `t` ends in `state` (with its output or its failure): its
    /// MAP counts it, and a reduction takes it in.
    pub(in crate::machine) fn finish(
        &mut self,
        t: usize,
        state: TaskState,
        output: Option<Value>,
        error: Option<Failure>,
    ) {
        let was = self.run.tasks[t].state;
        self.item_finishing(t, state);
        let task = &mut self.run.tasks[t];
        task.state = state;
        task.wake_at = None;
        task.finished_at = Some(self.now);
        if output.is_some() {
            task.output = output;
        }
        if let Some(failure) = error {
            task.error = Some(failure.message);
            task.error_info = Some(failure.info);
        }
        self.tr.touch(t);
        let kind = match state {
            TaskState::Completed => HistoryKind::TaskCompleted,
            TaskState::Failed => HistoryKind::TaskFailed,
            TaskState::Skipped => HistoryKind::TaskSkipped,
            _ => HistoryKind::TaskCancelled,
        };
        let task = &self.run.tasks[t];
        let detail = match (&task.error, &task.error_info) {
            (Some(e), Some(info)) if state == TaskState::Failed => json!({"error": e, "code": info.code}),
            (Some(e), None) if state == TaskState::Failed => json!({"error": e}),
            _ => json!({}),
        };
        let payload = self.task_payload(t, detail);
        self.tr.log(kind, payload);
        if !was.is_terminal() && matches!(state, TaskState::Completed | TaskState::Failed) {
            self.reduce_item(t);
        }
    }

    /// The run's status changes (with its output or its error).
    pub(super) fn set_run(&mut self, status: RunStatus, output: Option<Value>, error: Option<String>) {
        self.run.status = status;
        self.run.output = output;
        self.run.error = error.clone();
        self.tr.run_changed = true;
        let kind = match status {
            RunStatus::Running | RunStatus::Queued => HistoryKind::RunRetried,
            RunStatus::Paused => HistoryKind::RunPaused,
            RunStatus::Succeeded => HistoryKind::RunSucceeded,
            RunStatus::Failed => HistoryKind::RunFailed,
            RunStatus::Cancelled => HistoryKind::RunCancelled,
        };
        let payload = match error {
            Some(e) => json!({"error": e}),
            None => json!({}),
        };
        self.tr.log(kind, payload);
    }
}
