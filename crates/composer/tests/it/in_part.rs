//! Large runs read in part: a step's result loads the run's open and failed
//! tasks and what the state machine asks for, not every task of the run
//! (`COMPOSER_WHOLE_RUN_NODES`).

use std::time::Duration;

use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

/// 40 nodes: a chain of 24 whose last step reads the first's output, a
/// branch whose `when` is false (its chain of 5 is skipped), a step that
/// fails into a failure handler, a TRANSFORM that reads the middle of the
/// chain, a join of everything, and an output template.
fn large(http: &FakeHttp) -> Value {
    let mut nodes = vec![json!({"id": "c0", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/c0"),
        "body": {"order": "${ .input.order }"}}})];
    let mut edges = Vec::new();
    for i in 1..24 {
        nodes.push(http_node(&format!("c{i}"), &http.url(&format!("/ok/c{i}")), 1));
        edges.push(json!({"from": format!("c{}", i - 1), "to": format!("c{i}")}));
    }
    nodes.push(json!({"id": "far", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/far"),
        "body": {"first": "${ .nodes.c0.output.body.body.order }", "calls": "${ .nodes.c12.output.body.call }"}}}));
    edges.push(json!({"from": "c23", "to": "far"}));
    for i in 0..5 {
        nodes.push(http_node(&format!("never{i}"), &http.url(&format!("/ok/never{i}")), 1));
        let from = if i == 0 { "c3".to_string() } else { format!("never{}", i - 1) };
        let edge = match i {
            0 => json!({"from": from, "to": "never0", "when": ".input.order == \"none\""}),
            _ => json!({"from": from, "to": format!("never{i}")}),
        };
        edges.push(edge);
    }
    nodes.push(http_node("charge", &http.url("/fail/charge"), 1));
    nodes.push(http_node("refund", &http.url("/ok/refund"), 1));
    edges.push(json!({"from": "c5", "to": "charge"}));
    edges.push(json!({"from": "charge", "to": "refund", "on": "failure"}));
    nodes.push(
        json!({"id": "shape", "type": "TRANSFORM", "config": {"output": {"mid": "${ .nodes.c12.output.body.path }"}}}),
    );
    edges.push(json!({"from": "c20", "to": "shape"}));
    nodes.push(http_node("join", &http.url("/ok/join"), 1));
    for from in ["far", "never4", "refund", "shape"] {
        edges.push(json!({"from": from, "to": "join", "on": "always"}));
    }
    let names: Vec<&str> = nodes.iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert!(names.len() > 16 && names.len() < 40, "{}", names.len());
    json!({"name": "large", "nodes": nodes, "edges": edges,
           "output": {"far": "${ .nodes.far.output.body.body }", "shape": "${ .nodes.shape.output }",
                      "refunded": "${ .nodes.refund.state }", "skipped": "${ .nodes.never4.state }"}})
}

