//! What an operator relies on: a stopping coordinator leaves at once and
//! says so, a worker can be scraped.

use std::time::Duration;

use composer_core::machine::{Event, IgnoreKind};
use composer_testkit::{eventually, Engine};
use serde_json::json;

#[tokio::test]
async fn a_draining_coordinator_is_unready_and_answers_long_polls_at_once() {
    let e = Engine::start().await;
    let spec = json!({"name": "waits", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "k"}}]});
    let id = e.run(&spec).await;
    let (status, _) = e.get("/readyz").await;
    assert_eq!(status, 200);
    let url = format!("{}/v1/runs/{id}?wait=60s", e.url());
    let poll = tokio::spawn(async move { reqwest::get(url).await.unwrap().json::<serde_json::Value>().await.unwrap() });
    // A head start, so a fixed time: nothing outside the coordinator shows
    // a long-poll waiting. (Drained before it waits, it answers at once too.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    e.coordinators[0].drain();
    let (status, body) = e.get("/readyz").await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("draining")), "{body}");
    // The long-poll asked for 60 s; a stop must not wait for it.
    let run = tokio::time::timeout(Duration::from_secs(20), poll).await.expect("the long-poll answered").unwrap();
    assert_eq!(run["status"], "RUNNING", "{run}");
    e.stop().await;
}

#[tokio::test]
async fn a_worker_serves_metrics_and_health_and_the_new_metrics_are_scraped() {
    let mut e =
        composer_testkit::Engine::with(composer_testkit::EngineOptions { workers: 0, ..Default::default() }).await;
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut config = e.worker_config("scraped", 4);
    config.options.listen = Some(addr);
    e.spawn_worker(composer_worker::Worker::new(config));
    let http = composer_testkit::FakeHttp::start().await;
    let spec = json!({"name": "scrape_me", "nodes": [composer_testkit::http_node("a", &http.url("/ok/a"), 1)]});
    let id = e.run(&spec).await;
    assert_eq!(e.wait_for_run(id, Duration::from_secs(30)).await["status"], "SUCCEEDED");

    let get = |path: &str| reqwest::get(format!("http://{addr}{path}"));
    let health =
        eventually(Duration::from_secs(10), "the worker's /healthz to answer", || async { get("/healthz").await.ok() })
            .await;
    let health = health.json::<serde_json::Value>().await.unwrap();
    assert!(health["worker"].as_str().unwrap().starts_with("scraped"), "{health}");
    let scraped = get("/metrics").await.unwrap();
    assert_eq!(scraped.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let worker = scraped.text().await.unwrap();
    for line in ["composer_task_duration_seconds_count{node_type=\"HTTP\",outcome=\"ok\"}", "role=\"worker\"} 1"] {
        assert!(worker.contains(line), "the worker's metrics lack {line}:\n{worker}");
    }
    let coord = reqwest::get(format!("{}/metrics", e.url())).await.unwrap();
    assert_eq!(coord.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let coord = coord.text().await.unwrap();
    // One process, two roles: each listener serves its role's registry, so
    // scraping both counts nothing twice.
    for (text, theirs) in [(&worker, "composer_runs_started_total"), (&coord, "composer_tasks_executed_total")] {
        assert!(!text.contains(theirs), "{theirs} is the other role's:\n{text}");
    }
    assert!(!worker.contains("role=\"coordinator\""), "{worker}");
    assert!(!coord.contains("role=\"worker\""), "{coord}");
    for line in [
        "composer_api_request_duration_seconds_count{method=\"POST\",route=\"/v1/runs\",status=\"2xx\"}",
        "role=\"coordinator\"} 1",
    ] {
        assert!(coord.contains(line), "the coordinator's metrics lack {line}");
    }
    // The registry is the process's: once the other tests of this binary
    // named 200 workflows (MAX_LABEL_VALUES), later names count as `other`.
    let named = "composer_run_duration_seconds_count{workflow=\"scrape_me\",status=\"SUCCEEDED\"}";
    let folded = "composer_run_duration_seconds_count{workflow=\"other\",status=\"SUCCEEDED\"}";
    assert!(coord.contains(named) || coord.contains(folded), "the coordinator's metrics lack {named}");
    e.stop().await;
}

#[tokio::test]
async fn a_workers_metrics_are_closed_to_a_caller_without_the_token_when_one_is_set() {
    let mut e =
        composer_testkit::Engine::with(composer_testkit::EngineOptions { workers: 0, ..Default::default() }).await;
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut config = e.worker_config("guarded", 1);
    config.options.listen = Some(addr);
    config.options.metrics_token = Some("a-token-for-prometheus".into());
    e.spawn_worker(composer_worker::Worker::new(config));
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{addr}{path}");
    let health = eventually(Duration::from_secs(10), "the worker's /healthz to answer", || async {
        http.get(url("/healthz")).send().await.ok()
    })
    .await;
    assert_eq!(health.status().as_u16(), 200, "a liveness probe needs no token");
    let open = http.get(url("/metrics")).send().await.unwrap();
    assert_eq!(open.status().as_u16(), 401);
    let body: serde_json::Value = open.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    let wrong = http.get(url("/metrics")).bearer_auth("a-token-for-prometheux").send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let right = http.get(url("/metrics")).bearer_auth("a-token-for-prometheus").send().await.unwrap();
    assert_eq!(right.status().as_u16(), 200);
    assert!(right.text().await.unwrap().contains("role=\"worker\""));
    e.stop().await;
}

/// Every event the engine counts has its series from zero (the labels'
/// values are listed in the metrics crate, which knows no event). The names
/// are read from the match that gives them, so that a new event or ignore
/// reason fails here until the metric lists it.
#[test]
fn every_engine_event_and_result_is_a_known_value_of_the_events_counter() {
    // Event::name() and IgnoreKind's names, where the machine defines them.
    let source =
        [include_str!("../../../core/src/machine/event.rs"), include_str!("../../../core/src/machine/transition.rs")]
            .concat();
    let names_in = |function: &str| -> Vec<String> {
        let body = &source[source.find(function).unwrap_or_else(|| panic!("{function}"))..];
        let body = &body[..body.find("\n    }\n").unwrap()];
        body.lines()
            .filter_map(|l| l.split_once("=> \"").map(|(_, rest)| rest.split('"').next().unwrap().to_string()))
            .collect()
    };
    let labels = composer_metrics::EVENTS.labels;
    let (names, results) = (labels[0].1, labels[1].1);
    let events = names_in("pub fn name(&self) -> &'static str {");
    assert!(events.len() >= 15, "{events:?}");
    assert_eq!(events, names, "composer_events_total's event values are Event::name()'s");
    assert_eq!(Event::CancelRun.name(), "CancelRun");
    let reasons = names_in("impl IgnoreKind {");
    assert_eq!(reasons.len(), IgnoreKind::ALL.len(), "IgnoreKind::ALL lists every reason");
    let mut expected = vec!["applied".to_string()];
    expected.extend(IgnoreKind::ALL.iter().map(|k| k.as_str().to_string()));
    assert_eq!(expected, results, "composer_events_total's result values");
    assert_eq!(reasons, expected[1..]);
}
