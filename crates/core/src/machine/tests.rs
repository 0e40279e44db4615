use super::*;
use crate::definition::Workflow;
use proptest::prelude::*;
use serde_json::json;

fn sb() -> crate::expr::Sandbox {
    crate::expr::Sandbox::for_tests()
}

fn wf(nodes: &[&str], edges: &[(&str, &str)], max_attempts: u32) -> Workflow {
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|id| {
            json!({"id": id, "type": "HTTP", "config": {"url": format!("http://h/{id}")},
                   "retry": {"max_attempts": max_attempts, "initial_backoff": "1s"}})
        })
        .collect();
    let edges: Vec<Value> = edges.iter().map(|(f, t)| json!({"from": f, "to": t})).collect();
    Workflow::parse(&json!({"name": "t", "nodes": nodes, "edges": edges})).unwrap()
}

/// A run driven through the machine by hand (the migration's tests use it too).
pub(super) struct Sim {
    pub(super) wf: Workflow,
    pub(super) run: Run,
    now: DateTime<Utc>,
    next: u128,
}

impl Sim {
    pub(super) fn new(wf: Workflow) -> Sim {
        Sim { wf, run: Run::new(Uuid::from_u128(1), json!({"x": 1})), now: Utc::now(), next: 100 }
    }

    pub(super) fn apply(&mut self, e: Event) -> Transition {
        let next = &mut self.next;
        let mut ids = || {
            *next += 1;
            Uuid::from_u128(*next)
        };
        apply(&sb(), &self.wf, &mut self.run, e, self.now, &mut ids)
    }

    fn task(&self, node: &str) -> &Task {
        let n = self.wf.node_index(node).unwrap();
        self.run.tasks.iter().find(|t| t.node == n && !t.removed).unwrap_or_else(|| panic!("no task for {node}"))
    }

    fn has_task(&self, node: &str) -> bool {
        let n = self.wf.node_index(node).unwrap();
        self.run.tasks.iter().any(|t| t.node == n && !t.removed)
    }

    pub(super) fn complete(&mut self, node: &str) -> Transition {
        let t = self.task(node);
        let e = Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!({"node": node}) };
        self.apply(e)
    }

    fn fail(&mut self, node: &str, retryable: bool) -> Transition {
        let t = self.task(node);
        let e = Event::TaskFailed {
            task_id: t.id,
            attempt: t.attempt,
            error: "boom".into(),
            retryable,
            code: None,
            status: None,
            retry_after: None,
        };
        self.apply(e)
    }
}

#[test]
fn start_dispatches_only_roots() {
    let mut s = Sim::new(wf(&["a", "b", "c"], &[("a", "b"), ("b", "c")], 1));
    let tr = s.apply(Event::RunStarted);
    assert_eq!(tr.created, vec![0]);
    assert_eq!(tr.dispatch, vec![0]);
    let a = s.task("a");
    assert_eq!(a.input, json!({"url": "http://h/a", "idempotency_key": format!("{}:1", a.id)}));
    assert!(s.apply(Event::RunStarted).ignored.is_some(), "a second start is ignored");
}

#[test]
fn linear_run_succeeds_with_leaf_output() {
    let mut s = Sim::new(wf(&["a", "b", "c"], &[("a", "b"), ("b", "c")], 1));
    s.apply(Event::RunStarted);
    for n in ["a", "b"] {
        let tr = s.complete(n);
        assert_eq!(tr.dispatch.len(), 1);
        assert_eq!(s.run.status, RunStatus::Running);
    }
    let tr = s.complete("c");
    assert!(tr.run_changed);
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.run.output, Some(json!({"c": {"node": "c"}})));
}

#[test]
fn diamond_join_waits_for_both_branches() {
    let mut s = Sim::new(wf(&["a", "b", "c", "d"], &[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], 1));
    s.apply(Event::RunStarted);
    assert_eq!(s.complete("a").dispatch.len(), 2);
    assert!(s.complete("b").dispatch.is_empty(), "join must wait for c");
    assert!(!s.has_task("d"));
    assert_eq!(s.complete("c").dispatch.len(), 1);
    s.complete("d");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn duplicate_late_and_stale_reports_are_ignored() {
    let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")], 3));
    s.apply(Event::RunStarted);
    let a = s.task("a").clone();
    let done = Event::TaskCompleted { task_id: a.id, attempt: 1, output: json!(1) };
    assert!(s.apply(done.clone()).ignored.is_none());
    let again = s.apply(done);
    assert_eq!(again.ignored.as_deref(), Some("task is already COMPLETED"));
    assert_eq!(again.history[0].kind, HistoryKind::EventIgnored);
    let stale = s.apply(Event::TaskCompleted { task_id: a.id, attempt: 7, output: json!(2) });
    assert!(stale.ignored.unwrap().contains("stale"));
    let stranger = s.apply(Event::TaskFailed {
        task_id: Uuid::nil(),
        attempt: 1,
        error: "x".into(),
        retryable: false,
        code: None,
        status: None,
        retry_after: None,
    });
    assert!(stranger.ignored.unwrap().contains("does not belong"));
    assert_eq!(s.task("a").output, Some(json!(1)), "the first result wins");
}

#[test]
fn retryable_failure_waits_then_dispatches_the_next_attempt() {
    let mut s = Sim::new(wf(&["a"], &[], 3));
    s.apply(Event::RunStarted);
    let tr = s.fail("a", true);
    let a = s.task("a").clone();
    assert_eq!(a.state, TaskState::Waiting);
    assert_eq!(a.wake_at, Some(s.now + chrono::Duration::seconds(1)));
    assert!(tr.dispatch.is_empty());

    let early = s.apply(Event::TimerFired { task_id: a.id });
    assert_eq!(early.ignored.as_deref(), Some("timer is not due yet"));
    s.now += chrono::Duration::seconds(1);
    let tr = s.apply(Event::TimerFired { task_id: a.id });
    assert_eq!(tr.dispatch, vec![0]);
    assert_eq!((s.task("a").attempt, s.task("a").state), (2, TaskState::Pending));
    let dup = s.apply(Event::TimerFired { task_id: a.id });
    assert_eq!(dup.ignored.as_deref(), Some("task is PENDING, not WAITING"));

    let late = s.apply(Event::TaskCompleted { task_id: a.id, attempt: 1, output: json!(0) });
    assert!(late.ignored.is_some(), "a report for attempt 1 is stale once attempt 2 runs");
    s.complete("a");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn exhausted_attempts_fail_the_run_and_start_nothing_new() {
    let mut s = Sim::new(wf(&["a", "b", "x", "y"], &[("a", "b"), ("x", "y")], 2));
    s.apply(Event::RunStarted);
    s.fail("a", true);
    s.now += chrono::Duration::hours(1);
    let id = s.task("a").id;
    s.apply(Event::TimerFired { task_id: id });
    s.fail("a", true);
    assert_eq!(s.task("a").state, TaskState::Failed);
    assert_eq!(s.run.status, RunStatus::Running, "x is still running");
    let tr = s.complete("x");
    assert!(tr.created.is_empty(), "no new node starts after a failure");
    assert_eq!(s.run.status, RunStatus::Failed);
    assert!(s.run.error.as_deref().unwrap().contains("\"a\""));
    assert!(!s.has_task("b") && !s.has_task("y"));
}

#[test]
fn non_retryable_failure_fails_at_once() {
    let mut s = Sim::new(wf(&["a"], &[], 5));
    s.apply(Event::RunStarted);
    s.fail("a", false);
    assert_eq!(s.task("a").state, TaskState::Failed);
    assert_eq!(s.run.status, RunStatus::Failed);
}

#[test]
fn retry_run_restarts_failed_tasks_and_resumes_routing() {
    let mut s = Sim::new(wf(&["a", "b", "x", "y"], &[("a", "b"), ("x", "y")], 1));
    s.apply(Event::RunStarted);
    s.fail("a", false);
    s.complete("x");
    assert_eq!(s.run.status, RunStatus::Failed);
    assert!(s.apply(Event::CancelRun).ignored.is_some(), "a finished run cannot be cancelled");

    let tr = s.apply(Event::RetryRun);
    assert_eq!(s.run.status, RunStatus::Running);
    assert_eq!(tr.dispatch.len(), 2, "a again, and y which the failure held back");
    assert_eq!(s.task("a").attempt, 2);
    s.complete("a");
    s.complete("b");
    s.complete("y");
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert!(s.apply(Event::RetryRun).ignored.is_some());
}

#[test]
fn cancel_ends_every_open_task() {
    let mut s = Sim::new(wf(&["a", "b"], &[], 1));
    s.apply(Event::RunStarted);
    s.complete("a");
    let tr = s.apply(Event::CancelRun);
    assert_eq!(s.run.status, RunStatus::Cancelled);
    assert_eq!(s.task("b").state, TaskState::Cancelled);
    assert_eq!(s.task("a").state, TaskState::Completed);
    assert_eq!(tr.updated, vec![1]);
    assert!(s.complete("b").ignored.is_some());
}

#[test]
fn wait_node_is_a_timer() {
    let w = Workflow::parse(&json!({"name": "w", "nodes": [
        {"id": "w", "type": "WAIT", "config": {"duration": "1m"}},
        {"id": "a", "type": "HTTP", "config": {"url": "http://h/a"}}],
        "edges": [{"from": "w", "to": "a"}]}))
    .unwrap();
    let mut s = Sim::new(w);
    let tr = s.apply(Event::RunStarted);
    assert!(tr.dispatch.is_empty());
    let t = s.task("w").clone();
    assert_eq!((t.state, t.wake_at), (TaskState::Waiting, Some(s.now + chrono::Duration::minutes(1))));
    s.now += chrono::Duration::minutes(1);
    let tr = s.apply(Event::TimerFired { task_id: t.id });
    assert_eq!(s.task("w").state, TaskState::Completed);
    assert_eq!(tr.dispatch.len(), 1);
}

/// A tiny deterministic generator so a proptest seed replays a whole schedule.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn random_workflow(n: usize, edge_bits: &[bool], max_attempts: u32) -> Workflow {
    let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
    let mut edges = Vec::new();
    let mut k = 0;
    for i in 0..n {
        for j in i + 1..n {
            if edge_bits[k % edge_bits.len()] {
                edges.push((names[i].as_str(), names[j].as_str()));
            }
            k += 1;
        }
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    wf(&refs, &edges, max_attempts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever order results arrive in, with duplicates, late and stale
    /// copies: each (task, attempt) is applied at most once, no node starts
    /// before its predecessors end, and every run ends.
    #[test]
    fn every_result_is_applied_once_and_every_run_ends(
        n in 1usize..10,
        edge_bits in proptest::collection::vec(any::<bool>(), 1..45),
        max_attempts in 1u32..4,
        seed in 1u64..u64::MAX,
    ) {
        let mut rng = Rng(seed);
        let mut s = Sim::new(random_workflow(n, &edge_bits, max_attempts));
        let mut inbox = vec![Event::RunStarted];
        let mut applied = std::collections::HashSet::new();
        let mut steps = 0;
        while !inbox.is_empty() {
            steps += 1;
            prop_assert!(steps < 10_000, "the run did not converge");
            let event = inbox.swap_remove(rng.below(inbox.len()));
            s.now += chrono::Duration::hours(1);
            let before = s.run.tasks.len();
            let tr = s.apply(event.clone());
            if tr.ignored.is_some() {
                prop_assert!(tr.updated.is_empty() && tr.created.is_empty() && tr.dispatch.is_empty());
                continue;
            }
            if let Event::TaskCompleted { task_id, attempt, .. } | Event::TaskFailed { task_id, attempt, .. } = &event {
                prop_assert!(applied.insert((*task_id, *attempt)), "result applied twice");
            }
            for t in &s.run.tasks[before..] {
                for &e in &s.wf.incoming[t.node] {
                    let from = s.wf.edges[e].from;
                    let pred = s.run.tasks.iter().find(|p| p.node == from);
                    prop_assert!(pred.is_some_and(|p| p.state.is_terminal()), "node started before its predecessor ended");
                }
            }
            for &t in &tr.dispatch {
                let task = &s.run.tasks[t];
                let report = if rng.chance(60) {
                    Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!(t) }
                } else {
                    Event::TaskFailed { task_id: task.id, attempt: task.attempt, error: "e".into(), retryable: rng.chance(70), code: None, status: None, retry_after: None }
                };
                if rng.chance(30) {
                    inbox.push(report.clone());
                }
                inbox.push(report);
            }
            for t in s.run.tasks.iter().filter(|t| t.state == TaskState::Waiting) {
                inbox.push(Event::TimerFired { task_id: t.id });
            }
            if s.run.status == RunStatus::Failed && rng.chance(20) {
                inbox.push(Event::RetryRun);
            }
        }
        prop_assert!(s.run.status.is_terminal(), "run left {:?}", s.run.status);
        prop_assert!(s.run.tasks.iter().all(|t| t.state.is_terminal()));
        match s.run.status {
            RunStatus::Succeeded => {
                prop_assert_eq!(s.run.tasks.len(), s.wf.nodes.len());
                prop_assert!(s.run.tasks.iter().all(|t| t.state == TaskState::Completed));
            }
            RunStatus::Failed => prop_assert!(s.run.tasks.iter().any(|t| t.state == TaskState::Failed)),
            other => prop_assert!(false, "unexpected status {:?}", other),
        }
    }
}

fn parse(v: Value) -> Workflow {
    Workflow::parse(&v).unwrap()
}

#[test]
fn data_flows_from_input_and_outputs_into_config() {
    let mut s = Sim::new(parse(json!({"name": "flow", "nodes": [
        {"id": "a", "type": "HTTP", "config": {"url": "http://h/a"}},
        {"id": "b", "type": "HTTP", "config": {"url": "http://h/b",
            "body": {"x": "${ .input.x }", "from_a": "${ .nodes.a.output.node }", "msg": "a said ${ .nodes.a.output.node }"}}}],
        "edges": [{"from": "a", "to": "b"}]})));
    s.apply(Event::RunStarted);
    s.complete("a");
    assert_eq!(s.task("b").input["body"], json!({"x": 1, "from_a": "a", "msg": "a said a"}));
}

#[test]
fn a_false_branch_is_skipped_and_the_skip_propagates_but_a_join_still_runs() {
    let mut s = Sim::new(parse(json!({"name": "branch", "nodes": [
        {"id": "check", "type": "HTTP", "config": {"url": "http://h/c"}},
        {"id": "yes", "type": "HTTP", "config": {"url": "http://h/y"}},
        {"id": "no", "type": "HTTP", "config": {"url": "http://h/n"}},
        {"id": "after_no", "type": "HTTP", "config": {"url": "http://h/an"}},
        {"id": "join", "type": "HTTP", "config": {"url": "http://h/j"}}],
        "edges": [
            {"from": "check", "to": "yes", "when": ".nodes.check.output.node == \"check\""},
            {"from": "check", "to": "no", "when": ".nodes.check.output.node != \"check\""},
            {"from": "no", "to": "after_no"},
            {"from": "yes", "to": "join"}, {"from": "after_no", "to": "join"}]})));
    s.apply(Event::RunStarted);
    let tr = s.complete("check");
    assert_eq!(tr.dispatch.len(), 1);
    assert_eq!(s.task("yes").state, TaskState::Pending);
    assert_eq!(s.task("no").state, TaskState::Skipped);
    assert_eq!(s.task("after_no").state, TaskState::Skipped, "the skip propagates");
    s.complete("yes");
    assert_eq!(s.task("join").state, TaskState::Pending, "a join with one active edge runs");
    s.complete("join");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn transform_is_computed_in_routing_and_feeds_the_output_mapping() {
    let mut s = Sim::new(parse(json!({"name": "t", "nodes": [
        {"id": "a", "type": "HTTP", "config": {"url": "http://h/a"}},
        {"id": "shape", "type": "TRANSFORM", "config": {"output": {"total": "${ .input.x + 41 }", "who": "${ .nodes.a.output.node }"}}}],
        "edges": [{"from": "a", "to": "shape"}],
        "output": {"result": "${ .nodes.shape.output }"}})));
    s.apply(Event::RunStarted);
    let tr = s.complete("a");
    assert!(tr.dispatch.is_empty(), "a TRANSFORM is never dispatched");
    assert_eq!(s.task("shape").output, Some(json!({"total": 42, "who": "a"})));
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.run.output, Some(json!({"result": {"total": 42, "who": "a"}})));
}

#[test]
fn an_expression_error_fails_the_node_with_its_message() {
    let mut s = Sim::new(parse(json!({"name": "e", "nodes": [
        {"id": "a", "type": "HTTP", "config": {"url": "http://h/a", "body": "${ .input.x | ascii_downcase }"}}]})));
    let tr = s.apply(Event::RunStarted);
    assert!(tr.dispatch.is_empty());
    let a = s.task("a");
    assert_eq!(a.state, TaskState::Failed);
    assert!(a.error.as_deref().unwrap().contains("config"), "{:?}", a.error);
    assert_eq!(s.run.status, RunStatus::Failed);
}

#[test]
fn an_event_completes_its_waiter_and_a_timeout_fails_it() {
    let spec = json!({"name": "ev", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "shipped", "key": "${ .input.x | tostring }", "timeout": "1h"}},
        {"id": "next", "type": "HTTP", "config": {"url": "http://h/n", "body": "${ .nodes.w.output }"}}],
        "edges": [{"from": "w", "to": "next"}]});
    let mut s = Sim::new(parse(spec.clone()));
    s.apply(Event::RunStarted);
    let w = s.task("w").clone();
    assert_eq!((w.state, w.event.clone()), (TaskState::Waiting, Some(("shipped".into(), "1".into()))));
    assert_eq!(w.wake_at, Some(s.now + chrono::Duration::hours(1)));
    let tr = s.apply(Event::EventReceived { task_id: w.id, payload: json!({"carrier": "ups"}) });
    assert_eq!(tr.dispatch.len(), 1);
    assert_eq!(s.task("next").input["body"], json!({"carrier": "ups"}));
    assert!(s.apply(Event::EventReceived { task_id: w.id, payload: json!(2) }).ignored.is_some());

    let mut s = Sim::new(parse(spec));
    s.apply(Event::RunStarted);
    let w = s.task("w").clone();
    s.now += chrono::Duration::hours(1);
    s.apply(Event::TimerFired { task_id: w.id });
    assert_eq!(s.task("w").state, TaskState::Failed);
    assert!(s.task("w").error.as_deref().unwrap().contains("timed out"));
    assert_eq!(s.run.status, RunStatus::Failed);
}

