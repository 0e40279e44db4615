//! Updates: a request to a run's waiting step, validated there and
//! answered with the step's output or its refusal, once per update id —
//! through retries, concurrent sendings and a SIGKILLed coordinator.

use std::time::Duration;

use composer_testkit::{Engine, EngineOptions};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::processes::{kill9, TwoCoordinators};

const T: Duration = Duration::from_secs(60);

/// An order that waits for its approval (an event, or the `approve` update
/// within the run's limit), then says what was approved.
fn approval() -> Value {
    json!({"name": "order", "nodes": [
        {"id": "approval", "type": "WAIT_FOR_EVENT", "config": {"event": "approved", "key": "${ .input.order }"},
         "updates": [{"name": "approve", "validate": ".update.payload.amount <= .input.limit",
                      "refusal": "over the order's limit",
                      "output": {"by": "${ .update.payload.by }", "amount": "${ .update.payload.amount }"}},
                     {"name": "check", "validate": "if .update.payload.ok then true else error(\"not ok: \" + .update.id) end"}]},
        {"id": "done", "type": "TRANSFORM", "config": {"output": "${ .nodes.approval.output }"}}],
        "edges": [{"from": "approval", "to": "done"}]})
}

/// The run's steps completed by an update (its history says which).
async fn updated(e: &Engine, run: Uuid) -> Vec<Value> {
    e.history(run, "TaskCompleted").await.into_iter().filter(|h| !h["payload"]["update"].is_null()).collect()
}

async fn update(e: &Engine, run: Uuid, body: Value) -> (u16, Value) {
    e.post(&format!("/v1/runs/{run}/update"), &body).await
}

#[tokio::test]
async fn an_update_is_validated_by_its_step_answered_with_its_output_and_applied_once_per_id() {
    let e = Engine::start().await;
    e.register(&approval()).await;
    let run = e.start_run("order", json!({"order": "o-1", "limit": 100})).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;

    // Refused by validate: the reason, and the run unchanged.
    let (status, refused) =
        update(&e, run, json!({"name": "approve", "id": "u1", "payload": {"by": "ada", "amount": 500}})).await;
    assert_eq!(status, 200, "{refused}");
    assert_eq!(
        (refused["accepted"].clone(), refused["reason"].clone()),
        (json!(false), json!("over the order's limit"))
    );
    assert_eq!(refused["node"], "approval");
    // The same id again: the same refusal, even with a payload that would pass.
    let (_, again) =
        update(&e, run, json!({"name": "approve", "id": "u1", "payload": {"by": "ada", "amount": 500}})).await;
    assert_eq!((again["accepted"].clone(), again["duplicate"].clone()), (json!(false), json!(true)), "{again}");
    let (status, reused) =
        update(&e, run, json!({"name": "approve", "id": "u1", "payload": {"by": "ada", "amount": 5}})).await;
    assert_eq!((status, reused["error"]["code"].clone()), (422, json!("update_id_reused")), "{reused}");
    // An error in validate refuses with its message.
    let (_, checked) = update(&e, run, json!({"name": "check", "id": "c1", "payload": {"ok": false}})).await;
    assert_eq!(
        (checked["accepted"].clone(), checked["reason"].as_str().map(|r| r.contains("not ok: c1"))),
        (json!(false), Some(true)),
        "{checked}"
    );

    // Accepted: the step completes with the output, which is the answer.
    let (status, ok) =
        update(&e, run, json!({"name": "approve", "id": "u2", "payload": {"by": "grace", "amount": 80}})).await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(
        (ok["accepted"].clone(), ok["output"].clone()),
        (json!(true), json!({"by": "grace", "amount": 80})),
        "{ok}"
    );
    let done = e.wait_for_run(run, T).await;
    assert_eq!(
        (done["status"].as_str(), done["output"]["done"].clone()),
        (Some("SUCCEEDED"), json!({"by": "grace", "amount": 80}))
    );
    // Sent again: answered the same, applied once (the history has one completion).
    let (_, dup) =
        update(&e, run, json!({"name": "approve", "id": "u2", "payload": {"by": "grace", "amount": 80}})).await;
    assert_eq!(
        (dup["accepted"].clone(), dup["duplicate"].clone(), dup["output"]["by"].clone()),
        (json!(true), json!(true), json!("grace"))
    );
    let received = updated(&e, run).await;
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0]["payload"]["update"], json!({"id": "u2", "name": "approve"}), "{received:?}");
    // Rerun from the step: it waits again, and u2 sent again is still the
    // answer it was, applied to nothing; a new update completes it.
    let (status, rerun) =
        e.post(&format!("/v1/runs/{run}/rerun"), &json!({"from": ["approval"], "allow_completed": true})).await;
    assert_eq!(status, 200, "{rerun}");
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let (_, dup) =
        update(&e, run, json!({"name": "approve", "id": "u2", "payload": {"by": "grace", "amount": 80}})).await;
    assert_eq!((dup["accepted"].clone(), dup["duplicate"].clone()), (json!(true), json!(true)), "{dup}");
    let (_, still) = e.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(still["tasks"][0]["state"], "WAITING", "a retried update is not applied again: {still}");
    let (_, third) =
        update(&e, run, json!({"name": "approve", "id": "u3", "payload": {"by": "lin", "amount": 1}})).await;
    assert_eq!(third["output"], json!({"by": "lin", "amount": 1}), "{third}");
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["output"]["done"]["by"], "lin");
    assert_eq!(updated(&e, run).await.len(), 2, "u2 and u3, once each");
    // Another id once the run ended: nothing accepts it.
    let (status, late) =
        update(&e, run, json!({"name": "approve", "id": "u4", "payload": {"by": "x", "amount": 1}})).await;
    assert_eq!((status, late["error"]["code"].clone()), (409, json!("update_not_accepted")), "{late}");
    e.stop().await;
}

