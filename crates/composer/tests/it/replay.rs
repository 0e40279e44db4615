//! Replay: the triggers of recorded events run again after a fix, once per
//! event and trigger that has no run yet, whoever works the replay and
//! whatever kills it mid-way.

use std::collections::HashSet;
use std::time::Duration;

use composer_testkit::{eventually, Engine, EngineOptions};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::cli::cli;
use crate::processes::{kill9, TwoCoordinators};

const T: Duration = Duration::from_secs(60);

/// `audit`, whose trigger on `order.created` fails until it is fixed.
fn broken_audit() -> Value {
    json!({"name": "audit", "nodes": [{"id": "log", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
           "triggers": [{"event": "order.created", "input": "${ .event.payload.missing | error(\"not yet\") }"}]})
}

fn fixed_audit() -> Value {
    json!({"name": "audit", "nodes": [{"id": "log", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
           "triggers": [{"event": "order.created", "input": {"order": "${ .event.payload.order }"}}]})
}

/// A filter over the last hour and the next minute, with `more` fields.
fn filter(more: Value) -> Value {
    let now = chrono::Utc::now();
    let mut f = json!({"from": (now - chrono::Duration::hours(1)).to_rfc3339(),
                       "to": (now + chrono::Duration::minutes(1)).to_rfc3339()});
    f.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
    f
}

/// Polls a replay until it has ended.
async fn ended(get: impl Fn() -> futures_util::future::BoxFuture<'static, Value>) -> Value {
    eventually(T, "the replay to end", || {
        let r = get();
        async move {
            let r = r.await;
            (r["status"] != "RUNNING").then_some(r)
        }
    })
    .await
}

async fn replay_ended(e: &Engine, id: &str) -> Value {
    let (url, http) = (e.url(), reqwest::Client::new());
    let id = id.to_string();
    ended(move || {
        let (url, http, id) = (url.clone(), http.clone(), id.clone());
        Box::pin(async move {
            http.get(format!("{url}/v1/events/replay/{id}")).send().await.unwrap().json::<Value>().await.unwrap()
        })
    })
    .await
}

/// The events named `name`, oldest first.
async fn events(e: &Engine, name: &str) -> Vec<Value> {
    let (_, page) = e.get(&format!("/v1/events?name={name}&limit=100")).await;
    let mut events = page["events"].as_array().unwrap().clone();
    events.reverse();
    events
}

#[tokio::test]
async fn a_replay_after_a_fix_starts_each_failed_trigger_once_and_again_starts_nothing() {
    let e = Engine::start().await;
    e.register(&broken_audit()).await;
    for i in 0..3 {
        let ev =
            json!({"name": "order.created", "id": format!("evt-{i}"), "key": format!("k{i}"), "payload": {"order": i}});
        let (status, sent) = e.post("/v1/events", &ev).await;
        assert_eq!((status, sent["trigger_errors"].as_array().unwrap().len()), (200, 1), "{sent}");
    }
    assert_eq!(e.post("/v1/events", &json!({"name": "order.cancelled", "payload": {}})).await.0, 200);

    // A dry run: the three events, each still failing.
    let dry = json!({"filter": filter(json!({"name": "order.created", "failed_only": true})), "dry_run": true});
    let (status, answer) = e.post("/v1/events/replay", &dry).await;
    assert_eq!((status, answer["matched"].clone()), (200, json!(3)), "{answer}");
    let preview = answer["preview"].as_array().unwrap();
    assert_eq!(preview.len(), 3, "{answer}");
    assert!(preview.iter().all(|p| p["would_start"] == json!([])), "{answer}");
    assert!(preview[0]["would_fail"][0]["error"].as_str().unwrap().contains("not yet"), "{answer}");
    let kept_since: chrono::DateTime<chrono::Utc> = answer["kept_since"].as_str().unwrap().parse().unwrap();
    let week = chrono::Utc::now() - chrono::Duration::days(7) - kept_since;
    assert!(week.num_seconds().abs() < 60, "kept_since is a week ago by default: {kept_since}");
    let (_, one) = e.post("/v1/events/replay", &json!({"filter": filter(json!({"key": "k1"})), "dry_run": true})).await;
    assert_eq!(one["matched"], 1, "the key narrows: {one}");

    // Fixed: the dry run says what it would start, and the replay starts it.
    e.register(&fixed_audit()).await;
    let (_, answer) = e.post("/v1/events/replay", &dry).await;
    assert_eq!(answer["preview"][0]["would_start"], json!([{"workflow": "audit", "trigger": 0}]), "{answer}");
    let body = json!({"filter": filter(json!({"name": "order.created", "failed_only": true})), "reason": "fixed"});
    let (status, job) = e.post("/v1/events/replay", &body).await;
    assert_eq!((status, job["status"].clone(), job["matched"].clone()), (202, json!("RUNNING"), json!(3)), "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let done = replay_ended(&e, &id).await;
    assert_eq!(
        (done["status"].clone(), done["looked_at"].clone(), done["started"].clone(), done["failed"].clone()),
        (json!("SUCCEEDED"), json!(3), json!(3), json!(0)),
        "{done}"
    );
    assert_eq!((done["actor"].clone(), done["reason"].clone()), (json!("anonymous"), json!("fixed")), "{done}");
    for (i, ev) in events(&e, "order.created").await.iter().enumerate() {
        assert_eq!(ev["trigger_errors"], json!([]), "the failure is replaced by the run: {ev}");
        let started = &ev["started_runs"][0];
        assert_eq!(started["replayed_by"], json!(id), "{ev}");
        let run = e.wait_for_run(started["run_id"].as_str().unwrap().parse().unwrap(), T).await;
        assert_eq!((run["status"].as_str(), run["output"]["log"].clone()), (Some("SUCCEEDED"), json!({"order": i})));
        assert_eq!(
            (run["trigger"]["replay"].as_str(), run["trigger"]["event_id"].clone()),
            (Some(id.as_str()), json!(format!("evt-{i}")))
        );
    }
    // Sent again by its id, an event is a duplicate that answers the replay's run.
    let (_, again) = e
        .post("/v1/events", &json!({"name": "order.created", "id": "evt-0", "key": "k0", "payload": {"order": 0}}))
        .await;
    assert_eq!(
        (again["duplicate"].clone(), again["started_runs"].as_array().unwrap().len()),
        (json!(true), 1),
        "{again}"
    );

    // A trigger added since is a trigger with no run: the next replay starts
    // its runs, and none of audit's again; a third starts nothing.
    e.register(&json!({"name": "late", "nodes": [{"id": "n", "type": "TRANSFORM", "config": {"output": 1}}],
        "triggers": [{"event": "order.created"}]}))
        .await;
    let all = json!({"filter": filter(json!({"name": "order.created"}))});
    let (_, job) = e.post("/v1/events/replay", &all).await;
    let done = replay_ended(&e, job["id"].as_str().unwrap()).await;
    assert_eq!((done["looked_at"].clone(), done["started"].clone()), (json!(3), json!(3)), "late's three: {done}");
    let (_, job) = e.post("/v1/events/replay", &all).await;
    let done = replay_ended(&e, job["id"].as_str().unwrap()).await;
    assert_eq!((done["looked_at"].clone(), done["started"].clone()), (json!(3), json!(0)), "{done}");
    // A new version that shifts audit's trigger to another place: audit has
    // a run for each event, and is not started again for them.
    let mut shifted = fixed_audit();
    shifted["triggers"] = json!([{"event": "order.cancelled"}, shifted["triggers"][0].clone()]);
    e.register(&shifted).await;
    let (_, dry) = e
        .post("/v1/events/replay", &json!({"filter": filter(json!({"name": "order.created"})), "dry_run": true}))
        .await;
    assert!(dry["preview"].as_array().unwrap().iter().all(|p| p["would_start"] == json!([])), "{dry}");
    let (_, job) = e.post("/v1/events/replay", &all).await;
    let done = replay_ended(&e, job["id"].as_str().unwrap()).await;
    assert_eq!(done["started"], 0, "{done}");
    let (_, runs) = e.get("/v1/runs?workflow=audit&limit=100").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 3, "one audit run per event");
    // Stopping an ended replay leaves it as it ended.
    let (status, stopped) =
        e.post(&format!("/v1/events/replay/{}/cancel", job["id"].as_str().unwrap()), &json!({})).await;
    assert_eq!((status, stopped["status"].clone()), (200, json!("SUCCEEDED")), "{stopped}");
    e.stop().await;
}

#[tokio::test]
async fn a_replay_request_that_cannot_be_worked_is_refused_by_name() {
    let e = Engine::start().await;
    let now = chrono::Utc::now();
    let (later, earlier) = (now.to_rfc3339(), (now - chrono::Duration::hours(1)).to_rfc3339());
    let long = "n".repeat(257);
    for (body, says) in [
        (json!({"filter": {"from": later, "to": earlier}}), "from must be before to"),
        (json!({"filter": {"from": later, "to": later}}), "from must be before to"),
        (json!({"filter": {"from": "0001-01-01T00:00:00Z", "to": later}}), "filter.from must be in the years"),
        (json!({"filter": {"from": earlier, "to": later, "name": ""}}), "filter.name"),
        (json!({"filter": {"from": earlier, "to": later, "name": long}}), "filter.name"),
        (json!({"filter": {"from": earlier, "to": later, "key": "k".repeat(1025)}}), "filter.key"),
        (json!({"filter": {"from": earlier, "to": later}, "reason": "r".repeat(1025)}), "reason"),
        (json!({"filter": {"from": earlier, "to": later, "name": "a\u{0}b"}}), "NUL"),
        (json!({"filter": {"from": earlier}}), "to"),
        (json!({"filter": {"from": earlier, "to": later, "failed": true}}), "failed"),
    ] {
        let (status, answer) = e.post("/v1/events/replay", &body).await;
        assert!((400..500).contains(&status), "{body}: {status} {answer}");
        assert!(answer["error"]["message"].as_str().unwrap_or("").contains(says), "{body}: {answer}");
    }
    let (status, answer) = e.get("/v1/events/replay/not-a-uuid").await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = e.get(&format!("/v1/events/replay/{}", Uuid::now_v7())).await;
    assert_eq!((status, answer["error"]["code"].clone()), (404, json!("not_found")), "{answer}");
    let (status, _) = e.post(&format!("/v1/events/replay/{}/cancel", Uuid::now_v7()), &json!({})).await;
    assert_eq!(status, 404);
    e.stop().await;
}

/// 150 failed events; two replays of them at once, one on each of two
/// coordinators: each event's trigger starts one run between them.
#[tokio::test]
async fn two_replays_at_once_on_two_coordinators_start_each_run_once() {
    let e = Engine::with(EngineOptions { coordinators: 2, ..Default::default() }).await;
    e.register(&broken_audit()).await;
    for i in 0..150 {
        let ev = json!({"name": "order.created", "id": format!("e{i}"), "payload": {"order": i}});
        assert_eq!(e.post("/v1/events", &ev).await.0, 200);
    }
    e.register(&fixed_audit()).await;
    let http = reqwest::Client::new();
    let body = json!({"filter": filter(json!({"failed_only": true}))});
    let mut ids = Vec::new();
    for url in e.coordinator_urls() {
        let r = http.post(format!("{url}/v1/events/replay")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 202);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    let mut started = 0;
    for id in &ids {
        started += replay_ended(&e, id).await["started"].as_i64().unwrap();
    }
    assert_eq!(started, 150, "between them, one run per event");
    let (_, runs) = e.get("/v1/runs?workflow=audit&limit=1000").await;
    let orders: HashSet<String> =
        runs["runs"].as_array().unwrap().iter().map(|r| r["trigger"]["event_id"].to_string()).collect();
    assert_eq!((runs["runs"].as_array().unwrap().len(), orders.len()), (150, 150));
    e.stop().await;
}

/// The event log keeps what `COMPOSER_EVENT_LOG_KEPT` says, and forgets the rest.
#[tokio::test]
async fn the_event_log_forgets_what_is_older_than_its_setting() {
    let e = Engine::start().await;
    for id in ["old", "new"] {
        assert_eq!(e.post("/v1/events", &json!({"name": "tick", "id": id})).await.0, 200);
    }
    let client = composer_store::client(&e.db.pool()).await.unwrap();
    client
        .execute("UPDATE event_log SET received_at = now() - interval '2 minutes' WHERE event_id = 'old'", &[])
        .await
        .unwrap();
    let mut config = e.coordinator_config();
    config.event_log_kept = Duration::from_secs(90);
    assert_eq!(composer_coord::triggers::forget_old_events(&config, &client).await.unwrap(), 1);
    let kept: Vec<String> = events(&e, "tick").await.iter().map(|ev| ev["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(kept, ["new"]);
    // Forgotten, its id is new again.
    let (_, sent) = e.post("/v1/events", &json!({"name": "tick", "id": "old"})).await;
    assert_eq!(sent["duplicate"], false, "{sent}");
    e.stop().await;
}

/// A coordinator is SIGKILLed while it works a replay of 300 events: the
/// other finishes it, and each event's trigger started one run.
#[tokio::test]
async fn a_replay_whose_coordinator_is_killed_mid_way_starts_each_run_once() {
    let mut c = TwoCoordinators::start("kill-mid-replay", false).await;
    let clients = c.clients();
    assert_eq!(clients[0].post("/v1/workflows", &broken_audit()).await.0, 201);
    for i in 0..300 {
        let ev = json!({"name": "order.created", "id": format!("e{i}"), "payload": {"order": i}});
        assert_eq!(clients[i % 2].post("/v1/events", &ev).await.0, 200);
    }
    assert_eq!(clients[0].post("/v1/workflows", &fixed_audit()).await.0, 201);
    let (status, job) = clients[0].post("/v1/events/replay", &json!({"filter": filter(json!({}))})).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    // Killed as the first runs start (the coordinator that took the
    // request is woken at once; the other looks each second).
    eventually(T, "the replay's first run", || async {
        let page = clients[1].get("/v1/runs?workflow=audit&limit=1").await;
        (!page["runs"].as_array().unwrap().is_empty()).then_some(())
    })
    .await;
    kill9(&mut c.coordinators[0]);
    let done = eventually(Duration::from_secs(120), "the replay to end on the other", || async {
        let r = clients[1].get(&format!("/v1/events/replay/{id}")).await;
        (r["status"] != "RUNNING").then_some(r)
    })
    .await;
    // Each event's commit moved the cursor and the counts: they hold through the kill.
    assert_eq!(
        (done["status"].clone(), done["looked_at"].clone(), done["started"].clone()),
        (json!("SUCCEEDED"), json!(300), json!(300)),
        "{done}"
    );
    let runs = clients[1].get("/v1/runs?workflow=audit&limit=1000").await;
    let runs = runs["runs"].as_array().unwrap();
    let events: HashSet<String> = runs.iter().map(|r| r["trigger"]["event_id"].to_string()).collect();
    assert_eq!((runs.len(), events.len()), (300, 300), "one run per event, none twice");
    c.stop();
}

/// `composer event replay`: a dry run, the replay, its status; a time
/// that is neither RFC 3339 nor a duration, and a range the server refuses,
/// each named.
#[tokio::test]
async fn the_cli_replays_with_a_dry_run_first_and_shows_how_far_it_got() {
    let e = Engine::start().await;
    let url = e.url();
    e.register(&broken_audit()).await;
    assert_eq!(e.post("/v1/events", &json!({"name": "order.created", "payload": {"order": 5}})).await.0, 200);
    e.register(&fixed_audit()).await;
    let args = ["event", "replay", "--from", "1h", "--name", "order.created", "--failed-only", "-o", "json"];
    let dry = cli(&url, &[&args[..], &["--dry-run"]].concat(), None).await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let dry: Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(
        (dry["matched"].clone(), dry["preview"][0]["would_start"][0]["workflow"].clone()),
        (json!(1), json!("audit"))
    );
    let started = cli(&url, &[&args[..], &["--reason", "fixed"]].concat(), None).await;
    assert_eq!(started.code, 0, "{}", started.stderr);
    let id = serde_json::from_str::<Value>(&started.stdout).unwrap()["id"].as_str().unwrap().to_string();
    let done = eventually(T, "the replay to end", || async {
        let out = cli(&url, &["event", "replay-status", &id, "-o", "json"], None).await;
        let r: Value = serde_json::from_str(&out.stdout).unwrap();
        (r["status"] != "RUNNING").then_some(r)
    })
    .await;
    assert_eq!(
        (done["status"].clone(), done["started"].clone(), done["reason"].clone()),
        (json!("SUCCEEDED"), json!(1), json!("fixed"))
    );
    let bad = cli(&url, &["event", "replay", "--from", "yesterday"], None).await;
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("--from") && bad.stderr.contains("RFC 3339"), "{}", bad.stderr);
    let backwards = cli(&url, &["event", "replay", "--from", "1h", "--to", "2h"], None).await;
    assert_ne!(backwards.code, 0);
    assert!(backwards.stderr.contains("from must be before to"), "{}", backwards.stderr);
    e.stop().await;
}
