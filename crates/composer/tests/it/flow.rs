//! Runs through coordinator → outbox → stream → worker → report → routing.

use std::collections::HashSet;
use std::time::Duration;

use composer_testkit::{http_node, Engine, FakeHttp};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn linear_three_step_run_calls_each_endpoint_once() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "linear", "nodes": [
        http_node("a", &http.url("/ok/a"), 3), http_node("b", &http.url("/ok/b"), 3), http_node("c", &http.url("/ok/c"), 3)],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;

    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let mut keys = HashSet::new();
    for n in ["a", "b", "c"] {
        let path = format!("/ok/{n}");
        assert_eq!(http.calls(&path), 1, "{path} must be called exactly once");
        let key = http.requests(&path)[0].idempotency_key.clone().expect("Idempotency-Key header");
        assert!(keys.insert(key), "Idempotency-Keys must be distinct");
    }
    let tasks = run["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3);
    for t in tasks {
        assert_eq!(t["state"], "COMPLETED");
        assert_eq!(t["attempt"], 1);
        assert_eq!(t["output"]["status"], 200);
        assert_eq!(t["output"]["body"]["path"], format!("/ok/{}", t["node_id"].as_str().unwrap()));
        let key = http.requests(&format!("/ok/{}", t["node_id"].as_str().unwrap()))[0].idempotency_key.clone().unwrap();
        assert_eq!(key, format!("{}:1", t["id"].as_str().unwrap()), "Idempotency-Key is <task_id>:<attempt>");
        assert!(t["started_at"].is_string() && t["finished_at"].is_string());
    }
    assert_eq!(run["output"]["c"]["body"]["path"], "/ok/c", "the run's output is its leaf's output");
    e.stop().await;
}

#[tokio::test]
async fn diamond_join_runs_once_after_both_branches() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "diamond", "nodes": [
        http_node("a", &http.url("/ok/a"), 1),
        http_node("b", &http.url("/slow/400/b"), 1),
        http_node("c", &http.url("/ok/c"), 1),
        http_node("d", &http.url("/ok/d"), 1)],
        "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}, {"from": "b", "to": "d"}, {"from": "c", "to": "d"}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;

    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.calls("/ok/d"), 1, "the join runs once");
    let d = http.requests("/ok/d")[0].at;
    let b = http.requests("/slow/400/b")[0].at;
    assert!(d >= b + Duration::from_millis(400), "the join must start after the slow branch finished");
    assert!(d > http.requests("/ok/c")[0].at);
    let output = run["output"].as_object().unwrap();
    assert_eq!(output.keys().collect::<Vec<_>>(), vec!["d"]);
    e.stop().await;
}

#[tokio::test]
async fn flaky_endpoint_succeeds_on_the_third_attempt() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "flaky", "nodes": [http_node("f", &http.url("/flaky/2/f"), 3)]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;

    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.calls("/flaky/2/f"), 3);
    let t = &run["tasks"][0];
    assert_eq!(t["attempt"], 3);
    assert_eq!(t["state"], "COMPLETED");
    let keys: HashSet<_> = http.requests("/flaky/2/f").into_iter().map(|r| r.idempotency_key.unwrap()).collect();
    let first = format!("{}:1", t["id"].as_str().unwrap());
    assert_eq!(keys, HashSet::from([first]), "the retries of one execution send its one Idempotency-Key");

    let (_, history) = e.get(&format!("/v1/runs/{id}/events")).await;
    let kinds: Vec<&str> = history["events"].as_array().unwrap().iter().map(|h| h["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "TaskRetryScheduled").count(), 2, "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"RunSucceeded"));
    e.stop().await;
}

#[tokio::test]
async fn server_errors_fail_the_run_after_max_attempts_and_no_successor_runs() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "fails", "nodes": [
        http_node("x", &http.url("/fail/x"), 3), http_node("next", &http.url("/ok/next"), 3)],
        "edges": [{"from": "x", "to": "next"}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;

    assert_eq!(run["status"], "FAILED", "{run}");
    assert_eq!(http.calls("/fail/x"), 3, "called max_attempts times");
    assert_eq!(http.calls("/ok/next"), 0, "no successor runs");
    let tasks = run["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "the successor was never created");
    assert_eq!(tasks[0]["state"], "FAILED");
    assert_eq!(tasks[0]["attempt"], 3);
    assert!(tasks[0]["error"].as_str().unwrap().contains("500"), "{}", tasks[0]["error"]);
    assert!(run["error"].as_str().unwrap().contains("\"x\""), "the run's error names the node: {}", run["error"]);
    e.stop().await;
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "bad", "nodes": [http_node("y", &http.url("/bad/y"), 5)]})).await;
    let run = e.wait_for_run(id, T).await;

    assert_eq!(run["status"], "FAILED", "{run}");
    assert_eq!(http.calls("/bad/y"), 1, "a 4xx is called once");
    assert!(run["tasks"][0]["error"].as_str().unwrap().contains("not retryable"));
    e.stop().await;
}

#[tokio::test]
async fn a_run_stays_on_the_version_it_started_with() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let v1 = json!({"name": "pinned", "nodes": [http_node("a", &http.url("/slow/300/v1"), 1)]});
    let v2 = json!({"name": "pinned", "nodes": [http_node("a", &http.url("/ok/v2"), 1)]});
    assert_eq!(e.register(&v1).await["version"], 1);
    let first = e.start_run("pinned", json!({})).await;
    let (status, body) = e.post("/v1/workflows", &v2).await;
    assert_eq!((status, &body["version"]), (201, &json!(2)), "a changed spec is a new version");
    let (status, body) = e.post("/v1/workflows", &v2).await;
    assert_eq!((status, &body["version"]), (200, &json!(2)), "the same spec again is the same version");
    let second = e.start_run("pinned", json!({})).await;
    let (status, _) = e.post("/v1/runs", &json!({"workflow": "pinned", "version": 1})).await;
    assert_eq!(status, 201, "an explicit older version can still be started");

    assert_eq!(e.wait_for_run(first, T).await["version"], 1);
    assert_eq!(e.wait_for_run(second, T).await["version"], 2);
    assert!(http.calls("/slow/300/v1") >= 1 && http.calls("/ok/v2") == 1);
    e.stop().await;
}

#[tokio::test]
async fn a_wait_node_holds_the_run_without_a_worker_call() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "waits", "nodes": [
        {"id": "pause", "type": "WAIT", "config": {"duration": "700ms"}},
        http_node("after", &http.url("/ok/after"), 1)],
        "edges": [{"from": "pause", "to": "after"}]});
    let started = std::time::Instant::now();
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert!(http.requests("/ok/after")[0].at >= started + Duration::from_millis(700));
    e.stop().await;
}

#[tokio::test]
async fn cancel_stops_a_run_and_retry_resumes_a_failed_one() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let id =
        e.run(&json!({"name": "long", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}]})).await;
    let (status, run) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!((status, &run["status"]), (200, &json!("CANCELLED")), "{run}");
    assert_eq!(run["tasks"][0]["state"], "CANCELLED");
    let (status, body) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 409, "cancelling a finished run is a conflict: {body}");

    let id = e.run(&json!({"name": "retry-me", "nodes": [http_node("f", &http.url("/flaky/1/r"), 1)]})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "FAILED");
    let (status, run) = e.post(&format!("/v1/runs/{id}/retry"), &json!({})).await;
    // The answer is the run as read after the retry: its step may have run by then.
    assert_eq!(status, 200, "{run}");
    assert!(run["status"] == "RUNNING" || run["status"] == "SUCCEEDED", "{run}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 2);
    e.stop().await;
}
