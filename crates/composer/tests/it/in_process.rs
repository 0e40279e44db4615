//! A worker in its coordinator's process (`composer dev`, the bench) calls
//! the task API as functions, not over HTTP. Each guarantee a worker's
//! steps rest on is checked both ways, on the same engine: a chain of
//! steps, each applied once and each next step leased with the result; a
//! worker that dies holding a lease, whose step the next worker takes over
//! by the lease's expiry and runs once; an at-most-once step whose worker
//! died, which waits IN_DOUBT and is never sent again; a result the
//! coordinator cannot store, which fails its attempt by name.

use std::time::Duration;

use composer_store::leases::LeaseManager;
use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
use serde_json::json;
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

/// Both ways a worker reaches its coordinator.
const TRANSPORTS: [(&str, bool); 2] = [("over HTTP", false), ("in process", true)];

fn engine(in_process: bool, workers: usize) -> EngineOptions {
    EngineOptions { workers, in_process, lease_ttl: Duration::from_secs(1), ..Default::default() }
}

#[tokio::test]
async fn a_chain_runs_each_step_once_each_next_step_leased_with_the_result_both_ways() {
    for (how, in_process) in TRANSPORTS {
        let e = Engine::with(engine(in_process, 1)).await;
        let http = FakeHttp::start().await;
        let nodes: Vec<_> = ["a", "b", "c"].iter().map(|n| http_node(n, &http.url(&format!("/ok/{n}")), 1)).collect();
        let spec = json!({"name": "chain", "nodes": nodes,
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
        let runs: Vec<_> = {
            e.register(&spec).await;
            let mut ids = Vec::new();
            for _ in 0..5 {
                ids.push(e.start_run("chain", json!({})).await);
            }
            ids
        };
        for run in &runs {
            let done = e.wait_for_run(*run, T).await;
            assert_eq!(done["status"], "SUCCEEDED", "{how}: {done}");
        }
        for n in ["a", "b", "c"] {
            assert_eq!(http.calls(&format!("/ok/{n}")), 5, "{how}: each step of each run called once");
        }
        let stats = &e.workers[0].stats;
        assert!(stats.eager() > 0, "{how}: a result's answer leased the next step ({:?})", stats);
        e.stop().await;
    }
}

/// A worker that died holding `task`'s lease (or sent it and died): a
/// lease taken for a worker that will never report.
async fn leased_by_the_dead(e: &Engine, run: Uuid, task: Uuid) {
    let leases = LeaseManager::new(e.db.pool());
    let ghost = leases.acquire(run, task, "dead-worker", Duration::from_millis(300), 1).await.unwrap();
    assert!(ghost.is_granted());
}

fn first_task(run: &serde_json::Value) -> Uuid {
    run["tasks"][0]["id"].as_str().and_then(|t| t.parse().ok()).expect("a task id")
}

#[tokio::test]
async fn a_step_whose_worker_died_holding_its_lease_runs_once_on_the_next_worker_both_ways() {
    for (how, in_process) in TRANSPORTS {
        let mut e = Engine::with(engine(in_process, 0)).await;
        let http = FakeHttp::start().await;
        let run = e.run(&json!({"name": "orphan", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;
        let pending = e.wait_until(run, T, |r| r["tasks"][0]["state"] == "PENDING").await;
        let task = first_task(&pending);
        leased_by_the_dead(&e, run, task).await;
        e.wait_for_lease_expiry(task, T).await;
        composer_coord::loops::recover_tasks(&e.coordinators[0].shared).await;
        e.start_worker("survivor", 2).await;
        let done = e.wait_for_run(run, T).await;
        assert_eq!(done["status"], "SUCCEEDED", "{how}: {done}");
        assert_eq!(http.calls("/ok/a"), 1, "{how}: run once, by the survivor");
        assert_eq!(e.history(run, "TaskCompleted").await.len(), 1, "{how}: one applied result");
        e.stop().await;
    }
}

#[tokio::test]
async fn an_at_most_once_step_whose_worker_died_waits_in_doubt_and_is_not_sent_again_both_ways() {
    for (how, in_process) in TRANSPORTS {
        let mut e = Engine::with(engine(in_process, 0)).await;
        let http = FakeHttp::start().await;
        let mut node = http_node("pay", &http.url("/ok/pay"), 3);
        node["delivery"] = json!("at_most_once");
        let run = e.run(&json!({"name": "pay_once", "nodes": [node]})).await;
        let pending = e.wait_until(run, T, |r| r["tasks"][0]["state"] == "PENDING").await;
        leased_by_the_dead(&e, run, first_task(&pending)).await;
        let doubted = e.wait_until(run, T, |r| r["tasks"][0]["state"] == "IN_DOUBT").await;
        assert_eq!(doubted["tasks"][0]["error_info"]["code"], "in_doubt", "{how}: {doubted}");
        e.start_worker("live", 2).await;
        // An absence, so a fixed time: a live worker's polls in this window
        // must not send the attempt again.
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert_eq!(http.calls("/ok/pay"), 0, "{how}: never sent again by itself");
        e.stop().await;
    }
}

#[tokio::test]
async fn a_result_the_coordinator_cannot_store_fails_its_attempt_by_name_both_ways() {
    for (how, in_process) in TRANSPORTS {
        let e = Engine::with(engine(in_process, 1)).await;
        let http = FakeHttp::start().await;
        // A body with a NUL in a string, which PostgreSQL cannot store.
        let run = e.run(&json!({"name": "nul", "nodes": [http_node("a", &http.url("/nul/a"), 1)]})).await;
        let done = e.wait_for_run(run, T).await;
        assert_eq!(done["status"], "FAILED", "{how}: {done}");
        assert_eq!(done["tasks"][0]["error_info"]["code"], "payload", "{how}: {done}");
        e.stop().await;
    }
}

/// Over HTTP a stopped coordinator takes no more polls (its listener is
/// closed); the worker in its process must not be leased work through it
/// either: a result it could never deliver would hold the step for the
/// report's deadline and its lease, and run it again.
#[tokio::test]
async fn a_stopped_coordinator_leases_nothing_to_the_worker_in_its_process() {
    let mut e = Engine::with(EngineOptions { coordinators: 2, ..engine(true, 0) }).await;
    e.start_worker("local", 2).await;
    e.coordinators.remove(0).stop().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "after_stop", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(e.start_run("after_stop", json!({})).await);
    }
    // An absence, so a fixed time: the steps wait in the streams, and the
    // stopped coordinator's worker, polling all along, must not take them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(e.workers[0].stats.executed(), 0, "the stopped coordinator's worker ran nothing");
    let remote = composer_worker::Worker::new(e.worker_config("remote", 2));
    e.spawn_worker(remote);
    for run in &runs {
        let done = e.wait_for_run(*run, T).await;
        assert_eq!(done["status"], "SUCCEEDED", "{done}");
    }
    assert_eq!(e.workers[0].stats.executed(), 0, "the stopped coordinator's worker ran nothing");
    assert_eq!(http.calls("/ok/a"), 6, "each step called once");
    e.stop().await;
}
