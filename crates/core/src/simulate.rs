//! A run of a workflow through the pure state machine, with nothing real
//! behind it: worker-run nodes (HTTP, custom types) take a mocked output,
//! events arrive with a mocked payload, timers fire at once (the simulated
//! clock jumps to them). A user tests a workflow's logic — branches, data
//! flow, retries, the run's output — in CI without PostgreSQL, Redis or a
//! network. `composer workflow simulate` prints what this returns.
//!
//! - `approvals`: the votes an APPROVAL step's mock casts.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

mod approvals;

use crate::definition::{Decision, NodeKind, Workflow};
use crate::expr::Sandbox;
use crate::http;
use crate::machine::{self, codes, Event, HistoryKind, Resolution, Run, RunStatus, Task, TaskState, Transition};

/// What the simulated world answers. A SUB_WORKFLOW's child run is not
/// simulated: its mock is the child's output (or `--fail` fails the child);
/// a LOOP's iterations take the node's mock, or their own (`poll[2]`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub input: Value,
    /// A node's output (an HTTP or custom node) or its event's payload (a
    /// WAIT_FOR_EVENT); `{}` when not given. A MAP's items take their MAP's
    /// (`ship_each`), or their own (`ship_each[3]`).
    pub mocks: HashMap<String, Value>,
    /// Nodes whose every attempt fails, with this message (a WAIT_FOR_EVENT
    /// times out instead). The node's retry policy applies.
    pub failures: HashMap<String, String>,
    /// What each attempt of a worker-run node (or a MAP's item, `ship[3]`)
    /// does, attempt by attempt (the last one for every attempt past them):
    /// before `mocks` and `failures`.
    pub outcomes: HashMap<String, Vec<Outcome>>,
    /// Cancel the run when the `n`th piece of work starts (1 is the first):
    /// an attempt a worker would run (instead of its answer) or a child run
    /// (before it ends), as an operator would while it runs.
    pub cancel_at: Option<usize>,
    /// The largest value the engine keeps, as JSON bytes: what the server's
    /// `COMPOSER_MAX_PAYLOAD` is, or its `COMPOSER_MAX_OFFLOADED` when it
    /// offloads large values (`None`: the default payload limit, 1 MiB).
    pub max_value: Option<usize>,
    /// Updates sent to the run, `(name, payload)`: each is offered once, to
    /// the first step that waits and accepts it.
    pub updates: Vec<(String, Value)>,
}

/// What one attempt of a worker-run node does.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It completes with this output.
    Output(Value),
    /// It fails, retryably (under the node's policy) or for good.
    Fail { error: String, retryable: bool },
    /// It runs past the node's `timeout` (which the node must have): the
    /// attempt fails retryably.
    TimeOut,
    /// Its worker is lost while it runs, its outcome unknown: an
    /// `at_most_once` node's attempt goes IN_DOUBT, and an operator
    /// resolves it so.
    Unknown(Resolution),
}

/// How the simulated run went.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub status: RunStatus,
    pub output: Option<Value>,
    pub error: Option<String>,
    /// Every node, in the definition's order.
    pub nodes: Vec<NodeReport>,
    pub edges: Vec<EdgeReport>,
    /// What the simulation leaves out that production does (limits,
    /// priorities and fairness keys).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The hooks (`on_failure`, `on_success`, `on_end`) the run's end
    /// starts, each with the input its run would be given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookReport>,
    /// The run's deadlines and its steps', each with whether it fires on
    /// the simulated clock (a worker's attempt takes no time there; WAITs,
    /// backoffs and event timeouts move it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deadlines: Vec<DeadlineReport>,
    /// The updates offered to a waiting step, and its answer to each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub updates: Vec<UpdateReport>,
}

