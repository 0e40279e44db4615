//! Data flow, branching, TRANSFORM, external events, run control and
//! visibility (issue: data flow, external events and run control).

use std::collections::HashSet;
use std::time::Duration;

use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn typed_data_flows_from_the_input_and_one_output_into_the_next_body() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "flow", "nodes": [
        {"id": "first", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/first"),
            "body": {"amount": "${ .input.amount }", "items": "${ .input.items }"}}},
        {"id": "second", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/second"),
            "body": {"seen": "${ .nodes.first.output.body.body.amount }", "count": "${ .nodes.first.output.body.body.items | length }",
                     "note": "paid ${ .input.amount } by ${ .input.who }", "whole": "${ .nodes.first.output.status }"}}}],
        "edges": [{"from": "first", "to": "second"}]});
    e.register(&spec).await;
    let id = e.start_run("flow", json!({"amount": 12.5, "items": [1, 2, 3], "who": "ada"})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.requests("/echo/first")[0].body, json!({"amount": 12.5, "items": [1, 2, 3]}));
    assert_eq!(
        http.requests("/echo/second")[0].body,
        json!({"seen": 12.5, "count": 3, "note": "paid 12.5 by ada", "whole": 200}),
        "a whole ${{}} keeps its JSON type; text around it interpolates"
    );
    e.stop().await;
}

#[tokio::test]
async fn a_branch_is_taken_the_other_skipped_and_a_join_after_the_skip_still_runs() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "branch", "nodes": [
        http_node("check", &http.url("/ok/check"), 1),
        http_node("big", &http.url("/ok/big"), 1),
        http_node("small", &http.url("/ok/small"), 1),
        http_node("after_small", &http.url("/ok/after_small"), 1),
        http_node("join", &http.url("/ok/join"), 1)],
        "edges": [
            {"from": "check", "to": "big", "when": ".input.amount > 100"},
            {"from": "check", "to": "small", "when": ".input.amount <= 100"},
            {"from": "small", "to": "after_small"},
            {"from": "big", "to": "join"}, {"from": "after_small", "to": "join"}]});
    e.register(&spec).await;
    let id = e.start_run("branch", json!({"amount": 500})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let state = |n: &str| run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == n).unwrap()["state"].clone();
    assert_eq!(state("big"), "COMPLETED");
    assert_eq!(state("small"), "SKIPPED");
    assert_eq!(state("after_small"), "SKIPPED", "the skip propagates");
    assert_eq!(state("join"), "COMPLETED", "the join after a skipped branch still runs");
    assert_eq!((http.calls("/ok/small"), http.calls("/ok/after_small"), http.calls("/ok/join")), (0, 0, 1));
    e.stop().await;
}

#[tokio::test]
async fn a_transform_output_reaches_the_run_output() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "shape", "nodes": [
        http_node("fetch", &http.url("/ok/fetch"), 1),
        {"id": "summary", "type": "TRANSFORM", "config": {"output": {
            "status": "${ .nodes.fetch.output.status }", "who": "${ .input.who | ascii_upcase }"}}}],
        "edges": [{"from": "fetch", "to": "summary"}],
        "output": {"summary": "${ .nodes.summary.output }", "run": "${ .run.workflow }"}});
    e.register(&spec).await;
    let id = e.start_run("shape", json!({"who": "ada"})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"], json!({"summary": {"status": 200, "who": "ADA"}, "run": "shape"}));
    assert_eq!(http.all().len(), 1, "a TRANSFORM is never dispatched");
    e.stop().await;
}

