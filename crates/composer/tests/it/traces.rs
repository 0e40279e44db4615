//! OpenTelemetry traces, sent to a real collector (Rotel): a run is a trace
//! under the caller's `traceparent`, each attempt a span with its stages,
//! HTTP targets and task-API workers get the attempt's `traceparent`, a
//! child run sits under its parent's attempt, MAP items and loop
//! iterations are spans of their own, and an event's trace is continued by
//! the runs it starts and linked from the steps it completes.

use std::collections::HashMap;
use std::time::Duration;

use composer_testkit::{Collector, Engine, EngineOptions, FakeHttp, ReceivedSpan};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(60);
const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

/// An engine whose one coordinator sends its spans to `collector`.
async fn traced(collector: &Collector, workers: usize) -> Engine {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut c = e.coordinator_config();
    c.otlp_endpoint = Some(collector.endpoint.clone());
    e.start_coordinator_with(c).await;
    for i in 0..workers {
        e.start_worker(&format!("w{i}"), 8).await;
    }
    e
}

async fn post_traced(e: &Engine, path: &str, body: &Value, traceparent: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", e.url()))
        .header("traceparent", traceparent)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn of_run<'a>(spans: &'a [ReceivedSpan], run: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.attributes.get("composer.run.id").map(String::as_str) == Some(run)).collect()
}

fn run_span<'a>(spans: &'a [ReceivedSpan], run: &str) -> Option<&'a ReceivedSpan> {
    of_run(spans, run).into_iter().find(|s| s.attributes.contains_key("composer.run.status"))
}