/// What a waiting step answered to an update (`Options::updates`): it
/// completed with `output`, or refused it with `reason`.
#[derive(Debug, Clone, Serialize)]
pub struct UpdateReport {
    pub name: String,
    pub node: String,
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A deadline of the simulated run or of one of its steps.
#[derive(Debug, Clone, Serialize)]
pub struct DeadlineReport {
    /// The step's node; absent for the run's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub after: String,
    /// The workflow whose run it starts.
    pub workflow: String,
    /// Whether the run (or the step) was still open when it passed: in
    /// production it starts a run of `workflow` then.
    pub fires: bool,
    /// When it passes, in milliseconds after the run's start (`None` for a
    /// step that never started).
    pub at_ms: Option<i64>,
}

/// A hook the simulated run's end starts: production starts a run of
/// `workflow` with `input` in the commit that writes the end, or, when
/// the input does not evaluate, notes `error` in the run's history.
#[derive(Debug, Clone, Serialize)]
pub struct HookReport {
    /// `on_failure`, `on_success` or `on_end`.
    pub hook: &'static str,
    pub workflow: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    pub id: String,
    #[serde(rename = "type")]
    pub node_type: String,
    /// `NOT_REACHED` for a node no task was created for.
    pub state: String,
    pub attempts: i32,
    /// What the node was started with: the evaluated config of a worker-run
    /// node, the event and key of a WAIT_FOR_EVENT.
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<String>,
    /// The keys of its limits, evaluated: production would hold its steps
    /// by them; the simulation does not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limit_keys: Vec<String>,
    /// A MAP's items, by index.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemReport>,
}

/// One item of a MAP.
#[derive(Debug, Clone, Serialize)]
pub struct ItemReport {
    pub index: u32,
    pub state: String,
    pub attempts: i32,
    pub output: Option<Value>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EdgeReport {
    pub from: String,
    pub to: String,
    /// Which end of its source it follows: `success`, `failure`, `always`.
    pub on: &'static str,
    /// The state machine took it: its target started by it (as the run's
    /// history records, in production too).
    pub taken: bool,
}

/// Most events one simulation applies: a guard against a definition whose
/// retry policy and mocks would loop for long.
const MAX_EVENTS: usize = 100_000;

/// An attempt a worker would run, as [`simulate_asking`] asks its caller.
#[derive(Debug, Clone, Serialize)]
pub struct Ask<'a> {
    /// The node's id.
    pub node: &'a str,
    /// The node's id, or a MAP item's or LOOP iteration's (`ship[2]`).
    pub key: &'a str,
    /// The node's type (`charge_card`, `HTTP`).
    #[serde(rename = "type")]
    pub node_type: &'a str,
    /// The attempt's evaluated input.
    pub input: &'a Value,
    /// 1 for the first attempt.
    pub attempt: i32,
}

/// Runs `wf` to the end in the simulated world of `opts`, evaluating its
/// expressions in `sb`.
pub fn simulate(sb: &Sandbox, wf: &Workflow, opts: &Options) -> Report {
    simulate_asking(sb, wf, opts, &mut |_| None)
}

/// [`simulate`], asking `ask` first what each attempt a worker would run
/// does (`None`: what `opts` says): a test's handlers and mocks written as
/// functions, in any language that speaks to `composer workflow simulate
/// --ask`.
pub fn simulate_asking(
    sb: &Sandbox,
    wf: &Workflow,
    opts: &Options,
    ask: &mut dyn FnMut(&Ask<'_>) -> Option<Outcome>,
) -> Report {
    let mut ids = 0u128;
    let mut new_id = move || {
        ids += 1;
        Uuid::from_u128(ids)
    };
    let mut now: DateTime<Utc> = DateTime::<Utc>::UNIX_EPOCH;
    let mut run = Run::new(new_id(), opts.input.clone());
    if let Some(max) = opts.max_value {
        run.max_payload = max;
        // As the engine's: a scope holds at least the largest value and some room.
        run.max_read = run.max_read.max(max.saturating_add(64 << 20));
    }
    let mut world = World::default();
    world.apply(sb, wf, &mut run, Event::RunStarted, now, &mut new_id);
    let mut answered = 0;
    let mut updates = Vec::new();
    for _ in 0..MAX_EVENTS {
        if run.status != RunStatus::Running {
            break;
        }
        let update = offer_update(sb, wf, &run, opts, &mut updates);
        let next = update.or_else(|| next_event(wf, &run, opts, (&mut now, &mut answered), &world.votes, ask));
        let Some(event) = next else { break };
        lease(&mut run, &event);
        let vote = matches!(event, Event::ApprovalVote { .. }).then(|| event.clone());
        let ignored = world.apply(sb, wf, &mut run, event, now, &mut new_id);
        if let Some(vote) = vote {
            world.votes.applied(&vote, ignored.as_deref());
        }
    }
    let mut report = report(sb, wf, &run, &world.taken);
    for (task_id, why) in &world.votes.refused {
        let node = run.tasks.iter().find(|t| t.id == *task_id).map(|t| wf.nodes[t.node].id.as_str()).unwrap_or("?");
        report.notes.push(format!("approval {node}: a simulated vote was refused ({why}), so its deadline passed"));
    }
    report.deadlines = deadlines(wf, &run, &world.created, now);
    report.updates = updates;
    report
}

/// The next update not yet offered that a waiting step accepts, offered to
/// it: the event that completes the step when it accepts (its answer noted
/// in `answered` either way).
fn offer_update(
    sb: &Sandbox,
    wf: &Workflow,
    run: &Run,
    opts: &Options,
    answered: &mut Vec<UpdateReport>,
) -> Option<Event> {
    for (i, (name, payload)) in opts.updates.iter().enumerate().skip(answered.len()) {
        let waiting = run.tasks.iter().filter(|t| t.state == TaskState::Waiting && t.item.is_none());
        let (task, update) =
            waiting.filter_map(|t| Some((t, wf.nodes[t.node].updates.iter().find(|u| &u.name == name)?))).next()?;
        let scope = crate::definition::update_scope(&format!("simulated-{i}"), name, payload, &run.input);
        let (node, name) = (wf.nodes[task.node].id.clone(), name.clone());
        match update.decide(sb, &scope, run.max_payload) {
            Decision::Accepted(output) => {
                answered.push(UpdateReport { name, node, accepted: true, output: Some(output.clone()), reason: None });
                return Some(Event::EventReceived { task_id: task.id, payload: output });
            }
            Decision::Refused(reason) => {
                answered.push(UpdateReport { name, node, accepted: false, output: None, reason: Some(reason) })
            }
        }
    }
    None
}

/// The run's deadlines and its steps', on the simulated clock: the run
/// started at its epoch and, if it ended, ended at `end`.
fn deadlines(
    wf: &Workflow,
    run: &Run,
    created: &HashMap<Uuid, DateTime<Utc>>,
    end: DateTime<Utc>,
) -> Vec<DeadlineReport> {
    let start = DateTime::<Utc>::UNIX_EPOCH;
    let ended = run.status.is_terminal().then_some(end);
    let open_at = |from: DateTime<Utc>, until: Option<DateTime<Utc>>, d: &crate::definition::Deadline| {
        // A clock near its end (a saturated timer) never reaches it.
        let Some(at) = chrono::Duration::from_std(d.after).ok().and_then(|a| from.checked_add_signed(a)) else {
            return (false, i64::MAX);
        };
        let fires = until.is_none_or(|u| u > at) && ended.is_none_or(|e| e > at);
        (fires, (at - start).num_milliseconds())
    };
    let mut out = Vec::new();
    for d in &wf.deadlines {
        let (fires, at) = open_at(start, ended, d);
        let after = crate::duration::format(d.after);
        out.push(DeadlineReport { node: None, after, workflow: d.workflow.clone(), fires, at_ms: Some(at) });
    }
    for (n, node) in wf.nodes.iter().enumerate().filter(|(_, n)| n.item_of.is_none()) {
        let task = run.tasks.iter().find(|t| t.node == n && t.item.is_none() && !t.removed);
        let from = task.and_then(|t| created.get(&t.id)).copied();
        for d in &node.deadlines {
            let (fires, at) = match (from, task) {
                (Some(from), Some(t)) if !matches!(t.state, TaskState::Skipped) => {
                    let (fires, at) = open_at(from, t.finished_at, d);
                    (fires, Some(at))
                }
                _ => (false, None),
            };
            let after = crate::duration::format(d.after);
            out.push(DeadlineReport {
                node: Some(node.id.clone()),
                after,
                workflow: d.workflow.clone(),
                fires,
                at_ms: at,
            });
        }
    }
    out
}

/// A worker took the attempt an event answers: it is RUNNING, as a lease
/// makes it in production (where, for one, an `at_most_once` attempt that
/// times out RUNNING goes IN_DOUBT instead of being tried again).
fn lease(run: &mut Run, event: &Event) {
    let task_id = match event {
        Event::TaskCompleted { task_id, .. }
        | Event::TaskFailed { task_id, .. }
        | Event::TaskInDoubt { task_id, .. }
        | Event::TimerFired { task_id } => task_id,
        _ => return,
    };
    if let Some(t) = run.tasks.iter_mut().find(|t| t.id == *task_id && t.state == TaskState::Pending) {
        t.state = TaskState::Running;
    }
}

/// What the simulated engine keeps between events: the edges taken, and the
/// lists of MAPs that create their items a chunk at a time.
#[derive(Default)]
struct World {
    taken: HashSet<(String, String)>,
    sources: HashMap<Uuid, Vec<Value>>,
    /// When each task was created, on the simulated clock.
    created: HashMap<Uuid, DateTime<Utc>>,
    votes: approvals::Votes,
}

impl World {
    /// Applies `event` and serves what the machine asks of storage as the
    /// engine would (the run holds every task, so only MAP lists and
    /// MAPs that carry on after a commit need serving).
    fn apply(
        &mut self,
        sb: &Sandbox,
        wf: &Workflow,
        run: &mut Run,
        event: Event,
        now: DateTime<Utc>,
        new_id: &mut dyn FnMut() -> Uuid,
    ) -> Option<String> {
        let mut pending = vec![event];
        let mut first = None;
        while let Some(event) = pending.pop() {
            let tr = machine::apply(sb, wf, run, event, now, new_id);
            first.get_or_insert_with(|| tr.ignored.clone());
            note_taken(&tr, &mut self.taken);
            for &i in &tr.created {
                self.created.entry(run.tasks[i].id).or_insert(now);
            }
            for (m, first, list) in &tr.sources {
                let mut all = vec![Value::Null; (*first * machine::ITEM_CHUNK) as usize];
                all.extend(list.iter().cloned());
                self.sources.insert(run.tasks[*m].id, all);
            }
            for effect in &tr.effects {
                match effect {
                    machine::Effect::LoadItems(machine::Need::Sources { map, from, count }) => {
                        let list = self.sources.get(map).map(Vec::as_slice).unwrap_or_default();
                        let end = ((from + count) as usize).min(list.len());
                        let items = list.get(*from as usize..end).unwrap_or_default().to_vec();
                        pending.push(Event::SourcesLoaded { task_id: *map, from: *from, items });
                    }
                    // Every item created is in memory here: the machine
                    // finds them without asking.
                    machine::Effect::LoadItems(_) | machine::Effect::TakeBufferedEvent { .. } => {}
                }
            }
            for &m in &tr.continue_maps {
                pending.push(Event::ItemsLoaded { task_id: run.tasks[m].id });
            }
        }
        first.flatten()
    }
}

/// The edges a transition took, from its history: `(from, to)` node ids.
pub fn note_taken(tr: &Transition, taken: &mut HashSet<(String, String)>) {
    for h in &tr.history {
        if h.kind == HistoryKind::TaskReset {
            continue;
        }
        let (Some(to), Some(via)) = (h.payload["node_id"].as_str(), h.payload["via"].as_array()) else { continue };
        for from in via.iter().filter_map(|v| v["from"].as_str()) {
            taken.insert((from.to_string(), to.to_string()));
        }
    }
}

/// What the world does next: the oldest open task gets its answer (a MAP's
/// own task and its queued items wait for the items in flight).
fn next_event(
    wf: &Workflow,
    run: &Run,
    opts: &Options,
    (now, answered): (&mut DateTime<Utc>, &mut usize),
    votes: &approvals::Votes,
    ask: &mut dyn FnMut(&Ask<'_>) -> Option<Outcome>,
) -> Option<Event> {
    let task =
        run.tasks.iter().find(|t| !t.state.is_terminal() && t.progress.is_none() && t.state != TaskState::Queued)?;
    let node = &wf.nodes[task.node];
    // A MAP's item, or a LOOP's iteration, may have a mock of its own.
    let own = match (task.item, task.iteration) {
        (Some(i), _) => Some(format!("{}[{}]", node.id, i.index)),
        (None, Some(i)) => Some(format!("{}[{i}]", node.id)),
        (None, None) => None,
    };
    let mock = || lookup(&opts.mocks, own.as_deref(), &node.id).cloned().unwrap_or_else(|| json!({}));
    let failure = lookup(&opts.failures, own.as_deref(), &node.id).cloned();
    let outcome = lookup(&opts.outcomes, own.as_deref(), &node.id)
        .and_then(|script| script.get((task.attempt.max(1) as usize - 1).min(script.len().saturating_sub(1))));
    let worker_runs = matches!(task.state, TaskState::Pending | TaskState::Running) && node.kind.traits().dispatched;
    let child_runs = task.state == TaskState::Running && node.kind.traits().has_child;
    if worker_runs || child_runs {
        *answered += 1;
        if opts.cancel_at == Some(*answered) {
            return Some(Event::CancelRun);
        }
    }
    if worker_runs {
        let key = own.as_deref().unwrap_or(&node.id);
        let asked = Ask { node: &node.id, key, node_type: &node.node_type, input: &task.input, attempt: task.attempt };
        if let Some(o) = ask(&asked) {
            return scripted(task, &timed_out_or_failed(task, o), true, now);
        }
    }
    if let Some(event) = outcome.and_then(|o| scripted(task, o, worker_runs, now)) {
        return Some(event);
    }
    Some(match (task.state, &node.kind) {
        // A child run is not simulated: it "ends" with the mock, or fails.
        (TaskState::Running, kind) if kind.traits().has_child => Event::ChildFinished {
            task_id: task.id,
            attempt: task.attempt,
            iteration: task.iteration.unwrap_or(0),
            child: Some(Uuid::nil()),
            status: if failure.is_some() { RunStatus::Failed } else { RunStatus::Succeeded },
            output: failure.is_none().then(mock),
            error: failure,
        },
        (TaskState::Pending | TaskState::Running, kind) => worker_answer(task, kind, failure, mock),
        (TaskState::Waiting, NodeKind::Approval(_)) if failure.is_none() && !votes.refused.contains_key(&task.id) => {
            votes.next(task, lookup(&opts.mocks, own.as_deref(), &node.id), *now)
        }
        // An approval no one decides, with no deadline: it waits for ever.
        (TaskState::Waiting, NodeKind::Approval(_)) if task.wake_at.is_none() => return None,
        (TaskState::Waiting, NodeKind::WaitForEvent { .. }) if failure.is_none() => {
            Event::EventReceived { task_id: task.id, payload: mock() }
        }
        // A timer (WAIT, a retry's backoff, an event's timeout): the clock
        // jumps to it.
        (TaskState::Waiting, _) => {
            if let Some(at) = task.wake_at {
                *now = (*now).max(at);
            }
            Event::TimerFired { task_id: task.id }
        }
        _ => return None,
    })
}

/// An asked attempt's answer: a time-out of an attempt that has no
/// deadline (its node no `timeout`) is a retryable failure, as its worker
/// giving up would be.
fn timed_out_or_failed(task: &Task, o: Outcome) -> Outcome {
    match o {
        Outcome::TimeOut if task.wake_at.is_none() => {
            Outcome::Fail { error: "timed out (simulated; the node has no timeout)".into(), retryable: true }
        }
        o => o,
    }
}

/// A worker-run attempt's mocked answer: its failure, or its mock; a
/// mocked answer of an HTTP node is judged as a real one is: a status the
/// node does not accept fails the attempt.
fn worker_answer(task: &Task, kind: &NodeKind, failure: Option<String>, mock: impl FnOnce() -> Value) -> Event {
    if let Some(message) = failure {
        return Event::TaskFailed {
            task_id: task.id,
            attempt: task.attempt,
            error: message,
            retryable: true,
            code: None,
            status: None,
            retry_after: None,
        };
    }
    let output = mock();
    let status = output["status"].as_u64().and_then(|s| u16::try_from(s).ok());
    match status.filter(|_| *kind == NodeKind::Http).and_then(|s| Some((s, http::refusal(&task.input, s)?))) {
        Some((status, retryable)) => Event::TaskFailed {
            task_id: task.id,
            attempt: task.attempt,
            error: http::refused_answer(
                &task.input["method"].as_str().unwrap_or("GET").to_ascii_uppercase(),
                task.input["url"].as_str().unwrap_or("the target"),
                status,
                &output["body"],
            ),
            retryable,
            code: Some(codes::HTTP_STATUS.to_string()),
            status: Some(status),
            retry_after: None,
        },
        None => Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output },
    }
}

/// The event of a scripted attempt: its answer when a worker runs it, its
/// operator's resolution once IN_DOUBT.
fn scripted(task: &Task, outcome: &Outcome, worker_runs: bool, now: &mut DateTime<Utc>) -> Option<Event> {
    let (task_id, attempt) = (task.id, task.attempt);
    Some(match (outcome, worker_runs, task.state) {
        (Outcome::Output(output), true, _) => Event::TaskCompleted { task_id, attempt, output: output.clone() },
        (Outcome::Fail { error, retryable }, true, _) => Event::TaskFailed {
            task_id,
            attempt,
            error: error.clone(),
            retryable: *retryable,
            code: None,
            status: None,
            retry_after: None,
        },
        // The attempt's deadline is its timer: the clock jumps to it.
        (Outcome::TimeOut, true, _) => {
            if let Some(at) = task.wake_at {
                *now = (*now).max(at);
            }
            Event::TimerFired { task_id }
        }
        (Outcome::Unknown(_), true, _) => {
            Event::TaskInDoubt { task_id, attempt, reason: "its worker was lost (simulated)".into() }
        }
        (Outcome::Unknown(resolution), false, TaskState::InDoubt) => {
            Event::ResolveTask { task_id, resolution: resolution.clone() }
        }
        _ => return None,
    })
}

/// An item's own entry (`ship_each[3]`), else its node's.
fn lookup<'m, V>(m: &'m HashMap<String, V>, own: Option<&str>, node: &str) -> Option<&'m V> {
    own.and_then(|id| m.get(id)).or_else(|| m.get(node))
}