fn waiter_spec(http: &FakeHttp, timeout: &str) -> Value {
    json!({"name": format!("order-{timeout}"), "nodes": [
        {"id": "shipped", "type": "WAIT_FOR_EVENT", "config": {"event": "shipment.sent", "key": "${ .input.order_id }", "timeout": timeout}},
        {"id": "notify", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/notify"), "body": "${ .nodes.shipped.output }"}}],
        "edges": [{"from": "shipped", "to": "notify"}]})
}

#[tokio::test]
async fn an_event_wakes_only_the_run_whose_key_matches() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = waiter_spec(&http, "1h");
    e.register(&spec).await;
    let name = spec["name"].as_str().unwrap();
    let a = e.start_run(name, json!({"order_id": "A-1"})).await;
    let b = e.start_run(name, json!({"order_id": "B-2"})).await;
    e.wait_until(a, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    e.wait_until(b, T, |r| r["tasks"][0]["state"] == "WAITING").await;

    let (status, body) =
        e.post("/v1/events", &json!({"name": "shipment.sent", "key": "A-1", "payload": {"carrier": "ups"}})).await;
    assert_eq!((status, &body["matched"]), (200, &json!(1)), "{body}");
    let run = e.wait_for_run(a, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.requests("/echo/notify")[0].body, json!({"carrier": "ups"}), "the payload is the step's output");
    let (_, other) = e.get(&format!("/v1/runs/{b}")).await;
    assert_eq!(other["status"], "RUNNING");
    assert_eq!(other["tasks"][0]["state"], "WAITING", "the other key's run is untouched");
    e.stop().await;
}

#[tokio::test]
async fn an_event_sent_just_before_its_waiter_exists_is_still_delivered() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = waiter_spec(&http, "1h");
    e.register(&spec).await;
    let (status, body) =
        e.post("/v1/events", &json!({"name": "shipment.sent", "key": "EARLY", "payload": {"n": 1}})).await;
    assert_eq!((status, &body["matched"], &body["buffered"]), (200, &json!(0), &json!(true)), "{body}");
    let id = e.start_run(spec["name"].as_str().unwrap(), json!({"order_id": "EARLY"})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["tasks"][0]["output"], json!({"n": 1}));
    let second = e.start_run(spec["name"].as_str().unwrap(), json!({"order_id": "EARLY"})).await;
    let run = e.wait_until(second, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    assert_eq!(run["status"], "RUNNING", "a buffered event is consumed by the first waiter only");
    e.stop().await;
}

#[tokio::test]
async fn an_event_wait_times_out() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = waiter_spec(&http, "500ms");
    e.register(&spec).await;
    let id = e.start_run(spec["name"].as_str().unwrap(), json!({"order_id": "LATE"})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["tasks"][0]["error"].as_str().unwrap().contains("timed out"), "{run}");
    assert_eq!(http.calls("/echo/notify"), 0);
    let (_, body) = e.post("/v1/events", &json!({"name": "shipment.sent", "key": "LATE", "payload": {}})).await;
    assert_eq!(body["matched"], 0, "a timed-out wait takes no event");
    e.stop().await;
}

#[tokio::test]
async fn two_concurrent_starts_with_one_idempotency_key_make_one_run() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "once", "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]})).await;
    let body = json!({"workflow": "once", "idempotency_key": "order-77"});
    let starts: Vec<_> = (0..8).map(|_| e.post("/v1/runs", &body)).collect();
    let results = futures_util::future::join_all(starts).await;
    let ids: HashSet<String> = results.iter().map(|(_, r)| r["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 1, "one run for one key: {results:?}");
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 7, "{statuses:?}");
    let (_, list) = e.get("/v1/runs?workflow=once").await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 1);
    let (status, _) = e.post("/v1/runs", &json!({"workflow": "once", "idempotency_key": "order-78"})).await;
    assert_eq!(status, 201, "another key is another run");
    e.stop().await;
}