#[tokio::test]
async fn an_update_waits_for_its_step_up_to_its_timeout_and_bad_ones_are_refused_by_name() {
    let e = Engine::start().await;
    e.register(&approval()).await;
    // A run that waits 1 s before its approval step: the update waits for it.
    let slow = json!({"name": "slow_order", "nodes": [
        {"id": "pause", "type": "WAIT", "config": {"duration": "1s"}},
        {"id": "approval", "type": "WAIT_FOR_EVENT", "config": {"event": "approved", "key": "k"},
         "updates": [{"name": "approve"}]}], "edges": [{"from": "pause", "to": "approval"}]});
    e.register(&slow).await;
    let run = e.start_run("slow_order", json!({})).await;
    let (status, ok) = update(&e, run, json!({"name": "approve", "payload": 7, "timeout": "30s"})).await;
    assert_eq!((status, ok["accepted"].clone(), ok["output"].clone()), (200, json!(true), json!(7)), "{ok}");
    assert!(!ok["id"].as_str().unwrap().is_empty(), "an id is made: {ok}");
    // No step accepts that name: at once, naming it.
    let other = e.start_run("order", json!({"order": "o-2", "limit": 1})).await;
    let (status, none) = update(&e, other, json!({"name": "reject"})).await;
    assert_eq!((status, none["error"]["code"].clone()), (409, json!("update_not_accepted")), "{none}");
    assert!(none["error"]["message"].as_str().unwrap().contains("\"reject\""), "{none}");
    for (body, says) in [
        (json!({"name": "approve", "timeout": "2m"}), "timeout"),
        (json!({"name": "approve", "timeout": "soon"}), "timeout"),
        (json!({"name": "bad name"}), "name"),
        (json!({"name": "approve", "id": ""}), "id"),
        (json!({"name": "approve", "id": "i".repeat(257)}), "id"),
        (json!({"name": "approve", "extra": 1}), "extra"),
        (json!({"name": "approve", "payload": "a\u{0}b"}), "NUL"),
    ] {
        let (status, answer) = update(&e, other, body.clone()).await;
        assert!((400..500).contains(&status) && status != 409, "{body}: {status} {answer}");
        assert!(answer["error"]["message"].as_str().unwrap_or("").contains(says), "{body}: {answer}");
    }
    let (status, _) = update(&e, Uuid::now_v7(), json!({"name": "approve", "timeout": "0s"})).await;
    assert_eq!(status, 404);
    e.stop().await;
}

