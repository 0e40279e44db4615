//! Starting: the run's first step, a ready node's task created, its
//! attempt started by its node's kind, and an attempt dispatched.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::definition::limit::keys_in;
use crate::definition::{NodeKind, WaitFor, MAX_EVENT_KEY};
use crate::expr::Scope;
use crate::machine::codes;
use crate::machine::effect::Effect;
use crate::machine::history::HistoryKind;
use crate::machine::lifecycle::TaskState;
use crate::machine::state::{later, with_idempotency_key, Machine, FOREVER};
use crate::machine::task::{Failure, Task};
use crate::machine::transition::{Ignore, IgnoreKind};
use crate::storable;

/// How a task's attempt begins.
enum Started {
    /// A worker's attempt: its evaluated input, and its limit keys.
    Dispatch(Value, Vec<String>),
    /// A timer, and the `(event, key)` it waits for if any.
    Wait(DateTime<Utc>, Option<(String, String)>),
    /// Done at once with this output (a TRANSFORM).
    Done(Value),
    /// A MAP's items.
    Map(Vec<Value>),
    /// A child run, with the evaluated `{workflow, version, input}`.
    Child(Value),
    /// A FAIL node: its message and code.
    Fail(String, String),
    /// An APPROVAL's request (its attempt's input), waiting until its
    /// deadline.
    Approval(Value, DateTime<Utc>),
}

/// `started` if what it holds can be kept within `max` bytes; else the
/// task fails (PAYLOAD).
fn storable_start(started: Started, max: usize) -> Result<Started, Failure> {
    let unstorable = |e| Failure::fatal(codes::PAYLOAD, e);
    match &started {
        Started::Dispatch(v, _) | Started::Child(v) | Started::Approval(v, _) => {
            storable::check(v, "config", max).map_err(unstorable)?
        }
        Started::Done(v) => storable::check(v, "config.output", max).map_err(unstorable)?,
        Started::Wait(_, Some((_, key))) => {
            storable::check_text(key, "config.key").map_err(unstorable)?;
            let chars = key.chars().count();
            if chars > MAX_EVENT_KEY {
                return Err(unstorable(format!(
                    "config.key: {chars} characters, longer than the {MAX_EVENT_KEY} an event's key may have \
                     (no event could ever match it)"
                )));
            }
        }
        Started::Fail(m, _) => storable::check_text(m, "config.message").map_err(unstorable)?,
        Started::Wait(_, None) | Started::Map(_) => {}
    }
    Ok(started)
}

