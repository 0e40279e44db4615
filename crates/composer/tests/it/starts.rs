//! Starts that arrive together: the engine inserts the runs of a batch in one
//! statement, and each run is still its own.

use std::time::Duration;

use composer_core::machine::RunStatus;
use composer_store::runs::{self, NewRun};
use composer_testkit::{http_node, Engine, EngineOptions};
use futures_util::future::join_all;
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn starts_at_once_each_get_their_own_run_and_a_limit_still_holds() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "free", "tags": {"from": "${ .input.n | tostring }"},
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input.n * 2 }"}}]}))
        .await;
    e.register(&json!({"name": "limited", "concurrency": {"key": "all", "max": 2},
        "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]}))
        .await;
    let starts = (0..40).map(|n| {
        let workflow = if n % 2 == 0 { "free" } else { "limited" };
        let body = json!({"workflow": workflow, "input": {"n": n}, "tags": {"start": n.to_string()},
            "priority": 1 + n % 5});
        let e = &e;
        async move { (n, e.post("/v1/runs", &body).await) }
    });
    let mut ids = std::collections::HashSet::new();
    for (n, (status, body)) in join_all(starts).await {
        assert_eq!(status, 201, "start {n}: {body}");
        let id = body["id"].as_str().unwrap().to_string();
        assert!(ids.insert(id.clone()), "start {n} got another start's run");
        let (_, body) = e.get(&format!("/v1/runs/{id}")).await;
        assert_eq!(body["input"], json!({"n": n}), "start {n}");
        assert_eq!(body["priority"], json!(1 + n % 5), "start {n}");
        assert_eq!(body["tags"]["start"], json!(n.to_string()), "start {n}: {body}");
        if n % 2 == 0 {
            assert_eq!(body["tags"]["from"], json!(n.to_string()), "start {n}: {body}");
            let run = e.wait_for_run(body["id"].as_str().unwrap().parse().unwrap(), Duration::from_secs(20)).await;
            assert_eq!((run["status"].as_str(), &run["output"]["t"]), (Some("SUCCEEDED"), &json!(n * 2)), "{run}");
        }
    }
    let (_, running) = e.get("/v1/runs?workflow=limited&status=RUNNING").await;
    let (_, queued) = e.get("/v1/runs?workflow=limited&status=QUEUED").await;
    let count = |page: &serde_json::Value| page["runs"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!((count(&running), count(&queued)), (2, 18), "{running} {queued}");
    e.stop().await;
}

#[tokio::test]
async fn a_batch_insert_keeps_its_order_and_refuses_a_queued_run() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "rows", "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]})).await;
    let pool = e.db.pool();
    let mut client = composer_store::client(&pool).await.unwrap();
    let def = composer_store::definitions::by_name(&client, "rows", None).await.unwrap().unwrap();
    let inputs: Vec<serde_json::Value> = (0..3).map(|n| json!({"n": n})).collect();
    let parent = runs::Parent { run_id: Uuid::now_v7(), task_id: Uuid::now_v7(), attempt: 2, iteration: 5 };
    let new = |n: usize, status: RunStatus| NewRun {
        id: Uuid::now_v7(),
        workflow_definition_id: def.id,
        workflow_name: "rows",
        workflow_version: def.version,
        input: &inputs[n],
        idempotency_key: None,
        deadline: None,
        parent: (n == 1).then_some(parent),
        depth: n as i32,
        status,
        concurrency_key: None,
        trigger: None,
        root_run_id: None,
        handles_run_id: None,
        abandoned: n == 1,
        tags: None,
        traceparent: None,
        priority: 1 + n as u8,
        fairness_key: (n == 2).then_some("tenant"),
    };
    let batch: Vec<NewRun<'_>> = (0..3).map(|n| new(n, RunStatus::Running)).collect();
    let tx = composer_store::begin(&mut client).await.unwrap();
    let rows = runs::insert_runs(&tx, &batch).await.unwrap();
    let seen: Vec<_> = rows.iter().map(|r| (r.id, r.input.clone(), r.depth, r.priority, r.status)).collect();
    let want: Vec<_> = batch.iter().map(|r| (r.id, r.input.clone(), r.depth, r.priority, RunStatus::Running)).collect();
    assert_eq!(seen, want);
    assert_eq!(rows[1].parent, Some(parent));
    assert_eq!(rows[2].fairness_key.as_deref(), Some("tenant"));
    let e2 = runs::insert_runs(&tx, &[new(0, RunStatus::Queued)]).await.unwrap_err();
    assert!(e2.to_string().contains("not RUNNING"), "{e2}");
    drop(tx);
    e.stop().await;
}

/// Starts name their definition from memory (a numbered version) or from
/// one read per batch (the latest): a version registered on another
/// coordinator is the one the next start of the latest runs, whatever
/// starts ran before it.
#[tokio::test]
async fn a_start_runs_the_version_registered_just_before_it_on_any_coordinator() {
    let e = Engine::with(EngineOptions { workers: 0, coordinators: 2, ..Default::default() }).await;
    let urls = e.coordinator_urls();
    let http = reqwest::Client::new();
    let post = |url: String, body: serde_json::Value| {
        let http = http.clone();
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let spec =
        |v: i32| json!({"name": "versioned", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": v}}]});
    for v in 1..=3 {
        // Registered on the second coordinator, started on the first.
        let (status, body) = post(format!("{}/v1/workflows", urls[1]), spec(v)).await;
        assert_eq!(status, 201, "{body}");
        let starts = (0..20).map(|n| {
            let version = if n % 4 == 0 { json!(1) } else { json!(null) };
            post(format!("{}/v1/runs", urls[0]), json!({"workflow": "versioned", "version": version}))
        });
        for (n, (status, run)) in join_all(starts).await.into_iter().enumerate() {
            assert_eq!(status, 201, "{run}");
            let expected = if n % 4 == 0 { 1 } else { v };
            assert_eq!(run["version"], json!(expected), "start {n} after v{v} was registered: {run}");
        }
    }
    let (status, body) = post(format!("{}/v1/runs", urls[0]), json!({"workflow": "versioned", "version": 4})).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("version 4"), "{body}");
    let (status, body) = post(format!("{}/v1/runs", urls[0]), json!({"workflow": "nobody"})).await;
    assert_eq!(status, 404, "{body}");
    e.stop().await;
}

/// More definitions than a coordinator keeps: past the limit its memory is
/// emptied, and each start still runs the version it names.
#[tokio::test]
async fn starts_of_more_definitions_than_are_kept_each_run_their_own() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let n = composer_coord::definitions::MAX_CACHED_DEFINITIONS + 5;
    for i in 0..n {
        e.register(
            &json!({"name": format!("w{i}"), "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": i}}]}),
        )
        .await;
    }
    for round in 0..2 {
        for i in 0..n {
            let version = if (i + round) % 2 == 0 { json!(1) } else { json!(null) };
            let (status, run) = e.post("/v1/runs", &json!({"workflow": format!("w{i}"), "version": version})).await;
            assert_eq!(status, 201, "{run}");
            assert_eq!((run["workflow"].as_str(), &run["version"]), (Some(format!("w{i}").as_str()), &json!(1)));
        }
    }
    e.stop().await;
}