/// The items of MAP task `map`, by index.
fn items_of(run: &Run, map: &Task) -> Vec<ItemReport> {
    let mut items: Vec<ItemReport> = run
        .tasks
        .iter()
        .filter(|t| t.item.is_some_and(|i| i.map == map.id))
        .map(|t| ItemReport {
            index: t.item.map_or(0, |i| i.index),
            state: t.state.to_string(),
            attempts: t.attempt,
            output: t.output.clone(),
            error: t.error.clone(),
        })
        .collect();
    items.sort_by_key(|i| i.index);
    items
}

fn report(sb: &Sandbox, wf: &Workflow, run: &Run, taken: &HashSet<(String, String)>) -> Report {
    let nodes = wf
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| node.item_of.is_none())
        .map(|(i, node)| {
            let task = run.tasks.iter().find(|t| t.node == i && t.item.is_none() && !t.removed);
            NodeReport {
                id: node.id.clone(),
                node_type: node.node_type.clone(),
                state: task.map_or("NOT_REACHED".to_string(), |t| t.state.to_string()),
                attempts: task.map_or(0, |t| t.attempt),
                input: task.map(|t| t.input.clone()).filter(|v| !v.is_null()),
                output: task.and_then(|t| t.output.clone()),
                error: task.and_then(|t| t.error.clone()),
                limit_keys: task.map(|t| t.limit_keys.clone()).unwrap_or_default(),
                items: task.map(|m| items_of(run, m)).unwrap_or_default(),
            }
        })
        .collect();
    let edges = wf
        .edges
        .iter()
        .map(|e| {
            let (from, to) = (wf.nodes[e.from].id.clone(), wf.nodes[e.to].id.clone());
            let taken = taken.contains(&(from.clone(), to.clone()));
            EdgeReport { from, to, on: e.on.as_str(), taken }
        })
        .collect();
    let mut notes = Vec::new();
    if wf.nodes.iter().any(|n| !n.limits.is_empty()) {
        notes.push(
            "limits are not simulated: every step goes at once; in production a step waits for its limit keys \
             (rate, concurrency, a target's Retry-After)"
                .to_string(),
        );
    }
    if wf.priority != crate::priority::DEFAULT || wf.fairness_key.is_some() {
        let key = match wf.fairness_key_of(sb, &run.input) {
            Ok(Some(k)) => format!(", fairness key {k:?}"),
            Ok(None) => String::new(),
            Err(e) => format!(" ({e})"),
        };
        notes.push(format!(
            "priorities and fairness keys are not simulated: a simulation has no other work to go before or after; \
             in production this run is served at priority {}{key}",
            wf.priority
        ));
    }
    let hooks = wf
        .hooks
        .iter()
        .filter(|h| h.starts_on(run.status))
        .map(|h| {
            let input = machine::hook_input(sb, h, &machine::hook_scopes(h, wf, run), run.max_payload);
            let (input, error) = match input {
                Ok(v) => (Some(v), None),
                Err(e) => (None, Some(e)),
            };
            HookReport { hook: h.kind.field(), workflow: h.workflow.clone(), version: h.version, input, error }
        })
        .collect();
    Report {
        status: run.status,
        output: run.output.clone(),
        error: run.error.clone(),
        nodes,
        edges,
        notes,
        hooks,
        deadlines: Vec::new(),
        updates: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> crate::expr::Sandbox {
        crate::expr::Sandbox::for_tests()
    }

    fn wf(v: Value) -> Workflow {
        Workflow::parse(&v).unwrap()
    }

    #[test]
    fn a_runs_end_shows_the_hooks_it_starts_with_their_inputs() {
        let hooks = json!({
            "on_failure": {"workflow": "page", "input": {"why": "${ .failed_run.error }"}},
            "on_success": {"workflow": "notify", "input": {"total": "${ .run.output.total }", "id": "${ .input.id }"}},
            "on_end": {"workflow": "audit", "version": 2}});
        let def = |fail: bool| {
            let mut d = json!({"name": "h", "nodes": [
                {"id": "sum", "type": "TRANSFORM", "config": {"output": {"total": 5}}},
                if fail { json!({"id": "stop", "type": "FAIL", "config": {"message": "declined"}}) }
                else { json!({"id": "stop", "type": "TRANSFORM", "config": {"output": 1}}) }],
                "edges": [{"from": "sum", "to": "stop"}], "output": {"total": "${ .nodes.sum.output.total }"}});
            for (k, v) in hooks.as_object().unwrap() {
                d[k] = v.clone();
            }
            wf(d)
        };
        let opts = Options { input: json!({"id": 7}), ..Options::default() };
        let ok = simulate(&sb(), &def(false), &opts);
        assert_eq!(ok.status, RunStatus::Succeeded, "{ok:?}");
        let shown: Vec<_> = ok.hooks.iter().map(|h| (h.hook, h.workflow.as_str())).collect();
        assert_eq!(shown, [("on_success", "notify"), ("on_end", "audit")]);
        assert_eq!(ok.hooks[0].input, Some(json!({"total": 5, "id": 7})));
        let end = ok.hooks[1].input.as_ref().unwrap();
        assert_eq!(
            (end["run"]["status"].clone(), end["run"]["output"].clone()),
            (json!("SUCCEEDED"), json!({"total": 5}))
        );
        assert_eq!(end["run"]["nodes"]["sum"]["output"], json!({"total": 5}));
        assert_eq!(ok.hooks[1].version, Some(2));

        let failed = simulate(&sb(), &def(true), &opts);
        assert_eq!(failed.status, RunStatus::Failed, "{failed:?}");
        let shown: Vec<_> = failed.hooks.iter().map(|h| (h.hook, h.workflow.as_str())).collect();
        assert_eq!(shown, [("on_failure", "page"), ("on_end", "audit")]);
        assert_eq!(failed.hooks[0].input, Some(json!({"why": "declined"})));
        assert_eq!(failed.hooks[1].input.as_ref().unwrap()["run"]["status"], "FAILED");

        // An input that does not evaluate is shown as the error production notes.
        let mut bad = def(false);
        bad.hooks[1].input = Some(crate::expr::Template::compile(&json!("${ error(\"no\") }")).unwrap());
        let r = simulate(&sb(), &bad, &opts);
        assert!(
            r.hooks[0].input.is_none() && r.hooks[0].error.as_deref().is_some_and(|e| e.contains("on_success.input")),
            "{:?}",
            r.hooks
        );
    }

    #[test]
    fn a_deadline_fires_in_a_simulation_when_its_run_or_step_is_open_as_it_passes() {
        let page = |after: &str| json!({"after": after, "start": {"workflow": "page"}});
        let w = wf(json!({"name": "d", "deadlines": [page("1s"), page("1h")], "nodes": [
            {"id": "a", "type": "TRANSFORM", "config": {"output": 1}, "deadlines": [page("1ms")]},
            {"id": "w", "type": "WAIT", "config": {"duration": "5s"}, "deadlines": [page("4s"), page("6s")]},
            {"id": "b", "type": "TRANSFORM", "config": {"output": 2}, "deadlines": [page("1ms")]},
            {"id": "never", "type": "TRANSFORM", "config": {"output": 3}, "deadlines": [page("1ms")]}],
            "edges": [{"from": "a", "to": "w"}, {"from": "w", "to": "b"},
                      {"from": "a", "to": "never", "when": "false"}]}));
        let r = simulate(&sb(), &w, &Options::default());
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        let seen: Vec<(Option<&str>, &str, bool, Option<i64>)> =
            r.deadlines.iter().map(|d| (d.node.as_deref(), d.after.as_str(), d.fires, d.at_ms)).collect();
        assert_eq!(
            seen,
            [
                (None, "1s", true, Some(1000)),
                (None, "1h", false, Some(3_600_000)),
                (Some("a"), "1ms", false, Some(1)),
                (Some("w"), "4s", true, Some(4000)),
                (Some("w"), "6s", false, Some(6000)),
                (Some("b"), "1ms", false, Some(5001)),
                (Some("never"), "1ms", false, None),
            ]
        );
    }

    #[test]
    fn a_priority_or_fairness_key_is_named_as_not_simulated() {
        let w = wf(json!({"name": "p", "priority": 1, "fairness_key": "${ .input.tenant }",
                          "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}));
        let report = simulate(&sb(), &w, &Options { input: json!({"tenant": "acme"}), ..Default::default() });
        let note = report.notes.iter().find(|n| n.contains("priorities")).expect("a note on priorities");
        assert!(note.contains("priority 1") && note.contains("\"acme\""), "{note}");
        let plain = wf(json!({"name": "p", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}));
        let report = simulate(&sb(), &plain, &Options { input: json!({}), ..Default::default() });
        assert!(report.notes.iter().all(|n| !n.contains("priorities")));
    }

    fn http(id: &str) -> Value {
        json!({"id": id, "type": "HTTP", "config": {"url": "http://x/${ .input.who }"}})
    }

    #[test]
    fn a_branch_follows_the_mocked_output_and_the_output_is_computed() {
        let w = wf(json!({"name": "order", "nodes": [http("check"), http("big"), http("small"),
            {"id": "sum", "type": "TRANSFORM", "config": {"output": "${ .nodes.check.output.amount * 2 }"}}],
            "edges": [{"from": "check", "to": "big", "when": ".nodes.check.output.amount > 100"},
                      {"from": "check", "to": "small", "when": ".nodes.check.output.amount <= 100"},
                      {"from": "check", "to": "sum"}],
            "output": {"doubled": "${ .nodes.sum.output }"}}));
        let opts = Options {
            input: json!({"who": "ada"}),
            mocks: HashMap::from([("check".into(), json!({"amount": 500}))]),
            ..Default::default()
        };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!(r.status, RunStatus::Succeeded);
        assert_eq!(r.output, Some(json!({"doubled": 1000})));
        let state = |id: &str| r.nodes.iter().find(|n| n.id == id).unwrap().state.clone();
        assert_eq!((state("big"), state("small")), ("COMPLETED".into(), "SKIPPED".into()));
        assert_eq!(r.nodes[0].input.as_ref().map(|i| &i["url"]), Some(&json!("http://x/ada")), "the evaluated config");
        let taken: Vec<(String, bool)> = r.edges.iter().map(|e| (e.to.clone(), e.taken)).collect();
        assert_eq!(taken, vec![("big".into(), true), ("small".into(), false), ("sum".into(), true)]);
    }

    #[test]
    fn a_map_takes_its_items_mock_or_each_item_its_own() {
        let w = wf(json!({"name": "each", "nodes": [{"id": "ship", "type": "MAP", "config": {
            "items": "${ .input.orders }", "max_concurrency": 2, "on_item_failure": "continue",
            "node": {"type": "HTTP", "retry": {"max_attempts": 1}, "config": {"url": "http://x/${ .item }"}}}}]}));
        let opts = Options {
            input: json!({"orders": ["a", "b", "c"]}),
            mocks: HashMap::from([("ship".into(), json!("sent")), ("ship[2]".into(), json!("sent late"))]),
            failures: HashMap::from([("ship[1]".into(), "no stock".into())]),
            ..Default::default()
        };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!(r.status, RunStatus::Succeeded);
        assert_eq!(r.output, Some(json!({"ship": ["sent", {"error": "no stock"}, "sent late"]})));
        assert_eq!(r.nodes.len(), 1, "the item template is not a node of its own");
    }

    #[test]
    fn a_failing_node_uses_its_retries_then_fails_the_run() {
        let mut node = http("pay");
        node["retry"] = json!({"max_attempts": 3, "initial_backoff": "1h"});
        let w = wf(json!({"name": "pay", "nodes": [node]}));
        let opts = Options { failures: HashMap::from([("pay".into(), "card declined".into())]), ..Default::default() };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!(r.status, RunStatus::Failed);
        assert_eq!(r.nodes[0].attempts, 3, "timers fire at once, so every retry runs");
        assert!(r.error.unwrap().contains("card declined"));
    }

    /// The engine puts an `at_most_once` attempt that timed out while its
    /// worker held it IN_DOUBT; `simulate` retried it, as if no worker had
    /// taken it (found by the three-way failure model).
    #[test]
    fn an_at_most_once_attempt_that_times_out_is_in_doubt_as_in_production() {
        let mut node = http("pay");
        node["timeout"] = json!("1s");
        node["delivery"] = json!("at_most_once");
        node["retry"] = json!({"max_attempts": 3});
        let w = wf(json!({"name": "pay", "nodes": [node]}));
        let opts = Options { outcomes: HashMap::from([("pay".into(), vec![Outcome::TimeOut])]), ..Default::default() };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!((r.status, r.nodes[0].state.as_str(), r.nodes[0].attempts), (RunStatus::Running, "IN_DOUBT", 1));
        let resolved = vec![Outcome::Unknown(Resolution::Completed(json!({"ok": true})))];
        let opts = Options { outcomes: HashMap::from([("pay".into(), resolved)]), ..Default::default() };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!((r.status, r.nodes[0].output.clone()), (RunStatus::Succeeded, Some(json!({"ok": true}))));
    }

    #[test]
    fn waits_fire_and_events_arrive_with_their_mocked_payload() {
        let w = wf(json!({"name": "w", "nodes": [
            {"id": "cool", "type": "WAIT", "config": {"duration": "3650d"}},
            {"id": "paid", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "${ .input.order }"}},
            {"id": "late", "type": "WAIT_FOR_EVENT", "config": {"event": "x", "key": "k", "timeout": "1h",
                "default_output": {"late": true}}}],
            "edges": [{"from": "cool", "to": "paid"}, {"from": "paid", "to": "late"}]}));
        let opts = Options {
            input: json!({"order": "o-1"}),
            mocks: HashMap::from([("paid".into(), json!({"amount": 5}))]),
            failures: HashMap::from([("late".into(), String::new())]),
            ..Default::default()
        };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        assert_eq!(r.nodes[1].output, Some(json!({"amount": 5})));
        assert_eq!(r.nodes[1].input, Some(json!({"event": "paid", "key": "o-1"})));
        assert_eq!(r.nodes[2].output, Some(json!({"late": true})), "a failed event wait times out");
    }

    #[test]
    fn an_update_a_waiting_step_refuses_leaves_it_waiting_and_one_it_accepts_completes_it() {
        let w = wf(json!({"name": "u", "nodes": [
            {"id": "ok", "type": "WAIT_FOR_EVENT", "config": {"event": "e", "key": "k"}, "updates": [
                {"name": "approve", "validate": ".update.payload.amount <= .input.limit", "refusal": "too much",
                 "output": {"amount": "${ .update.payload.amount }", "via": "${ .update.name }"}}]}]}));
        let updates =
            vec![("approve".to_string(), json!({"amount": 500})), ("approve".to_string(), json!({"amount": 5}))];
        let opts = Options { input: json!({"limit": 100}), updates, ..Default::default() };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
        assert_eq!(r.nodes[0].output, Some(json!({"amount": 5, "via": "approve"})), "the accepted update's output");
        let answers: Vec<_> = r.updates.iter().map(|u| (u.accepted, u.reason.clone(), u.node.as_str())).collect();
        assert_eq!(answers, [(false, Some("too much".into()), "ok"), (true, None, "ok")]);
        // No step accepts it: never offered, and the event's mock completes the step.
        let opts = Options { updates: vec![("reject".into(), json!(1))], ..Default::default() };
        let r = simulate(&sb(), &w, &opts);
        assert_eq!((r.status, r.updates.len()), (RunStatus::Succeeded, 0));
    }
}