#[test]
fn a_paused_run_lets_started_tasks_finish_and_starts_nothing_new_until_resumed() {
    let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")], 1));
    s.apply(Event::RunStarted);
    assert!(s.apply(Event::PauseRun).ignored.is_none());
    assert_eq!(s.run.status, RunStatus::Paused);
    let tr = s.complete("a");
    assert!(tr.ignored.is_none(), "a started task's result is applied while paused");
    assert_eq!(s.task("a").state, TaskState::Completed);
    assert!(!s.has_task("b") && tr.dispatch.is_empty(), "its successor waits for the resume");
    assert_eq!(s.run.status, RunStatus::Paused, "and the run does not end while paused");
    assert!(s.apply(Event::PauseRun).ignored.is_some(), "pausing twice changes nothing");
    let tr = s.apply(Event::ResumeRun);
    assert_eq!((s.run.status, tr.dispatch.len()), (RunStatus::Running, 1), "resuming starts b");
    assert!(s.apply(Event::ResumeRun).ignored.is_some(), "only a paused run resumes");
    s.complete("b");
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert!(s.apply(Event::PauseRun).ignored.is_some(), "a finished run cannot be paused");
}

#[test]
fn a_retry_due_while_paused_is_held_until_the_resume() {
    let mut s = Sim::new(wf(&["a"], &[], 3));
    s.apply(Event::RunStarted);
    s.fail("a", true);
    s.apply(Event::PauseRun);
    s.now += chrono::Duration::hours(1);
    let id = s.task("a").id;
    let tr = s.apply(Event::TimerFired { task_id: id });
    assert!(tr.dispatch.is_empty(), "no new attempt while paused");
    assert_eq!((s.task("a").state, s.task("a").wake_at), (TaskState::Waiting, None), "held, no timer left to refire");
    let tr = s.apply(Event::ResumeRun);
    assert_eq!(tr.dispatch, vec![0]);
    assert_eq!(s.task("a").attempt, 2);
}

#[test]
fn a_paused_run_can_be_cancelled() {
    let mut s = Sim::new(wf(&["a", "b"], &[("a", "b")], 1));
    s.apply(Event::RunStarted);
    s.apply(Event::PauseRun);
    assert!(s.apply(Event::CancelRun).ignored.is_none());
    assert_eq!((s.run.status, s.task("a").state), (RunStatus::Cancelled, TaskState::Cancelled));
}

#[test]
fn an_attempt_past_its_node_timeout_fails_retryably_and_the_next_gets_a_new_deadline() {
    let w =
        Workflow::parse(&json!({"name": "t", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h/a"},
        "timeout": "30s", "retry": {"max_attempts": 2, "initial_backoff": "1s"}}]}))
        .unwrap();
    let mut s = Sim::new(w);
    s.apply(Event::RunStarted);
    let first_deadline = s.task("a").wake_at.expect("a deadline");
    assert_eq!(first_deadline, s.now + chrono::Duration::seconds(30));
    let id = s.task("a").id;
    assert!(s.apply(Event::TimerFired { task_id: id }).ignored.is_some(), "not before its deadline");
    s.now += chrono::Duration::seconds(31);
    let tr = s.apply(Event::TimerFired { task_id: id });
    assert!(tr.ignored.is_none());
    assert_eq!(s.task("a").state, TaskState::Waiting, "the retry policy applies");
    assert!(s.task("a").error.as_deref().unwrap_or_default().contains("timed out after 30s"));
    s.now += chrono::Duration::seconds(2);
    s.apply(Event::TimerFired { task_id: id });
    assert_eq!((s.task("a").state, s.task("a").attempt), (TaskState::Pending, 2));
    assert_eq!(s.task("a").wake_at, Some(s.now + chrono::Duration::seconds(30)), "a new deadline per attempt");
    s.complete("a");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn a_run_past_its_timeout_fails_and_its_open_tasks_are_cancelled() {
    let w = Workflow::parse(&json!({"name": "t", "timeout": "1m", "nodes": [
        {"id": "w", "type": "WAIT", "config": {"duration": "1h"}}]}))
    .unwrap();
    let mut s = Sim::new(w);
    s.apply(Event::RunStarted);
    assert_eq!(s.run.deadline, Some(s.now + chrono::Duration::minutes(1)));
    assert!(s.apply(Event::RunTimedOut).ignored.is_some(), "not before the deadline");
    s.now += chrono::Duration::seconds(61);
    assert!(s.apply(Event::RunTimedOut).ignored.is_none());
    assert_eq!((s.run.status, s.task("w").state), (RunStatus::Failed, TaskState::Cancelled));
    assert_eq!(s.run.error.as_deref(), Some("run timed out after 1m"));
    assert!(s.apply(Event::RunTimedOut).ignored.is_some(), "once");
}

/// A random DAG whose nodes (HTTP, or SUB_WORKFLOW where `sub_bits` says)
/// have a timeout per attempt, and (sometimes) a timeout for the whole run.
fn random_bounded_workflow(
    n: usize,
    edge_bits: &[bool],
    sub_bits: &[bool],
    max_attempts: u32,
    run_timeout: bool,
) -> Workflow {
    let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
    let nodes: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (kind, config) = if sub_bits[i % sub_bits.len()] {
                ("SUB_WORKFLOW", json!({"workflow": "child", "input": {"n": i}}))
            } else {
                ("HTTP", json!({"url": "http://h/x"}))
            };
            json!({"id": id, "type": kind, "config": config, "timeout": "30m",
                   "retry": {"max_attempts": max_attempts, "initial_backoff": "1s"}})
        })
        .collect();
    let mut edges = Vec::new();
    let mut k = 0;
    for i in 0..n {
        for j in i + 1..n {
            if edge_bits[k % edge_bits.len()] {
                edges.push(json!({"from": names[i], "to": names[j]}));
            }
            k += 1;
        }
    }
    let mut spec = json!({"name": "t", "nodes": nodes, "edges": edges});
    if run_timeout {
        spec["timeout"] = json!("20h");
    }
    Workflow::parse(&spec).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// With SUB_WORKFLOW nodes whose children end (or never do) at random,
    /// attempt deadlines firing, pauses and resumes at random and a run
    /// timeout: still each (task, attempt) ends once — by its report, its
    /// child or its timeout, never two of them — each attempt of a
    /// SUB_WORKFLOW asks for one child, and every run ends.
    #[test]
    fn with_timeouts_and_pauses_every_attempt_ends_once_and_every_run_ends(
        n in 1usize..8,
        edge_bits in proptest::collection::vec(any::<bool>(), 1..30),
        sub_bits in proptest::collection::vec(any::<bool>(), 1..8),
        max_attempts in 1u32..4,
        run_timeout in any::<bool>(),
        seed in 1u64..u64::MAX,
    ) {
        let mut rng = Rng(seed);
        let mut s = Sim::new(random_bounded_workflow(n, &edge_bits, &sub_bits, max_attempts, run_timeout));
        let mut asked = std::collections::HashSet::new();
        let mut inbox = vec![Event::RunStarted];
        let mut ended = std::collections::HashSet::new();
        let mut steps = 0;
        loop {
            if inbox.is_empty() {
                // The world goes on: the timer loop keeps firing what is
                // due, and someone resumes a paused run.
                if s.run.status.is_terminal() {
                    break;
                }
                if s.run.status == RunStatus::Paused {
                    inbox.push(Event::ResumeRun);
                }
                for t in s.run.tasks.iter().filter(|t| t.wake_at.is_some() || t.state == TaskState::Waiting) {
                    inbox.push(Event::TimerFired { task_id: t.id });
                }
                prop_assert!(!inbox.is_empty(), "an open run with nothing that can move it: {:?}", s.run.tasks);
            }
            steps += 1;
            prop_assert!(steps < 20_000, "the run did not converge");
            let event = inbox.swap_remove(rng.below(inbox.len()));
            s.now += chrono::Duration::minutes(20);
            let attempt_of = |s: &Sim, id: Uuid| s.run.tasks.iter().find(|t| t.id == id).map(|t| (t.state, t.attempt));
            let before = match &event {
                Event::TimerFired { task_id } => attempt_of(&s, *task_id),
                _ => None,
            };
            let tr = s.apply(event.clone());
            if tr.ignored.is_some() {
                prop_assert!(tr.updated.is_empty() && tr.created.is_empty() && tr.dispatch.is_empty());
                continue;
            }
            match &event {
                Event::TaskCompleted { task_id, attempt, .. }
                | Event::TaskFailed { task_id, attempt, .. }
                | Event::ChildFinished { task_id, attempt, .. } => {
                    prop_assert!(ended.insert((*task_id, *attempt)), "an attempt ended twice");
                }
                Event::TimerFired { task_id } => {
                    if let Some((TaskState::Pending | TaskState::Running, attempt)) = before {
                        prop_assert!(ended.insert((*task_id, attempt)), "a timed-out attempt ended twice");
                    }
                }
                _ => {}
            }
            for &t in &tr.children {
                let task = &s.run.tasks[t];
                prop_assert!(asked.insert((task.id, task.attempt)), "two children for one attempt");
                // Some children never end: the attempt's deadline ends it.
                if rng.chance(80) {
                    let status = [RunStatus::Succeeded, RunStatus::Failed, RunStatus::Cancelled][rng.below(3)];
                    inbox.push(Event::ChildFinished {
                        task_id: task.id,
                        attempt: task.attempt,
                        iteration: 0,
                        child: Some(Uuid::from_u128(rng.next() as u128)),
                        status,
                        output: Some(json!(t)),
                        error: None,
                    });
                }
                // A worker may try to report for it too; it is refused.
                if rng.chance(10) {
                    inbox.push(Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!("forged") });
                }
            }
            for &t in &tr.dispatch {
                let task = &s.run.tasks[t];
                // Some results never come: the attempt's deadline ends it.
                if rng.chance(80) {
                    let report = if rng.chance(60) {
                        Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!(t) }
                    } else {
                        Event::TaskFailed { task_id: task.id, attempt: task.attempt, error: "e".into(), retryable: rng.chance(70), code: None, status: None, retry_after: None }
                    };
                    inbox.push(report);
                }
            }
            for t in s.run.tasks.iter().filter(|t| t.wake_at.is_some() || t.state == TaskState::Waiting) {
                inbox.push(Event::TimerFired { task_id: t.id });
            }
            if s.run.status == RunStatus::Running && rng.chance(10) {
                inbox.push(Event::PauseRun);
            }
            if s.run.status == RunStatus::Paused && rng.chance(30) {
                inbox.push(Event::ResumeRun);
            }
            if !s.run.status.is_terminal() && s.run.deadline.is_some() {
                inbox.push(Event::RunTimedOut);
            }
        }
        prop_assert!(s.run.status.is_terminal(), "run left {:?}", s.run.status);
        prop_assert!(s.run.tasks.iter().all(|t| t.state.is_terminal()));
        if s.run.status == RunStatus::Failed {
            let timed_out = s.run.error.as_deref().is_some_and(|e| e.starts_with("run timed out"));
            prop_assert!(timed_out || s.run.tasks.iter().any(|t| t.state == TaskState::Failed));
        }
    }
}

// ---- MAP ----

fn map_wf(max_concurrency: Option<u32>, on_item_failure: &str, max_attempts: u32) -> Workflow {
    let mut config = json!({
        "items": "${ .input.orders }",
        "on_item_failure": on_item_failure,
        "node": {"type": "HTTP", "retry": {"max_attempts": max_attempts, "initial_backoff": "1s"},
                 "config": {"url": "http://h/ship", "body": {"order": "${ .item }", "at": "${ .index }"}}}
    });
    if let Some(c) = max_concurrency {
        config["max_concurrency"] = json!(c);
    }
    parse(json!({
        "name": "m",
        "nodes": [
            {"id": "each", "type": "MAP", "config": config},
            {"id": "after", "type": "TRANSFORM", "config": {"output": "${ .nodes.each.output | length }"}}
        ],
        "edges": [{"from": "each", "to": "after"}],
        "output": {"shipped": "${ .nodes.each.output }", "count": "${ .nodes.after.output }"}
    }))
}

impl Sim {
    fn with_input(wf: Workflow, input: Value) -> Sim {
        let mut s = Sim::new(wf);
        s.run.input = input;
        s
    }

    fn item(&self, index: u32) -> &Task {
        self.run.tasks.iter().find(|t| t.item.is_some_and(|i| i.index == index)).expect("item")
    }

    fn items_in(&self, state: TaskState) -> Vec<u32> {
        let mut v: Vec<u32> =
            self.run.tasks.iter().filter(|t| t.state == state).filter_map(|t| t.item.map(|i| i.index)).collect();
        v.sort_unstable();
        v
    }

    fn report_item(&mut self, index: u32, ok: bool) -> Transition {
        let t = self.item(index);
        let e = if ok {
            Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!(format!("shipped {index}")) }
        } else {
            Event::TaskFailed {
                task_id: t.id,
                attempt: t.attempt,
                error: format!("no stock {index}"),
                retryable: false,
                code: None,
                status: None,
                retry_after: None,
            }
        };
        self.apply(e)
    }
}

#[test]
fn a_map_runs_each_item_under_its_concurrency_and_gathers_outputs_in_item_order() {
    let input = json!({"orders": ["a", "b", "c", "d", "e"]});
    let mut e = engine_of(map_wf(Some(2), "fail", 1), input);
    let (tr, _) = e.apply(Event::RunStarted);
    assert_eq!(tr.created.len(), 1 + super::map::ITEM_CHUNK as usize, "the MAP's task and its first chunk of items");
    assert_eq!(tr.sources.len(), 0, "handed to storage (the model took them)");
    assert_eq!(e.sources.values().next().map(Vec::len), Some(5), "the list kept for the items to come");
    assert_eq!(tr.dispatch.len(), 2, "max_concurrency");
    let in_state = |e: &Engine, state: TaskState| -> Vec<u32> {
        let mut v: Vec<u32> =
            e.stored.tasks.iter().filter(|t| t.state == state).filter_map(|t| t.item.map(|i| i.index)).collect();
        v.sort_unstable();
        v
    };
    let item = |e: &Engine, i: u32| e.stored.tasks.iter().find(|t| t.item.is_some_and(|x| x.index == i)).cloned();
    assert_eq!(in_state(&e, TaskState::Pending), vec![0, 1]);
    assert_eq!(in_state(&e, TaskState::Queued), vec![2]);
    assert!(item(&e, 3).is_none(), "item 3 is not created yet");
    let two = item(&e, 2).unwrap();
    assert_eq!(
        two.input,
        json!({"url": "http://h/ship", "body": {"order": "c", "at": 2}, "idempotency_key": format!("{}:1", two.id)})
    );
    // Out of order: each result frees one slot, lowest queued index first,
    // the next chunk created from the list when the created ones ran out.
    let done = |e: &mut Engine, i: u32| {
        let t = item(e, i).unwrap();
        e.apply(Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!(format!("shipped {i}")) })
    };
    done(&mut e, 1);
    assert_eq!(in_state(&e, TaskState::Pending), vec![0, 2]);
    for i in [2, 0, 3, 4] {
        done(&mut e, i);
        let p = e.stored.tasks.iter().find(|t| t.progress.is_some()).unwrap().progress.unwrap();
        assert!(p.open <= 2, "{p:?}");
        assert_eq!(p.queued + p.open + p.completed + p.failed, 5);
    }
    assert_eq!(e.stored.status, RunStatus::Succeeded);
    let shipped: Vec<Value> = (0..5).map(|i| json!(format!("shipped {i}"))).collect();
    assert_eq!(e.stored.output, Some(json!({"shipped": shipped, "count": 5})));
}

