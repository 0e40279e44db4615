//! A run's hooks — `on_failure`, `on_success`, `on_end` — through the
//! engine on real PostgreSQL, Redis and HTTP: which ends start which, once
//! each, with the run that ended as their input; a hook's run starts none.

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