fn states(run: &Value) -> Vec<(String, String)> {
    let mut s: Vec<(String, String)> = run["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["node_id"].as_str().unwrap().to_string(), t["state"].as_str().unwrap().to_string()))
        .collect();
    s.sort();
    s
}

/// The coordinator's count of reads of missing tasks (the registry is the
/// process's: tests running alongside may add to it, never take from it).
async fn partial_loads(e: &Engine) -> f64 {
    let text = reqwest::get(format!("{}/metrics", e.url())).await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.starts_with("composer_partial_loads_total ")).expect("the metric is exported");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn run_large(opts: EngineOptions) -> (Value, f64) {
    let e = Engine::with(opts).await;
    let http = FakeHttp::start().await;
    e.register(&large(&http)).await;
    let before = partial_loads(&e).await;
    let id = e.start_run("large", json!({"order": "o-1"})).await;
    let run = e.wait_for_run(id, T).await;
    let loads = partial_loads(&e).await - before;
    for path in ["/ok/c1", "/ok/c23", "/echo/far", "/fail/charge", "/ok/refund", "/ok/join"] {
        assert_eq!(http.calls(path), 1, "{path} called once");
    }
    assert_eq!(http.calls("/ok/never0"), 0);
    e.stop().await;
    (run, loads)
}

#[tokio::test]
async fn a_large_run_read_in_part_ends_as_the_same_run_read_whole() {
    let (part, loads) = run_large(EngineOptions::default()).await;
    assert_eq!(part["status"], "SUCCEEDED", "{part}");
    assert_eq!(
        part["output"],
        json!({"far": {"first": "o-1", "calls": 1}, "shape": {"mid": "/ok/c12"}, "refunded": "COMPLETED", "skipped": "SKIPPED"}),
        "reads of steps far behind, a skipped branch, a handled failure and a TRANSFORM, as loaded on demand"
    );
    // Each step of the chain but the last looked for the next node's task.
    assert!(loads >= 23.0, "the run was read in part: {loads} reads of missing tasks");

    let (whole, _) = run_large(EngineOptions { coordinator: |c| c.whole_run_nodes = 1000, ..Default::default() }).await;
    assert_eq!(whole["status"], "SUCCEEDED", "{whole}");
    assert_eq!(part["output"], whole["output"]);
    assert_eq!(states(&part), states(&whole));
}

#[tokio::test]
async fn every_run_read_in_part_still_ends_right_and_a_cancel_reads_it_whole() {
    // 0: every run is read in part, a 3-step one too.
    let e = Engine::with(EngineOptions { coordinator: |c| c.whole_run_nodes = 0, ..Default::default() }).await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "small", "nodes": [
        http_node("a", &http.url("/ok/a"), 1),
        {"id": "b", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/b"), "body": {"from": "${ .nodes.a.output.body.path }"}}},
        {"id": "c", "type": "WAIT", "config": {"duration": "1h"}}],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    e.register(&spec).await;
    let id = e.start_run("small", json!({})).await;
    let run = e.wait_until(id, T, |r| r["tasks"].as_array().is_some_and(|t| t.len() == 3)).await;
    assert_eq!(http.requests("/echo/b")[0].body, json!({"from": "/ok/a"}), "{run}");
    let (status, body) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "CANCELLED");
    assert_eq!(
        states(&run),
        [("a", "COMPLETED"), ("b", "COMPLETED"), ("c", "CANCELLED")]
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .to_vec()
    );
    e.stop().await;
}

/// `n` TRANSFORMs in a chain after `after`, to make a definition large.
fn fillers(n: usize, after: &str) -> (Vec<Value>, Vec<Value>) {
    let nodes = (0..n).map(|i| json!({"id": format!("f{i}"), "type": "TRANSFORM", "config": {"output": i}})).collect();
    let edges = (0..n)
        .map(|i| {
            let from = if i == 0 { after.to_string() } else { format!("f{}", i - 1) };
            json!({"from": from, "to": format!("f{i}")})
        })
        .collect();
    (nodes, edges)
}

#[tokio::test]
async fn a_large_run_read_in_part_gives_its_failure_handler_every_node_and_later_map_chunks_their_reads() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "cleanup", "nodes": [{"id": "note", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    // 20 nodes: a token, fillers, a MAP of 1,100 items (a second chunk of
    // items is created while the run is read in part) whose items send the
    // token, then a step that fails; the handler's input reads the token.
    let (mut nodes, mut edges) = fillers(16, "token");
    nodes.insert(
        0,
        json!({"id": "token", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/token"),
        "body": {"token": "t-1"}}}),
    );
    nodes.push(json!({"id": "each", "type": "MAP", "config": {"items": "${ [range(1100)] }", "max_concurrency": 50,
        "collect": "none", "node": {"type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/item"),
        "body": {"token": "${ .nodes.token.output.body.body.token }"}}}}}));
    nodes.push(http_node("pay", &http.url("/bad/pay"), 1));
    edges.push(json!({"from": "f15", "to": "each"}));
    edges.push(json!({"from": "each", "to": "pay"}));
    e.register(&json!({"name": "big_fail", "nodes": nodes, "edges": edges,
        "on_failure": {"workflow": "cleanup", "input": {"token": "${ .failed_run.nodes.token.output.body.body.token }",
                                                       "filler": "${ .failed_run.nodes.f7.output }"}}}))
        .await;
    let id = e.start_run("big_fail", json!({})).await;
    let run = e.wait_for_run(id, Duration::from_secs(120)).await;
    assert_eq!(run["status"], "FAILED", "{}", run["error"]);
    let items = http.requests("/echo/item");
    assert_eq!(items.len(), 1100);
    let tokens: std::collections::BTreeSet<String> = items.iter().map(|r| r.body["token"].to_string()).collect();
    assert_eq!(tokens, ["\"t-1\"".to_string()].into(), "every chunk's items read the token");
    let handler = run["failure_handler_run_ids"][0].as_str().expect("a handler started").parse().unwrap();
    let handler = e.wait_for_run(handler, T).await;
    assert_eq!(handler["input"], json!({"token": "t-1", "filler": 7}), "{handler}");
    e.stop().await;
}
