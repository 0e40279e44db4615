//! The state machine the model asks what an event does: the code's own,
//! `composer_core::machine::apply`, on a run rebuilt from what the model
//! knows of it (the run's status, each task's state and attempt), with a
//! workflow of HTTP steps in a chain. Its answers are memoized: they depend
//! on that view and the event only, and there are a few hundred of them,
//! against millions of steps of the search.
//!
//! So the model does not restate the rules of a report (the guard on the
//! attempt and the state, retries, IN_DOUBT, routing to the next step, the
//! run's end, a cancel): it takes them from the machine.

use std::cell::RefCell;

use chrono::{DateTime, Utc};
use composer_core::definition::Workflow;
use composer_core::expr::Sandbox;
use composer_core::machine::{self, codes, Event, IgnoreKind, RunStatus, Task, TaskState};
use serde_json::json;
use uuid::Uuid;

use crate::checker::FxMap;

/// What the machine is given of a run: its status, and per node its task's
/// state and attempt (`None`: no task yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct View {
    pub run: RunStatus,
    pub tasks: [Option<(TaskState, u8)>; 2],
}

/// How a failed attempt failed, as the code the report or the sweep gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// The target answered: a known outcome (retryable).
    Known,
    /// The request broke off after connecting (`transport`): the outcome is unknown.
    Transport,
    /// Recovery dispatched the attempt `COMPOSER_MAX_DISPATCHES` times (`max_dispatches`).
    MaxDispatches,
}

/// The events the protocol sends a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Happened {
    Started,
    Completed { task: u8, attempt: u8 },
    Failed { task: u8, attempt: u8, code: Code },
    InDoubt { task: u8, attempt: u8 },
    TimerFired { task: u8 },
    Cancelled,
}

/// What the machine made of an event: why it ignored it, or the run's
/// status, the tasks it wrote (state and attempt) and those it dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub ignored: Option<IgnoreKind>,
    pub run: RunStatus,
    pub written: [Option<(TaskState, u8)>; 2],
    pub dispatched: [bool; 2],
}

/// The machine, over a workflow of `tasks` HTTP steps in a chain.
pub struct Oracle {
    wf: Workflow,
    /// The steps have a node `timeout`, and a dispatched attempt's deadline has passed.
    timeout: bool,
    memo: RefCell<FxMap<(View, Happened), Decision>>,
}

/// The time every event is applied at: a backoff written with it is over
/// by the next event (the model's timers are actions, not clocks).
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).expect("a valid time")
}

impl Oracle {
    /// A chain `a → b` (or `a` alone) of HTTP steps with `max_attempts`
    /// attempts each, at most once or not, with a node `timeout` or not.
    pub fn new(tasks: usize, max_attempts: u8, at_most_once: bool, timeout: bool) -> Oracle {
        let delivery = if at_most_once { "at_most_once" } else { "at_least_once" };
        let ids = ["a", "b"];
        let nodes: Vec<_> = ids[..tasks]
            .iter()
            .map(|id| {
                let mut node = json!({"id": id, "type": "HTTP", "config": {"url": format!("http://target/{id}")},
                       "retry": {"max_attempts": max_attempts, "initial_backoff": "1s"}, "delivery": delivery});
                if timeout {
                    node["timeout"] = json!("30s");
                }
                node
            })
            .collect();
        let edges: Vec<_> = (1..tasks).map(|i| json!({"from": ids[i - 1], "to": ids[i]})).collect();
        let spec = json!({"name": "protocol_model", "nodes": nodes, "edges": edges});
        let wf = Workflow::parse(&spec).unwrap_or_else(|e| panic!("the model's workflow: {e:?}"));
        Oracle { wf, timeout, memo: RefCell::new(FxMap::default()) }
    }

    /// What `event` does to a run the machine sees as `view`.
    pub fn decide(&self, view: View, event: Happened) -> Decision {
        if let Some(d) = self.memo.borrow().get(&(view, event)) {
            return *d;
        }
        let d = self.apply(view, event);
        self.memo.borrow_mut().insert((view, event), d);
        d
    }