#[test]
fn an_empty_list_completes_at_once_with_an_empty_output() {
    let mut s = Sim::with_input(map_wf(None, "fail", 1), json!({"orders": []}));
    s.apply(Event::RunStarted);
    assert_eq!(s.task("each").output, Some(json!([])));
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.run.output, Some(json!({"shipped": [], "count": 0})));
}

#[test]
fn a_map_past_its_trees_fan_out_budget_fails_before_creating_an_item() {
    let mut s = Sim::with_input(map_wf(None, "fail", 1), json!({"orders": ["a", "b", "c"]}));
    s.run.items_left = 2;
    let tr = s.apply(Event::RunStarted);
    assert_eq!(s.run.status, RunStatus::Failed);
    let error = s.task("each").error.clone().unwrap();
    assert!(error.contains("3 items") && error.contains("COMPOSER_MAX_TREE_ITEMS"), "{error}");
    assert!(s.run.tasks.iter().all(|t| t.item.is_none()), "no item was created");
    assert_eq!(tr.dispatch.len(), 0);

    let mut s = Sim::with_input(map_wf(None, "fail", 1), json!({"orders": ["a", "b", "c"]}));
    s.run.items_left = 3;
    s.apply(Event::RunStarted);
    assert_eq!(s.items_in(TaskState::Pending), vec![0, 1, 2], "a budget met exactly is enough");
}

#[test]
fn items_that_are_not_a_list_fail_the_map_naming_the_field() {
    let mut s = Sim::with_input(map_wf(None, "fail", 1), json!({"orders": {"a": 1}}));
    s.apply(Event::RunStarted);
    assert_eq!(s.run.status, RunStatus::Failed);
    assert_eq!(s.task("each").error.as_deref(), Some("config.items: must be a list, got an object"));
}

#[test]
fn the_first_failed_item_fails_the_map_and_cancels_the_rest() {
    let mut s = Sim::with_input(map_wf(Some(2), "fail", 1), json!({"orders": [1, 2, 3, 4]}));
    s.apply(Event::RunStarted);
    let tr = s.report_item(1, false);
    assert!(tr.dispatch.is_empty(), "no more items start");
    assert_eq!(s.task("each").state, TaskState::Failed);
    assert_eq!(s.task("each").error.as_deref(), Some("item 1 failed: no stock 1 (not retryable)"));
    assert_eq!(s.items_in(TaskState::Cancelled), vec![0, 2], "item 3 was never created");
    assert_eq!(s.run.status, RunStatus::Failed);
    assert!(s.run.error.as_deref().unwrap().contains("item 1 failed"));
    assert_eq!(tr.cancel_items.len(), 1, "storage cancels what the machine did not hold");
    assert!(s.report_item(0, true).ignored.is_some(), "a late item result is ignored");
}

#[test]
fn with_on_item_failure_continue_every_item_runs_and_a_failure_is_an_error_entry() {
    let mut s = Sim::with_input(map_wf(Some(1), "continue", 1), json!({"orders": [1, 2, 3]}));
    s.apply(Event::RunStarted);
    s.report_item(0, true);
    s.report_item(1, false);
    s.report_item(2, true);
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.task("each").output, Some(json!(["shipped 0", {"error": "no stock 1 (not retryable)"}, "shipped 2"])));
}

#[test]
fn an_item_retries_under_the_template_policy() {
    let mut s = Sim::with_input(map_wf(None, "fail", 2), json!({"orders": [1]}));
    s.apply(Event::RunStarted);
    let t = s.item(0).clone();
    s.apply(Event::TaskFailed {
        task_id: t.id,
        attempt: 1,
        error: "503".into(),
        retryable: true,
        code: None,
        status: None,
        retry_after: None,
    });
    assert_eq!(s.item(0).state, TaskState::Waiting);
    s.now += chrono::Duration::seconds(2);
    let tr = s.apply(Event::TimerFired { task_id: t.id });
    assert_eq!(tr.dispatch.len(), 1);
    assert_eq!(s.item(0).attempt, 2);
    s.report_item(0, true);
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn a_report_for_the_map_task_itself_is_ignored() {
    let mut s = Sim::with_input(map_wf(None, "fail", 1), json!({"orders": [1]}));
    s.apply(Event::RunStarted);
    let map = s.task("each").clone();
    let tr = s.apply(Event::TaskCompleted { task_id: map.id, attempt: 1, output: json!("forged") });
    assert_eq!(tr.ignored_kind, Some(IgnoreKind::NotDispatched));
    assert_eq!(s.task("each").state, TaskState::Running);
}

#[test]
fn transform_items_complete_when_the_map_starts() {
    let wf = parse(json!({"name": "m", "nodes": [{"id": "sq", "type": "MAP", "config": {
        "items": [1, 2, 3], "node": {"type": "TRANSFORM", "config": {"output": "${ .item * .item + .index }"}}}}]}));
    let mut s = Sim::new(wf);
    s.apply(Event::RunStarted);
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.run.output, Some(json!({"sq": [1, 5, 11]})));
}

/// A run through `simulate` (the whole engine loop: chunks of items,
/// MAPs that carry on), with the state and error of node `node`.
fn simulated(wf: &Workflow, node: &str) -> (RunStatus, String, Option<String>, Option<Value>) {
    let report = crate::simulate::simulate(&sb(), wf, &crate::simulate::Options::default());
    let n = report.nodes.iter().find(|n| n.id == node).unwrap();
    (report.status, n.state.clone(), n.error.clone(), n.output.clone())
}

/// A MAP of TRANSFORM items (which end as they are created) reported
/// SUCCEEDED for failed items: the failure was counted while the MAP filled,
/// and only asked about before.
#[test]
fn a_map_of_transform_items_fails_when_an_item_fails_under_on_item_failure_fail() {
    let items = |on_item_failure: &str, tolerated: Value| {
        let mut config = json!({"items": "${ [range(10)] }", "on_item_failure": on_item_failure,
            "node": {"type": "TRANSFORM", "config": {"output": "${ if .item == 3 then error(\"bad\") else .item end }"}}});
        if !tolerated.is_null() {
            config["tolerated_failures"] = tolerated;
        }
        parse(json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": config}]}))
    };
    let (run, state, error, _) = simulated(&items("fail", Value::Null), "each");
    assert_eq!((run, state.as_str()), (RunStatus::Failed, "FAILED"));
    assert!(error.as_deref().unwrap().contains("item 3 failed"), "{error:?}");
    let mut s = Sim::new(items("fail", Value::Null));
    s.apply(Event::RunStarted);
    let created = s.run.tasks.iter().filter(|t| t.item.is_some()).count();
    assert!(created <= 4 + ITEM_CHUNK as usize, "no item starts past the failure: {created}");

    let (run, state, _, _) = simulated(&items("fail", json!(1)), "each");
    assert_eq!((run, state.as_str()), (RunStatus::Succeeded, "COMPLETED"), "1 tolerated");
    let (run, _, _, _) = simulated(&items("fail", json!("5%")), "each");
    assert_eq!(run, RunStatus::Failed, "1 of 10 is more than 5%");
    let (run, _, _, output) = simulated(&items("continue", Value::Null), "each");
    assert_eq!(run, RunStatus::Succeeded);
    assert!(output.unwrap()[3]["error"].as_str().unwrap().contains("bad"));
}

/// Once an item failed its MAP, the items after it are not evaluated:
/// they are cancelled with the MAP, as queued ones are, even when, like
/// TRANSFORM items, they would end as they are created (found by the
/// three-way failure model: one item past the failure COMPLETED).
#[test]
fn items_after_the_one_that_failed_the_map_are_cancelled_not_evaluated() {
    let wf = parse(json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": [0, 1, 2], "max_concurrency": 1,
        "node": {"type": "TRANSFORM", "config": {"output": "${ if .index == 0 then error(\"no\") else .item end }"}}}}]}));
    let report = crate::simulate::simulate(&sb(), &wf, &crate::simulate::Options::default());
    let states: Vec<&str> = report.nodes[0].items.iter().map(|i| i.state.as_str()).collect();
    assert_eq!(states, ["FAILED", "CANCELLED", "CANCELLED"]);
    assert_eq!(report.status, RunStatus::Failed);
}

/// A retried MAP runs its TRANSFORM items again by evaluating them (over
/// the item each kept), as it did the first time; it sent them to a queue
/// named TRANSFORM, which nothing serves, and the run waited for ever.
#[test]
fn a_retried_map_evaluates_its_transform_items_again_instead_of_dispatching_them() {
    let wf = parse(json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": [0, 1, 2],
        "node": {"type": "TRANSFORM", "config": {"output": "${ if .item == 0 and (.input.ok | not) then error(\"no\") else .item * 10 end }"}}}}]}));
    let mut s = Sim::with_input(wf, json!({"ok": false}));
    s.apply(Event::RunStarted);
    assert_eq!(s.run.status, RunStatus::Failed);
    assert_eq!(s.items_in(TaskState::Cancelled), vec![1, 2], "not evaluated past the failure");
    let tr = s.apply(Event::RetryRun);
    assert!(tr.dispatch.is_empty(), "a TRANSFORM item is never dispatched: {:?}", tr.dispatch);
    assert_eq!(s.run.status, RunStatus::Failed, "evaluated again, and failed again: not left waiting");
    assert_eq!(s.items_in(TaskState::Failed), vec![0]);
    assert_eq!(s.item(0).attempt, 2);
    // Given what it lacked, the retry completes every item.
    s.run.input = json!({"ok": true});
    s.apply(Event::RetryRun);
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.task("each").output, Some(json!([0, 10, 20])));
}

/// Every item of a MAP of TRANSFORMs failing (each output over its share
/// of the collected output: 7 items, as many as one event creates under
/// test, of 150,000 bytes under 1 MiB) reported SUCCEEDED too.
#[test]
fn a_map_whose_every_transform_item_is_over_its_share_fails() {
    assert_eq!(ITEMS_PER_EVENT, 7);
    let wf = parse(json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(7)] }", "node": {"type": "TRANSFORM", "config": {"output": "${ \"x\" * 150000 }"}}}}]}));
    let (run, state, error, _) = simulated(&wf, "each");
    assert_eq!((run, state.as_str()), (RunStatus::Failed, "FAILED"));
    assert!(error.as_deref().unwrap().contains("share"), "{error:?}");
}

/// A `collect.reduce` that errors (or builds an accumulator past the payload
/// limit) was dropped and the run SUCCEEDED with what it had.
#[test]
fn a_failing_collect_reduce_fails_the_map_and_the_run() {
    let reducing = |reduce: &str, init: Value, items: Value, output: &str| {
        parse(json!({"name": "m", "nodes": [{"id": "m", "type": "MAP", "config": {"items": items,
            "collect": {"reduce": reduce, "init": init},
            "node": {"type": "TRANSFORM", "config": {"output": output}}}}]}))
    };
    for (reduce, init) in [("error(\"boom\")", json!(0)), (".acc + \"s\"", json!(0))] {
        let (run, state, error, _) = simulated(&reducing(reduce, init, json!([1, 2, 3]), "${ .item }"), "m");
        assert_eq!((run, state.as_str()), (RunStatus::Failed, "FAILED"), "{reduce}");
        assert!(error.as_deref().unwrap().contains("collect.reduce at item 0"), "{reduce}: {error:?}");
    }
    let growing = reducing(".acc + [.item.output]", json!([]), json!("${ [range(300)] }"), "${ \"x\" * 4000 }");
    let (run, state, error, _) = simulated(&growing, "m");
    assert_eq!((run, state.as_str()), (RunStatus::Failed, "FAILED"));
    assert!(error.as_deref().unwrap().contains("collect.reduce"), "{error:?}");
}

#[test]
fn a_paused_map_starts_no_item_until_resumed() {
    let mut s = Sim::with_input(map_wf(Some(1), "fail", 1), json!({"orders": [1, 2]}));
    s.apply(Event::RunStarted);
    s.apply(Event::PauseRun);
    let tr = s.report_item(0, true);
    assert!(tr.dispatch.is_empty(), "the running item's result is applied; the next waits");
    assert_eq!(s.items_in(TaskState::Queued), vec![1]);
    let tr = s.apply(Event::ResumeRun);
    assert_eq!(tr.dispatch.len(), 1);
    s.report_item(1, true);
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn retrying_a_run_reruns_the_items_that_did_not_complete_and_keeps_the_others() {
    let mut s = Sim::with_input(map_wf(Some(1), "fail", 1), json!({"orders": [1, 2, 3]}));
    s.apply(Event::RunStarted);
    s.report_item(0, true);
    s.report_item(1, false);
    assert_eq!(s.run.status, RunStatus::Failed);
    let tr = s.apply(Event::RetryRun);
    assert!(tr.ignored.is_none());
    assert_eq!(s.items_in(TaskState::Pending), vec![1]);
    assert_eq!(s.item(1).attempt, 2);
    s.report_item(1, true);
    s.report_item(2, true);
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.task("each").output, Some(json!(["shipped 0", "shipped 1", "shipped 2"])));
}

#[test]
fn cancelling_a_run_ends_its_map_and_items() {
    let mut s = Sim::with_input(map_wf(Some(1), "fail", 1), json!({"orders": [1, 2]}));
    s.apply(Event::RunStarted);
    let tr = s.apply(Event::CancelRun);
    assert_eq!(s.task("each").state, TaskState::Cancelled);
    assert!(s.run.tasks.iter().all(|t| t.state.is_terminal()));
    assert_eq!(tr.cancel_items.len(), 1);
}

/// The engine's view of a run: it holds node tasks and only the items an
/// event names, and loads more when the machine asks ([`Need`]). This model
/// keeps the whole run as "storage" and hands the machine what the engine
/// would, then writes back what the transition says it changed, and cancels
/// in storage as the writer does. With `in_part`, it reads the run as the
/// engine reads a large one: whole the first time, then, for the events that
/// read in part, only the open and failed node tasks and those named, and the
/// nodes the machine says it misses ([`Transition::missing`]).
struct Engine {
    wf: Workflow,
    stored: Run,
    now: DateTime<Utc>,
    next: u128,
    /// The lists of MAPs with items still to create, by index, by MAP task.
    sources: std::collections::HashMap<Uuid, Vec<Value>>,
    in_part: bool,
    /// Whether the run was loaded before (the first load is whole).
    seen: bool,
    /// Applications the machine voided for want of a node's tasks.
    voided: usize,
    /// Whether it leaves values unread as the engine does: for a step's own
    /// news, the run's input and every ended node task's input and output
    /// are handed over as references, read when the machine says it needs
    /// one ([`Transition::unread`]).
    unread: bool,
    /// The values handed over as references, by the number each names.
    kept: Vec<Value>,
    /// Applications the machine voided for want of a value left unread.
    reread: usize,
}

impl Engine {
    fn view(&mut self, named: Option<Uuid>, event: &Event) -> Run {
        self.view_of(&named.into_iter().collect::<Vec<_>>(), std::slice::from_ref(event))
    }

    fn view_of(&mut self, named: &[Uuid], events: &[Event]) -> Run {
        let mut run = self.stored.clone();
        let maps_of_retry = events.iter().any(|e| matches!(e, Event::RetryRun));
        let resume = events.iter().any(|e| matches!(e, Event::ResumeRun));
        let part = self.in_part && self.seen && events.iter().all(Event::reads_in_part);
        run.tasks.retain(|t| match t.item {
            Some(_) => {
                named.contains(&t.id)
                    || maps_of_retry
                    || (resume && t.state == TaskState::Waiting && t.wake_at.is_none())
            }
            None => {
                !part
                    || named.contains(&t.id)
                    || !matches!(t.state, TaskState::Completed | TaskState::Skipped | TaskState::Cancelled)
            }
        });
        // Runs read in part gather a MAP's output from storage, as the
        // engine's do; the others from the items loaded.
        run.collects_in_storage = part;
        if self.unread && self.wf.hooks.is_empty() && events.iter().all(Event::reads_in_part) {
            let mut keep = |v: &mut Value| {
                let real = std::mem::replace(v, json!({crate::storable::OFFLOADED_KEY: {"n": self.kept.len()}}));
                self.kept.push(real);
            };
            keep(&mut run.input);
            for t in run.tasks.iter_mut().filter(|t| t.item.is_none() && t.state.is_terminal()) {
                keep(&mut t.input);
                if let Some(output) = &mut t.output {
                    keep(output);
                }
            }
            run.unread = true;
        }
        if part {
            let mut known = vec![false; self.wf.nodes.len()];
            for t in run.tasks.iter().filter(|t| t.item.is_none()) {
                known[t.node] = true;
            }
            run.known = Some(known);
        }
        run
    }

