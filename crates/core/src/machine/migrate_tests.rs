//! Moving a run to another version (`migrate`): which runs can move, and
//! how a moved run goes on under the new version.

use proptest::prelude::*;
use serde_json::{json, Value};
use uuid::Uuid;

use super::migrate::{move_run, plan, Mapping, Plan};
use super::tests::Sim;
use super::{Event, HistoryKind, RunStatus, TaskState, Transition};
use crate::definition::Workflow;

/// A workflow of HTTP nodes (`id` or `id:TYPE`) and edges.
fn wf(nodes: &[&str], edges: &[(&str, &str)]) -> Workflow {
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| match n.split_once(':') {
            Some((id, "TRANSFORM")) => json!({"id": id, "type": "TRANSFORM", "config": {"output": 1}}),
            Some((id, t)) => json!({"id": id, "type": t}),
            None => json!({"id": n, "type": "HTTP", "config": {"url": format!("http://h/{n}")}}),
        })
        .collect();
    let edges: Vec<Value> = edges.iter().map(|(f, t)| json!({"from": f, "to": t})).collect();
    Workflow::parse(&json!({"name": "t", "nodes": nodes, "edges": edges})).unwrap()
}

/// A run of `wf`, started.
fn started(wf: Workflow) -> Sim {
    let mut s = Sim::new(wf);
    s.apply(Event::RunStarted);
    s
}

fn state(s: &Sim, node: &str) -> Option<TaskState> {
    let n = s.wf.node_index(node)?;
    s.run.tasks.iter().find(|t| t.node == n && !t.removed).map(|t| t.state)
}

fn complete(s: &mut Sim, node: &str) {
    let tr = s.complete(node);
    assert!(tr.ignored.is_none(), "{node}: {:?}", tr.ignored);
}

/// Moves the run to `new` under `map`, as the engine does.
fn migrate(s: &mut Sim, new: Workflow, map: &[(&str, &str)]) -> Result<Transition, Plan> {
    let map: Mapping = map.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    move_run(&s.wf, &new, &mut s.run, &map)?;
    s.wf = new;
    Ok(s.apply(Event::Migrate { definition: Uuid::nil(), from_version: 1, to_version: 2, map }))
}

