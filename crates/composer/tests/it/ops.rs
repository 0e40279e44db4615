//! What an operator relies on: a stopping coordinator leaves at once and
//! says so, a worker can be scraped.

use std::time::Duration;

use composer_core::machine::{Event, IgnoreKind, Resolution, RunStatus};
use composer_testkit::Engine;
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
    let mut health = None;
    for _ in 0..100 {
        if let Ok(r) = get("/healthz").await {
            health = Some(r.json::<serde_json::Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = health.expect("the worker's /healthz answers");
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
    let mut health = None;
    for _ in 0..100 {
        if let Ok(r) = http.get(url("/healthz")).send().await {
            health = Some(r.status().as_u16());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(health, Some(200), "a liveness probe needs no token");
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
/// values are listed in the metrics crate, which knows no event).
#[test]
fn every_engine_event_and_result_is_a_known_value_of_the_events_counter() {
    let id = uuid::Uuid::nil();
    let events = [
        Event::RunStarted,
        Event::TaskCompleted { task_id: id, attempt: 1, output: json!(null) },
        Event::TaskFailed { task_id: id, attempt: 1, error: String::new(), retryable: true, code: None, status: None },
        Event::TimerFired { task_id: id },
        Event::EventReceived { task_id: id, payload: json!(null) },
        Event::CancelRun,
        Event::RetryRun,
        Event::PauseRun,
        Event::ResumeRun,
        Event::RunTimedOut,
        Event::TaskInDoubt { task_id: id, attempt: 1, reason: String::new() },
        Event::ResolveTask { task_id: id, resolution: Resolution::Retry },
        Event::ItemsLoaded { task_id: id },
        Event::SourcesLoaded { task_id: id, from: 0, items: vec![] },
        Event::ChildFinished {
            task_id: id,
            attempt: 1,
            iteration: 0,
            child: None,
            status: RunStatus::Failed,
            output: None,
            error: None,
        },
    ];
    let labels = composer_metrics::EVENTS.labels;
    let (names, results) = (labels[0].1, labels[1].1);
    assert_eq!(names.len(), events.len());
    for e in &events {
        assert!(names.contains(&e.name()), "{}", e.name());
    }
    assert_eq!(results.len(), IgnoreKind::ALL.len() + 1);
    assert!(results.contains(&"applied"));
    for k in IgnoreKind::ALL {
        assert!(results.contains(&k.as_str()), "{}", k.as_str());
    }
}