#[tokio::test]
async fn a_run_is_one_trace_under_its_callers_span_with_a_span_per_attempt_item_and_child() {
    let collector = Collector::start();
    // The worker starts once the run has: its first step goes through its
    // stream (a worker already waiting would be handed it with the start's commit).
    let mut e = traced(&collector, 0).await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "billing", "nodes": [{"id": "bill", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    e.register(&json!({"name": "traced", "nodes": [
        {"id": "call", "type": "HTTP", "config": {"url": http.url("/flaky/1/call")},
         "retry": {"max_attempts": 2, "initial_backoff": "10ms"}},
        {"id": "each", "type": "MAP", "config": {"items": "${ [1, 2] }",
         "node": {"type": "HTTP", "config": {"url": http.url("/ok/item")}}}},
        {"id": "child", "type": "SUB_WORKFLOW", "config": {"workflow": "billing"}},
        {"id": "shape", "type": "TRANSFORM", "config": {"output": "${ .nodes.child.output }"}}],
        "edges": [{"from": "call", "to": "each"}, {"from": "each", "to": "child"}, {"from": "child", "to": "shape"}]}))
        .await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (status, run) = post_traced(&e, "/v1/runs", &json!({"workflow": "traced"}), &caller).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["trace_id"], CALLER_TRACE, "the run says which trace it is in");
    let id: Uuid = run["id"].as_str().unwrap().parse().unwrap();
    e.start_worker("w0", 8).await;
    let page = reqwest::get(format!("{}/ui/runs/{id}", e.url())).await.unwrap().text().await.unwrap();
    assert!(page.contains(&format!("trace <code class=\"trace\">{CALLER_TRACE}</code>")), "the run page too");
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    let run_id = id.to_string();
    let billing = |s: &ReceivedSpan| s.name == "run billing" && s.trace_id == CALLER_TRACE;
    let spans = collector.wait_for(T, |s| run_span(s, &run_id).is_some() && s.iter().any(billing)).await;

    let root = run_span(&spans, &run_id).unwrap();
    assert_eq!((root.trace_id.as_str(), root.parent_id.as_str()), (CALLER_TRACE, CALLER_SPAN), "the caller's trace");
    assert_eq!(root.name, "run traced");
    assert_eq!(root.attributes["composer.run.status"], "SUCCEEDED");
    let steps: Vec<&ReceivedSpan> = of_run(&spans, &run_id).into_iter().filter(|s| s.id != root.id).collect();
    for s in &steps {
        assert_eq!((s.trace_id.as_str(), s.parent_id.as_str()), (CALLER_TRACE, root.id.as_str()), "{s:?}");
        assert!(root.start_ns <= s.start_ns && s.end_ns <= root.end_ns, "within the run: {s:?}");
    }
    let by_name = |name: &str| steps.iter().filter(|s| s.name == name).copied().collect::<Vec<_>>();

    // Two attempts of `call`: the first failed (500) and was retried.
    let mut calls = by_name("call");
    calls.sort_by_key(|s| s.attributes["composer.attempt"].clone());
    assert_eq!(calls.len(), 2, "{steps:#?}");
    assert_eq!(calls[0].attributes["composer.outcome"], "RETRIED");
    assert_eq!(calls[0].status.as_ref().map(|s| s.0.as_str()), Some("STATUS_CODE_ERROR"));
    assert_eq!(calls[1].attributes["composer.outcome"], "COMPLETED");
    assert_eq!(calls[1].kind, "SPAN_KIND_CLIENT");
    assert_eq!(calls[0].events, ["commit", "publish", "read", "lease", "execute", "report"], "every stage");
    // The retry went through its stream too, or, as the worker waited for
    // work, was leased in its dispatching commit and handed to its poll.
    let handed = ["commit", "lease", "execute", "report"];
    assert!(calls[1].events == calls[0].events || calls[1].events == handed, "{:?}", calls[1].events);
    // Each attempt's request carried its own span as the parent.
    let sent: Vec<String> = http
        .requests("/flaky/1/call")
        .iter()
        .map(|r| r.headers.get("traceparent").cloned().unwrap_or_default())
        .collect();
    let expected: Vec<String> = calls.iter().map(|s| format!("00-{CALLER_TRACE}-{}-01", s.id)).collect();
    assert_eq!(sent, expected);

    // The MAP's items are spans of their own.
    let items: HashMap<String, &ReceivedSpan> =
        ["each[0]", "each[1]"].iter().map(|n| (n.to_string(), *by_name(n).first().expect(n))).collect();
    assert_eq!(items["each[1]"].attributes["composer.item.index"], "1");
    assert_eq!(by_name("each").len(), 1, "and the MAP one too");
    // The child run is under the SUB_WORKFLOW's attempt, in the same trace.
    let child_step = by_name("child")[0];
    let child = spans.iter().find(|s| billing(s)).unwrap();
    assert_eq!(child.parent_id, child_step.id, "the child run sits under its parent's attempt");
    assert_eq!(by_name("shape").len(), 1);
}

#[tokio::test]
async fn a_task_api_worker_gets_its_attempts_traceparent_and_a_failed_run_says_why() {
    let collector = Collector::start();
    let e = traced(&collector, 0).await;
    e.register(&json!({"name": "remote", "nodes": [{"id": "resize", "type": "resize", "queue": "py"}]})).await;
    let id = e.start_run("remote", json!({})).await;
    let (status, body) =
        e.post("/v1/tasks/poll", &json!({"worker_id": "py-1", "queues": ["py"], "max": 1, "wait": "10s"})).await;
    assert_eq!(status, 200, "{body}");
    let task = &body["tasks"][0];
    let tp = task["traceparent"].as_str().expect("the poll gives the attempt's traceparent").to_string();
    let (status, body) = e
        .post(
            &format!("/v1/tasks/{}/fail", task["id"].as_str().unwrap()),
            &json!({"worker_id": "py-1", "run_id": id, "attempt": 1, "error": "no such image", "retryable": false}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(e.wait_for_run(id, T).await["status"], "FAILED");
    let run_id = id.to_string();
    let spans = collector.wait_for(T, |s| run_span(s, &run_id).is_some()).await;
    let root = run_span(&spans, &run_id).unwrap();
    assert_eq!(root.trace_id, id.simple().to_string(), "a run started without a traceparent is a trace of its own");
    let (_, view) = e.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(view["trace_id"], root.trace_id);
    assert_eq!(root.parent_id, "");
    assert_eq!(root.status.as_ref().map(|s| s.0.as_str()), Some("STATUS_CODE_ERROR"));
    let step = of_run(&spans, &run_id).into_iter().find(|s| s.name == "resize").unwrap();
    assert_eq!(tp, format!("00-{}-{}-01", root.trace_id, step.id), "the worker was told the span it runs in");
    assert_eq!(step.status.as_ref().map(|s| s.1.as_str()), Some("no such image (not retryable)"));
    assert_eq!(step.events, ["report"]);
}

#[tokio::test]
async fn an_events_trace_is_continued_by_the_runs_it_starts_and_linked_from_the_steps_it_completes() {
    let collector = Collector::start();
    let e = traced(&collector, 1).await;
    e.register(&json!({"name": "on_order", "triggers": [{"event": "order.created"}],
        "nodes": [{"id": "ack", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    e.register(&json!({"name": "waits", "nodes": [
        {"id": "paid", "type": "WAIT_FOR_EVENT", "config": {"event": "order.created", "key": "o-1"}},
        {"id": "again", "type": "LOOP", "config": {"workflow": "on_order", "until": ".iteration.index >= 1",
         "max_iterations": 3}}],
        "edges": [{"from": "paid", "to": "again"}]}))
        .await;
    let waiting = e.start_run("waits", json!({})).await;
    e.wait_until(waiting, T, |run| run["tasks"].as_array().is_some_and(|t| t.iter().any(|t| t["state"] == "WAITING")))
        .await;
    let sender = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (status, sent) =
        post_traced(&e, "/v1/events", &json!({"name": "order.created", "key": "o-1", "payload": {}}), &sender).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["delivered_to_waiters"], 1, "{sent}");
    let started: Uuid = sent["started_runs"][0]["run_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(e.wait_for_run(started, T).await["status"], "SUCCEEDED");
    assert_eq!(e.wait_for_run(waiting, T).await["status"], "SUCCEEDED");
    let (started_id, waiting_id) = (started.to_string(), waiting.to_string());
    let spans =
        collector.wait_for(T, |s| run_span(s, &started_id).is_some() && run_span(s, &waiting_id).is_some()).await;
    let triggered = run_span(&spans, &started_id).unwrap();
    assert_eq!((triggered.trace_id.as_str(), triggered.parent_id.as_str()), (CALLER_TRACE, CALLER_SPAN));
    let paid = of_run(&spans, &waiting_id).into_iter().find(|s| s.name == "paid").unwrap();
    assert_eq!(paid.links, [(CALLER_TRACE.to_string(), CALLER_SPAN.to_string())], "the wait links to the event");
    // Each loop iteration is a child run under the LOOP's attempt.
    let again = of_run(&spans, &waiting_id).into_iter().find(|s| s.name == "again").unwrap();
    assert_eq!(again.attributes["composer.iterations"], "2");
    let iterations: Vec<&ReceivedSpan> =
        spans.iter().filter(|s| s.name == "run on_order" && s.parent_id == again.id).collect();
    assert_eq!(iterations.len(), 2, "{spans:#?}");
    assert!(iterations.iter().all(|s| s.trace_id == waiting.simple().to_string()));
}

#[tokio::test]
async fn a_map_of_thousands_of_items_ending_at_once_loses_no_span_and_never_the_runs() {
    let collector = Collector::start();
    let e = traced(&collector, 1).await;
    e.register(&json!({"name": "wide", "nodes": [{"id": "m", "type": "MAP", "config": {
        "items": "${ [range(3000)] }", "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}}]}))
        .await;
    let id = e.start_run("wide", json!({})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    let run_id = id.to_string();
    let spans = collector.wait_for(T, |s| run_span(s, &run_id).is_some() && of_run(s, &run_id).len() >= 3002).await;
    let items =
        of_run(&spans, &run_id).into_iter().filter(|s| s.attributes.contains_key("composer.item.index")).count();
    assert_eq!(items, 3000, "every item's span arrived (the SDK's default queue of 2,048 dropped the rest)");
}

/// A start's `traceparent` could name another run's trace (a run started
/// without one has its id as its trace id) and put the new run's spans
/// under that run's: it is ignored, as an invalid header is, and the new
/// run has a trace of its own. An event's and a caller's own trace still go on.
#[tokio::test]
async fn a_start_or_an_event_cannot_join_another_runs_trace() {
    let collector = Collector::start();
    let e = traced(&collector, 0).await;
    e.register(&json!({"name": "victim", "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT",
        "config": {"event": "never", "key": "k"}}]}))
        .await;
    e.register(&json!({"name": "intruder", "triggers": [{"event": "intrude"}],
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    let victim = e.start_run("victim", json!({})).await;
    let victim_trace = victim.simple().to_string();
    let victim_span = composer_core::trace::run_span_id(victim);
    let span_hex: String = victim_span.iter().map(|b| format!("{b:02x}")).collect();
    let joining = format!("00-{victim_trace}-{span_hex}-01");
    let (status, started) = post_traced(&e, "/v1/runs", &json!({"workflow": "intruder"}), &joining).await;
    assert_eq!(status, 201, "{started}");
    let intruder = started["id"].as_str().unwrap().to_string();
    assert_ne!(started["trace_id"], json!(victim_trace), "a trace of its own: {started}");
    let (status, sent) = post_traced(&e, "/v1/events", &json!({"name": "intrude"}), &joining).await;
    assert_eq!(status, 200, "{sent}");
    let by_event = sent["started_runs"][0]["run_id"].as_str().unwrap().to_string();
    let (_, view) = e.get(&format!("/v1/runs/{by_event}")).await;
    assert_ne!(view["trace_id"], json!(victim_trace), "{view}");
    // A caller's own trace is continued as before.
    let own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (_, started) = post_traced(&e, "/v1/runs", &json!({"workflow": "intruder"}), own).await;
    assert_eq!(started["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{started}");
    for id in [&intruder, &by_event] {
        e.wait_for_run(id.parse().unwrap(), T).await;
    }
    let spans = collector.wait_for(T, |spans| run_span(spans, &by_event).is_some()).await;
    assert!(spans.iter().all(|s| s.trace_id != victim_trace), "nothing was put in the victim's trace");
    e.stop().await;
}

/// Issue 55: every span names its run's namespace.
#[tokio::test]
async fn a_runs_spans_name_its_namespace() {
    let collector = Collector::start();
    let e = traced(&collector, 0).await;
    let (status, made) = e.post("/v1/namespaces", &json!({"name": "traced-ns"})).await;
    assert_eq!(status, 201, "{made}");
    let spec = json!({"name": "where", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    let mut runs = Vec::new();
    for ns in ["default", "traced-ns"] {
        let header = [("composer-namespace", ns)];
        let (status, body) = e.post_with("/v1/workflows", &spec, &header).await;
        assert!(status < 300, "{body}");
        let (status, run) = e.post_with("/v1/runs", &json!({"workflow": "where"}), &header).await;
        assert_eq!(status, 201, "{run}");
        runs.push((ns, run["id"].as_str().unwrap().to_string()));
    }
    let spans = collector.wait_for(T, |s| runs.iter().all(|(_, id)| run_span(s, id).is_some())).await;
    for (ns, id) in &runs {
        let of = of_run(&spans, id);
        assert_eq!(of.len(), 2, "the run's span and its step's: {of:?}");
        for span in of {
            assert_eq!(span.attributes.get("composer.namespace").map(String::as_str), Some(*ns), "{span:?}");
        }
    }
}