#[test]
fn a_step_added_after_the_running_one_runs_when_reached_and_the_move_is_recorded() {
    let mut s = started(wf(&["a", "b"], &[("a", "b")]));
    complete(&mut s, "a");
    let new = wf(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    let p = plan(&s.wf, &new, &s.run, &Mapping::new());
    assert!(p.movable(), "{p:?}");
    assert_eq!(p.added, ["c"]);
    let tr = migrate(&mut s, new, &[]).unwrap();
    assert_eq!(tr.history[0].kind, HistoryKind::RunMigrated);
    assert_eq!(tr.history[0].payload["to_version"], 2);
    assert_eq!(
        (state(&s, "a"), state(&s, "b"), state(&s, "c")),
        (Some(TaskState::Completed), Some(TaskState::Pending), None)
    );
    complete(&mut s, "b");
    assert_eq!(state(&s, "c"), Some(TaskState::Pending), "the new step starts once b ends");
    complete(&mut s, "c");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn a_new_step_whose_predecessors_ended_starts_at_the_move() {
    let mut s = started(wf(&["a", "b"], &[("a", "b")]));
    complete(&mut s, "a");
    let tr = migrate(&mut s, wf(&["a", "b", "audit"], &[("a", "b"), ("a", "audit")]), &[]).unwrap();
    assert_eq!(state(&s, "audit"), Some(TaskState::Pending));
    assert_eq!(tr.dispatch.len(), 1, "the new step is sent: {tr:?}");
}

#[test]
fn a_step_that_would_have_waited_for_one_not_run_refuses_the_move_and_changes_nothing() {
    let mut s = started(wf(&["a", "b"], &[("a", "b")]));
    complete(&mut s, "a");
    let before = s.run.clone();
    let new = wf(&["a", "check", "b"], &[("a", "check"), ("check", "b")]);
    let refused = migrate(&mut s, new, &[]).unwrap_err();
    assert!(refused.reasons[0].contains("puts `check` before it"), "{refused:?}");
    assert_eq!(s.run, before);
}

#[test]
fn a_step_the_new_version_lacks_refuses_until_the_map_names_its_step() {
    let mut s = started(wf(&["a", "b"], &[("a", "b")]));
    complete(&mut s, "a");
    let new = || wf(&["charge", "b"], &[("charge", "b")]);
    let refused = plan(&s.wf, &new(), &s.run, &Mapping::new());
    assert!(refused.reasons[0].contains("no step `a`: map it"), "{refused:?}");
    let mut map = Mapping::new();
    map.insert("a".into(), "charge".into());
    assert_eq!(move_run(&s.wf, &new(), &mut s.run.clone(), &map), Ok(vec![("a".into(), "charge".into())]));
    migrate(&mut s, new(), &[("a", "charge")]).unwrap();
    assert_eq!(state(&s, "charge"), Some(TaskState::Completed));
    complete(&mut s, "b");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn refusals_name_each_reason() {
    let mut s = started(wf(&["a", "b"], &[("a", "b")]));
    complete(&mut s, "a");
    let typed = plan(&s.wf, &wf(&["a", "b:resize"], &[("a", "b")]), &s.run, &Mapping::new());
    assert!(typed.reasons[0].contains("is a resize step, not a HTTP"), "{typed:?}");
    let two: Mapping = [("a".to_string(), "b".to_string())].into();
    let both = plan(&s.wf, &wf(&["b", "c"], &[("b", "c")]), &s.run, &two);
    assert!(both.reasons.iter().any(|r| r.contains("would both become `b`")), "{both:?}");
    let unknown: Mapping = [("zz".to_string(), "a".to_string())].into();
    let named = plan(&s.wf, &s.wf, &s.run, &unknown);
    assert!(named.reasons[0].contains("`zz`"), "{named:?}");
    complete(&mut s, "b");
    let ended = plan(&s.wf, &s.wf, &s.run, &Mapping::new());
    assert!(ended.reasons[0].contains("only an open run moves"), "{ended:?}");
}

#[test]
fn a_move_is_undone_by_moving_back() {
    let v1 = || wf(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    let v2 = || wf(&["a2", "b", "c"], &[("a2", "b"), ("b", "c")]);
    let mut s = started(v1());
    complete(&mut s, "a");
    let before: Vec<(usize, TaskState)> = s.run.tasks.iter().map(|t| (t.node, t.state)).collect();
    migrate(&mut s, v2(), &[("a", "a2")]).unwrap();
    migrate(&mut s, v1(), &[("a2", "a")]).unwrap();
    let after: Vec<(usize, TaskState)> = s.run.tasks.iter().map(|t| (t.node, t.state)).collect();
    assert_eq!(before, after);
    complete(&mut s, "b");
    complete(&mut s, "c");
    assert_eq!(s.run.status, RunStatus::Succeeded);
}

#[test]
fn a_step_not_ended_moves_only_to_a_step_sent_held_and_waited_for_as_it_was() {
    let node = |extra: Value| {
        let mut n = json!({"id": "b", "type": "HTTP", "config": {"url": "http://h/b"}});
        n.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        n
    };
    let with_b = |b: Value| {
        let a = json!({"id": "a", "type": "HTTP", "config": {"url": "http://h/a"}});
        Workflow::parse(&json!({"name": "t", "nodes": [a, b], "edges": [{"from": "a", "to": "b"}]})).unwrap()
    };
    let mut s = started(with_b(node(json!({}))));
    complete(&mut s, "a");
    for (changed, why) in [
        (json!({"delivery": "at_most_once"}), "delivered otherwise"),
        (json!({"queue": "elsewhere"}), "on queue \"elsewhere\""),
        (json!({"limits": [{"key": "bank", "concurrency": 1}]}), "other limits"),
    ] {
        let p = plan(&s.wf, &with_b(node(changed.clone())), &s.run, &Mapping::new());
        assert!(p.reasons.iter().any(|r| r.contains(why)), "{changed}: {p:?}");
    }
    // Its config may change: what was sent stands, a retry takes the new one.
    let p = plan(
        &s.wf,
        &with_b(json!({"id": "b", "type": "HTTP", "config": {"url": "http://h/fixed"}})),
        &s.run,
        &Mapping::new(),
    );
    assert!(p.movable(), "{p:?}");
    // Ended, it may change in every way but its type.
    complete(&mut s, "b");
    s.run.status = RunStatus::Running;
    let p = plan(&s.wf, &with_b(node(json!({"delivery": "at_most_once", "queue": "q"}))), &s.run, &Mapping::new());
    assert!(p.movable(), "{p:?}");
    // A wait waits for what it waited for.
    let waits = |event: &str| {
        Workflow::parse(&json!({"name": "t", "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": event, "key": "k"}}]}))
            .unwrap()
    };
    let s = started(waits("paid"));
    let p = plan(&s.wf, &waits("shipped"), &s.run, &Mapping::new());
    assert!(p.reasons.iter().any(|r| r.contains("waits for something else")), "{p:?}");
}

#[test]
fn a_failure_the_old_version_went_on_from_must_be_handled_by_the_new_one() {
    let handled = |on: &str| {
        let nodes = json!([{"id": "a", "type": "HTTP", "config": {"url": "http://h/a"}},
                           {"id": "h", "type": "HTTP", "config": {"url": "http://h/h"}}]);
        Workflow::parse(&json!({"name": "t", "nodes": nodes, "edges": [{"from": "a", "to": "h", "on": on}]})).unwrap()
    };
    let mut s = started(handled("failure"));
    let a = s.run.tasks[0].clone();
    let tr = s.apply(Event::TaskFailed {
        task_id: a.id,
        attempt: a.attempt,
        error: "no".into(),
        retryable: false,
        code: None,
        status: None,
        retry_after: None,
    });
    assert!(tr.ignored.is_none());
    assert_eq!(state(&s, "h"), Some(TaskState::Pending), "the failure edge was taken");
    assert!(plan(&s.wf, &handled("always"), &s.run, &Mapping::new()).movable());
    let p = plan(&s.wf, &handled("success"), &s.run, &Mapping::new());
    assert!(p.reasons.iter().any(|r| r.contains("no failure edge")), "{p:?}");
}

#[test]
fn a_queued_run_keeps_its_concurrency() {
    let limited = |max: u32| {
        Workflow::parse(&json!({"name": "t", "concurrency": {"max": max},
            "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .unwrap()
    };
    let mut s = Sim::new(limited(1));
    s.run.status = RunStatus::Queued;
    assert!(plan(&s.wf, &limited(1), &s.run, &Mapping::new()).movable());
    let p = plan(&s.wf, &limited(2), &s.run, &Mapping::new());
    assert!(p.reasons[0].contains("concurrency differs"), "{p:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A chain of n steps run up to step k; the new version inserts a
    /// step before step `at`. The run can move exactly when it has not
    /// reached step `at`, and a moved run finishes with every step of
    /// the new version run once and no ended step run again.
    #[test]
    fn a_run_moves_exactly_when_no_step_it_reached_would_wait_for_the_new_one(
        n in 2usize..7, k in 0usize..7, at in 1usize..7,
    ) {
        let (k, at) = (k.min(n - 1), at.min(n - 1));
        let ids: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
        let chain = |ids: &[String]| {
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            let edges: Vec<(&str, &str)> = refs.windows(2).map(|w| (w[0], w[1])).collect();
            wf(&refs, &edges)
        };
        let mut s = started(chain(&ids));
        for id in &ids[..k] {
            complete(&mut s, id);
        }
        let mut new_ids = ids.clone();
        new_ids.insert(at, "new".to_string());
        let reached = at <= k;
        match migrate(&mut s, chain(&new_ids), &[]) {
            Ok(_) => {
                prop_assert!(!reached, "moved though step {at} had started");
                for id in &new_ids {
                    if state(&s, id) != Some(TaskState::Completed) {
                        complete(&mut s, id);
                    }
                }
                prop_assert_eq!(s.run.status, RunStatus::Succeeded);
                prop_assert!(s.run.tasks.iter().all(|t| t.attempt == 1 && !t.removed));
                prop_assert_eq!(s.run.tasks.len(), n + 1);
            }
            Err(p) => prop_assert!(reached, "refused: {:?}", p.reasons),
        }
    }
}