    fn load(&self, run: &mut Run, need: Need) -> usize {
        let held: std::collections::HashSet<Uuid> = run.tasks.iter().map(|t| t.id).collect();
        let (map, count) = match need {
            Need::Queued { map, count } => (map, count as usize),
            Need::All { map } => (map, usize::MAX),
            Need::Sources { .. } | Need::Collect { .. } => unreachable!("not a load of items"),
        };
        let mut rows: Vec<Task> = self
            .stored
            .tasks
            .iter()
            .filter(|t| t.item.is_some_and(|i| i.map == map) && !held.contains(&t.id))
            .filter(|t| matches!(need, Need::All { .. }) || t.state == TaskState::Queued)
            .cloned()
            .collect();
        rows.sort_by_key(|t| t.item.map(|i| i.index));
        rows.truncate(count);
        let n = rows.len();
        run.tasks.extend(rows);
        n
    }

    /// MAP `map`'s output as storage gathers it: each item's entry, the
    /// run's copy of the item if it holds one, else the stored one.
    fn collect(&self, run: &Run, map: Uuid, share: usize) -> Value {
        let of = |tasks: &[Task], index: u32| {
            tasks.iter().find(|t| t.item.is_some_and(|i| i.map == map && i.index == index)).cloned()
        };
        let total = run.task(map).and_then(|t| t.progress).expect("a MAP that collects").total;
        let entries = (0..total).map(|index| {
            let t = of(&run.tasks, index).or_else(|| of(&self.stored.tasks, index)).expect("every item stored");
            super::collected_entry(t.state, t.output, t.error.as_deref(), share)
        });
        Value::Array(entries.collect())
    }

    /// The machine's `apply`, and for a run in part, as the engine does:
    /// while it misses nodes' tasks, the transition is dropped, the run put
    /// back, the tasks added (then every node still missing) and the event
    /// applied again, minting the same ids.
    fn apply_loading(&mut self, run: &mut Run, event: Event) -> Transition {
        if !run.unread {
            return self.apply_loading_nodes(run, event);
        }
        let (before, next) = (run.clone(), self.next);
        let tr = self.apply_loading_nodes(run, event.clone());
        if !tr.unread {
            return tr;
        }
        self.reread += 1;
        (*run, self.next) = (before, next);
        self.read_unread(run);
        let tr = self.apply_loading_nodes(run, event);
        assert!(!tr.unread, "a value read is still unread");
        tr
    }

    /// Every reference in `run` replaced by the value it stands for.
    fn read_unread(&self, run: &mut Run) {
        let read = |v: &mut Value| {
            if crate::storable::is_reference(v) {
                let n = v[crate::storable::OFFLOADED_KEY]["n"].as_u64().expect("a reference of the model") as usize;
                *v = self.kept[n].clone();
            }
        };
        read(&mut run.input);
        for t in run.tasks.iter_mut() {
            read(&mut t.input);
            if let Some(output) = &mut t.output {
                read(output);
            }
        }
        run.unread = false;
    }

    /// [`Engine::apply_loading`] for a run that left no value unread.
    fn apply_loading_nodes(&mut self, run: &mut Run, event: Event) -> Transition {
        let mut rounds = 0;
        loop {
            let (before, next) = (run.clone(), self.next);
            let counter = &mut self.next;
            let mut ids = || {
                *counter += 1;
                Uuid::from_u128(*counter)
            };
            let tr = apply(&sb(), &self.wf, run, event.clone(), self.now, &mut ids);
            if tr.missing.is_empty() {
                return tr;
            }
            self.voided += 1;
            (*run, self.next) = (before, next);
            let known = run.known.as_mut().expect("only a run in part misses tasks");
            let missing: Vec<usize> = match rounds {
                0 => tr.missing,
                _ => (0..known.len()).filter(|&n| !known[n]).collect(),
            };
            rounds += 1;
            assert!(!missing.is_empty(), "the machine misses nodes that are all loaded");
            for &n in &missing {
                assert!(!known[n], "node {n} was asked for twice");
                known[n] = true;
            }
            let have: std::collections::HashSet<Uuid> = run.tasks.iter().map(|t| t.id).collect();
            let more = self.stored.tasks.iter().filter(|t| t.item.is_none() && missing.contains(&t.node));
            let more: Vec<Task> = more.filter(|t| !have.contains(&t.id)).cloned().collect();
            run.tasks.extend(more);
        }
    }

    fn apply(&mut self, event: Event) -> (Transition, Run) {
        let (mut each, run) = self.apply_all(&[event]);
        (each.pop().expect("one event"), run)
    }

    /// Applies a batch of events to the run in one load, as the engine does
    /// with the events of one run in one transaction; each event's
    /// transition, and the run as the batch left it.
    fn apply_all(&mut self, events: &[Event]) -> (Vec<Transition>, Run) {
        let mut named: Vec<Uuid> = events.iter().flat_map(Event::task_ids).collect();
        named.extend(events.iter().filter_map(|e| match e {
            Event::ItemsLoaded { task_id } => Some(*task_id),
            _ => None,
        }));
        let mut run = self.view_of(&named, events);
        self.seen = true;
        let mut all = Transition::default();
        let mut each = Vec::new();
        for event in events {
            let mut tr = self.apply_loading(&mut run, event.clone());
            loop {
                let needs: Vec<Need> = std::mem::take(&mut tr.effects)
                    .into_iter()
                    .filter_map(|e| match e {
                        Effect::LoadItems(need) => Some(need),
                        Effect::TakeBufferedEvent { .. } => None,
                    })
                    .collect();
                if needs.is_empty() {
                    break;
                }
                for need in needs {
                    let map = match need {
                        Need::Queued { map, .. } | Need::All { map } => map,
                        Need::Collect { map, share } => {
                            let output = self.collect(&run, map, share);
                            let more = self.apply_loading(&mut run, Event::ItemsCollected { task_id: map, output });
                            tr.merge(more);
                            continue;
                        }
                        Need::Sources { map, from, count } => {
                            let list = self.sources.get(&map).expect("the list of a MAP that asks for it");
                            let items = list[from as usize..(from + count) as usize].to_vec();
                            let loaded = Event::SourcesLoaded { task_id: map, from, items };
                            let more = self.apply_loading(&mut run, loaded);
                            tr.merge(more);
                            continue;
                        }
                    };
                    assert!(self.load(&mut run, need) > 0, "a need storage cannot meet: {need:?}");
                    let more = self.apply_loading(&mut run, Event::ItemsLoaded { task_id: map });
                    tr.merge(more);
                }
            }
            for (m, first, rest) in std::mem::take(&mut tr.sources) {
                let mut list = vec![Value::Null; (first * super::map::ITEM_CHUNK) as usize];
                list.extend(rest);
                self.sources.insert(run.tasks[m].id, list);
            }
            all.merge(tr.clone());
            each.push(tr);
        }
        // Write back: the writer's bulk cancel first, then the changes (a
        // task taken out of the run is deleted).
        let written: std::collections::HashSet<Uuid> =
            all.updated.iter().chain(&all.created).map(|&i| run.tasks[i].id).collect();
        for &m in &all.cancel_items {
            let map = run.tasks[m].id;
            for t in self.stored.tasks.iter_mut() {
                if t.item.is_some_and(|i| i.map == map) && !t.state.is_terminal() && !written.contains(&t.id) {
                    t.state = TaskState::Cancelled;
                    t.wake_at = None;
                }
            }
        }
        // What it kept unread and did not change is written back as it
        // was (the engine writes the reference, which names the same value).
        for &i in &all.created {
            let t = &run.tasks[i];
            let values = std::iter::once(&t.input).chain(&t.output);
            assert!(!values.into_iter().any(crate::storable::is_reference), "a new task holds a value left unread");
        }
        let mut written_run = run.clone();
        self.read_unread(&mut written_run);
        for &i in all.updated.iter().chain(&all.created) {
            let task = written_run.tasks[i].clone();
            match self.stored.tasks.iter().position(|t| t.id == task.id) {
                Some(at) if task.removed => {
                    self.stored.tasks.remove(at);
                }
                Some(at) => self.stored.tasks[at] = task,
                None if task.removed => {}
                None => self.stored.tasks.push(task),
            }
        }
        self.stored.status = run.status;
        self.stored.output = run.output.clone();
        self.stored.error = run.error.clone();
        self.stored.deadline = run.deadline;
        (each, run)
    }
}

fn random_map_workflow(max_concurrency: Option<u32>, continue_on_failure: bool, max_attempts: u32) -> Workflow {
    let mut config = json!({
        "items": "${ .input.items }",
        "on_item_failure": if continue_on_failure { "continue" } else { "fail" },
        "node": {"type": "HTTP", "timeout": "30m", "retry": {"max_attempts": max_attempts, "initial_backoff": "1s"},
                 "config": {"url": "http://h/${ .item }"}}
    });
    if let Some(c) = max_concurrency {
        config["max_concurrency"] = json!(c);
    }
    parse(json!({
        "name": "pm",
        "nodes": [
            {"id": "first", "type": "HTTP", "config": {"url": "http://h/first"}, "timeout": "30m",
             "retry": {"max_attempts": 2}},
            {"id": "each", "type": "MAP", "config": config},
            {"id": "last", "type": "HTTP", "config": {"url": "http://h/last"}, "timeout": "30m"}
        ],
        "edges": [{"from": "first", "to": "each"}, {"from": "each", "to": "last"}],
    }))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A MAP driven the way the engine drives it (partial loads, needs,
    /// bulk cancels) under random results, timeouts, pauses, cancels and
    /// retries: every (task, attempt) ends once, the concurrency holds, the
    /// counts match the stored items, the output has one entry per item in
    /// item order, and every run ends.
    #[test]
    fn a_map_driven_like_the_engine_applies_each_item_result_once_and_ends(
        items in 0usize..12,
        max_concurrency in proptest::option::of(1u32..5),
        continue_on_failure in any::<bool>(),
        max_attempts in 1u32..3,
        seed in 1u64..u64::MAX,
    ) {
        let mut rng = Rng(seed);
        let wf = random_map_workflow(max_concurrency, continue_on_failure, max_attempts);
        let input = json!({"items": (0..items).collect::<Vec<_>>()});
        let mut e = engine_of(wf, input);
        let mut inbox = vec![Event::RunStarted];
        let mut ended = std::collections::HashSet::new();
        let mut retried = false;
        let mut steps = 0;
        loop {
            if inbox.is_empty() {
                match e.stored.status {
                    RunStatus::Failed if !retried && rng.chance(50) => {
                        retried = true;
                        inbox.push(Event::RetryRun);
                    }
                    s if s.is_terminal() => break,
                    RunStatus::Paused => inbox.push(Event::ResumeRun),
                    _ => {}
                }
                for t in e.stored.tasks.iter().filter(|t| t.wake_at.is_some() || t.state == TaskState::Waiting) {
                    inbox.push(Event::TimerFired { task_id: t.id });
                }
                prop_assert!(!inbox.is_empty(), "an open run that nothing can move: {:?}", e.stored.tasks);
            }
            steps += 1;
            prop_assert!(steps < 20_000, "the run did not converge");
            let event = inbox.swap_remove(rng.below(inbox.len()));
            e.now += chrono::Duration::minutes(20);
            let before = event.task_id().and_then(|id| e.stored.tasks.iter().find(|t| t.id == id)).map(|t| (t.state, t.attempt));
            let (tr, run) = e.apply(event.clone());
            if tr.ignored.is_some() {
                prop_assert!(tr.updated.is_empty() && tr.created.is_empty() && tr.dispatch.is_empty());
                continue;
            }
            match &event {
                Event::TaskCompleted { task_id, attempt, .. } | Event::TaskFailed { task_id, attempt, .. } => {
                    prop_assert!(ended.insert((*task_id, *attempt)), "an attempt ended twice");
                }
                Event::TimerFired { task_id } => {
                    if let Some((TaskState::Pending | TaskState::Running, attempt)) = before {
                        prop_assert!(ended.insert((*task_id, attempt)), "a timed-out attempt ended twice");
                    }
                }
                _ => {}
            }
            for &t in &tr.dispatch {
                let task = &run.tasks[t];
                if rng.chance(85) {
                    inbox.push(if rng.chance(70) {
                        Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!(task.item.map(|i| i.index)) }
                    } else {
                        Event::TaskFailed { task_id: task.id, attempt: task.attempt, error: "e".into(), retryable: rng.chance(60), code: None, status: None, retry_after: None }
                    });
                }
            }
            // What storage says must agree with the MAP's counts.
            if let Some(map) = e.stored.tasks.iter().find(|t| t.progress.is_some()) {
                let p = map.progress.unwrap();
                let of = |f: &dyn Fn(TaskState) -> bool| {
                    e.stored.tasks.iter().filter(|t| t.item.is_some_and(|i| i.map == map.id) && f(t.state)).count() as u32
                };
                prop_assert_eq!(p.total as usize, items);
                if !map.state.is_terminal() {
                    prop_assert_eq!(of(&|s| s == TaskState::Queued) + p.total - p.created(), p.queued);
                    prop_assert!(of(&|_| true) <= p.created(), "no more items stored than created");
                    prop_assert_eq!(of(&|s| matches!(s, TaskState::Pending | TaskState::Running | TaskState::Waiting)), p.open);
                    prop_assert_eq!(of(&|s| s == TaskState::Completed), p.completed);
                    prop_assert!(p.open <= max_concurrency.unwrap_or(u32::MAX));
                }
            }
            if e.stored.status == RunStatus::Running && rng.chance(8) {
                inbox.push(Event::PauseRun);
            }
            if e.stored.status == RunStatus::Paused && rng.chance(30) {
                inbox.push(Event::ResumeRun);
            }
            if !e.stored.status.is_terminal() && rng.chance(1) {
                inbox.push(Event::CancelRun);
            }
        }
        prop_assert!(e.stored.status.is_terminal());
        prop_assert!(e.stored.tasks.iter().all(|t| t.state.is_terminal()), "open: {:?}", e.stored.tasks);
        let map = e.wf.node_index("each").unwrap();
        if let Some(m) = e.stored.tasks.iter().find(|t| t.node == map && t.state == TaskState::Completed) {
            let out = m.output.as_ref().and_then(Value::as_array).unwrap();
            prop_assert_eq!(out.len(), items);
            for (i, entry) in out.iter().enumerate() {
                prop_assert!(entry == &json!(i) || entry.get("error").is_some(), "entry {} is {}", i, entry);
                if !continue_on_failure {
                    prop_assert_eq!(entry, &json!(i));
                }
            }
        }
    }
}

#[test]
fn an_item_result_needs_only_that_item_until_the_next_must_start_or_the_output_gathers() {
    let wf = map_wf(Some(1), "fail", 1);
    let input = json!({"orders": ["a", "b", "c"]});
    let mut e = engine_of(wf, input);
    e.apply(Event::RunStarted);
    let item =
        |e: &Engine, i: u32| e.stored.tasks.iter().find(|t| t.item.is_some_and(|x| x.index == i)).unwrap().clone();
    // Without storage behind it, the machine asks for the next item.
    let first = item(&e, 0);
    let mut bare = e.view(Some(first.id), &Event::RunStarted);
    let done = Event::TaskCompleted { task_id: first.id, attempt: 1, output: json!(0) };
    let tr = apply(&sb(), &e.wf, &mut bare, done.clone(), e.now, &mut || Uuid::from_u128(999));
    let map = e.stored.tasks.iter().find(|t| t.progress.is_some()).unwrap().id;
    assert_eq!(tr.effects, vec![Effect::LoadItems(Need::Queued { map, count: 1 })]);
    assert_eq!(bare.tasks.len(), 2, "the MAP's task and the one item named");
    // Driven like the engine, the same result starts item 1.
    let (tr, _) = e.apply(done);
    assert_eq!(tr.dispatch.len(), 1);
    assert_eq!(item(&e, 1).state, TaskState::Pending);
    e.apply(Event::TaskCompleted { task_id: item(&e, 1).id, attempt: 1, output: json!(1) });
    // The last result needs every item, to gather the output in order.
    let last = item(&e, 2);
    let mut bare = e.view(Some(last.id), &Event::RunStarted);
    let done = Event::TaskCompleted { task_id: last.id, attempt: 1, output: json!(2) };
    let tr = apply(&sb(), &e.wf, &mut bare, done.clone(), e.now, &mut || Uuid::from_u128(998));
    assert_eq!(tr.effects, vec![Effect::LoadItems(Need::All { map })]);
    e.apply(done);
    assert_eq!(e.stored.status, RunStatus::Succeeded);
    assert_eq!(e.stored.output, Some(json!({"shipped": [0, 1, 2], "count": 3})));
}

// ---- SUB_WORKFLOW ----