impl Machine<'_> {
    /// The run's first event: its deadline set, and the nodes with nothing
    /// before them started.
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

    /// Creates `node`'s task: failed by a `when` that failed, skipped
    /// when no edge into it was taken, else started.
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
    pub(in crate::machine) fn start(&mut self, t: usize, ctx: &mut Option<Scope>) {
        let node = &self.wf.nodes[self.run.tasks[t].node];
        let needs_ctx = !node.template.is_literal() || !node.kind.traits().dispatched || !node.limits.is_empty();
        if needs_ctx && !self.require_reads(self.run.tasks[t].node) {
            // Void: the engine loads what the node reads and applies the event again.
            return;
        }
        let scope =
            if needs_ctx { Some(ctx.get_or_insert_with(|| self.scope(self.run.tasks[t].node)).clone()) } else { None };
        let outcome = self
            .evaluate_start(t, scope.as_ref())
            .map_err(|e| Failure::fatal(codes::EXPRESSION, e))
            .and_then(|started| storable_start(started, self.run.max_payload));
        self.begin(t, outcome, scope);
    }

    /// What task `t`'s attempt begins with: its node's config evaluated in
    /// `scope`, or why it cannot begin.
    fn evaluate_start(&self, t: usize, scope: Option<&Scope>) -> Result<Started, String> {
        let node = &self.wf.nodes[self.run.tasks[t].node];
        let now = self.now;
        let sb = self.sb;
        let eval = |tpl: &crate::expr::Template| tpl.eval_in(sb, scope);
        match &node.kind {
            NodeKind::Http | NodeKind::Custom => {
                node.template.eval_input(sb, scope).map_err(|e| format!("config: {e}")).and_then(|input| {
                    let limit_keys = keys_in(sb, &node.limits, scope)?;
                    Ok(Started::Dispatch(input, limit_keys))
                })
            }
            NodeKind::Wait(WaitFor::Duration(d)) => Ok(Started::Wait(later(now, *d), None)),
            NodeKind::Wait(WaitFor::Until(until)) => eval(until)
                .and_then(|v| parse_time(&v))
                .map(|at| Started::Wait(at, None))
                .map_err(|e| format!("config.until: {e}")),
            NodeKind::WaitForEvent { event, key, timeout, .. } => {
                let until = timeout.map(|d| later(now, d)).unwrap_or(FOREVER);
                match eval(key) {
                    Ok(Value::String(k)) => Ok(Started::Wait(until, Some((event.clone(), k)))),
                    Ok(Value::Number(n)) => Ok(Started::Wait(until, Some((event.clone(), n.to_string())))),
                    Ok(other) => {
                        Err(format!("config.key: must be a string, got {}", crate::clipped(&other.to_string(), 200)))
                    }
                    Err(e) => Err(format!("config.key: {e}")),
                }
            }
            NodeKind::Transform { output } => {
                output.eval_value(sb, scope).map(Started::Done).map_err(|e| format!("config.output: {e}"))
            }
            NodeKind::Map(m) => {
                self.evaluate_items(m, scope).map(Started::Map).map_err(|e| format!("config.items: {e}"))
            }
            NodeKind::SubWorkflow { .. } => {
                node.template.eval_value(sb, scope).map(Started::Child).map_err(|e| format!("config: {e}"))
            }
            NodeKind::Loop(_) => self.iteration_input(t, scope).map(Started::Child).map_err(|e| format!("config: {e}")),
            NodeKind::Approval(approval) => {
                let evaluated = node.template.eval_value(sb, scope).map_err(|e| format!("config: {e}"))?;
                let request = approval.request(&evaluated, now)?;
                let until = crate::definition::approval::next_wake(&request).unwrap_or(FOREVER);
                Ok(Started::Approval(request, until))
            }
            NodeKind::Fail { message, code } => match eval(message) {
                Ok(Value::String(m)) => Ok(Started::Fail(m, code.clone())),
                Ok(other) => Ok(Started::Fail(other.to_string(), code.clone())),
                Err(e) => Err(format!("config.message: {e}")),
            },
        }
    }

    /// Begins task `t`'s attempt as `outcome` says: it ends at once (failed,
    /// a FAIL node, a TRANSFORM's output), starts its MAP's items, goes to a
    /// worker or a child run, or waits.
    fn begin(&mut self, t: usize, outcome: Result<Started, Failure>, scope: Option<Scope>) {
        match outcome {
            Err(error) => self.finish(t, TaskState::Failed, None, Some(error)),
            Ok(Started::Fail(message, code)) => {
                self.finish(t, TaskState::Failed, None, Some(Failure::fatal(&code, message)))
            }
            Ok(Started::Done(output)) => self.finish(t, TaskState::Completed, Some(output), None),
            Ok(Started::Map(items)) => self.start_map(t, items, scope),
            Ok(Started::Dispatch(input, limit_keys)) => self.begin_attempt(t, input, limit_keys),
            Ok(Started::Child(input)) => self.begin_attempt(t, input, Vec::new()),
            Ok(Started::Wait(wake_at, event)) => self.begin_wait(t, wake_at, event),
            Ok(Started::Approval(request, wake_at)) => {
                self.run.tasks[t].input = request;
                self.begin_wait(t, wake_at, None)
            }
        }
    }

    /// An attempt a worker or a child run carries out: its input (with its
    /// idempotency key) and limit keys kept, then dispatched.
    fn begin_attempt(&mut self, t: usize, input: Value, limit_keys: Vec<String>) {
        let task = &mut self.run.tasks[t];
        if matches!(self.wf.nodes[task.node].kind, NodeKind::Loop(_)) {
            task.iteration.get_or_insert(0);
        }
        task.input = with_idempotency_key(&self.wf.nodes[task.node].kind, input, task.id, task.attempt);
        task.limit_keys = limit_keys;
        self.dispatch(t);
    }

    /// A wait until `wake_at` ([`FOREVER`]: no timer), for an event when it
    /// names one (one that came before it is taken, by the engine).
    fn begin_wait(&mut self, t: usize, wake_at: DateTime<Utc>, event: Option<(String, String)>) {
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

    /// Sends the attempt to a worker; a node with a `timeout` gets its
    /// deadline in `wake_at`, which the timer loop fires like any timer.
    /// A SUB_WORKFLOW's attempt instead asks the engine for its child run
    /// (RUNNING: no worker will lease it).
    pub(in crate::machine) fn dispatch(&mut self, t: usize) {
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
}

/// A WAIT `until`: RFC 3339 text or unix seconds.
fn parse_time(v: &Value) -> Result<DateTime<Utc>, String> {
    match v {
        Value::String(s) => DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| format!("{s:?} is not an RFC 3339 timestamp: {e}")),
        Value::Number(n) => n
            .as_f64()
            .and_then(|secs| DateTime::from_timestamp_millis((secs * 1000.0) as i64))
            .ok_or_else(|| format!("{n} is not a unix time")),
        other => Err(format!("expected a timestamp, got {}", crate::clipped(&other.to_string(), 200))),
    }
}