/// Ten sendings of one update id at once, on two coordinators: one is
/// applied, all ten get its answer.
#[tokio::test]
async fn one_update_sent_at_once_to_two_coordinators_is_applied_once() {
    let e = Engine::with(EngineOptions { coordinators: 2, ..Default::default() }).await;
    e.register(&approval()).await;
    let run = e.start_run("order", json!({"order": "o-3", "limit": 100})).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let http = reqwest::Client::new();
    let urls = e.coordinator_urls();
    let body = json!({"name": "approve", "id": "once", "payload": {"by": "ada", "amount": 10}});
    let sends = (0..10).map(|i| {
        let (http, url, body) = (http.clone(), urls[i % 2].clone(), body.clone());
        tokio::spawn(async move {
            let r = http.post(format!("{url}/v1/runs/{run}/update")).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    });
    let mut first = 0;
    for s in sends {
        let (status, answer) = s.await.unwrap();
        assert_eq!((status, answer["accepted"].clone()), (200, json!(true)), "{answer}");
        first += usize::from(answer["duplicate"] == false);
    }
    assert!(first >= 1, "one sending applied it");
    e.wait_for_run(run, T).await;
    assert_eq!(updated(&e, run).await.len(), 1, "applied once");
    e.stop().await;
}

/// A coordinator is SIGKILLed while updates arrive; each sender retries its
/// update on the other coordinator with the same id: every run's step
/// took exactly one update, and every retry was answered its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn updates_sent_when_a_coordinator_is_killed_are_applied_once_each() {
    let mut c = TwoCoordinators::start("kill-mid-updates", false).await;
    let clients = c.clients();
    assert_eq!(clients[0].post("/v1/workflows", &approval()).await.0, 201);
    let mut runs = Vec::new();
    for i in 0..40 {
        let (status, run) = clients[1]
            .post("/v1/runs", &json!({"workflow": "order", "input": {"order": format!("o{i}"), "limit": 100}}))
            .await;
        assert_eq!(status, 201, "{run}");
        runs.push(run["id"].as_str().unwrap().to_string());
    }
    for id in &runs {
        composer_testkit::eventually(T, "the step to wait", || async {
            let r = clients[1].get(&format!("/v1/runs/{id}")).await;
            (r["tasks"][0]["state"] == "WAITING").then_some(())
        })
        .await;
    }
    // Sent to the first coordinator, which is killed while they go.
    let http = reqwest::Client::new();
    let body =
        |i: usize| json!({"name": "approve", "id": format!("u{i}"), "payload": {"by": format!("p{i}"), "amount": i}});
    let sends: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (http, url, body) = (http.clone(), clients[0].base.clone(), body(i));
            let id = id.clone();
            tokio::spawn(async move { http.post(format!("{url}/v1/runs/{id}/update")).json(&body).send().await.ok() })
        })
        .collect();
    // Killed while they are in flight: once the first have been applied.
    composer_testkit::eventually(T, "a first update applied", || async {
        for id in &runs {
            let r = clients[1].get(&format!("/v1/runs/{id}")).await;
            if r["tasks"][0]["state"] == "COMPLETED" {
                return Some(());
            }
        }
        None
    })
    .await;
    kill9(&mut c.coordinators[0]);
    let mut answered = 0;
    for s in sends {
        answered += usize::from(s.await.ok().flatten().is_some_and(|r| r.status() == 200));
    }
    println!("{answered} of 40 updates answered before the kill");
    // Every sender retries on the survivor with its id.
    for (i, id) in runs.iter().enumerate() {
        let (status, answer) = clients[1].post(&format!("/v1/runs/{id}/update"), &body(i)).await;
        assert_eq!((status, answer["accepted"].clone()), (200, json!(true)), "{answer}");
        assert_eq!(answer["output"], json!({"by": format!("p{i}"), "amount": i}), "{answer}");
        let run = clients[1].wait_for_run(id, T).await;
        assert_eq!(run["output"]["done"]["by"], format!("p{i}"), "{run}");
        let history = clients[1].get(&format!("/v1/runs/{id}/events?limit=100")).await;
        let received = history["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "TaskCompleted" && !e["payload"]["update"].is_null())
            .count();
        assert_eq!(received, 1, "run {id}: the update applied once");
    }
    c.stop();
}

/// `composer run update`: exit 0 with the output when accepted, 1 with the
/// reason when refused; `composer workflow simulate --update` offers the
/// same updates offline and shows each answer.
#[tokio::test]
async fn the_cli_sends_updates_and_simulate_offers_them_offline() {
    let e = Engine::start().await;
    let url = e.url();
    e.register(&approval()).await;
    let run = e.start_run("order", json!({"order": "o-9", "limit": 100})).await.to_string();
    e.wait_until(run.parse().unwrap(), T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let args = |payload: &str, id: &str| -> Vec<String> {
        ["run", "update", &run, "approve", "--payload", payload, "--update-id", id, "-o", "json"]
            .map(String::from)
            .to_vec()
    };
    let no = crate::cli::cli(
        &url,
        &args(r#"{"by": "x", "amount": 900}"#, "c1").iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    )
    .await;
    assert_eq!(no.code, 1, "{} {}", no.stdout, no.stderr);
    assert!(no.stdout.contains("over the order's limit"), "{}", no.stdout);
    let yes = crate::cli::cli(
        &url,
        &args(r#"{"by": "ada", "amount": 9}"#, "c2").iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    )
    .await;
    assert_eq!(yes.code, 0, "{} {}", yes.stdout, yes.stderr);
    let answer: Value = serde_json::from_str(&yes.stdout).unwrap();
    assert_eq!(answer["output"], json!({"by": "ada", "amount": 9}));

    let dir = composer_embedded::temp_dir("simulate-updates").unwrap();
    let def = dir.join("order.json");
    std::fs::write(&def, approval().to_string()).unwrap();
    let sim = |extra: &[&str]| {
        let mut a =
            vec!["workflow", "simulate", "-f", def.to_str().unwrap(), "--input", r#"{"order": "o", "limit": 10}"#];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let table =
        sim(&["--update", r#"approve={"by": "b", "amount": 50}"#, "--update", r#"approve={"by": "c", "amount": 5}"#]);
    let out = crate::cli::cli(&url, &table.iter().map(String::as_str).collect::<Vec<_>>(), None).await;
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("updates\n  approve -> step approval  refused: over the order's limit\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(r#"  approve -> step approval  accepted, output {"amount":5,"by":"c"}"#),
        "{}",
        out.stdout
    );
    let bad = sim(&["--update", "approve"]);
    let out = crate::cli::cli(&url, &bad.iter().map(String::as_str).collect::<Vec<_>>(), None).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--update"), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(dir);
    e.stop().await;
}