fn sub_wf(max_attempts: u32) -> Workflow {
    parse(json!({"name": "parent", "nodes": [
        {"id": "bill", "type": "SUB_WORKFLOW", "retry": {"max_attempts": max_attempts, "initial_backoff": "1s"},
         "config": {"workflow": "billing", "version": 3, "input": {"customer": "${ .input.x }"}}}]}))
}

fn child_done(s: &Sim, node: &str, status: RunStatus, output: Option<Value>) -> Event {
    let t = s.task(node);
    Event::ChildFinished {
        task_id: t.id,
        attempt: t.attempt,
        iteration: 0,
        child: Some(Uuid::from_u128(77)),
        status,
        output,
        error: (status != RunStatus::Succeeded).then(|| "card declined".to_string()),
    }
}

#[test]
fn a_sub_workflow_asks_for_its_child_and_takes_the_child_output() {
    let mut s = Sim::new(sub_wf(1));
    let tr = s.apply(Event::RunStarted);
    assert_eq!(tr.children, vec![0], "one child for the attempt");
    assert!(tr.dispatch.is_empty(), "no worker runs it");
    assert_eq!(s.task("bill").state, TaskState::Running);
    assert_eq!(s.task("bill").input, json!({"workflow": "billing", "version": 3, "input": {"customer": 1}}));
    s.apply(child_done(&s, "bill", RunStatus::Succeeded, Some(json!({"paid": true}))));
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.run.output, Some(json!({"bill": {"paid": true}})));
}

#[test]
fn a_failed_child_fails_the_attempt_and_the_retry_asks_for_a_new_child() {
    let mut s = Sim::new(sub_wf(2));
    s.apply(Event::RunStarted);
    s.apply(child_done(&s, "bill", RunStatus::Failed, None));
    let bill = s.task("bill").clone();
    assert_eq!(bill.state, TaskState::Waiting);
    assert!(bill.error.as_deref().unwrap().contains("FAILED: card declined"), "{:?}", bill.error);
    s.now += chrono::Duration::seconds(2);
    let tr = s.apply(Event::TimerFired { task_id: bill.id });
    assert_eq!(tr.children, vec![0]);
    assert_eq!(s.task("bill").attempt, 2);
    let stale = Event::ChildFinished {
        task_id: bill.id,
        attempt: 1,
        iteration: 0,
        child: Some(Uuid::from_u128(77)),
        status: RunStatus::Succeeded,
        output: None,
        error: None,
    };
    assert_eq!(s.apply(stale).ignored_kind, Some(IgnoreKind::StaleAttempt), "the first child's late end");
    s.apply(child_done(&s, "bill", RunStatus::Cancelled, None));
    assert_eq!(s.run.status, RunStatus::Failed);
    assert!(s.run.error.as_deref().unwrap().contains("CANCELLED"));
}

#[test]
fn a_child_that_cannot_start_fails_the_node_for_good() {
    let mut s = Sim::new(sub_wf(5));
    s.apply(Event::RunStarted);
    let t = s.task("bill").clone();
    s.apply(Event::ChildFinished {
        task_id: t.id,
        attempt: 1,
        iteration: 0,
        child: None,
        status: RunStatus::Failed,
        output: None,
        error: Some("workflow \"billing\" version 3 is not registered".into()),
    });
    assert_eq!(s.task("bill").state, TaskState::Failed);
    assert_eq!(s.run.status, RunStatus::Failed);
}

#[test]
fn a_worker_cannot_report_for_a_sub_workflow_task() {
    let mut s = Sim::new(sub_wf(1));
    s.apply(Event::RunStarted);
    let t = s.task("bill").clone();
    let forged = s.apply(Event::TaskCompleted { task_id: t.id, attempt: 1, output: json!("forged") });
    assert_eq!(forged.ignored_kind, Some(IgnoreKind::NotDispatched));
    let forged = s.apply(Event::TaskFailed {
        task_id: t.id,
        attempt: 1,
        error: "x".into(),
        retryable: false,
        code: None,
        status: None,
        retry_after: None,
    });
    assert_eq!(forged.ignored_kind, Some(IgnoreKind::NotDispatched));
    assert_eq!(s.task("bill").state, TaskState::Running);
}

#[test]
fn a_map_of_sub_workflows_asks_for_a_child_per_started_item() {
    let wf = parse(json!({"name": "fan", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": [1, 2, 3], "max_concurrency": 2,
        "node": {"type": "SUB_WORKFLOW", "config": {"workflow": "one", "input": {"n": "${ .item }"}}}}}]}));
    let mut s = Sim::new(wf);
    let tr = s.apply(Event::RunStarted);
    assert_eq!(tr.children.len(), 2);
    assert_eq!(s.item(1).input, json!({"workflow": "one", "input": {"n": 2}}));
    let first = s.item(0).clone();
    let tr = s.apply(Event::ChildFinished {
        task_id: first.id,
        attempt: 1,
        iteration: 0,
        child: Some(Uuid::from_u128(5)),
        status: RunStatus::Succeeded,
        output: Some(json!("ok")),
        error: None,
    });
    assert_eq!(tr.children.len(), 1, "the next item's child");
}

#[test]
fn a_queued_run_does_not_start_until_the_engine_makes_it_running_and_can_be_cancelled() {
    let mut s = Sim::new(wf(&["a"], &[], 1));
    s.run.status = RunStatus::Queued;
    assert!(!RunStatus::Queued.is_terminal());
    assert!(s.apply(Event::RunStarted).ignored.is_some(), "started only once promoted");
    assert!(s.apply(Event::PauseRun).ignored.is_some(), "nothing to pause");
    let tr = s.apply(Event::CancelRun);
    assert!(tr.run_changed);
    assert_eq!(s.run.status, RunStatus::Cancelled);
}

#[test]
fn what_a_commit_owes_other_runs_is_computed_from_the_run_as_it_then_stands() {
    let mut s = Sim::new(sub_wf(2));
    let tr = s.apply(Event::RunStarted);
    let bill = s.task("bill").clone();
    assert_eq!(
        after_commit(&s.wf, &s.run, &tr),
        vec![AfterCommit::StartChild { task_id: bill.id, attempt: 1, iteration: 0 }],
        "a first attempt: its child, and no older child to cancel"
    );
    // The child failed: the attempt waits for its retry and cancels what
    // the failed attempt left open.
    let tr = s.apply(child_done(&s, "bill", RunStatus::Failed, None));
    assert_eq!(
        after_commit(&s.wf, &s.run, &tr),
        vec![AfterCommit::CancelChildren { task_id: bill.id, attempt: 1, iteration: 0, current: true }]
    );

    // A child run tells its parent how it ended, and frees its slot.
    let mut child = Sim::new(wf(&["a"], &[], 1));
    let parent = ParentRef { run_id: Uuid::from_u128(9), task_id: bill.id, attempt: 1, iteration: 0 };
    child.run.parent = Some(parent);
    child.run.concurrency_key = Some("k".into());
    child.apply(Event::RunStarted);
    let tr = child.complete("a");
    let owed = after_commit(&child.wf, &child.run, &tr);
    assert!(
        matches!(&owed[0], AfterCommit::NotifyParent { parent_run, event: Event::ChildFinished { status: RunStatus::Succeeded, .. } } if *parent_run == parent.run_id),
        "{owed:?}"
    );
    assert_eq!(owed[1], AfterCommit::FreeSlot { workflow: "t".into(), key: "k".into() });
}

#[test]
fn a_task_that_begins_to_wait_for_an_event_asks_for_one_that_came_first() {
    let wf = Workflow::parse(&json!({"name": "e", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "${ .input.x }"}}]}))
    .unwrap();
    let mut s = Sim::new(wf);
    let tr = s.apply(Event::RunStarted);
    let w = s.task("w").id;
    assert_eq!(tr.effects, vec![Effect::TakeBufferedEvent { task_id: w, event: "paid".into(), key: "1".into() }]);
}

/// `charge` fails for good unless told otherwise; `refund` follows its
/// failure, `ship` its success, `note` always runs after it.
fn order_wf(extra: Value) -> Workflow {
    let http = |id: &str| {
        json!({"id": id, "type": "HTTP", "config": {"url": format!("http://h/{id}")},
                                 "retry": {"max_attempts": 1}})
    };
    let mut spec = json!({"name": "order", "nodes": [http("charge"), http("ship"), http("refund"), http("note"),
        {"id": "failed", "type": "FAIL", "config": {"message": "refunded ${ .nodes.charge.error.status }", "code": "refunded"}}],
        "edges": [{"from": "charge", "to": "ship"},
                  {"from": "charge", "to": "refund", "on": "failure"},
                  {"from": "charge", "to": "note", "on": "always"},
                  {"from": "refund", "to": "failed"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    parse(spec)
}

fn http_failure(s: &mut Sim, node: &str, status: u16) -> Transition {
    let t = s.task(node);
    let e = Event::TaskFailed {
        task_id: t.id,
        attempt: t.attempt,
        error: format!("POST answered {status}"),
        retryable: false,
        code: Some(codes::HTTP_STATUS.into()),
        status: Some(status),
        retry_after: None,
    };
    s.apply(e)
}

#[test]
fn a_failure_edge_takes_a_failed_node_to_its_handler_which_sees_the_error() {
    let mut s = Sim::new(order_wf(json!({"nodes": [
        {"id": "charge", "type": "HTTP", "config": {"url": "http://h/c"}, "retry": {"max_attempts": 1}},
        {"id": "ship", "type": "HTTP", "config": {"url": "http://h/s"}},
        {"id": "refund", "type": "HTTP", "config": {"url": "http://h/r", "body": {"why": "${ .nodes.charge.error }"}}},
        {"id": "note", "type": "HTTP", "config": {"url": "http://h/n", "body": "${ .nodes.charge.state }"}}],
        "edges": [{"from": "charge", "to": "ship"}, {"from": "charge", "to": "refund", "on": "failure"},
                  {"from": "charge", "to": "note", "on": "always"}]})));
    s.apply(Event::RunStarted);
    let tr = http_failure(&mut s, "charge", 402);
    assert_eq!(s.task("ship").state, TaskState::Skipped, "a success edge out of a failed node is not taken");
    assert_eq!(
        s.task("refund").input["body"]["why"],
        json!({"message": "POST answered 402 (not retryable)", "code": "http_status", "retryable": false,
               "attempts": 1, "status": 402})
    );
    assert_eq!(s.task("note").input["body"], json!("FAILED"), "an always edge runs after a failure too");
    let refund = s.task("refund").id;
    let line = tr.history.iter().find(|h| h.payload["task_id"] == json!(refund)).unwrap();
    assert_eq!(line.payload["via"], json!([{"from": "charge", "on": "failure"}]), "the history says which edge");
    assert_eq!(s.run.status, RunStatus::Running);
    s.complete("refund");
    s.complete("note");
    assert_eq!(s.run.status, RunStatus::Succeeded, "a handled failure does not fail the run: {:?}", s.run.error);
    assert_eq!(s.run.output, Some(json!({"refund": {"node": "refund"}, "note": {"node": "note"}})));
}

#[test]
fn a_fail_node_ends_the_run_failed_with_its_message() {
    let mut s = Sim::new(order_wf(json!({})));
    s.apply(Event::RunStarted);
    http_failure(&mut s, "charge", 402);
    s.complete("note");
    s.complete("refund");
    assert_eq!(s.task("failed").state, TaskState::Failed);
    assert_eq!(s.task("failed").error_info.as_ref().map(|i| i.code.as_str()), Some("refunded"));
    assert_eq!(s.run.status, RunStatus::Failed);
    assert_eq!(s.run.error.as_deref(), Some("refunded 402"));
}

#[test]
fn the_success_path_skips_the_failure_branch() {
    let mut s = Sim::new(order_wf(json!({})));
    s.apply(Event::RunStarted);
    s.complete("charge");
    assert_eq!(s.task("refund").state, TaskState::Skipped);
    assert_eq!(s.task("failed").state, TaskState::Skipped, "the skip propagates");
    s.complete("ship");
    s.complete("note");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn a_failure_without_a_failure_edge_still_fails_the_run_and_starts_nothing_new() {
    let mut s = Sim::new(order_wf(json!({})));
    s.apply(Event::RunStarted);
    http_failure(&mut s, "charge", 402);
    s.complete("note");
    let refund = s.task("refund").clone();
    s.apply(Event::TaskFailed {
        task_id: refund.id,
        attempt: refund.attempt,
        error: "bank down".into(),
        retryable: false,
        code: None,
        status: None,
        retry_after: None,
    });
    assert!(!s.has_task("failed"), "an unhandled failure starts nothing new");
    assert_eq!(s.run.status, RunStatus::Failed);
    assert!(s.run.error.as_deref().unwrap().contains("\"refund\" failed: bank down"), "{:?}", s.run.error);
}

#[test]
fn a_failure_edges_condition_can_test_the_error() {
    let wf = parse(json!({"name": "c", "nodes": [
        {"id": "charge", "type": "HTTP", "config": {"url": "http://h/c"}, "retry": {"max_attempts": 1}},
        {"id": "declined", "type": "HTTP", "config": {"url": "http://h/d"}},
        {"id": "other", "type": "HTTP", "config": {"url": "http://h/o"}}],
        "edges": [{"from": "charge", "to": "declined", "on": "failure", "when": ".nodes.charge.error.status == 402"},
                  {"from": "charge", "to": "other", "on": "failure", "when": ".nodes.charge.error.status != 402"}]}));
    let mut s = Sim::new(wf);
    s.apply(Event::RunStarted);
    http_failure(&mut s, "charge", 500);
    assert_eq!(s.task("declined").state, TaskState::Skipped);
    assert_eq!(s.task("other").state, TaskState::Pending);
}

#[test]
fn retrying_a_run_reruns_a_handled_failure_and_resets_the_branch_it_took() {
    let mut s = Sim::new(order_wf(json!({})));
    s.apply(Event::RunStarted);
    http_failure(&mut s, "charge", 402);
    s.complete("note");
    s.complete("refund");
    assert_eq!(s.run.status, RunStatus::Failed);
    let (old_refund, old_failed) = (s.task("refund").id, s.task("failed").id);
    let tr = s.apply(Event::RetryRun);
    assert_eq!(s.task("charge").attempt, 2, "the failed node runs again");
    assert_eq!(s.task("charge").state, TaskState::Pending);
    assert!(!s.has_task("refund") && !s.has_task("failed") && !s.has_task("note"), "its branch is reset");
    let reset: Vec<&Value> =
        tr.history.iter().filter(|h| h.kind == HistoryKind::TaskReset).map(|h| &h.payload["node_id"]).collect();
    assert_eq!(reset.len(), 4, "ship, skipped, is reset too: {reset:?}");
    assert!(tr.updated.iter().any(|&t| s.run.tasks[t].id == old_refund && s.run.tasks[t].removed));
    // A late report for a reset task changes nothing.
    let late = s.apply(Event::TaskCompleted { task_id: old_failed, attempt: 1, output: json!({}) });
    assert_eq!(late.ignored_kind, Some(IgnoreKind::UnknownTask));
    s.complete("charge");
    assert_eq!(s.task("refund").state, TaskState::Skipped, "the new attempt took the success path");
    assert_ne!(s.task("refund").id, old_refund, "a new task");
    s.complete("ship");
    s.complete("note");
    assert_eq!(s.run.status, RunStatus::Succeeded, "{:?}", s.run.error);
}

/// Each pair of nodes `i < j` has no edge, or one of these kinds.
fn edge_kind(bits: u8) -> Option<(&'static str, bool)> {
    match bits % 8 {
        3 => Some(("success", true)),
        4 => Some(("failure", true)),
        5 => Some(("always", true)),
        6 => Some(("success", false)),
        7 => Some(("failure", false)),
        _ => None,
    }
}

fn random_failure_workflow(n: usize, kinds: &[u8]) -> Workflow {
    let nodes: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("n{i}"), "type": "HTTP", "config": {"url": "http://h"}, "retry": {"max_attempts": 1}}))
        .collect();
    let mut edges = Vec::new();
    let mut k = 0;
    for i in 0..n {
        for j in i + 1..n {
            if let Some((on, when)) = edge_kind(kinds[k % kinds.len()]) {
                edges.push(json!({"from": format!("n{i}"), "to": format!("n{j}"), "on": on, "when": when.to_string()}));
            }
            k += 1;
        }
    }
    parse(json!({"name": "f", "nodes": nodes, "edges": edges}))
}

/// The states every node ends in when nothing stops early: the rules
/// written out again, one node at a time, in index order.
fn expected_states(wf: &Workflow, fails: &[bool]) -> Vec<TaskState> {
    let mut state = vec![TaskState::Skipped; wf.nodes.len()];
    for &n in &wf.topo_order {
        let active = wf.incoming[n].is_empty()
            || wf.incoming[n].iter().any(|&e| {
                let edge = &wf.edges[e];
                edge.on.follows(state[edge.from]) && edge.when.as_ref().is_none_or(|w| w.source() == "true")
            });
        state[n] = match (active, fails[n]) {
            (false, _) => TaskState::Skipped,
            (true, true) => TaskState::Failed,
            (true, false) => TaskState::Completed,
        };
    }
    state
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random DAGs with success, failure and always edges, each node's
    /// outcome fixed, its results arriving in any order with duplicates:
    /// every run ends; it fails exactly when a failure without a failure or
    /// always edge out of it happened; a run that succeeds ends every node
    /// as the rules say; and simulate agrees with it.
    #[test]
    fn failure_edges_end_every_run_and_only_unhandled_failures_fail_it(
        n in 1usize..9,
        kinds in proptest::collection::vec(any::<u8>(), 1..40),
        fails in proptest::collection::vec(proptest::bool::weighted(0.3), 9),
        seed in 1u64..u64::MAX,
    ) {
        let wf = random_failure_workflow(n, &kinds);
        let mut rng = Rng(seed);
        let mut s = Sim::new(wf.clone());
        let mut inbox = vec![Event::RunStarted];
        let mut steps = 0;
        while !inbox.is_empty() {
            steps += 1;
            prop_assert!(steps < 10_000, "the run did not converge");
            let event = inbox.swap_remove(rng.below(inbox.len()));
            let tr = s.apply(event);
            for &t in &tr.dispatch {
                let task = &s.run.tasks[t];
                let report = if fails[task.node] {
                    Event::TaskFailed { task_id: task.id, attempt: task.attempt, error: "no".into(), retryable: false,
                                        code: None, status: None, retry_after: None }
                } else {
                    Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!(t) }
                };
                if rng.chance(30) {
                    inbox.push(report.clone());
                }
                inbox.push(report);
            }
        }
        prop_assert!(s.run.status.is_terminal(), "run left {:?}", s.run.status);
        prop_assert!(s.run.tasks.iter().all(|t| t.state.is_terminal()));
        let expected = expected_states(&wf, &fails);
        let unhandled = (0..n).any(|i| expected[i] == TaskState::Failed && !wf.handles_failure(i));
        prop_assert_eq!(s.run.status, if unhandled { RunStatus::Failed } else { RunStatus::Succeeded });
        let failures = (0..n).filter(|&i| fails[i]).map(|i| (format!("n{i}"), "no".to_string())).collect();
        let simulated = crate::simulate::simulate(&sb(), &wf, &crate::simulate::Options { failures, ..Default::default() });
        prop_assert_eq!(simulated.status, s.run.status);
        if !unhandled {
            for (i, want) in expected.iter().enumerate() {
                prop_assert_eq!(s.task(&format!("n{i}")).state, *want, "node n{}", i);
                prop_assert_eq!(&simulated.nodes[i].state, want.as_str(), "simulated node n{}", i);
            }
        }
        for t in s.run.tasks.iter().filter(|t| t.state == TaskState::Failed) {
            prop_assert!(fails[t.node], "n{} failed without being made to", t.node);
        }
    }
}

fn loop_wf(config: Value) -> Workflow {
    let mut c = json!({"workflow": "step", "input": {"n": "${ (.previous.n // 0) }", "at": "${ .iteration.index }"},
                       "until": ".iteration.output.n >= 3", "max_iterations": 5});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), config.as_object()) {
        c.extend(extra.clone());
    }
    parse(json!({"name": "l", "nodes": [{"id": "poll", "type": "LOOP", "config": c, "retry": {"max_attempts": 2}}]}))
}

