//! The rules: how each event moves a run's tasks, how a node that became
//! ready starts, and when the run ends.

use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::state::{items, later, parse_time, Machine, Started, FOREVER};
use super::types::{codes, Effect, Event, Failure, HistoryKind, Ignore, IgnoreKind, RunStatus, Task, TaskState};
use super::{context, context_of, DEPTH_LIMIT};
use crate::definition::limit::{keys_in, MAX_RETRY_AFTER};
use crate::definition::{NodeKind, WaitFor};
use crate::expr::Scope;
use crate::storable;

impl Machine<'_> {
    pub(super) fn on(&mut self, event: Event) -> Result<(), Ignore> {
        match event {
            Event::RunStarted => self.on_run_started(),
            Event::TaskCompleted { task_id, attempt, output } => {
                let t = self.reportable(task_id, attempt)?;
                self.worker_runs(t)?;
                self.tr.reported.push(t);
                match self.over_share(t, &output) {
                    Some(failure) => self.fail_attempt(t, failure),
                    None => {
                        self.finish(t, TaskState::Completed, Some(output), None);
                        self.route();
                    }
                }
                Ok(())
            }
            Event::TaskFailed { task_id, attempt, error, retryable, code, status, retry_after } => {
                let code = code.filter(|c| crate::definition::is_error_code(c));
                let mut failure = Failure::fatal(code.as_deref().unwrap_or(codes::TASK_FAILED), error);
                failure.info.retryable = retryable;
                failure.info.status = status;
                failure.retry_after = retry_after.filter(|_| status == Some(429)).map(|d| d.min(MAX_RETRY_AFTER));
                self.on_task_failed(task_id, attempt, failure)
            }
            Event::TimerFired { task_id } => self.on_timer_fired(task_id),
            Event::EventReceived { task_id, payload } => self.on_event_received(task_id, payload),
            Event::CancelRun => self.on_cancel(),
            Event::RetryRun => self.on_retry(),
            Event::PauseRun => self.on_pause(),
            Event::ResumeRun => self.on_resume(),
            Event::RunTimedOut => self.on_run_timed_out(),
            Event::TaskInDoubt { task_id, attempt, reason } => {
                let t = self.reportable(task_id, attempt)?;
                if !self.wf.nodes[self.run.tasks[t].node].at_most_once || self.run.tasks[t].state != TaskState::Running
                {
                    return Err(Ignore(IgnoreKind::NotDispatched, "not a running at-most-once attempt".into()));
                }
                self.in_doubt(t, reason);
                Ok(())
            }
            Event::ResolveTask { task_id, resolution } => self.on_resolve(task_id, resolution),
            Event::RerunFrom { tasks, input, allow_completed } => self.on_rerun(&tasks, input, allow_completed),
            Event::CompleteTask { task_id, output } => self.on_complete(task_id, output),
            Event::ItemsLoaded { task_id } => self.on_items_loaded(task_id),
            Event::SourcesLoaded { task_id, from, items } => self.on_sources_loaded(task_id, from, items),
            Event::ChildFinished { task_id, attempt, iteration, child, status, output, error } => {
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
                self.on_child_finished(t, child, status, output, error.as_deref())
            }
        }
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

    pub(super) fn on_run_started(&mut self) -> Result<(), Ignore> {
        self.require_running()?;
        if !self.run.tasks.is_empty() {
            return Err(Ignore(IgnoreKind::AlreadyStarted, "run already started".into()));
        }
        if let (Some(limit), None) = (self.wf.timeout, self.run.deadline) {
            self.run.deadline = Some(later(self.now, limit));
        }
        self.tr.log(HistoryKind::RunStarted, json!({}));
        self.route();
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

    /// The task's current attempt failed (by its worker, its child run or
    /// its timeout).
    pub(super) fn fail_attempt(&mut self, t: usize, mut failure: Failure) {
        let attempt = self.run.tasks[t].attempt;
        let node = &self.wf.nodes[self.run.tasks[t].node];
        // A leased at-most-once attempt that timed out, or whose request
        // broke off, may have taken effect: it is not sent again.
        let unknown = [codes::TIMEOUT, codes::TRANSPORT, codes::IN_DOUBT].contains(&failure.info.code.as_str());
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

    /// A due timer ends a WAIT, times out a WAIT_FOR_EVENT, or ends a retry
    /// backoff by dispatching the next attempt.
    pub(super) fn on_timer_fired(&mut self, task_id: Uuid) -> Result<(), Ignore> {
        self.require_active()?;
        let t = self.find(task_id)?;
        let task = &self.run.tasks[t];
        // A dispatched attempt past its node's timeout fails (retryably);
        // the worker holding it loses its lease at the next renewal.
        if matches!(task.state, TaskState::Pending | TaskState::Running) {
            let node = &self.wf.nodes[task.node];
            let (Some(limit), Some(deadline)) = (node.timeout, task.wake_at) else {
                return Err(Ignore(IgnoreKind::NotWaiting, format!("task is {}, not WAITING", task.state)));
            };
            if deadline > self.now {
                return Err(Ignore(IgnoreKind::NotDue, "the attempt's deadline has not passed".into()));
            }
            let error = format!(
                "attempt {} timed out after {} (the node's timeout)",
                task.attempt,
                crate::duration::format(limit)
            );
            self.fail_attempt(t, Failure::retryable(codes::TIMEOUT, error));
            return Ok(());
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
        let mut reset = vec![false; self.wf.nodes.len()];
        for &t in &failed {
            let node = self.run.tasks[t].node;
            if self.wf.handles_failure(node) {
                for (n, below) in self.wf.downstream(node).into_iter().enumerate() {
                    reset[n] |= below;
                }
            }
        }
        for t in 0..self.run.tasks.len() {
            let task = &self.run.tasks[t];
            if task.item.is_none() && !task.removed && reset[task.node] {
                self.remove(t);
            }
        }
        for t in failed {
            if !reset[self.run.tasks[t].node] {
                self.restart(t);
            }
        }
        self.route();
        Ok(())
    }

    /// Takes a task out of the run (its node runs again when it becomes
    /// ready): a MAP's items with it, and a child run is cancelled (after the
    /// commit). Its row is deleted; its history stays.
    pub(super) fn remove(&mut self, t: usize) {
        let id = self.run.tasks[t].id;
        let payload = self.task_payload(t, json!({}));
        for i in 0..self.run.tasks.len() {
            if self.run.tasks[i].item.is_some_and(|item| item.map == id) {
                self.run.tasks[i].removed = true;
                self.run.tasks[i].state = TaskState::Cancelled;
            }
        }
        if self.run.tasks[t].progress.is_some() && !self.tr.cancel_items.contains(&t) {
            self.tr.cancel_items.push(t);
        }
        let task = &mut self.run.tasks[t];
        task.removed = true;
        task.state = TaskState::Cancelled;
        task.wake_at = None;
        self.tr.touch(t);
        self.maps = super::state::Maps::default();
        self.tr.log(HistoryKind::TaskReset, payload);
    }

    pub(super) fn require_running(&self) -> Result<(), Ignore> {
        if self.run.status != RunStatus::Running {
            return Err(Ignore(IgnoreKind::RunFinished, format!("run is {}", self.run.status)));
        }
        Ok(())
    }

    /// Running or paused: what has started may still finish.
    pub(super) fn require_active(&self) -> Result<(), Ignore> {
        if self.run.status.is_terminal() {
            return Err(Ignore(IgnoreKind::RunFinished, format!("run is {}", self.run.status)));
        }
        Ok(())
    }

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

    pub(super) fn find(&self, task_id: Uuid) -> Result<usize, Ignore> {
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
                let output = output.unwrap_or(Value::Null);
                match self.over_share(t, &output) {
                    Some(failure) => self.fail_attempt(t, failure),
                    None => {
                        self.finish(t, TaskState::Completed, Some(output), None);
                        self.route();
                    }
                }
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
                self.fail_attempt(t, Failure::fatal(codes::CHILD_FAILED, why));
                Ok(())
            }
        }
    }

    pub(super) fn task_payload(&self, t: usize, mut extra: Value) -> Value {
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

    pub(super) fn finish(&mut self, t: usize, state: TaskState, output: Option<Value>, error: Option<Failure>) {
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

    pub(super) fn restart(&mut self, t: usize) {
        if self.run.tasks[t].progress.is_some() {
            self.restart_map(t);
            return;
        }
        let task = &mut self.run.tasks[t];
        task.attempt += 1;
        task.error = None;
        task.error_info = None;
        task.output = None;
        task.finished_at = None;
        task.wake_at = None;
        // A loop's new execution starts from its first iteration.
        task.iteration = None;
        self.tr.touch(t);
        let mut ctx = None;
        self.start(t, &mut ctx);
    }

    /// Whether node `n`'s task, or that it has none, is loaded ([`Run::known`]).
    ///
    /// [`Run::known`]: super::types::Run::known
    pub(super) fn known(&self, n: usize) -> bool {
        self.run.known.as_ref().is_none_or(|k| k.get(n).copied().unwrap_or(true))
    }

    /// Names in `tr.missing` the nodes of `nodes` whose tasks are not
    /// loaded; whether all are.
    pub(super) fn require(&mut self, nodes: impl IntoIterator<Item = usize>) -> bool {
        let mut all = true;
        for n in nodes {
            if !self.known(n) {
                all = false;
                if !self.tr.missing.contains(&n) {
                    self.tr.missing.push(n);
                }
            }
        }
        all
    }

    /// [`Self::require`] for the nodes `node`'s expressions read (every node
    /// when that cannot be known).
    pub(super) fn require_reads(&mut self, node: usize) -> bool {
        if self.run.known.is_none() {
            return true;
        }
        let wf = self.wf;
        match &wf.nodes[node].reads {
            Some(reads) => self.require(reads.iter().copied()),
            None => self.require(wf.topo_order.iter().copied()),
        }
    }

    /// What `node`'s expressions see, converted for jaq: the context with
    /// just the nodes they read (all nodes when that cannot be known).
    pub(super) fn scope(&self, node: usize) -> Scope {
        let ctx = match &self.wf.nodes[node].reads {
            Some(reads) => self.context_of(
                reads
                    .iter()
                    .filter_map(|&n| self.run.tasks.iter().find(|t| t.node == n && t.item.is_none() && !t.removed)),
            ),
            None => self.context(),
        };
        Scope::new(&ctx).unwrap_or_else(|_| Scope::null())
    }

    /// What expressions see: `{input, nodes: {<id>: {output, state}}, run}`.
    pub(super) fn context(&self) -> Value {
        context(self.wf, self.run)
    }

    pub(super) fn context_of<'t>(&self, tasks: impl Iterator<Item = &'t Task>) -> Value {
        context_of(self.wf, self.run, tasks)
    }

    /// Creates a task for every node that has become ready, in topological
    /// order so that a skip (or a TRANSFORM's result) reaches its successors
    /// in the same pass; then ends the run if nothing is left to do.
    pub(super) fn route(&mut self) {
        self.advance_maps();
        // Paused: what finished is recorded, nothing new starts, the run
        // does not end; resuming routes again.
        if self.run.status == RunStatus::Paused {
            return;
        }
        let n = self.wf.nodes.len();
        let mut by_node: Vec<Option<usize>> = vec![None; n];
        let mut unhandled = false;
        for (i, t) in self.run.tasks.iter().enumerate().filter(|(_, t)| t.item.is_none() && !t.removed) {
            by_node[t.node] = Some(i);
            unhandled |= t.state == TaskState::Failed && !self.wf.handles_failure(t.node);
        }
        let wf = self.wf;
        // A run loaded in part (every open and failed task, and the nodes
        // known) looks only after the tasks that ended in this event: a node
        // becomes ready when its last predecessor ends, so no other can
        // have. Whole, it looks at every node, as after a retry or a rerun.
        let mut after: Option<Vec<bool>> = self.run.known.as_ref().map(|_| vec![false; n]);
        if let Some(after) = &mut after {
            for &t in self.tr.updated.iter().chain(&self.tr.created) {
                let task = &self.run.tasks[t];
                if task.item.is_none() && !task.removed && task.state.is_terminal() {
                    for &e in &wf.outgoing[task.node] {
                        after[wf.edges[e].to] = true;
                    }
                }
            }
        }
        for &node in &wf.topo_order {
            // An unhandled failure fails the run: nothing new starts.
            if unhandled {
                break;
            }
            if after.as_ref().is_some_and(|after| !after[node]) {
                continue;
            }
            if by_node[node].is_some() {
                continue;
            }
            // In part: the node itself (it may have a task not loaded), what
            // comes into it, and what its expressions read must be loaded.
            if after.is_some() {
                let preds: Vec<usize> = wf.incoming[node].iter().map(|&e| wf.edges[e].from).collect();
                let known = self.require(std::iter::once(node).chain(preds));
                if !(known && self.require_reads(node)) {
                    continue;
                }
            }
            let mut ctx: Option<Scope> = None;
            let mut ready = true;
            let mut active = wf.incoming[node].is_empty();
            let mut via = Vec::new();
            let mut edge_error = None;
            for &e in &wf.incoming[node] {
                let edge = &wf.edges[e];
                match by_node[edge.from].map(|t| self.run.tasks[t].state) {
                    Some(s) if edge.on.follows(s) => {
                        let taken = match &edge.when {
                            None => true,
                            Some(when) => {
                                let c = ctx.get_or_insert_with(|| self.scope(node));
                                match when.eval_bool_in(self.sb, c) {
                                    Ok(b) => b,
                                    Err(m) => {
                                        edge_error = Some(format!(
                                            "edge {} -> {}: when: {m}",
                                            wf.nodes[edge.from].id, wf.nodes[node].id
                                        ));
                                        false
                                    }
                                }
                            }
                        };
                        if taken {
                            active = true;
                            via.push(json!({"from": wf.nodes[edge.from].id, "on": edge.on.as_str()}));
                        }
                    }
                    Some(s) if s.is_terminal() => {}
                    _ => {
                        ready = false;
                        break;
                    }
                }
            }
            if !ready {
                continue;
            }
            let logged = self.tr.history.len();
            let t = self.create(node, active, edge_error, &mut ctx);
            // The task's first line of history says which edges it came by.
            if let (Some(first), false) = (self.tr.history.get_mut(logged), via.is_empty()) {
                first.payload["via"] = Value::Array(via);
            }
            by_node[node] = Some(t);
            unhandled = self.run.tasks[t].state == TaskState::Failed && !wf.handles_failure(node);
            // What it ended at once (a skip, a TRANSFORM) readies what follows it.
            if let (Some(after), true) = (&mut after, self.run.tasks[t].state.is_terminal()) {
                for &e in &wf.outgoing[node] {
                    after[wf.edges[e].to] = true;
                }
            }
        }
        if !self.tr.missing.is_empty() {
            return;
        }
        self.finish_run_if_done();
    }

    pub(super) fn create(
        &mut self,
        node: usize,
        active: bool,
        edge_error: Option<String>,
        ctx: &mut Option<Scope>,
    ) -> usize {
        let t = self.run.tasks.len();
        self.run.tasks.push(Task::new((self.new_id)(), node, None));
        if let Some(known) = &mut self.run.known {
            known[node] = true;
        }
        self.tr.created.push(t);
        if let Some(error) = edge_error {
            self.finish(t, TaskState::Failed, None, Some(Failure::fatal(codes::EXPRESSION, error)));
        } else if !active {
            self.finish(t, TaskState::Skipped, None, None);
        } else {
            self.start(t, ctx);
        }
        t
    }

    /// Starts a task's current attempt according to its node's kind:
    /// dispatch, timer, event wait, or (TRANSFORM) complete at once. An
    /// expression that fails fails the task with its message.
    pub(super) fn start(&mut self, t: usize, ctx: &mut Option<Scope>) {
        let node = &self.wf.nodes[self.run.tasks[t].node];
        let now = self.now;
        let needs_ctx = !node.template.is_literal() || !node.kind.traits().dispatched || !node.limits.is_empty();
        if needs_ctx && !self.require_reads(self.run.tasks[t].node) {
            // Void: the engine loads what the node reads and applies the event again.
            return;
        }
        let node = &self.wf.nodes[self.run.tasks[t].node];
        let scope =
            if needs_ctx { Some(ctx.get_or_insert_with(|| self.scope(self.run.tasks[t].node)).clone()) } else { None };
        let sb = self.sb;
        let eval = |tpl: &crate::expr::Template| tpl.eval_in(sb, scope.as_ref());
        let mut limit_keys = Vec::new();
        let outcome: Result<Started, String> = match &node.kind {
            NodeKind::Http | NodeKind::Custom => {
                node.template.eval_input(sb, scope.as_ref()).map_err(|e| format!("config: {e}")).and_then(|input| {
                    limit_keys = keys_in(sb, &node.limits, scope.as_ref())?;
                    Ok(Started::Dispatch(input))
                })
            }
            NodeKind::Wait(WaitFor::Duration(d)) => Ok(Started::Wait(later(now, *d), None)),
            NodeKind::Wait(WaitFor::Until(until)) => eval(until)
                .and_then(|v| parse_time(&v))
                .map(|at| Started::Wait(at, None))
                .map_err(|e| format!("config.until: {e}")),
            NodeKind::WaitForEvent { event, key, timeout, .. } => match eval(key) {
                Ok(Value::String(k)) => {
                    Ok(Started::Wait(timeout.map(|d| later(now, d)).unwrap_or(FOREVER), Some((event.clone(), k))))
                }
                Ok(Value::Number(n)) => Ok(Started::Wait(
                    timeout.map(|d| later(now, d)).unwrap_or(FOREVER),
                    Some((event.clone(), n.to_string())),
                )),
                Ok(other) => Err(format!("config.key: must be a string, got {other}")),
                Err(e) => Err(format!("config.key: {e}")),
            },
            NodeKind::Transform { output } => {
                eval(output).map(Started::Done).map_err(|e| format!("config.output: {e}"))
            }
            NodeKind::Map(m) => {
                let left = self.run.items_left;
                m.items
                    .eval_in_with(sb, scope.as_ref(), crate::expr::Limits::MAP_ITEMS)
                    .and_then(items)
                    .and_then(|items| match items.len() as u64 {
                        n if n > left => Err(format!(
                            "{n} items, more than the {left} its run tree may still create \
                             (the fan-out budget, COMPOSER_MAX_TREE_ITEMS)"
                        )),
                        _ => Ok(Started::Map(items)),
                    })
                    .map_err(|e| format!("config.items: {e}"))
            }
            NodeKind::SubWorkflow { .. } => {
                eval(&node.template).map(Started::Child).map_err(|e| format!("config: {e}"))
            }
            NodeKind::Loop(_) => {
                let task = &self.run.tasks[t];
                let index = task.iteration.unwrap_or(0);
                let previous = task.output.clone().unwrap_or(Value::Null);
                scope
                    .as_ref()
                    .ok_or_else(|| "no scope".to_string())
                    .and_then(|s| s.with(&[("iteration", &json!({"index": index})), ("previous", &previous)]))
                    .and_then(|s| node.template.eval_in(sb, Some(&s)))
                    .map(Started::Child)
                    .map_err(|e| format!("config: {e}"))
            }
            NodeKind::Fail { message, code } => match eval(message) {
                Ok(Value::String(m)) => Ok(Started::Fail(m, code.clone())),
                Ok(other) => Ok(Started::Fail(other.to_string(), code.clone())),
                Err(e) => Err(format!("config.message: {e}")),
            },
        };
        let outcome = outcome.map_err(|e| Failure::fatal(codes::EXPRESSION, e));
        let max = self.run.max_payload;
        let outcome = outcome.and_then(|started| {
            let unstorable = |e| Failure::fatal(codes::PAYLOAD, e);
            match &started {
                Started::Dispatch(v) | Started::Child(v) => storable::check(v, "config", max).map_err(unstorable)?,
                Started::Done(v) => storable::check(v, "config.output", max).map_err(unstorable)?,
                Started::Wait(_, Some((_, key))) => storable::check_text(key, "config.key").map_err(unstorable)?,
                Started::Fail(m, _) => storable::check_text(m, "config.message").map_err(unstorable)?,
                Started::Wait(_, None) | Started::Map(_) => {}
            }
            Ok(started)
        });
        match outcome {
            Err(error) => self.finish(t, TaskState::Failed, None, Some(error)),
            Ok(Started::Fail(message, code)) => {
                self.finish(t, TaskState::Failed, None, Some(Failure::fatal(&code, message)))
            }
            Ok(Started::Done(output)) => self.finish(t, TaskState::Completed, Some(output), None),
            Ok(Started::Map(items)) => self.start_map(t, items, scope.unwrap_or_else(Scope::null)),
            Ok(Started::Dispatch(input) | Started::Child(input)) => {
                let task = &mut self.run.tasks[t];
                if matches!(self.wf.nodes[task.node].kind, NodeKind::Loop(_)) {
                    task.iteration.get_or_insert(0);
                }
                task.input =
                    super::state::with_idempotency_key(&self.wf.nodes[task.node].kind, input, task.id, task.attempt);
                task.limit_keys = limit_keys;
                self.dispatch(t);
            }
            Ok(Started::Wait(wake_at, event)) => {
                let task = &mut self.run.tasks[t];
                task.state = TaskState::Waiting;
                task.wake_at = (wake_at != FOREVER).then_some(wake_at);
                if let Some((name, key)) = &event {
                    task.input = json!({"event": name, "key": key});
                    let take = Effect::TakeBufferedEvent { task_id: task.id, event: name.clone(), key: key.clone() };
                    self.tr.effects.push(take);
                }
                task.event = event;
                let payload = self.task_payload(t, json!({"wake_at": self.run.tasks[t].wake_at}));
                self.tr.log(HistoryKind::TaskWaiting, payload);
            }
        }
    }

    /// Sends the attempt to a worker; a node with a `timeout` gets its
    /// deadline in `wake_at`, which the timer loop fires like any timer.
    /// A SUB_WORKFLOW's attempt instead asks the engine for its child run
    /// (RUNNING: no worker will lease it).
    pub(super) fn dispatch(&mut self, t: usize) {
        let deadline = self.wf.nodes[self.run.tasks[t].node].timeout.map(|d| later(self.now, d));
        self.run.tasks[t].wake_at = deadline;
        if self.wf.nodes[self.run.tasks[t].node].kind.traits().has_child {
            self.run.tasks[t].state = TaskState::Running;
            self.tr.children.push(t);
        } else {
            self.run.tasks[t].state = TaskState::Pending;
            self.tr.dispatch.push(t);
        }
        let payload = self.task_payload(t, json!({}));
        self.tr.log(HistoryKind::TaskDispatched, payload);
    }

    pub(super) fn finish_run_if_done(&mut self) {
        if self.run.status != RunStatus::Running || self.run.tasks.iter().any(|t| !t.state.is_terminal()) {
            return;
        }
        // Loaded in part (every open and failed task is here), a run that
        // ends needs its leaves for its output, or every node for an output
        // template or for an `on_failure` handler's input (its nodes).
        if self.run.known.is_some() {
            let wf = self.wf;
            let fails =
                self.run.tasks.iter().any(|t| {
                    t.state == TaskState::Failed && t.item.is_none() && !t.removed && !wf.handles_failure(t.node)
                });
            let reads: Vec<usize> = match (wf.on_failure.is_some(), fails, &wf.output) {
                (true, _, _) | (false, false, Some(_)) => wf.topo_order.clone(),
                (false, true, _) => Vec::new(),
                (false, false, None) => wf.topo_order.iter().copied().filter(|&n| wf.is_leaf(n)).collect(),
            };
            if !self.require(reads) {
                return;
            }
        }
        // A failure with a failure or always edge out of it was handled.
        let unhandled = self.run.tasks.iter().find(|t| {
            t.state == TaskState::Failed && t.item.is_none() && !t.removed && !self.wf.handles_failure(t.node)
        });
        if let Some(first) = unhandled {
            let node = &self.wf.nodes[first.node];
            let message = first.error.as_deref().unwrap_or("unknown error");
            let error = match node.kind {
                NodeKind::Fail { .. } => message.to_string(),
                _ => format!("node {:?} failed: {message}", node.id),
            };
            self.set_run(RunStatus::Failed, None, Some(error));
            return;
        }
        if let Some(template) = &self.wf.output {
            let max = self.run.max_payload;
            match template.eval(self.sb, &self.context()).and_then(|v| storable::check(&v, "output", max).map(|()| v)) {
                Ok(output) => self.set_run(RunStatus::Succeeded, Some(output), None),
                Err(e) => self.set_run(RunStatus::Failed, None, Some(format!("output: {e}"))),
            }
            return;
        }
        let mut output = Map::new();
        for t in &self.run.tasks {
            if t.state == TaskState::Completed && self.wf.is_leaf(t.node) && !t.removed {
                output.insert(self.wf.nodes[t.node].id.clone(), t.output.clone().unwrap_or(Value::Null));
            }
        }
        let output = Value::Object(output);
        match storable::check(&output, "output", self.run.max_payload) {
            Ok(()) => self.set_run(RunStatus::Succeeded, Some(output), None),
            Err(e) => self.set_run(RunStatus::Failed, None, Some(e)),
        }
    }

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
        let ctx = json!({"input": self.run.input, "iteration": {"index": index, "output": output}});
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
}

impl Machine<'_> {
    /// An at-most-once attempt whose outcome is unknown: it waits IN_DOUBT
    /// (the run with it) until an operator resolves it; pause and cancel
    /// still work.
    pub(super) fn in_doubt(&mut self, t: usize, reason: String) {
        let task = &mut self.run.tasks[t];
        task.state = TaskState::InDoubt;
        task.wake_at = None;
        let payload = json!({"reason": reason});
        task.error = Some(reason);
        task.error_info =
            Some(super::types::ErrorInfo { code: codes::IN_DOUBT.into(), retryable: false, status: None });
        self.tr.touch(t);
        let payload = self.task_payload(t, payload);
        self.tr.log(HistoryKind::TaskInDoubt, payload);
    }

    /// An operator's word on an IN_DOUBT attempt: it completed (with an
    /// output), failed for good, or is to be sent again (a new attempt; held
    /// while the run is paused).
    pub(super) fn on_resolve(&mut self, task_id: Uuid, resolution: super::types::Resolution) -> Result<(), Ignore> {
        use super::types::Resolution;
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
        match self.run.status {
            RunStatus::Queued => return Err(Ignore(IgnoreKind::NotDue, "the run has not started".into())),
            RunStatus::Succeeded if !allow_completed => {
                return Err(Ignore(
                    IgnoreKind::RunFinished,
                    "the run SUCCEEDED: rerun it with allow_completed to run it again".into(),
                ))
            }
            _ => {}
        }
        if tasks.is_empty() {
            return Err(Ignore(IgnoreKind::UnknownTask, "a rerun names at least one step".into()));
        }
        let mut found = Vec::with_capacity(tasks.len());
        for &id in tasks {
            found.push(self.find(id)?);
        }
        // Items of a MAP that reduces cannot be taken out of its value.
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
        let mut reset = vec![false; self.wf.nodes.len()];
        let mut names = Vec::new();
        for &t in &found {
            let task = &self.run.tasks[t];
            names.push(json!(task.node_id(&self.wf.nodes[task.node])));
            match task.item {
                // The item's MAP stays; what comes after it does not.
                Some(item) => {
                    if let Some(m) = self.map_task(item.map) {
                        for (n, below) in self.wf.downstream(self.run.tasks[m].node).into_iter().enumerate() {
                            reset[n] |= below;
                        }
                    }
                }
                None => {
                    reset[task.node] = true;
                    for (n, below) in self.wf.downstream(task.node).into_iter().enumerate() {
                        reset[n] |= below;
                    }
                }
            }
        }
        self.tr.log(HistoryKind::RunRerun, json!({"from": names, "input_changed": input.is_some()}));
        if let Some(input) = input {
            self.run.input = input;
            self.tr.input_changed = true;
        }
        if self.run.status.is_terminal() {
            self.set_run(RunStatus::Running, None, None);
        }
        for t in 0..self.run.tasks.len() {
            let task = &self.run.tasks[t];
            if task.item.is_none() && !task.removed && reset[task.node] {
                self.remove(t);
            }
        }
        for t in found {
            if self.run.tasks[t].item.is_some() && !self.run.tasks[t].removed {
                self.rerun_item(t);
            }
        }
        self.route();
        Ok(())
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
        task.attempt += 1;
        task.error = None;
        task.error_info = None;
        task.output = None;
        task.finished_at = None;
        task.wake_at = None;
        let default_key = format!("{}:", task.id);
        if task.input["idempotency_key"].as_str().is_some_and(|k| k.starts_with(&default_key)) {
            task.input["idempotency_key"] = json!(format!("{default_key}{}", task.attempt));
        }
        self.tr.touch(t);
        let map = &mut self.run.tasks[m];
        if map.state.is_terminal() {
            map.state = TaskState::Running;
            map.output = None;
            map.error = None;
            map.error_info = None;
            map.finished_at = None;
        }
        self.tr.touch(m);
        self.maps.queued = None;
        if !self.maps.dirty.contains(&m) {
            self.maps.dirty.push(m);
        }
    }

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
            if let Some(item) = self.run.tasks[t].item {
                // The failed item's MAP opens again to count it as completed.
                if let Some(m) = self.map_task(item.map) {
                    if let Some(p) = &mut self.run.tasks[m].progress {
                        p.failed = p.failed.saturating_sub(1);
                        p.open += 1;
                    }
                    self.run.tasks[t].state = TaskState::Running;
                    let map = &mut self.run.tasks[m];
                    if map.state.is_terminal() {
                        map.state = TaskState::Running;
                        map.error = None;
                        map.error_info = None;
                        map.finished_at = None;
                    }
                    self.tr.touch(m);
                }
            }
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
}