    fn apply(&self, view: View, event: Happened) -> Decision {
        let mut run = machine::Run::new(Uuid::from_u128(1), json!({}));
        run.status = view.run;
        for (node, task) in view.tasks.iter().enumerate() {
            if let Some((state, attempt)) = *task {
                run.tasks.push(rebuilt(node, state, attempt, self.timeout));
            }
        }
        let mut next = 100u128;
        let mut new_id = || {
            next += 1;
            Uuid::from_u128(next)
        };
        let sb = Sandbox::simple_only();
        let event = self.event(&run, event);
        let tr = machine::apply(&sb, &self.wf, &mut run, event, now(), &mut new_id);
        let mut d = Decision { ignored: tr.ignored_kind, run: run.status, written: [None; 2], dispatched: [false; 2] };
        if d.ignored.is_some() {
            return d;
        }
        for (i, t) in run.tasks.iter().enumerate().filter(|(_, t)| !t.removed) {
            if tr.created.contains(&i) || tr.updated.contains(&i) {
                d.written[t.node] = Some((t.state, u8::try_from(t.attempt).expect("a small attempt")));
            }
            // As `store::transitions` writes it: only a task still PENDING is sent.
            d.dispatched[t.node] = tr.dispatch.contains(&i) && t.state == TaskState::Pending;
        }
        d
    }

    /// The code's event for what happened, naming the tasks as rebuilt.
    fn event(&self, run: &machine::Run, event: Happened) -> Event {
        let id = |task: u8| run.tasks.iter().find(|t| t.node == usize::from(task)).map_or(Uuid::nil(), |t| t.id);
        match event {
            Happened::Started => Event::RunStarted,
            Happened::Completed { task, attempt } => {
                Event::TaskCompleted { task_id: id(task), attempt: attempt.into(), output: json!({"ok": true}) }
            }
            Happened::Failed { task, attempt, code } => {
                let code = match code {
                    Code::Known => codes::HTTP_STATUS,
                    Code::Transport => codes::TRANSPORT,
                    Code::MaxDispatches => codes::MAX_DISPATCHES,
                };
                Event::TaskFailed {
                    task_id: id(task),
                    attempt: attempt.into(),
                    error: format!("the model's {code}"),
                    retryable: true,
                    code: Some(code.to_string()),
                    status: None,
                    retry_after: None,
                }
            }
            Happened::InDoubt { task, attempt } => {
                Event::TaskInDoubt { task_id: id(task), attempt: attempt.into(), reason: "lease expired".into() }
            }
            Happened::TimerFired { task } => Event::TimerFired { task_id: id(task) },
            Happened::Cancelled => Event::CancelRun,
        }
    }
}

/// A task as the engine would load it from its row: what the model keeps
/// of it, and what the machine needs besides (an output once COMPLETED, an
/// error once it failed; a backoff that is over; with a node `timeout`, a
/// dispatched attempt's deadline that has passed: the model fires that
/// timer only when the deadline is its choice).
fn rebuilt(node: usize, state: TaskState, attempt: u8, timeout: bool) -> Task {
    let failed = matches!(state, TaskState::Failed | TaskState::InDoubt);
    let dispatched = matches!(state, TaskState::Pending | TaskState::Running);
    Task {
        id: Uuid::from_u128(node as u128 + 10),
        node,
        state,
        attempt: attempt.into(),
        input: json!({}),
        output: (state == TaskState::Completed).then(|| json!({"ok": true})),
        error: failed.then(|| "failed in the model".to_string()),
        wake_at: (timeout && dispatched).then(|| now() - chrono::Duration::seconds(1)),
        finished_at: None,
        event: None,
        item: None,
        progress: None,
        error_info: None,
        iteration: None,
        removed: false,
        limit_keys: Vec::new(),
    }
}