fn iteration_done(s: &mut Sim, status: RunStatus, output: Value) -> Transition {
    let t = s.task("poll").clone();
    s.apply(Event::ChildFinished {
        task_id: t.id,
        attempt: t.attempt,
        iteration: t.iteration.unwrap(),
        child: Some(Uuid::from_u128(7)),
        status,
        output: Some(output),
        error: None,
    })
}

#[test]
fn a_loop_starts_a_child_per_iteration_with_the_previous_output_until_its_condition_holds() {
    let mut s = Sim::new(loop_wf(json!({})));
    let tr = s.apply(Event::RunStarted);
    let poll = s.task("poll").clone();
    assert_eq!((poll.state, poll.iteration), (TaskState::Running, Some(0)));
    assert_eq!(poll.input["input"], json!({"n": 0, "at": 0}));
    assert_eq!(
        after_commit(&s.wf, &s.run, &tr),
        vec![AfterCommit::StartChild { task_id: poll.id, attempt: 1, iteration: 0 }]
    );
    for n in 1..3 {
        let tr = iteration_done(&mut s, RunStatus::Succeeded, json!({"n": n}));
        let poll = s.task("poll").clone();
        assert_eq!(poll.iteration, Some(n as u32));
        assert_eq!(poll.input["input"], json!({"n": n, "at": n}), "the next input sees .previous and .iteration");
        assert!(after_commit(&s.wf, &s.run, &tr).contains(&AfterCommit::StartChild {
            task_id: poll.id,
            attempt: 1,
            iteration: n as u32
        }));
    }
    // A late report of an older iteration changes nothing.
    let poll = s.task("poll").clone();
    let stale = s.apply(Event::ChildFinished {
        task_id: poll.id,
        attempt: 1,
        iteration: 0,
        child: None,
        status: RunStatus::Succeeded,
        output: Some(json!({"n": 99})),
        error: None,
    });
    assert_eq!(stale.ignored_kind, Some(IgnoreKind::StaleAttempt));
    iteration_done(&mut s, RunStatus::Succeeded, json!({"n": 3}));
    assert_eq!(s.task("poll").state, TaskState::Completed);
    assert_eq!(s.task("poll").output, Some(json!({"output": {"n": 3}, "iterations": 3})));
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn a_loop_fails_after_max_iterations_and_a_failed_iteration_is_retried_as_itself() {
    let mut s = Sim::new(loop_wf(json!({"max_iterations": 2})));
    s.apply(Event::RunStarted);
    iteration_done(&mut s, RunStatus::Succeeded, json!({"n": 1}));
    // The second iteration's child fails: the retry policy runs it again.
    let t = s.task("poll").clone();
    s.apply(Event::ChildFinished {
        task_id: t.id,
        attempt: 1,
        iteration: 1,
        child: Some(Uuid::from_u128(8)),
        status: RunStatus::Failed,
        output: None,
        error: Some("boom".into()),
    });
    assert_eq!(s.task("poll").state, TaskState::Waiting);
    s.now += chrono::Duration::hours(1);
    let poll = s.task("poll").id;
    s.apply(Event::TimerFired { task_id: poll });
    let poll = s.task("poll").clone();
    assert_eq!((poll.attempt, poll.iteration, poll.state), (2, Some(1), TaskState::Running), "the same iteration");
    iteration_done(&mut s, RunStatus::Succeeded, json!({"n": 2}));
    let poll = s.task("poll");
    assert_eq!(poll.state, TaskState::Failed);
    assert_eq!(poll.error_info.as_ref().unwrap().code, codes::MAX_ITERATIONS);
    assert_eq!(s.run.status, RunStatus::Failed);
}

#[test]
fn a_loops_delay_is_a_timer_and_a_pause_holds_the_next_iteration() {
    let mut s = Sim::new(loop_wf(json!({"delay": "10s"})));
    s.apply(Event::RunStarted);
    let tr = iteration_done(&mut s, RunStatus::Succeeded, json!({"n": 1}));
    let poll = s.task("poll").clone();
    assert_eq!(poll.state, TaskState::Waiting);
    // The cancel this commit owes reaches the iteration that ended, not
    // the next one's child, which may have started by the time it runs.
    assert_eq!(
        after_commit(&s.wf, &s.run, &tr),
        vec![AfterCommit::CancelChildren { task_id: poll.id, attempt: 1, iteration: 1, current: false }]
    );
    assert_eq!(poll.wake_at, Some(s.now + chrono::Duration::seconds(10)));
    s.apply(Event::PauseRun);
    s.now += chrono::Duration::seconds(11);
    s.apply(Event::TimerFired { task_id: poll.id });
    assert_eq!(s.task("poll").state, TaskState::Waiting, "held while paused");
    let tr = s.apply(Event::ResumeRun);
    let poll = s.task("poll").clone();
    assert_eq!((poll.state, poll.iteration, poll.attempt), (TaskState::Running, Some(1), 1));
    assert!(after_commit(&s.wf, &s.run, &tr).contains(&AfterCommit::StartChild {
        task_id: poll.id,
        attempt: 1,
        iteration: 1
    }));
}

#[test]
fn a_loop_is_refused_without_a_condition_or_a_bound() {
    let bad = |c: Value| {
        Workflow::parse(&json!({"name": "l", "nodes": [{"id": "p", "type": "LOOP", "config": c}]})).unwrap_err()
    };
    assert_eq!(bad(json!({"workflow": "w", "max_iterations": 3})).path, "nodes[p].config.until");
    assert_eq!(bad(json!({"workflow": "w", "until": "true"})).path, "nodes[p].config.max_iterations");
    assert_eq!(
        bad(json!({"workflow": "w", "until": "true", "max_iterations": 200000})).path,
        "nodes[p].config.max_iterations"
    );
    assert_eq!(bad(json!({"workflow": "w", "until": "${ .x }", "max_iterations": 3})).path, "nodes[p].config.until");
    assert_eq!(
        bad(json!({"workflow": "w", "until": "true", "max_iterations": 3, "on_parent_close": "x"})).path,
        "nodes[p].config.on_parent_close"
    );
    assert_eq!(bad(json!({"until": "true", "max_iterations": 3})).path, "nodes[p].config.workflow");
}

fn engine_of(wf: Workflow, input: Value) -> Engine {
    Engine {
        wf,
        stored: Run::new(Uuid::from_u128(1), input),
        now: Utc::now(),
        next: 100,
        sources: Default::default(),
        in_part: false,
        seen: false,
        voided: 0,
        unread: false,
        kept: Vec::new(),
        reread: 0,
    }
}

fn big_map(config: Value) -> Workflow {
    let mut c = json!({"items": "${ .input.items }",
        "node": {"type": "HTTP", "retry": {"max_attempts": 1}, "config": {"url": "http://h/${ .item }"}}});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), config.as_object()) {
        c.extend(extra.clone());
    }
    parse(json!({"name": "big", "nodes": [{"id": "each", "type": "MAP", "config": c}]}))
}

/// Runs a MAP's items to their end through the engine model: each item
/// completes with its index, or fails when `fails` says so.
fn run_items(e: &mut Engine, fails: impl Fn(u32) -> bool) {
    for _ in 0..100_000 {
        let next = e.stored.tasks.iter().find(|t| t.item.is_some() && t.state == TaskState::Pending).cloned();
        let Some(t) = next else { return };
        let index = t.item.unwrap().index;
        let event = match fails(index) {
            true => Event::TaskFailed {
                task_id: t.id,
                attempt: t.attempt,
                error: format!("no {index}"),
                retryable: false,
                code: None,
                status: None,
                retry_after: None,
            },
            false => Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!({"i": index}) },
        };
        e.apply(event);
    }
}

#[test]
fn a_map_that_collects_nothing_counts_its_items_and_never_loads_them_all() {
    let items: Vec<u32> = (0..20).collect();
    let mut e = engine_of(
        big_map(json!({"collect": "none", "max_concurrency": 4, "tolerated_failures": 3})),
        json!({"items": items}),
    );
    e.apply(Event::RunStarted);
    run_items(&mut e, |i| i % 7 == 3);
    assert_eq!(e.stored.status, RunStatus::Succeeded, "3 failures tolerated: {:?}", e.stored.error);
    assert_eq!(e.stored.output, Some(json!({"each": {"count": 20, "succeeded": 17, "failed": 3}})));
}

#[test]
fn a_map_fails_once_more_items_failed_than_it_tolerates() {
    for (tolerated, fails, ends) in [
        (json!(2), 3, RunStatus::Failed),
        (json!("15%"), 3, RunStatus::Succeeded),
        (json!("10%"), 3, RunStatus::Failed),
        (json!(0), 1, RunStatus::Failed),
    ] {
        let items: Vec<u32> = (0..20).collect();
        let mut e = engine_of(
            big_map(json!({"collect": "none", "max_concurrency": 2, "tolerated_failures": tolerated})),
            json!({"items": items}),
        );
        e.apply(Event::RunStarted);
        run_items(&mut e, |i| i < fails);
        assert_eq!(e.stored.status, ends, "{tolerated}: {:?}", e.stored.error);
        if ends == RunStatus::Failed && fails > 1 {
            assert!(e.stored.error.as_deref().unwrap().contains("more than it tolerates"), "{:?}", e.stored.error);
        }
    }
}

#[test]
fn a_map_reduces_its_items_one_by_one_as_they_end() {
    let items: Vec<u32> = (0..12).collect();
    let wf = big_map(json!({"max_concurrency": 5, "on_item_failure": "continue",
        "collect": {"init": {"sum": 0, "failed": []}, "reduce":
            ".item as $i | .acc | if $i.state == \"COMPLETED\" then .sum += $i.output.i else .failed += [$i.index] end"}}));
    let mut e = engine_of(wf, json!({"items": items}));
    e.apply(Event::RunStarted);
    run_items(&mut e, |i| i == 4);
    assert_eq!(e.stored.status, RunStatus::Succeeded, "{:?}", e.stored.error);
    assert_eq!(e.stored.output, Some(json!({"each": {"sum": 66 - 4, "failed": [4]}})));
}

#[test]
fn a_map_that_collects_every_output_gives_each_item_its_share_or_fails_before_starting() {
    // 1 KiB shared by 4 items: about 230 bytes each.
    let items: Vec<u32> = (0..4).collect();
    let mut e = engine_of(big_map(json!({"on_item_failure": "continue"})), json!({"items": items}));
    e.stored.max_payload = 1024;
    e.apply(Event::RunStarted);
    for _ in 0..4 {
        let t = e.stored.tasks.iter().find(|t| t.item.is_some() && t.state == TaskState::Pending).cloned().unwrap();
        let index = t.item.unwrap().index;
        let output = if index == 2 { json!("x".repeat(500)) } else { json!(index) };
        e.apply(Event::TaskCompleted { task_id: t.id, attempt: 1, output });
    }
    assert_eq!(e.stored.status, RunStatus::Succeeded, "{:?}", e.stored.error);
    let out = e.stored.output.as_ref().unwrap()["each"].as_array().unwrap().clone();
    assert!(out[2]["error"].as_str().unwrap().contains("share"), "{:?}", out[2]);
    assert_eq!((&out[0], &out[3]), (&json!(0), &json!(3)));
    // 100 items cannot share 1 KiB: the MAP fails before any starts.
    let items: Vec<u32> = (0..100).collect();
    let mut e = engine_of(big_map(json!({})), json!({"items": items}));
    e.stored.max_payload = 1024;
    let (tr, _) = e.apply(Event::RunStarted);
    assert!(tr.dispatch.is_empty());
    assert_eq!(e.stored.status, RunStatus::Failed);
    assert!(e.stored.error.as_deref().unwrap().contains("collect: \"none\""), "{:?}", e.stored.error);
}

#[test]
fn a_map_creates_a_bounded_number_of_items_per_event_and_carries_on_after_the_commit() {
    let items: Vec<u32> = (0..40).collect();
    let wf = parse(json!({"name": "t", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ .input.items }", "collect": "none", "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}}]}));
    let mut e = engine_of(wf, json!({"items": items}));
    let (tr, run) = e.apply(Event::RunStarted);
    let per_event = super::map::ITEMS_PER_EVENT as usize;
    assert!(tr.created.len() <= per_event + super::map::ITEM_CHUNK as usize + 1, "{}", tr.created.len());
    let owed = after_commit(&e.wf, &run, &tr);
    let map = e.stored.tasks.iter().find(|t| t.progress.is_some()).unwrap().id;
    assert_eq!(owed, vec![AfterCommit::ContinueMap { task_id: map }]);
    let mut rounds = 1;
    while e.stored.status == RunStatus::Running {
        rounds += 1;
        assert!(rounds < 50, "the MAP does not carry on");
        let (tr, run) = e.apply(Event::ItemsLoaded { task_id: map });
        assert!(tr.created.len() <= per_event + super::map::ITEM_CHUNK as usize);
        let _ = after_commit(&e.wf, &run, &tr);
    }
    assert_eq!(e.stored.output, Some(json!({"each": {"count": 40, "succeeded": 40, "failed": 0}})));
}