#[tokio::test]
async fn an_expression_error_is_shown_on_the_failed_node() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "bad-expr", "nodes": [
        {"id": "calc", "type": "HTTP", "config": {"url": http.url("/ok/calc"), "body": {"x": "${ .input.n | ascii_downcase }"}}}]});
    e.register(&spec).await;
    let id = e.start_run("bad-expr", json!({"n": 5})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED");
    let error = run["tasks"][0]["error"].as_str().unwrap();
    assert!(error.contains("config.body.x") || error.contains("ascii_downcase"), "{error}");
    assert_eq!(http.calls("/ok/calc"), 0);

    let (status, body) = e
        .post(
            "/v1/workflows",
            &json!({"name": "syntax", "nodes": [
        {"id": "n", "type": "HTTP", "config": {"url": "http://h/", "body": "${ .input. | }"}}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("nodes[n].config.body"), "{body}");
    let (status, body) = e
        .post(
            "/v1/workflows",
            &json!({"name": "syntax2", "nodes": [http_node("a", "http://h/a", 1), http_node("b", "http://h/b", 1)],
        "edges": [{"from": "a", "to": "b", "when": ".x ==="}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("edges[0].when"), "{body}");
    e.stop().await;
}

#[tokio::test]
async fn runs_are_listed_newest_first_in_pages_and_history_is_paged() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "listed", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}]})).await;
    e.register(&json!({"name": "other", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}]})).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(e.start_run("listed", json!({})).await.to_string());
    }
    e.start_run("other", json!({})).await;
    let (_, page1) = e.get("/v1/runs?workflow=listed&limit=2").await;
    let (_, page2) =
        e.get(&format!("/v1/runs?workflow=listed&limit=2&cursor={}", page1["next_cursor"].as_str().unwrap())).await;
    let (_, page3) =
        e.get(&format!("/v1/runs?workflow=listed&limit=2&cursor={}", page2["next_cursor"].as_str().unwrap())).await;
    let seen: Vec<String> = [&page1, &page2, &page3]
        .iter()
        .flat_map(|p| p["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()))
        .collect();
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first);
    assert!(page3["next_cursor"].is_null());
    let (_, running) = e.get("/v1/runs?status=running&limit=100").await;
    assert_eq!(running["runs"].as_array().unwrap().len(), 6);
    let (status, body) = e.get("/v1/runs?limit=100000").await;
    assert_eq!(status, 400, "the page size is bounded: {body}");
    let (status, _) = e.get("/v1/runs?status=sleeping").await;
    assert_eq!(status, 400);

    let (_, cancelled) = e.post(&format!("/v1/runs/{}/cancel", ids[0]), &json!({})).await;
    assert_eq!(cancelled["status"], "CANCELLED");
    let (_, h1) = e.get(&format!("/v1/runs/{}/events?limit=2", ids[0])).await;
    let kinds: Vec<&str> = h1["events"].as_array().unwrap().iter().map(|h| h["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["RunStarted", "TaskWaiting"]);
    let (_, h2) = e.get(&format!("/v1/runs/{}/events?after={}", ids[0], h1["next_after"])).await;
    let kinds: Vec<&str> = h2["events"].as_array().unwrap().iter().map(|h| h["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["TaskCancelled", "RunCancelled"]);
    e.stop().await;
}

#[tokio::test]
async fn too_large_payloads_are_refused_with_413() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.max_payload = 2000, ..Default::default() }).await;
    let big = "x".repeat(5000);
    let (status, body) = e.post("/v1/events", &json!({"name": "n", "key": "k", "payload": {"blob": big}})).await;
    assert_eq!(status, 413, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("2000"), "{body}");
    let (status, _) = e.post_raw("/v1/workflows", &format!("{{\"name\": \"{}\"}}", "y".repeat(200_000))).await;
    assert_eq!(status, 413, "a body past the limit is refused before parsing");
    e.stop().await;
}

#[tokio::test]
async fn a_paused_run_finishes_what_started_starts_nothing_new_and_resumes() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "pausable", "nodes": [
        http_node("a", &http.url("/slow/800/a"), 1), http_node("b", &http.url("/ok/b"), 1)],
        "edges": [{"from": "a", "to": "b"}]});
    let id = e.run(&spec).await;
    let (status, paused) = e.post(&format!("/v1/runs/{id}/pause"), &json!({})).await;
    assert_eq!((status, paused["status"].as_str()), (200, Some("PAUSED")), "{paused}");
    let run = e.wait_until(id, T, |r| r["tasks"][0]["state"] == "COMPLETED").await;
    assert_eq!(run["status"], "PAUSED", "the step that had started finished: {run}");
    // An absence, so a fixed time: nothing new may start in this window.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(run["tasks"].as_array().unwrap().len(), 1, "nothing new started: {run}");
    assert_eq!(http.calls("/ok/b"), 0);
    let (_, listed) = e.get("/v1/runs?status=PAUSED").await;
    assert_eq!(listed["runs"][0]["id"], json!(id.to_string()));

    let (status, _) = e.post(&format!("/v1/runs/{id}/resume"), &json!({})).await;
    assert_eq!(status, 200);
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.calls("/ok/b"), 1);
    let (status, body) = e.post(&format!("/v1/runs/{id}/pause"), &json!({})).await;
    assert_eq!(status, 409, "a finished run cannot be paused: {body}");
    assert_eq!(e.history(id, "RunPaused").await.len(), 1);
    assert_eq!(e.history(id, "RunResumed").await.len(), 1);

    let other = e.run(&spec).await;
    e.post(&format!("/v1/runs/{other}/pause"), &json!({})).await;
    let (status, cancelled) = e.post(&format!("/v1/runs/{other}/cancel"), &json!({})).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("CANCELLED")), "a paused run can be cancelled");
    e.stop().await;
}

#[tokio::test]
async fn a_node_timeout_fails_a_slow_attempt_and_the_retry_policy_applies() {
    let e = Engine::with(EngineOptions {
        coordinator: |c| c.timer_interval = Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "bounded", "nodes": [{"id": "slow", "type": "HTTP",
        "config": {"url": http.url("/slow/5000/s")}, "timeout": "500ms",
        "retry": {"max_attempts": 2, "initial_backoff": "10ms"}}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("timed out after 500ms"), "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 2, "each attempt has its own deadline");
    assert_eq!(e.history(id, "TaskRetryScheduled").await.len(), 1);
    e.stop().await;
}

#[tokio::test]
async fn a_run_past_its_definition_timeout_fails_with_its_open_steps_cancelled() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.timer_interval = Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let spec = json!({"name": "bounded_run", "timeout": "1s", "nodes": [
        {"id": "long", "type": "WAIT", "config": {"duration": "1h"}}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert_eq!(run["error"], "run timed out after 1s");
    assert_eq!(run["tasks"][0]["state"], "CANCELLED");
    let (status, body) = e
        .post(
            "/v1/workflows",
            &json!({"name": "bad_timeout", "timeout": "0s",
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    e.stop().await;
}
