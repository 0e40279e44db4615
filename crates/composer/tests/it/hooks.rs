//! A run's hooks — `on_failure`, `on_success`, `on_end` — and deadlines,
//! through the engine on real PostgreSQL, Redis and HTTP: which ends start
//! which hooks, once each, with the run that ended as their input; a
//! deadline fires once while its run or step is open, and never after; a
//! hook's or a deadline's run starts none of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use composer_testkit::{http_node, Engine, FakeHttp};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

/// The hook runs a run's end started, by hook, each hook's run waited for.
async fn hooks_of(e: &Engine, run: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for h in run["hook_runs"].as_array().unwrap_or_else(|| panic!("no hook_runs: {run}")) {
        let id: Uuid = h["run_id"].as_str().unwrap().parse().unwrap();
        let hook = h["hook"].as_str().unwrap().to_string();
        assert!(out.insert(hook, e.wait_for_run(id, T).await).is_none(), "a hook started twice: {run}");
    }
    out
}

#[tokio::test]
async fn each_end_starts_the_hooks_for_it_once_with_the_run_as_input_and_a_hook_run_starts_none() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // The hooks' workflow has hooks of its own: a hook's run starts none.
    e.register(&json!({"name": "note", "on_end": {"workflow": "note"}, "on_success": {"workflow": "note"},
        "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]}))
        .await;
    let hooks = json!({
        "on_failure": {"workflow": "note", "input": {"why": "${ .failed_run.error }", "amount": "${ .input.amount }"}},
        "on_success": {"workflow": "note", "input": {"total": "${ .run.output.total }", "id": "${ .run.id }"}},
        "on_end": {"workflow": "note"}});
    let with_hooks = |name: &str, nodes: Value| {
        let mut d = json!({"name": name, "nodes": nodes, "output": {"total": "${ .input.amount * 2 }"}});
        for (k, v) in hooks.as_object().unwrap() {
            d[k] = v.clone();
        }
        d
    };
    e.register(&with_hooks("pays", json!([{"id": "ok", "type": "TRANSFORM", "config": {"output": 1}}]))).await;
    e.register(&with_hooks("declines", json!([http_node("pay", &http.url("/bad/declines"), 1)]))).await;
    e.register(&with_hooks("waits", json!([http_node("pay", &http.url("/slow/20000/waits"), 1)]))).await;

    let paid = e.start_run("pays", json!({"amount": 4})).await;
    let run = e.wait_for_run(paid, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let started = hooks_of(&e, &run).await;
    assert_eq!(started.keys().collect::<Vec<_>>(), ["on_end", "on_success"], "{run}");
    let success = &started["on_success"];
    assert_eq!(success["input"], json!({"total": 8, "id": paid.to_string()}), "{success}");
    assert_eq!(success["trigger"], json!({"hook": "on_success", "end_of": paid.to_string()}));
    assert_eq!(success["handles_run_id"], json!(paid.to_string()));
    let end = &started["on_end"];
    assert_eq!(end["input"]["run"]["status"], "SUCCEEDED", "{end}");
    assert_eq!(end["input"]["run"]["output"], json!({"total": 8}), "{end}");
    assert_eq!(end["input"]["run"]["nodes"]["ok"], json!({"state": "COMPLETED", "output": 1}), "{end}");
    assert_eq!(run["failure_handler_run_ids"], Value::Null, "a run that succeeded lists no failure handler");
    for hook in started.values() {
        assert_eq!(hook["status"], "SUCCEEDED", "{hook}");
        assert_eq!(hook["hook_runs"], json!([]), "a hook's run starts no hook of its own: {hook}");
    }
    let history = e.history(paid, "HandlerStarted").await;
    let noted: Vec<&str> = history.iter().map(|h| h["payload"]["hook"].as_str().unwrap()).collect();
    assert_eq!(noted, ["on_success", "on_end"], "{history:?}");

    let declined = e.start_run("declines", json!({"amount": 3})).await;
    let run = e.wait_for_run(declined, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let started = hooks_of(&e, &run).await;
    assert_eq!(started.keys().collect::<Vec<_>>(), ["on_end", "on_failure"], "{run}");
    assert_eq!(started["on_failure"]["input"], json!({"why": run["error"], "amount": 3}));
    assert_eq!(started["on_end"]["input"]["run"]["status"], "FAILED");
    let handler = json!([started["on_failure"]["id"]]);
    assert_eq!(run["failure_handler_run_ids"], handler, "only on_failure's run is a failure handler");

    // A cancel is an end on_end is for; on_failure is not, unless it says so.
    let waiting = e.start_run("waits", json!({"amount": 1})).await;
    e.wait_until(waiting, T, |r| r["tasks"][0]["state"] == "RUNNING" || r["tasks"][0]["state"] == "PENDING").await;
    let (status, body) = e.post(&format!("/v1/runs/{waiting}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(waiting, T).await;
    let started = hooks_of(&e, &run).await;
    assert_eq!(started.keys().collect::<Vec<_>>(), ["on_end"], "{run}");
    assert_eq!(started["on_end"]["input"]["run"]["status"], "CANCELLED");
    e.stop().await;
}

/// A hook whose input does not evaluate, or whose workflow is not
/// registered, leaves the end written and says why in the run's history;
/// the run's other hooks start.
#[tokio::test]
async fn a_hook_that_cannot_start_leaves_the_end_written_says_why_and_the_others_start() {
    let e = Engine::start().await;
    e.register(&json!({"name": "note", "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    e.register(&json!({"name": "ends", "nodes": [{"id": "ok", "type": "TRANSFORM", "config": {"output": 1}}],
        "on_success": {"workflow": "note", "input": "${ error(\"no input for you\") }"},
        "on_end": {"workflow": "nowhere_registered"}}))
        .await;
    let id = e.start_run("ends", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!((run["status"].as_str(), run["hook_runs"].clone()), (Some("SUCCEEDED"), json!([])), "{run}");
    let noted = e.history(id, "HandlerStarted").await;
    let why: Vec<(&str, &str)> = noted
        .iter()
        .map(|h| (h["payload"]["hook"].as_str().unwrap(), h["payload"]["error"].as_str().unwrap()))
        .collect();
    assert_eq!(why.len(), 2, "{noted:?}");
    assert!(why[0].0 == "on_success" && why[0].1.contains("no input for you"), "{why:?}");
    assert!(why[1].0 == "on_end" && why[1].1.contains("nowhere_registered"), "{why:?}");
    e.stop().await;
}

/// The run's deadlines still armed (rows of `run_deadlines`), as
/// `(node, index)`.
async fn armed(e: &Engine, run: Uuid) -> Vec<(String, i32)> {
    let c = e.db.pool().get().await.unwrap();
    let rows =
        c.query("SELECT node_id, idx FROM run_deadlines WHERE run_id = $1 ORDER BY 1, 2", &[&run]).await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

#[tokio::test]
async fn a_deadline_fires_once_while_its_run_or_step_is_open_and_changes_nothing_of_the_run() {
    let e = Engine::start().await;
    // The deadline's workflow has deadlines of its own: a deadline's run arms none.
    e.register(&json!({"name": "note", "deadlines": [{"after": "10ms", "start": {"workflow": "note"}}],
        "nodes": [{"id": "n", "type": "WAIT", "config": {"duration": "300ms"}}]}))
        .await;
    let page = |after: &str| json!({"after": after, "start": {"workflow": "note"}});
    e.register(&json!({"name": "slow", "output": {"done": "${ .nodes.done.output }"},
        "deadlines": [
            {"after": "300ms", "start": {"workflow": "note", "input": {"id": "${ .run.id }", "after": "${ .deadline.after }",
                "amount": "${ .input.amount }", "status": "${ .run.status }"}}},
            page("1h")],
        "nodes": [
            {"id": "w", "type": "WAIT", "config": {"duration": "2s"}, "deadlines": [page("100ms")]},
            {"id": "done", "type": "TRANSFORM", "config": {"output": 7}, "deadlines": [page("1h")]}],
        "edges": [{"from": "w", "to": "done"}]}))
    .await;
    let id = e.start_run("slow", json!({"amount": 5})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!((run["status"].as_str(), run["output"].clone()), (Some("SUCCEEDED"), json!({"done": 7})));
    assert!(armed(&e, id).await.is_empty(), "the run's end disarms what did not fire");
    let noted = e.history(id, "DeadlinePassed").await;
    let mut seen: Vec<(Value, String)> = noted
        .iter()
        .map(|h| (h["payload"]["node"].clone(), h["payload"]["after"].as_str().unwrap().to_string()))
        .collect();
    seen.sort_by_key(|s| s.1.clone());
    assert_eq!(seen, [(json!("w"), "100ms".to_string()), (Value::Null, "300ms".to_string())], "{noted:?}");
    let started = run["hook_runs"].as_array().unwrap();
    assert_eq!(started.len(), 2, "{run}");
    assert!(started.iter().all(|h| h["hook"] == "deadline"), "{run}");
    for h in started {
        let d = e.wait_for_run(h["run_id"].as_str().unwrap().parse().unwrap(), T).await;
        assert_eq!(d["status"], "SUCCEEDED", "{d}");
        assert_eq!(d["handles_run_id"], json!(id.to_string()));
        assert_eq!(d["trigger"]["hook"], "deadline");
        assert_eq!(d["trigger"]["deadline_of"], json!(id.to_string()));
        assert_eq!(d["hook_runs"], json!([]), "a deadline's run fires no deadline of its own: {d}");
        let input = &d["input"];
        match d["trigger"]["node"].as_str() {
            Some("w") => {
                assert_eq!(input["step"]["node"], "w", "{input}");
                assert_eq!(input["step"]["state"], "WAITING", "{input}");
                assert_eq!(input["deadline"]["after"], "100ms", "{input}");
                assert_eq!(input["run"]["id"], json!(id.to_string()), "{input}");
            }
            _ => assert_eq!(input, &json!({"id": id.to_string(), "after": "300ms", "amount": 5, "status": "RUNNING"})),
        }
    }

    // A run that ends before its deadline never fires it: its end disarms it.
    e.register(&json!({"name": "quick", "deadlines": [page("2s")],
        "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": 1}, "deadlines": [page("2s")]}]}))
        .await;
    let quick = e.start_run("quick", json!({})).await;
    let run = e.wait_for_run(quick, T).await;
    assert_eq!(run["status"], "SUCCEEDED");
    assert!(armed(&e, quick).await.is_empty());
    assert_eq!(run["hook_runs"], json!([]));
    e.stop().await;
}

/// A deadline whose workflow is not registered, or whose input does not
/// evaluate, notes why in the run's history and is not fired again; the
/// run goes on.
#[tokio::test]
async fn a_deadline_that_cannot_start_its_run_says_why_once_and_the_run_goes_on() {
    let e = Engine::start().await;
    e.register(&json!({"name": "note", "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    e.register(&json!({"name": "stuck", "deadlines": [
            {"after": "50ms", "start": {"workflow": "nowhere_registered"}},
            {"after": "50ms", "start": {"workflow": "note", "input": "${ error(\"no input for you\") }"}}],
        "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}}]}))
        .await;
    let id = e.start_run("stuck", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let noted = e.history(id, "DeadlinePassed").await;
    let mut why: Vec<String> = noted.iter().map(|h| h["payload"]["error"].as_str().unwrap().to_string()).collect();
    why.sort();
    assert_eq!(why.len(), 2, "each noted once: {noted:?}");
    assert!(why[0].contains("no input for you") && why[1].contains("nowhere_registered"), "{why:?}");
    assert_eq!(run["hook_runs"], json!([]));
    e.stop().await;
}

/// Hooks' and deadlines' runs join the run tree of the run that started
/// them, and so do the runs those start: a chain of definitions that would
/// start runs without end (a deadline's run whose child has deadlines, a
/// hook's run whose child has the hook) stops at the tree's fan-out budget
/// (charged for each child), and says so.
#[tokio::test]
async fn hooks_and_deadlines_that_would_start_runs_without_end_stop_at_the_trees_budget() {
    use composer_testkit::EngineOptions;
    let e = Engine::with(EngineOptions { coordinator: |c| c.max_tree_runs = 10, ..Default::default() }).await;
    // Each `late` run's three deadlines start `again`, whose child is `late`.
    let page = json!({"after": "10ms", "start": {"workflow": "again"}});
    e.register(&json!({"name": "late", "deadlines": [page, page, page],
        "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "3s"}}]}))
        .await;
    e.register(&json!({"name": "again", "nodes": [{"id": "c", "type": "SUB_WORKFLOW", "config": {"workflow": "late"},
        "retry": {"max_attempts": 1}}]}))
        .await;
    // Each `ends` run's end starts `restart`, whose child is `ends`.
    e.register(&json!({"name": "ends", "on_end": {"workflow": "restart"},
        "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    e.register(
        &json!({"name": "restart", "nodes": [{"id": "c", "type": "SUB_WORKFLOW", "config": {"workflow": "ends"},
        "retry": {"max_attempts": 1}}]}),
    )
    .await;
    let count = |workflow: &'static str| {
        let e = &e;
        async move {
            let (_, page) = e.get(&format!("/v1/runs?workflow={workflow}&limit=100")).await;
            page["runs"].as_array().unwrap().len()
        }
    };
    for (root, workflows, noted) in
        [("late", ["late", "again"], "DeadlinePassed"), ("ends", ["ends", "restart"], "HandlerStarted")]
    {
        let first = e.start_run(root, json!({})).await;
        // The budget's refusal is noted on some run of the tree: a hook or
        // a deadline that could not start, or a child that could not.
        let refused = composer_testkit::eventually(T, "a start refused by the tree's budget", || async {
            for workflow in workflows {
                let (_, page) = e.get(&format!("/v1/runs?workflow={workflow}&limit=100")).await;
                for r in page["runs"].as_array().unwrap() {
                    if let Some(error) = r["error"].as_str() {
                        return Some(error.to_string());
                    }
                    let id: Uuid = r["id"].as_str().unwrap().parse().unwrap();
                    let noted = e.history(id, noted).await;
                    if let Some(h) = noted.iter().find(|h| h["payload"]["error"].as_str().is_some()) {
                        return Some(h["payload"]["error"].as_str().unwrap().to_string());
                    }
                }
            }
            None
        })
        .await;
        assert!(refused.contains("COMPOSER_MAX_TREE_RUNS"), "{refused}");
        // The root and its children are charged (at most 10); each of them
        // starts at most three hooks' or deadlines' runs.
        let (charged, owed) = (count(workflows[0]).await, count(workflows[1]).await);
        assert!(charged <= 10 && owed <= 3 * charged, "{root}: {charged} charged runs, {owed} owed");
        let run = e.wait_for_run(first, T).await;
        assert!(run["status"] == "SUCCEEDED", "{run}");
    }
    e.stop().await;
}

/// Two hooks of one end whose runs start MAPs share the tree's budget of
/// items: each sees what the one before it took, so the end commits (the
/// second MAP is refused what is left) instead of failing its write for a
/// budget both read before either was charged.
#[tokio::test]
async fn two_hooks_whose_maps_share_the_trees_items_see_each_others_and_the_run_ends() {
    use composer_testkit::EngineOptions;
    let e = Engine::with(EngineOptions { coordinator: |c| c.max_tree_items = 8, ..Default::default() }).await;
    e.register(&json!({"name": "mapper", "nodes": [{"id": "each", "type": "MAP",
        "config": {"items": [1, 2, 3, 4, 5], "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}}]}))
        .await;
    e.register(&json!({"name": "ends", "on_success": {"workflow": "mapper"}, "on_end": {"workflow": "mapper"},
        "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    let id = e.start_run("ends", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let started = hooks_of(&e, &run).await;
    let ends: Vec<(&str, &str)> = started.iter().map(|(k, r)| (k.as_str(), r["status"].as_str().unwrap())).collect();
    assert_eq!(ends.iter().filter(|(_, s)| *s == "SUCCEEDED").count(), 1, "{ends:?}");
    let failed = started.values().find(|r| r["status"] == "FAILED").unwrap();
    assert!(failed["error"].as_str().unwrap().contains("COMPOSER_MAX_TREE_ITEMS"), "{failed}");
    e.stop().await;
}