#[test]
fn a_loops_ten_thousandth_iteration_costs_what_its_tenth_does() {
    let mut s = Sim::new(loop_wf(json!({"until": ".iteration.output.n >= 10000", "max_iterations": 20000})));
    s.apply(Event::RunStarted);
    let mut writes = Vec::new();
    for n in 1..=10_000 {
        let tr = iteration_done(&mut s, RunStatus::Succeeded, json!({"n": n, "pad": "x".repeat(100)}));
        writes.push((tr.updated.len(), tr.created.len(), tr.history.len()));
    }
    assert_eq!(s.run.status, RunStatus::Succeeded);
    assert_eq!(s.run.tasks.len(), 1, "one task, however many iterations");
    assert_eq!(writes[9], writes[9_998], "the same writes at iteration 10 and 9,999");
    let kept = serde_json::to_vec(&s.task("poll").output).unwrap().len();
    assert!(kept < 300, "only the last output is kept: {kept} bytes");
}

#[test]
fn a_step_carries_its_limit_keys_from_its_scope_and_a_map_item_its_own() {
    let mut s = Sim::new(parse(json!({"name": "l", "nodes": [
        {"id": "a", "type": "HTTP", "config": {"url": "http://h/a"},
         "limits": [{"key": "stripe:${ .input.x }", "rate": "5/1s"}, {"key": "crm", "concurrency": 2}]},
        {"id": "each", "type": "MAP", "config": {"items": [7, 8], "node": {"type": "HTTP",
            "config": {"url": "http://h/i"}, "limits": [{"key": "item:${ .item }"}]}}}]})));
    let tr = s.apply(Event::RunStarted);
    assert_eq!(s.task("a").limit_keys, ["stripe:1", "crm"]);
    let items: Vec<&Task> = s.run.tasks.iter().filter(|t| t.item.is_some()).collect();
    let keys: Vec<&[String]> = items.iter().map(|t| t.limit_keys.as_slice()).collect();
    assert_eq!(keys, [["item:7".to_string()], ["item:8".to_string()]]);
    assert_eq!(tr.dispatch.len(), 3, "a held step is dispatched all the same: the writer holds it back");
}

#[test]
fn a_429_with_retry_after_waits_that_long_and_holds_the_keys_unless_ignored() {
    let spec = |on_429: Value| {
        parse(json!({"name": "l", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h/a"},
            "retry": {"max_attempts": 3, "initial_backoff": "1s", "on_429": on_429},
            "limits": [{"key": "partner"}]}]}))
    };
    let busy = |s: &mut Sim, status: u16| {
        let t = s.task("a");
        let (task_id, attempt) = (t.id, t.attempt);
        s.apply(Event::TaskFailed {
            task_id,
            attempt,
            error: "busy".into(),
            retryable: true,
            code: Some(codes::HTTP_STATUS.into()),
            status: Some(status),
            retry_after: Some(std::time::Duration::from_secs(30)),
        })
    };
    let mut s = Sim::new(spec(json!("respect")));
    s.apply(Event::RunStarted);
    let tr = busy(&mut s, 429);
    let wake = s.task("a").wake_at.unwrap();
    assert_eq!((wake - s.now).num_seconds(), 30, "the target's 30 s, not the 1 s backoff");
    assert_eq!(tr.limit_holds.len(), 1);
    assert_eq!((tr.limit_holds[0].1 - s.now).num_seconds(), 30);

    // Only a 429's Retry-After counts, and an hour at most.
    let mut s = Sim::new(spec(json!("respect")));
    s.apply(Event::RunStarted);
    let tr = busy(&mut s, 503);
    assert_eq!(((s.task("a").wake_at.unwrap() - s.now).num_seconds(), tr.limit_holds.len()), (1, 0));

    let mut s = Sim::new(spec(json!("ignore")));
    s.apply(Event::RunStarted);
    let tr = busy(&mut s, 429);
    assert_eq!(((s.task("a").wake_at.unwrap() - s.now).num_seconds(), tr.limit_holds.len()), (1, 0));
}

#[test]
fn a_limit_key_that_does_not_evaluate_fails_the_step_naming_the_limit() {
    let mut s = Sim::new(parse(json!({"name": "l", "nodes": [{"id": "a", "type": "HTTP",
        "config": {"url": "http://h/a"}, "limits": [{"key": "k"}, {"key": "${ .input }"}]}]})));
    s.apply(Event::RunStarted);
    let t = s.task("a");
    assert_eq!(t.state, TaskState::Failed);
    assert!(t.error.as_deref().unwrap().contains("limits[1].key: must be text or a number"), "{:?}", t.error);
}

/// The engine's way with a run loaded in part ([`Run::known`]), in memory:
/// `stored` is what the writer keeps. Each event gets the open and failed
/// tasks and the ones it names; while the machine says tasks are missing,
/// they are added and the event applied again (minting the same ids).
struct InPart {
    wf: Workflow,
    stored: Vec<Task>,
    run: Run,
    now: DateTime<Utc>,
    next: u128,
    /// Applications the machine voided for want of a task.
    voided: usize,
}

impl InPart {
    fn new(wf: Workflow) -> InPart {
        let run = Run::new(Uuid::from_u128(1), json!({"x": 1}));
        InPart { wf, stored: Vec::new(), run, now: Utc::now(), next: 100, voided: 0 }
    }

    fn apply(&mut self, e: Event) -> Transition {
        let named = e.task_ids();
        let whole = !e.reads_in_part();
        let mut run = self.run.clone();
        run.tasks = self
            .stored
            .iter()
            .filter(|t| {
                whole
                    || named.contains(&t.id)
                    || !matches!(t.state, TaskState::Completed | TaskState::Skipped | TaskState::Cancelled)
            })
            .cloned()
            .collect();
        if !whole {
            let mut known = vec![false; self.wf.nodes.len()];
            for t in &run.tasks {
                known[t.node] = true;
            }
            run.known = Some(known);
        }
        loop {
            let (before, next) = (run.clone(), self.next);
            let counter = &mut self.next;
            let mut ids = || {
                *counter += 1;
                Uuid::from_u128(*counter)
            };
            let tr = apply(&sb(), &self.wf, &mut run, e.clone(), self.now, &mut ids);
            if tr.missing.is_empty() {
                for t in &run.tasks {
                    match (self.stored.iter().position(|s| s.id == t.id), t.removed) {
                        (Some(at), true) => {
                            self.stored.remove(at);
                        }
                        (Some(at), false) => self.stored[at] = t.clone(),
                        (None, false) => self.stored.push(t.clone()),
                        (None, true) => {}
                    }
                }
                run.tasks.clear();
                run.known = None;
                self.run = run;
                return tr;
            }
            self.voided += 1;
            (run, self.next) = (before, next);
            let known = run.known.as_mut().expect("only a run in part misses tasks");
            for &n in &tr.missing {
                assert!(!known[n], "node {n} was asked for twice");
                known[n] = true;
            }
            let have: Vec<Uuid> = run.tasks.iter().map(|t| t.id).collect();
            let more = self.stored.iter().filter(|t| tr.missing.contains(&t.node) && !have.contains(&t.id));
            run.tasks.extend(more.cloned().collect::<Vec<_>>());
        }
    }
}

/// A random DAG of `n` nodes: HTTP steps whose bodies read an earlier
/// node's output, TRANSFORMs (ended at once), edges on success, on failure,
/// always, or with a `when` on what came before, and maybe an output template.
fn varied_workflow(n: usize, bits: &[u8], output: bool) -> Workflow {
    let mut byte = 0usize;
    let mut next = || {
        byte += 1;
        bits[byte % bits.len()]
    };
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for i in 0..n {
        let id = format!("n{i}");
        let read = if i > 0 { format!("${{ .nodes.n{}.output }}", next() as usize % i) } else { "none".into() };
        nodes.push(match next() % 4 {
            0 if i > 0 => {
                json!({"id": id, "type": "TRANSFORM", "config": {"output": {"from": read, "x": "${ .input.x }"}}})
            }
            _ => json!({"id": id, "type": "HTTP", "config": {"url": format!("http://h/{i}"), "body": {"from": read}},
                        "retry": {"max_attempts": 1 + next() as u32 % 2, "initial_backoff": "1s"}}),
        });
        for j in 0..i {
            let edge = match next() % 12 {
                0 => json!({"from": format!("n{j}"), "to": id, "on": "failure"}),
                1 => json!({"from": format!("n{j}"), "to": id, "on": "always"}),
                2 => json!({"from": format!("n{j}"), "to": id, "when": format!(".nodes.n{j}.output != null")}),
                3 | 4 => json!({"from": format!("n{j}"), "to": id}),
                _ => continue,
            };
            edges.push(edge);
        }
    }
    let mut spec = json!({"name": "varied", "nodes": nodes, "edges": edges});
    if output {
        spec["output"] = json!({"last": format!("${{ .nodes.n{}.output }}", n - 1)});
    }
    Workflow::parse(&spec).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A run loaded in part, given what it says it misses, goes exactly as
    /// the same run loaded whole: the same tasks, states, inputs, outputs,
    /// dispatches and ends, through duplicates, stale reports, retries and
    /// a retry of the run.
    #[test]
    fn a_run_loaded_in_part_goes_as_the_run_loaded_whole(
        n in 1usize..12,
        bits in proptest::collection::vec(any::<u8>(), 1..80),
        output in any::<bool>(),
        seed in 1u64..u64::MAX,
    ) {
        let wf = varied_workflow(n, &bits, output);
        let mut rng = Rng(seed);
        let mut whole = Sim::new(wf.clone());
        let mut part = InPart::new(wf);
        let mut inbox = vec![Event::RunStarted];
        let mut steps = 0;
        while !inbox.is_empty() {
            steps += 1;
            prop_assert!(steps < 5_000, "the run did not converge");
            let event = inbox.swap_remove(rng.below(inbox.len()));
            whole.now += chrono::Duration::hours(1);
            part.now = whole.now;
            let a = whole.apply(event.clone());
            let b = part.apply(event.clone());
            prop_assert_eq!(a.ignored.is_some(), b.ignored.is_some(), "{:?}", event);
            let ids = |tr: &Transition, run: &[Task], of: &[usize]| -> Vec<Uuid> {
                let mut v: Vec<Uuid> = of.iter().map(|&t| run[t].id).collect();
                v.sort();
                let _ = tr;
                v
            };
            prop_assert_eq!(a.history.len(), b.history.len());
            prop_assert_eq!((whole.run.status, &whole.run.output, &whole.run.error), (part.run.status, &part.run.output, &part.run.error));
            let live: Vec<&Task> = whole.run.tasks.iter().filter(|t| !t.removed).collect();
            prop_assert_eq!(live.len(), part.stored.len());
            for t in &live {
                let s = part.stored.iter().find(|s| s.id == t.id);
                prop_assert_eq!(Some(*t), s, "task {} of node {}", t.id, t.node);
            }
            let dispatched = ids(&a, &whole.run.tasks, &a.dispatch);
            for id in &dispatched {
                let task = whole.run.tasks.iter().find(|t| t.id == *id).unwrap();
                if task.state != TaskState::Pending {
                    continue;
                }
                let report = if rng.chance(60) {
                    Event::TaskCompleted { task_id: task.id, attempt: task.attempt, output: json!({"v": rng.below(3)}) }
                } else {
                    Event::TaskFailed { task_id: task.id, attempt: task.attempt, error: "e".into(), retryable: rng.chance(70), code: None, status: None, retry_after: None }
                };
                if rng.chance(20) {
                    inbox.push(report.clone());
                }
                inbox.push(report);
            }
            for t in whole.run.tasks.iter().filter(|t| t.state == TaskState::Waiting && !t.removed) {
                inbox.push(Event::TimerFired { task_id: t.id });
            }
            if whole.run.status == RunStatus::Failed && rng.chance(30) {
                inbox.push(Event::RetryRun);
            }
        }
        prop_assert!(whole.run.status.is_terminal());
    }
}

#[test]
fn a_chain_loaded_in_part_reads_only_the_step_after_the_one_that_ended() {
    let names: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let edges: Vec<(&str, &str)> = refs.windows(2).map(|w| (w[0], w[1])).collect();
    let mut part = InPart::new(wf(&refs, &edges, 1));
    part.apply(Event::RunStarted);
    for i in 0..50 {
        let t = part.stored.iter().find(|t| t.state == TaskState::Pending).unwrap().clone();
        assert_eq!(t.node, i);
        let before = part.voided;
        part.apply(Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!({}) });
        // The next node's task (it has none) is looked for once; the last
        // step's end needs its own output, which is loaded.
        assert_eq!(part.voided - before, usize::from(i < 49), "step {i}");
    }
    assert_eq!(part.run.status, RunStatus::Succeeded);
    assert_eq!(part.stored.len(), 50);
}

/// A random DAG of every kind of node: HTTP steps, TRANSFORMs, MAPs (of 0 to
/// 8 items, in chunks, reading an earlier node), waits for a time and for an
/// event, sub-workflows and loops, each reading an earlier node's output
/// (a TRANSFORM and a loop's `until` the run's input too);
/// edges as in [`varied_workflow`]; maybe an output template, maybe an
/// `on_failure` handler (whose input is every node).
fn every_kind_workflow(n: usize, bits: &[u8], output: bool, handler: bool) -> Workflow {
    let mut byte = 0usize;
    let mut next = || {
        byte += 1;
        bits[byte % bits.len()]
    };
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for i in 0..n {
        let id = format!("n{i}");
        let read = if i > 0 { format!("${{ .nodes.n{}.output }}", next() as usize % i) } else { "none".into() };
        let retry = json!({"max_attempts": 1 + next() as u32 % 2, "initial_backoff": "1s"});
        nodes.push(match next() % 9 {
            0 if i > 0 => json!({"id": id, "type": "TRANSFORM", "config": {"output": {"from": read}}}),
            1 => {
                let mut config = json!({"items": format!("${{ [range({})] }}", next() % 9),
                    "on_item_failure": if next() % 2 == 0 { "continue" } else { "fail" },
                    "node": {"type": "HTTP", "retry": retry, "config": {"url": "http://h/${ .item }", "body": {"from": read}}}});
                if next() % 2 == 0 {
                    config["max_concurrency"] = json!(1 + next() % 3);
                }
                json!({"id": id, "type": "MAP", "config": config})
            }
            2 => json!({"id": id, "type": "WAIT_FOR_EVENT", "config": {"event": "e", "key": format!("k{i}"), "timeout": "1h"}}),
            3 => json!({"id": id, "type": "WAIT", "config": {"duration": "1m"}}),
            4 => json!({"id": id, "type": "SUB_WORKFLOW", "retry": retry, "config": {"workflow": "child", "input": {"from": read}}}),
            5 => json!({"id": id, "type": "LOOP", "retry": retry, "config": {"workflow": "step", "input": {"from": read},
                        "until": ".iteration.output.v >= .input.x", "max_iterations": 3}}),
            _ => json!({"id": id, "type": "HTTP", "config": {"url": format!("http://h/{i}"), "body": {"from": read}}, "retry": retry}),
        });
        for j in 0..i {
            let edge = match next() % 12 {
                0 => json!({"from": format!("n{j}"), "to": id, "on": "failure"}),
                1 => json!({"from": format!("n{j}"), "to": id, "on": "always"}),
                2 => json!({"from": format!("n{j}"), "to": id, "when": format!(".nodes.n{j}.output != null")}),
                3 | 4 => json!({"from": format!("n{j}"), "to": id}),
                _ => continue,
            };
            edges.push(edge);
        }
    }
    let mut spec = json!({"name": "every", "nodes": nodes, "edges": edges});
    if output {
        spec["output"] = json!({"last": format!("${{ .nodes.n{}.output }}", n - 1)});
    }
    if handler {
        spec["on_failure"] = json!({"workflow": "cleanup", "on": ["FAILED", "CANCELLED"]});
    }
    Workflow::parse(&spec).unwrap()
}

