//! Moving live runs to a new version: a dry run's verdict per run, the job
//! that moves exactly the movable ones (each once, recorded with who and
//! why), moved runs finishing on the new version, a move undone by moving
//! back, and requests refused by name.

use std::time::Duration;

use composer_testkit::Engine;
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

/// `order` v1: a → w1 → w2 → b, each wait for its event keyed by the run's `k`.
fn v1() -> Value {
    json!({"name": "order", "tags": {"k": "${ .input.k }"}, "nodes": [
        {"id": "a", "type": "TRANSFORM", "config": {"output": {"v": 1}}},
        {"id": "w1", "type": "WAIT_FOR_EVENT", "config": {"event": "w1", "key": "${ .input.k }"}},
        {"id": "w2", "type": "WAIT_FOR_EVENT", "config": {"event": "w2", "key": "${ .input.k }"}},
        {"id": "b", "type": "TRANSFORM", "config": {"output": {"version": 1}}}],
        "edges": [{"from": "a", "to": "w1"}, {"from": "w1", "to": "w2"}, {"from": "w2", "to": "b"}]})
}

/// v2: a step `check` between w1 and w2, and b says so.
fn v2() -> Value {
    json!({"name": "order", "tags": {"k": "${ .input.k }"}, "nodes": [
        {"id": "a", "type": "TRANSFORM", "config": {"output": {"v": 1}}},
        {"id": "w1", "type": "WAIT_FOR_EVENT", "config": {"event": "w1", "key": "${ .input.k }"}},
        {"id": "check", "type": "TRANSFORM", "config": {"output": "${ .nodes.a.output.v + 1 }"}},
        {"id": "w2", "type": "WAIT_FOR_EVENT", "config": {"event": "w2", "key": "${ .input.k }"}},
        {"id": "b", "type": "TRANSFORM", "config": {"output": {"version": 2, "check": "${ .nodes.check.output }"}}}],
        "edges": [{"from": "a", "to": "w1"}, {"from": "w1", "to": "check"}, {"from": "check", "to": "w2"},
                  {"from": "w2", "to": "b"}]})
}

async fn send(e: &Engine, event: &str, key: &str) {
    let (status, answer) = e.post("/v1/events", &json!({"name": event, "key": key})).await;
    assert_eq!((status, &answer["delivered_to_waiters"]), (200, &json!(1)), "{answer}");
}

/// Waits until run `id`'s step `node` is waiting for its event.
async fn waiting_at(e: &Engine, id: Uuid, node: &str) {
    e.wait_until(id, T, |run| {
        run["tasks"].as_array().into_iter().flatten().any(|t| t["node_id"] == node && t["state"] == "WAITING")
    })
    .await;
}

async fn job_done(e: &Engine, job: &Value) -> Value {
    let id = job["id"].as_str().unwrap_or_else(|| panic!("a job: {job}"));
    e.wait_for_bulk_job(id, T).await
}

