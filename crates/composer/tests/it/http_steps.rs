//! A coordinator runs HTTP steps itself (`--http-slots`): those whose
//! config reads no secret, handed to its own executor by its commits, with
//! a worker's rules (egress, leases, recovery). A step that reads a secret,
//! an at-most-once step and anything the executor is not handed go to
//! workers, as without it.

use std::time::Duration;

use std::collections::HashSet;

use composer_testkit::{eventually, http_node, unique_prefix, Engine, EngineOptions, FakeHttp, TestDb};
use serde_json::json;

use crate::processes::{composer, coordinator_procs, Client, Proc};

const T: Duration = Duration::from_secs(30);

fn engine(workers: usize) -> EngineOptions {
    EngineOptions { workers, lease_ttl: Duration::from_secs(1), ..Default::default() }
}

fn chain(name: &str, http: &FakeHttp) -> serde_json::Value {
    let nodes: Vec<_> =
        ["a", "b", "c"].iter().map(|n| http_node(n, &http.url(&format!("/ok/{name}-{n}")), 1)).collect();
    json!({"name": name, "nodes": nodes, "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})
}

/// With no worker at all, a coordinator whose executor has a free slot
/// runs a chain of plain HTTP calls to its end: the first step handed to
/// it by the start's commit, each next one leased with the result before.
/// (What finds no free slot goes to the streams, for workers.)
#[tokio::test]
async fn a_coordinator_runs_http_steps_that_read_no_secret_without_any_worker() {
    let mut e = Engine::with(engine(0)).await;
    e.start_coordinators_http(0, 4, |_| {});
    let http = FakeHttp::start().await;
    e.register(&chain("plain", &http)).await;
    for _ in 0..5 {
        let run = e.start_run("plain", json!({})).await;
        let done = e.wait_for_run(run, T).await;
        assert_eq!(done["status"], "SUCCEEDED", "{done}");
        assert_eq!(e.history(run, "TaskCompleted").await.len(), 3, "one applied result per step");
    }
    for n in ["a", "b", "c"] {
        assert_eq!(http.calls(&format!("/ok/plain-{n}")), 5, "each step of each run called once");
    }
    let executor = &e.workers[0];
    assert!(executor.id.starts_with("coordinator-"), "{}", executor.id);
    assert_eq!(executor.stats.executed(), 15);
    assert!(executor.stats.eager() > 0, "a result's answer leased the next step ({:?})", executor.stats);
    e.stop().await;
}

/// A step whose config reads a secret never reaches the coordinator (whose
/// executor could not read it, and would fail it): a worker that holds the
/// secret runs it, while the plain steps around it may run on the
/// coordinator.
#[tokio::test]
async fn a_step_that_reads_a_secret_goes_to_a_worker_never_to_the_coordinator() {
    // A name no other test uses: the test process's environment is shared.
    let (name, value) = ("HTTP_STEPS_TOKEN", "s3cr3t-of-http-steps");
    std::env::set_var(format!("COMPOSER_SECRET_{name}"), value);
    let mut e = Engine::with(engine(0)).await;
    e.start_coordinators_http(0, 4, |_| {});
    let http = FakeHttp::start().await;
    let mut secret = http_node("b", &http.url("/headers/b"), 1);
    secret["config"]["headers"] = json!({"authorization": format!("Bearer ${{ .secrets.{name} }}")});
    let spec = json!({"name": "mixed", "nodes": [http_node("a", &http.url("/ok/a"), 1), secret,
        http_node("c", &http.url("/ok/c"), 1)], "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]});
    let run = e.run(&spec).await;
    // The plain first step runs on the coordinator; the secret one waits
    // for a worker.
    e.wait_until(run, T, |r| r["tasks"].as_array().is_some_and(|t| t.iter().any(|t| t["node_id"] == "b"))).await;
    e.start_worker("holder", 2).await;
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    let sent = http.requests("/headers/b");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].headers.get("authorization").map(String::as_str), Some(&*format!("Bearer {value}")));
    // The worker ran the secret step (the coordinator's executor would have
    // failed it) and may have taken the next with its result.
    let (coordinator, worker) = (e.workers[0].stats.executed(), e.workers[1].stats.executed());
    assert!(coordinator >= 1 && worker >= 1 && coordinator + worker == 3, "{coordinator} and {worker}");
    e.stop().await;
}

/// An at-most-once step is never leased in a commit (its answer, lost,
/// would put it IN_DOUBT unsent): a worker takes it from its stream.
#[tokio::test]
async fn an_at_most_once_http_step_goes_to_a_worker_never_to_the_coordinator() {
    let mut e = Engine::with(engine(0)).await;
    e.start_coordinators_http(0, 4, |_| {});
    let http = FakeHttp::start().await;
    let mut once = http_node("pay", &http.url("/ok/pay"), 1);
    once["delivery"] = json!("at_most_once");
    let run = e.run(&json!({"name": "pay_once", "nodes": [once]})).await;
    e.start_worker("payer", 2).await;
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!((e.workers[0].stats.executed(), e.workers[1].stats.executed()), (0, 1));
    e.stop().await;
}

/// The egress rules a worker has hold for the coordinator's HTTP steps.
#[tokio::test]
async fn the_egress_rules_hold_for_the_coordinators_http_steps() {
    let mut e = Engine::with(engine(0)).await;
    e.start_coordinators_http(0, 2, |c| c.options.egress.http_deny = vec!["127.0.0.0/8".into(), "::1/128".into()]);
    let http = FakeHttp::start().await;
    let run = e.run(&json!({"name": "denied", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "FAILED", "{done}");
    let error = done["tasks"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("COMPOSER_HTTP_DENY"), "{done}");
    assert_eq!(http.calls("/ok/a"), 0);
    assert_eq!(e.workers[0].stats.executed(), 1, "the coordinator ran it, and refused the address");
    e.stop().await;
}

/// A coordinator process killed in the middle of a call leaves its lease:
/// it expires, the other coordinator sends the step again, a worker runs it
/// at the same attempt under the same Idempotency-Key, and one result is
/// applied — as for a worker killed mid-call.
#[tokio::test]
async fn a_coordinator_killed_mid_call_leaves_its_step_to_a_worker_by_the_lease() {
    let db = TestDb::create().await;
    let dir = composer_embedded::temp_dir("http-steps-kill").unwrap();
    let (mut procs, urls) = coordinator_procs(&db, &unique_prefix(), &dir, 2, |cmd| {
        cmd.env("COMPOSER_LEASE_TTL", "2s")
            .env("COMPOSER_RECOVERY_INTERVAL", "1s")
            .env("COMPOSER_COORDINATOR_HTTP_SLOTS", "4");
    })
    .await;
    let http = FakeHttp::start().await;
    let client = Client::new(&urls[0]);
    let spec = json!({"name": "cut", "nodes": [http_node("a", &http.url("/slow/3000/a"), 1)]});
    assert_eq!(client.post("/v1/workflows", &spec).await.0, 201);
    // No worker yet: only the first coordinator's own executor can have it.
    // It runs a step its coordinator's commit hands to one of its polls
    // that waits; a step made ready between two polls (or before the first,
    // on busy cores) goes to the workers' streams, and no worker is here
    // yet. So a run whose step no coordinator took in 10 s is cancelled, and
    // another started (at most three).
    let pool = db.pool();
    let owner = "SELECT lease_owner FROM task_instances WHERE run_id = $1 AND state = 'RUNNING'";
    let mut tries = 0;
    let (run_id, held) = loop {
        tries += 1;
        let (_, run) = client.post("/v1/runs", &json!({"workflow": "cut"})).await;
        let run_id: uuid::Uuid = run["id"].as_str().unwrap().parse().unwrap();
        let took: Result<String, _> = composer_testkit::poll_until(Duration::from_secs(10), || async {
            let c = pool.get().await.unwrap();
            c.query_opt(owner, &[&run_id]).await.unwrap().and_then(|r| r.get::<_, Option<String>>(0))
        })
        .await;
        match took {
            Ok(held) => break (run_id, held),
            Err(_) if tries < 3 => {
                let (status, body) = client.post(&format!("/v1/runs/{run_id}/cancel"), &json!({})).await;
                assert_eq!(status, 200, "{body}");
            }
            Err(seen) => panic!("the coordinator to run the step: not in {tries} runs of 10 s ({seen:?})"),
        }
    };
    assert!(held.starts_with("coordinator-"), "{held}");
    eventually(T, "the call to be in flight", || async { (http.calls("/slow/3000/a") == 1).then_some(()) }).await;
    let _ = procs[0].0.kill();
    let _ = procs[0].0.wait();
    let mut worker = composer(&["worker"]);
    worker.env("COMPOSER_COORDINATOR_URLS", &urls[1]);
    let mut worker = Proc::spawn(&mut worker);
    let survivor = Client::new(&urls[1]);
    let done = survivor.wait_for_run(&run_id.to_string(), Duration::from_secs(60)).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!(done["tasks"][0]["attempt"], 1, "finished at the same attempt");
    let events = survivor.get(&format!("/v1/runs/{run_id}/events?limit=1000")).await;
    let completed = events["events"].as_array().unwrap().iter().filter(|e| e["type"] == "TaskCompleted").count();
    assert_eq!(completed, 1, "one applied result");
    let keys: HashSet<String> = http.requests("/slow/3000/a").into_iter().filter_map(|r| r.idempotency_key).collect();
    assert_eq!((http.calls("/slow/3000/a"), keys.len()), (2, 1), "sent again once, under the same Idempotency-Key");
    assert!(worker.terminate(T).success());
    assert!(procs[1].terminate(T).success());
    let _ = std::fs::remove_dir_all(dir);
}

/// The executor's slots are a limit with a name: past 10,000 the
/// coordinator does not start, and says which setting; a bad deny list
/// names its own. A coordinator runs no HTTP step unless told to (its calls
/// would start from its host, under rules given perhaps only to workers):
/// without the setting its egress rules are not even read.
#[test]
fn a_coordinator_runs_http_steps_only_when_told_and_refuses_bad_settings_naming_them() {
    for (slots, var, value, says) in [
        ("10001", "COMPOSER_COORDINATOR_HTTP_SLOTS", "10001", "more than 10000 slots"),
        ("4", "COMPOSER_HTTP_DENY", "not-a-range", "COMPOSER_HTTP_DENY"),
        ("", "COMPOSER_HTTP_DENY", "not-a-range", "COMPOSER_DATABASE_URL"),
    ] {
        let mut cmd = composer(&["coordinator"]);
        cmd.env(var, value);
        if !slots.is_empty() {
            cmd.env("COMPOSER_COORDINATOR_HTTP_SLOTS", slots);
        }
        let out = cmd.output().expect("running composer");
        assert!(!out.status.success(), "{var}={value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "slots {slots:?}, {var}={value}: {stderr}");
    }
}