/// What a failure handler's input sees of a run: each node's task.
fn node_tasks(run: &Run) -> Vec<(usize, TaskState, Option<Value>, Option<String>)> {
    let mut v: Vec<_> = run
        .tasks
        .iter()
        .filter(|t| t.item.is_none() && !t.removed)
        .map(|t| (t.node, t.state, t.output.clone(), t.error.clone()))
        .collect();
    v.sort_by_key(|t| t.0);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// As [`a_run_loaded_in_part_goes_as_the_run_loaded_whole`], over every
    /// kind of node and the engine's item loads: MAP items in chunks and
    /// their follow-ups, timers, events and their timeouts, children's ends
    /// and loop iterations, pauses, cancels and a failure handler's view of
    /// the run, with two events of the run applied in one load at times.
    /// With `unread`, the run also leaves its values unread as the engine
    /// does for a step's own news (every one a reference, not only large
    /// ones), reading them when the machine says it needs one.
    #[test]
    fn a_run_of_every_kind_of_node_loaded_in_part_goes_as_the_run_loaded_whole(
        n in 1usize..10,
        bits in proptest::collection::vec(any::<u8>(), 1..80),
        output in any::<bool>(),
        handler in any::<bool>(),
        in_part in any::<bool>(),
        unread in any::<bool>(),
        seed in 1u64..u64::MAX,
    ) {
        let wf = every_kind_workflow(n, &bits, output, handler);
        let mut rng = Rng(seed);
        let mut whole = engine_of(wf.clone(), json!({"x": 1}));
        let mut part = engine_of(wf.clone(), json!({"x": 1}));
        part.in_part = in_part || !unread;
        part.unread = unread;
        let mut inbox = vec![Event::RunStarted];
        let mut issued = std::collections::HashSet::new();
        let (mut steps, mut retries) = (0, 0);
        loop {
            if inbox.is_empty() {
                match whole.stored.status {
                    RunStatus::Paused => inbox.push(Event::ResumeRun),
                    RunStatus::Failed if retries < 2 && rng.chance(50) => {
                        retries += 1;
                        inbox.push(Event::RetryRun);
                    }
                    s if s.is_terminal() => break,
                    _ => prop_assert!(false, "an open run that nothing moves: {:?}", whole.stored.tasks),
                }
            }
            steps += 1;
            prop_assert!(steps < 5_000, "the run did not converge");
            let mut batch = vec![inbox.swap_remove(rng.below(inbox.len()))];
            if !inbox.is_empty() && rng.chance(25) {
                batch.push(inbox.swap_remove(rng.below(inbox.len())));
            }
            whole.now += chrono::Duration::hours(1);
            part.now = whole.now;
            let (a, run_a) = whole.apply_all(&batch);
            let (b, run_b) = part.apply_all(&batch);
            for (x, y) in a.iter().zip(&b) {
                prop_assert_eq!(x.ignored.is_some(), y.ignored.is_some(), "{:?}", batch);
                prop_assert_eq!(x.history.len(), y.history.len(), "{:?}", batch);
                let ids = |tr: &Transition, run: &Run| {
                    let mut v: Vec<Uuid> = tr.dispatch.iter().chain(&tr.children).map(|&t| run.tasks[t].id).collect();
                    v.sort();
                    v
                };
                prop_assert_eq!(ids(x, &run_a), ids(y, &run_b));
                let owed_a = after_commit(&wf, &run_a, x);
                prop_assert_eq!(&owed_a, &after_commit(&wf, &run_b, y));
                for owed in owed_a {
                    if let AfterCommit::ContinueMap { task_id } = owed {
                        inbox.push(Event::ItemsLoaded { task_id });
                    }
                }
            }
            prop_assert_eq!(
                (whole.stored.status, &whole.stored.output, &whole.stored.error),
                (part.stored.status, &part.stored.output, &part.stored.error)
            );
            let mut stored_a = whole.stored.tasks.clone();
            let mut stored_b = part.stored.tasks.clone();
            stored_a.sort_by_key(|t| t.id);
            stored_b.sort_by_key(|t| t.id);
            prop_assert_eq!(stored_a, stored_b);
            if handler && whole.stored.status.is_terminal() && a.iter().any(|t| t.run_changed) {
                prop_assert_eq!(node_tasks(&run_a), node_tasks(&run_b), "what the handler is given");
            }
            // The next events, from what storage holds: a result for each
            // attempt sent out, a timer for each wait, an event for each
            // waiter, an end for each child; a few twice.
            for t in &whole.stored.tasks {
                let key = format!("{}:{}:{:?}:{:?}:{:?}", t.id, t.attempt, t.iteration, t.state, t.wake_at);
                if t.state.is_terminal() || !issued.insert(key) {
                    continue;
                }
                let has_child = t.item.is_none() && wf.nodes[t.node].kind.traits().has_child;
                let mut news = Vec::new();
                match t.state {
                    TaskState::Running if has_child => {
                        let ok = rng.chance(70);
                        news.push(Event::ChildFinished {
                            task_id: t.id,
                            attempt: t.attempt,
                            iteration: t.iteration.unwrap_or(0),
                            child: Some(Uuid::from_u128(7)),
                            status: if ok { RunStatus::Succeeded } else { RunStatus::Failed },
                            output: ok.then(|| json!({"v": rng.below(3)})),
                            error: (!ok).then(|| "declined".to_string()),
                        });
                    }
                    TaskState::Pending => news.push(if rng.chance(65) {
                        Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!({"v": rng.below(3)}) }
                    } else {
                        Event::TaskFailed { task_id: t.id, attempt: t.attempt, error: "e".into(), retryable: rng.chance(70), code: None, status: None, retry_after: None }
                    }),
                    TaskState::Waiting if t.wake_at.is_some() => {
                        news.push(Event::TimerFired { task_id: t.id });
                        if t.event.is_some() && rng.chance(60) {
                            news.push(Event::EventReceived { task_id: t.id, payload: json!({"v": rng.below(3)}) });
                        }
                    }
                    _ => {}
                }
                for e in news {
                    if rng.chance(15) {
                        inbox.push(e.clone());
                    }
                    inbox.push(e);
                }
            }
            match whole.stored.status {
                RunStatus::Running if rng.chance(3) => inbox.push(Event::PauseRun),
                RunStatus::Running if rng.chance(2) => inbox.push(Event::CancelRun),
                RunStatus::Paused if rng.chance(30) => inbox.push(Event::ResumeRun),
                _ => {}
            }
        }
    }
}

/// The scope a node's expressions see, built from the run's values in
/// place, is the scope of the context as one JSON value: the same values,
/// keys in the same order, an absent output `null`, a failed node's error.
#[test]
fn a_scope_built_in_place_is_the_scope_of_the_context() {
    use crate::expr::{Expr, Limits, Scope};
    let mut s = Sim::new(parse(json!({"name": "ctx", "nodes": [
        {"id": "zeta", "type": "HTTP", "config": {"url": "http://h/z"}},
        {"id": "alpha", "type": "HTTP", "config": {"url": "http://h/a"}, "retry": {"max_attempts": 1}},
        {"id": "mid", "type": "HTTP", "config": {"url": "http://h/m"}}]})));
    s.run.input = json!({"z": [3, {"b": 1, "a": 2}], "a": "é\u{1}"});
    s.apply(Event::RunStarted);
    let zeta = s.task("zeta");
    let (id, attempt) = (zeta.id, zeta.attempt);
    s.apply(Event::TaskCompleted { task_id: id, attempt, output: json!({"y": 1.5, "b": [null, true], "a": {}}) });
    s.fail("alpha", false);
    let read = ". as $x | [($x | tojson), ([$x | paths] | tojson), ($x.nodes | keys_unsorted)]";
    let expr = Expr::compile(read).unwrap();
    let sb = sb();
    let of = |scope: &Scope| expr.eval_limited(&sb, scope, Limits::DEFAULT).unwrap();
    let whole = Scope::new(&context_of(&s.wf, &s.run, s.run.tasks.iter())).unwrap();
    let in_place = scope_of(&s.wf, &s.run, s.run.tasks.iter(), true, &std::cell::Cell::new(usize::MAX));
    assert_eq!(of(&in_place), of(&whole));
    assert_eq!(of(&in_place)[2], json!(["alpha", "mid", "zeta"]));
    assert!(of(&in_place)[0].as_str().unwrap().contains(r#""mid":{"output":null,"state":"#), "{}", of(&in_place)[0]);
    // Without the input, the same scope but for `.input`.
    let without = scope_of(&s.wf, &s.run, s.run.tasks.iter(), false, &std::cell::Cell::new(usize::MAX));
    let probe = Expr::compile("[.input, (.nodes | tojson)]").unwrap();
    let (a, b) =
        (probe.eval_limited(&sb, &without, Limits::DEFAULT), probe.eval_limited(&sb, &in_place, Limits::DEFAULT));
    assert_eq!(a.unwrap(), json!([null, b.unwrap()[1]]));
}

/// What one expression's scope may hold of a run's values is charged
/// before they are converted: a node whose expressions read more than
/// `max_read` (its input and the outputs it names) fails, naming the
/// limit; under it, and for a node that reads less, the run goes on; the
/// output template is charged the same.
#[test]
fn a_scope_that_would_hold_more_of_the_runs_values_than_it_may_fails_its_node_naming_the_limit() {
    let json_of = |reads: &str| {
        json!({"name": "t", "nodes": [
            {"id": "a", "type": "HTTP", "config": {"url": "http://h/a"}},
            {"id": "b", "type": "HTTP", "config": {"url": "http://h/b"}},
            {"id": "sum", "type": "TRANSFORM", "config": {"output": format!("${{ {reads} }}")}}],
            "edges": [{"from": "a", "to": "sum"}, {"from": "b", "to": "sum"}]})
    };
    let spec = |reads: &str| Workflow::parse(&json_of(reads)).unwrap();
    let run = |reads: &str, max_read: usize| {
        let mut s = Sim::new(spec(reads));
        s.run.input = json!({"text": "i".repeat(300)});
        s.run.max_read = max_read;
        s.apply(Event::RunStarted);
        for node in ["a", "b"] {
            let t = s.task(node);
            let e = Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!("o".repeat(300)) };
            s.apply(e);
        }
        s
    };
    let both = ".nodes.a.output + .nodes.b.output | length";
    // 302 bytes a value, as JSON.
    let s = run(both, 1000);
    assert_eq!((s.run.status, s.task("sum").output.clone()), (RunStatus::Succeeded, Some(json!(600))));
    let s = run(both, 500);
    assert_eq!(s.task("sum").state, TaskState::Failed);
    let error = s.task("sum").error.clone().unwrap();
    assert!(error.contains("500 bytes of JSON one expression's scope may hold"), "{error}");
    assert!(!error.contains("ooo"), "the values are not in the error: {error}");
    // One value fits; the input counts only where it may be read.
    assert_eq!(run(".nodes.a.output | length", 500).run.status, RunStatus::Succeeded);
    assert_eq!(run(".nodes.a.output + .input.text | length", 500).task("sum").state, TaskState::Failed);
    // The output template is charged too.
    let mut wf = json_of("1");
    wf["output"] = json!({"all": "${ [.nodes.a.output, .nodes.b.output] }"});
    let mut s = Sim::new(Workflow::parse(&wf).unwrap());
    s.run.max_read = 500;
    s.apply(Event::RunStarted);
    for node in ["a", "b"] {
        let t = s.task(node);
        s.apply(Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!("o".repeat(300)) });
    }
    assert_eq!(s.run.status, RunStatus::Failed);
    assert!(s.run.error.as_deref().unwrap().contains("scope may hold"), "{:?}", s.run.error);
}

#[test]
fn the_size_a_scope_is_charged_is_about_the_values_json_and_counts_no_further_than_asked() {
    use crate::storable::size_up_to;
    for v in [json!(null), json!(12345), json!("abc"), json!([1, "x", {"k": [true]}]), json!({"a": {"bb": ["ccc"]}})] {
        let exact = serde_json::to_vec(&v).unwrap().len();
        let about = size_up_to(&v, usize::MAX).unwrap();
        assert!(about >= exact / 2 && about <= exact * 3 + 8, "{v}: {about} for {exact}");
    }
    let big = json!(vec!["x".repeat(1000); 1000]);
    assert!(size_up_to(&big, 1_000_000).is_none());
    assert!(size_up_to(&big, 2_000_000).is_some());
}

/// The scopes of one event share a budget ([`super::EVENT_READS`] scopes'
/// worth): nodes that each read one value within a scope's limit go on
/// until the event has converted that much, and the next fails, naming it.
#[test]
fn the_scopes_of_one_event_convert_no_more_than_its_budget_of_the_runs_values() {
    let readers = |n: usize| {
        let mut nodes = vec![json!({"id": "big", "type": "HTTP", "config": {"url": "http://h/big"}})];
        let mut edges = Vec::new();
        for i in 0..n {
            nodes.push(json!({"id": format!("r{i}"), "type": "TRANSFORM",
                "config": {"output": "${ .nodes.big.output | length }"}}));
            edges.push(json!({"from": "big", "to": format!("r{i}")}));
        }
        Workflow::parse(&json!({"name": "t", "nodes": nodes, "edges": edges})).unwrap()
    };
    let run = |n: usize| {
        let mut s = Sim::new(readers(n));
        // A scope may hold 500 bytes; the event 2,000. The value is 302.
        s.run.max_read = 500;
        s.apply(Event::RunStarted);
        let t = s.task("big");
        s.apply(Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!("o".repeat(300)) });
        s
    };
    let s = run(6);
    assert_eq!(s.run.status, RunStatus::Succeeded, "six reads of 302 bytes: within 2,000");
    let s = run(8);
    let failed: Vec<&Task> = s.run.tasks.iter().filter(|t| t.state == TaskState::Failed).collect();
    assert_eq!(failed.len(), 1, "the seventh read is past the event's 2,000 bytes (and the run ends)");
    assert_eq!(s.run.status, RunStatus::Failed);
    let error = failed[0].error.as_deref().unwrap();
    assert!(error.contains("more of the run's values than one event may convert (4 scopes of 500 bytes"), "{error}");
}

/// A MAP's items are evaluated in one scope an event, the one its `items`
/// was, however many chunks the event creates: charged once, not once a
/// chunk (five scopes here, past the event's budget of four).
#[test]
fn a_maps_chunks_of_items_share_one_scope_an_event() {
    let wf = Workflow::parse(&json!({"name": "t", "nodes": [
        {"id": "big", "type": "HTTP", "config": {"url": "http://h/big"}},
        {"id": "each", "type": "MAP", "config": {"items": "${ [range(7)] }",
            "node": {"type": "TRANSFORM", "config": {"output": "${ .nodes.big.output | length }"}}}},
        {"id": "beside", "type": "TRANSFORM", "config": {"output": "${ .nodes.big.output | length }"}}],
        "edges": [{"from": "big", "to": "each"}, {"from": "big", "to": "beside"}]}))
    .unwrap();
    let mut s = Sim::new(wf);
    // The value is 302 bytes and the input 14 (`range` may read it): a
    // scope of 320 holds them; the event's budget is 1,280.
    s.run.max_read = 320;
    s.apply(Event::RunStarted);
    let t = s.task("big");
    s.apply(Event::TaskCompleted { task_id: t.id, attempt: t.attempt, output: json!("o".repeat(300)) });
    // Several chunks in one event.
    const _: () = assert!(super::map::ITEM_CHUNK < 7 && super::map::ITEMS_PER_EVENT >= 7);
    assert_eq!(s.run.status, RunStatus::Succeeded, "{:?}", s.run.error);
    assert_eq!(s.task("each").output, Some(json!(vec![300; 7])));
}

#[test]
fn an_approval_escalates_once_and_a_second_firing_of_its_timer_changes_nothing() {
    use crate::definition::approval::{Answer, Vote};
    let spec = json!({"name": "ok", "nodes": [{"id": "a", "type": "APPROVAL", "config": {"prompt": "ok?",
        "assignees": {"people": ["ana", "bo"]}, "quorum": "all", "escalate": {"after": "1h", "people": ["cy"]}}}]});
    let mut s = Sim::new(parse(spec));
    s.apply(Event::RunStarted);
    let a = s.task("a").clone();
    assert_eq!((a.state, a.wake_at), (TaskState::Waiting, Some(s.now + chrono::Duration::hours(1))));
    assert!(s.apply(Event::TimerFired { task_id: a.id }).ignored.is_some(), "not due yet");
    s.now += chrono::Duration::hours(1);
    let tr = s.apply(Event::TimerFired { task_id: a.id });
    assert!(tr.ignored.is_none(), "{:?}", tr.ignored);
    let a = s.task("a").clone();
    assert_eq!((a.state, a.wake_at, a.input["needed"].clone()), (TaskState::Waiting, None, json!(3)));
    // Another coordinator fires the same timer again: no deadline, so it waits on.
    let again = s.apply(Event::TimerFired { task_id: a.id });
    assert!(again.ignored.is_some());
    assert_eq!(s.task("a").state, TaskState::Waiting);
    // "all" is everyone named, the escalation's too; each vote once.
    let vote = |p: &str| Vote {
        person: p.into(),
        answer: Answer::Approve,
        data: json!({}),
        comment: None,
        via: None,
        at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
    };
    let mut earlier = Vec::new();
    for p in ["ana", "cy"] {
        let e = Event::ApprovalVote {
            task_id: a.id,
            attempt: 1,
            vote: Box::new(vote(p)),
            groups: vec![],
            earlier: earlier.clone(),
        };
        assert!(s.apply(e).ignored.is_none());
        earlier.push(vote(p));
    }
    assert_eq!(s.task("a").state, TaskState::Waiting, "bo has not approved");
    let twice = Event::ApprovalVote {
        task_id: a.id,
        attempt: 1,
        vote: Box::new(vote("ana")),
        groups: vec![],
        earlier: earlier.clone(),
    };
    assert!(s.apply(twice).ignored.unwrap().contains("already decided"));
    let last = Event::ApprovalVote { task_id: a.id, attempt: 1, vote: Box::new(vote("bo")), groups: vec![], earlier };
    assert!(s.apply(last).ignored.is_none());
    assert_eq!(s.task("a").state, TaskState::Completed);
    assert_eq!(s.run.status, RunStatus::Succeeded);
}