#[tokio::test]
async fn a_dry_run_gives_each_run_its_verdict_and_the_job_moves_exactly_the_movable_ones() {
    let e = Engine::start().await;
    e.register(&v1()).await;
    let ended = e.start_run("order", json!({"k": "ended"})).await;
    waiting_at(&e, ended, "w1").await;
    send(&e, "w1", "ended").await;
    waiting_at(&e, ended, "w2").await;
    send(&e, "w2", "ended").await;
    assert_eq!(e.wait_for_run(ended, T).await["status"], "SUCCEEDED");
    // Three runs at w1 (one of them paused), two past it at w2.
    let mut early = Vec::new();
    for k in ["m1", "m2", "m3"] {
        let id = e.start_run("order", json!({"k": k})).await;
        waiting_at(&e, id, "w1").await;
        early.push(id);
    }
    let (status, paused) = e.post(&format!("/v1/runs/{}/pause", early[2]), &json!({})).await;
    assert_eq!(status, 200, "{paused}");
    let mut late = Vec::new();
    for k in ["u1", "u2"] {
        let id = e.start_run("order", json!({"k": k})).await;
        waiting_at(&e, id, "w1").await;
        send(&e, "w1", k).await;
        waiting_at(&e, id, "w2").await;
        late.push(id);
    }
    assert_eq!(e.register(&v2()).await["version"], 2);

    let body = json!({"from_version": 1, "to_version": 2, "dry_run": true});
    let (status, dry) = e.post("/v1/workflows/order/migrate", &body).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!((dry["movable"].as_i64(), dry["unmovable"].as_i64()), (Some(3), Some(2)), "{dry}");
    let verdicts = dry["runs"].as_array().unwrap();
    assert_eq!(verdicts.len(), 5, "the ended run is not looked at: {dry}");
    for v in verdicts {
        let id: Uuid = v["run_id"].as_str().unwrap().parse().unwrap();
        if early.contains(&id) {
            assert_eq!((&v["movable"], &v["added"]), (&json!(true), &json!(["check"])), "{v}");
        } else {
            assert!(late.contains(&id), "{v}");
            assert_eq!(v["movable"], false, "{v}");
            let why = v["reasons"].to_string();
            assert!(why.contains("step `w2` is WAITING, and the new version puts `check` before it"), "{why}");
        }
    }
    assert!(e.history(early[0], "RunMigrated").await.is_empty(), "a dry run moves nothing");

    let body = json!({"from_version": 1, "to_version": 2, "reason": "v1 forgets the check"});
    let (status, job) = e.post("/v1/workflows/order/migrate", &body).await;
    assert_eq!(status, 202, "{job}");
    assert_eq!((&job["action"], &job["migrate"]["to_version"]), (&json!("migrate"), &json!(2)), "{job}");
    let done = job_done(&e, &job).await;
    assert_eq!((done["acted_on"].as_i64(), done["refused"].as_i64()), (Some(3), Some(2)), "{done}");
    for id in &early {
        let moved = e.history(*id, "RunMigrated").await;
        assert_eq!(moved.len(), 1, "moved once: {moved:?}");
        let p = &moved[0]["payload"];
        assert_eq!(
            (&p["from_version"], &p["to_version"], &p["reason"]),
            (&json!(1), &json!(2), &json!("v1 forgets the check"))
        );
        assert!(p["actor"].is_string(), "{p}");
    }
    for id in &late {
        assert!(e.history(*id, "RunMigrated").await.is_empty());
    }

    // Undone: m1 moves back to v1 (its tags pick it), and again to v2.
    let one = |to: i32, from: i32| json!({"from_version": from, "to_version": to, "filter": {"tags": {"k": "m1"}}});
    for (from, to) in [(2, 1), (1, 2)] {
        let (status, job) = e.post("/v1/workflows/order/migrate", &one(to, from)).await;
        assert_eq!(status, 202, "{job}");
        assert_eq!(job_done(&e, &job).await["acted_on"], 1);
        let (_, run) = e.get(&format!("/v1/runs/{}", early[0])).await;
        assert_eq!(run["version"], to, "{run}");
    }
    assert_eq!(e.history(early[0], "RunMigrated").await.len(), 3);

    // Every run finishes: the moved ones on v2 (their check ran), the others on v1.
    let (status, resumed) = e.post(&format!("/v1/runs/{}/resume", early[2]), &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    for k in ["m1", "m2", "m3"] {
        send(&e, "w1", k).await;
    }
    for id in &early {
        waiting_at(&e, *id, "w2").await;
    }
    for k in ["m1", "m2", "m3", "u1", "u2"] {
        send(&e, "w2", k).await;
    }
    for id in &early {
        let run = e.wait_for_run(*id, T).await;
        assert_eq!((&run["status"], &run["version"]), (&json!("SUCCEEDED"), &json!(2)), "{run}");
        assert_eq!(run["output"]["b"], json!({"version": 2, "check": 2}), "{run}");
    }
    for id in &late {
        let run = e.wait_for_run(*id, T).await;
        assert_eq!((&run["status"], &run["version"]), (&json!("SUCCEEDED"), &json!(1)), "{run}");
        assert_eq!(run["output"]["b"], json!({"version": 1}), "{run}");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_renamed_step_moves_by_the_map_and_bad_requests_are_refused_by_name() {
    let e = Engine::start().await;
    e.register(&v1()).await;
    let id = e.start_run("order", json!({"k": "r"})).await;
    waiting_at(&e, id, "w1").await;
    let mut renamed = v1();
    renamed["nodes"][1]["id"] = json!("wait_one");
    renamed["edges"] =
        json!([{"from": "a", "to": "wait_one"}, {"from": "wait_one", "to": "w2"}, {"from": "w2", "to": "b"}]);
    e.register(&renamed).await;
    let dry = |map: Value| json!({"from_version": 1, "to_version": 2, "map": map, "dry_run": true});
    let (_, unmapped) = e.post("/v1/workflows/order/migrate", &dry(json!({}))).await;
    assert!(unmapped["runs"][0]["reasons"].to_string().contains("no step `w1`: map it"), "{unmapped}");
    let (_, mapped) = e.post("/v1/workflows/order/migrate", &dry(json!({"w1": "wait_one"}))).await;
    assert_eq!(mapped["runs"][0]["movable"], true, "{mapped}");
    let body = json!({"from_version": 1, "to_version": 2, "map": {"w1": "wait_one"}});
    let (status, job) = e.post("/v1/workflows/order/migrate", &body).await;
    assert_eq!(status, 202, "{job}");
    assert_eq!(job_done(&e, &job).await["acted_on"], 1);
    // The step kept its wait under its new name: the same event ends it.
    send(&e, "w1", "r").await;
    waiting_at(&e, id, "w2").await;
    send(&e, "w2", "r").await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let nodes: Vec<&str> = run["tasks"].as_array().unwrap().iter().map(|t| t["node_id"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["a", "wait_one", "w2", "b"], "{run}");

    let too_many: serde_json::Map<String, Value> = (0..101).map(|i| (format!("s{i}"), json!("a"))).collect();
    for (body, status, names) in [
        (json!({"from_version": 1, "to_version": 1}), 400, "to_version"),
        (json!({"from_version": 1, "to_version": 9}), 404, "no version 9"),
        (json!({"from_version": 0, "to_version": 2}), 400, "from_version"),
        (json!({"from_version": 1, "to_version": 2, "map": {"nope": "a"}}), 400, "no step \"nope\""),
        (json!({"from_version": 1, "to_version": 2, "map": {"a": "w1"}}), 400, "no step \"w1\""),
        (json!({"from_version": 1, "to_version": 2, "filter": {"status": "SUCCEEDED"}}), 400, "filter.status"),
        (json!({"from_version": 1, "to_version": 2, "filter": {"workflow": "other"}}), 400, "filter.workflow"),
        (json!({"from_version": 1, "to_version": 2, "surprise": 1}), 400, "surprise"),
        (json!({"from_version": 1, "to_version": 2, "map": too_many}), 400, "at most 100 steps"),
    ] {
        let (got, answer) = e.post("/v1/workflows/order/migrate", &body).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(names), "{body}: {answer}");
    }
    let (got, answer) = e.post("/v1/workflows/nothing/migrate", &json!({"from_version": 1, "to_version": 2})).await;
    assert_eq!(got, 404, "{answer}");
    let (got, answer) = e.post("/v1/runs/bulk", &json!({"filter": {"workflow": "order"}, "action": "migrate"})).await;
    assert_eq!(got, 400, "{answer}");
    assert!(answer["error"].to_string().contains("/migrate"), "{answer}");
    e.stop().await;
}

/// A dry run gives at most `MAX_MIGRATE_VERDICTS` (1,000) verdicts, oldest
/// first, and says there are more; the job looks at every run.
#[tokio::test]
async fn a_dry_run_gives_at_most_1000_verdicts_and_the_job_moves_every_run() {
    let e = Engine::start().await;
    let wait = json!({"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "all"}});
    e.register(&json!({"name": "many", "nodes": [wait]})).await;
    let mut ids = Vec::new();
    for chunk in 0..11 {
        let starts = (0..91).map(|_| e.start_run("many", json!({})));
        ids.extend(futures_util::future::join_all(starts).await);
        assert_eq!(ids.len(), (chunk + 1) * 91);
    }
    ids.sort();
    e.register(&json!({"name": "many", "nodes": [wait, {"id": "t", "type": "TRANSFORM", "config": {"output": 1}}],
        "edges": [{"from": "w", "to": "t"}]}))
        .await;
    let (status, dry) =
        e.post("/v1/workflows/many/migrate", &json!({"from_version": 1, "to_version": 2, "dry_run": true})).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!((&dry["truncated"], &dry["movable"]), (&json!(true), &json!(1000)));
    let shown: Vec<Uuid> =
        dry["runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(shown, ids[..1000], "the oldest 1,000, in order");
    let (status, job) = e.post("/v1/workflows/many/migrate", &json!({"from_version": 1, "to_version": 2})).await;
    assert_eq!(status, 202, "{job}");
    let done = job_done(&e, &job).await;
    assert_eq!((done["matched"].as_i64(), done["acted_on"].as_i64()), (Some(1001), Some(1001)), "{done}");
    e.stop().await;
}
