//! A trigger's flow control on real services: `debounce` (trailing and
//! leading), `batch`, `throttle` (queued and dropped) and `singleton`
//! (skip and cancel) — what each event's answer and record say, and the
//! runs that start — and events sent while a coordinator is SIGKILLed,
//! with no batched, debounced, throttled or singleton run started twice or
//! lost.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use composer_testkit::{eventually, Engine};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::processes::TwoCoordinators;

const T: Duration = Duration::from_secs(60);

/// A workflow `name` whose runs output their input, started by `signal`
/// events through `trigger` (its flow control).
fn echo(name: &str, trigger: Value) -> Value {
    let mut t = json!({"event": "signal"});
    for (k, v) in trigger.as_object().unwrap() {
        t[k] = v.clone();
    }
    json!({"name": name, "nodes": [{"id": "echo", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
           "triggers": [t]})
}

async fn send(e: &Engine, id: &str, key: &str, payload: Value) -> Value {
    let (status, sent) =
        e.post("/v1/events", &json!({"name": "signal", "id": id, "key": key, "payload": payload})).await;
    assert_eq!(status, 200, "{sent}");
    sent
}

/// The runs of `workflow`, oldest first, once each has ended.
async fn runs_of(e: &Engine, workflow: &str) -> Vec<Value> {
    let (_, page) = e.get(&format!("/v1/runs?workflow={workflow}&limit=1000")).await;
    let mut out = Vec::new();
    for r in page["runs"].as_array().unwrap().iter().rev() {
        out.push(e.wait_for_run(r["id"].as_str().unwrap().parse().unwrap(), T).await);
    }
    out
}

/// Until `workflow` has `n` runs.
async fn until_runs(e: &Engine, workflow: &str, n: usize) {
    eventually(T, "the runs", || async {
        let (_, page) = e.get(&format!("/v1/runs?workflow={workflow}&limit=1000")).await;
        (page["runs"].as_array().unwrap().len() >= n).then_some(())
    })
    .await;
}

/// The recorded event `id` (of the last 100).
async fn recorded(e: &Engine, id: &str) -> Value {
    let (_, page) = e.get("/v1/events?name=signal&limit=100").await;
    page["events"].as_array().unwrap().iter().find(|ev| ev["id"] == id).cloned().unwrap()
}

#[tokio::test]
async fn a_trailing_debounce_starts_one_run_per_key_with_the_burst_s_last_event() {
    let e = Engine::start().await;
    e.register(&echo("settle", json!({"debounce": {"period": "700ms"}}))).await;
    for i in 0..4 {
        let sent = send(&e, &format!("a{i}"), "a", json!({"n": i})).await;
        assert!(sent["started_runs"].as_array().unwrap().is_empty(), "{sent}");
        let held = &sent["held"][0];
        assert_eq!((held["workflow"].as_str(), held["flow"].as_str()), (Some("settle"), Some("debounce")), "{sent}");
        assert!(held["note"].as_str().unwrap().contains("unless another event"), "{sent}");
    }
    send(&e, "b0", "b", json!({"n": 10})).await;
    until_runs(&e, "settle", 2).await;
    let runs = runs_of(&e, "settle").await;
    let mut inputs: Vec<Value> = runs.iter().map(|r| r["output"]["echo"].clone()).collect();
    inputs.sort_by_key(Value::to_string);
    assert_eq!(inputs, [json!({"n": 10}), json!({"n": 3})], "one run per key, with its last event");
    let by_key: BTreeMap<String, Value> =
        runs.iter().map(|r| (r["trigger"]["key"].as_str().unwrap().to_string(), r["trigger"].clone())).collect();
    assert_eq!((by_key["a"]["flow"].clone(), by_key["a"]["event_id"].clone()), (json!("debounce"), json!("a3")));
    // Each event's record says what became of it.
    let last = recorded(&e, "a3").await;
    assert_eq!(last["started_runs"][0]["workflow"], "settle", "{last}");
    let replaced = recorded(&e, "a1").await;
    assert!(replaced["started_runs"].as_array().unwrap().is_empty(), "{replaced}");
    assert!(replaced["held"][0]["note"].as_str().unwrap().contains("a later event (a2)"), "{replaced}");
    // The events page says it too: the run, or what became of the event.
    let page = reqwest::get(format!("{}/ui/events?name=signal", e.url())).await.unwrap().text().await.unwrap();
    assert!(page.contains("settle: no run (debounce)") && page.contains("<span class=\"flow\">(debounce)</span>"));
    let run_page = reqwest::get(format!("{}/ui/runs/{}", e.url(), runs[0]["id"].as_str().unwrap())).await.unwrap();
    assert!(run_page.text().await.unwrap().contains("(debounce of key <code>"), "the run page says how it started");
    let wf_page = reqwest::get(format!("{}/ui/workflows/settle", e.url())).await.unwrap().text().await.unwrap();
    assert!(wf_page.contains("debounced: one run 700ms after a burst&#39;s last event"), "{wf_page}");
    // A burst after the quiet time is a new one.
    send(&e, "a9", "a", json!({"n": 9})).await;
    until_runs(&e, "settle", 3).await;
    e.stop().await;
}

#[tokio::test]
async fn a_leading_debounce_starts_the_burst_s_first_event_and_drops_the_rest() {
    let e = Engine::start().await;
    let trigger = json!({"debounce": {"period": "5s", "leading": true}, "key": "${ .event.payload.user }"});
    e.register(&echo("greet", trigger)).await;
    let first = send(&e, "l0", "", json!({"user": "ada", "n": 0})).await;
    assert_eq!(first["started_runs"].as_array().unwrap().len(), 1, "{first}");
    for i in 1..3 {
        let sent = send(&e, &format!("l{i}"), "", json!({"user": "ada", "n": i})).await;
        assert!(sent["started_runs"].as_array().unwrap().is_empty(), "{sent}");
        assert!(sent["held"][0]["note"].as_str().unwrap().contains("starts none"), "{sent}");
    }
    let other = send(&e, "l9", "", json!({"user": "bo", "n": 9})).await;
    assert_eq!(other["started_runs"].as_array().unwrap().len(), 1, "another key's burst: {other}");
    let runs = runs_of(&e, "greet").await;
    let ns: BTreeSet<i64> = runs.iter().map(|r| r["output"]["echo"]["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, BTreeSet::from([0, 9]));
    e.stop().await;
}

#[tokio::test]
async fn a_batch_starts_a_run_per_max_size_events_and_one_for_the_rest_after_max_wait() {
    let e = Engine::start().await;
    let trigger = json!({"batch": {"max_size": 3, "max_wait": "800ms"}, "input": {"id": "${ .event.id }"}});
    e.register(&echo("bulk", trigger)).await;
    let db = composer_store::client(&e.db.pool()).await.unwrap();
    let mut full = Vec::new();
    for i in 0..7 {
        let sent = send(&e, &format!("b{i}"), "k", json!({})).await;
        match sent["started_runs"].as_array().unwrap().first() {
            Some(r) => full.push((i, r["run_id"].as_str().unwrap().to_string())),
            None => assert!(sent["held"][0]["note"].as_str().unwrap().starts_with("batch: held"), "{sent}"),
        }
        // Each held event is a row of its own, gone with the batch's start
        // (so that an event writes one row, not the key's whole list).
        if i < 6 {
            let rows: i64 = db.query_one("SELECT count(*) FROM trigger_flow_events", &[]).await.unwrap().get(0);
            assert_eq!(rows, (i as i64 + 1) % 3, "after b{i}");
        }
    }
    assert_eq!(full.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [2, 5], "the third and sixth fill a batch");
    until_runs(&e, "bulk", 3).await;
    let runs = runs_of(&e, "bulk").await;
    let ids = |r: &Value| -> Vec<String> {
        r["output"]["echo"].as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap().to_string()).collect()
    };
    let batches: Vec<Vec<String>> = runs.iter().map(ids).collect();
    assert_eq!(batches, [vec!["b0", "b1", "b2"], vec!["b3", "b4", "b5"], vec!["b6"]], "every event once, in order");
    assert_eq!(runs[2]["trigger"]["events"], 1);
    // The held events' records name the run that took them.
    let held = recorded(&e, "b0").await;
    assert_eq!(held["started_runs"][0]["run_id"].as_str(), Some(full[0].1.as_str()), "{held}");
    let late = recorded(&e, "b6").await;
    assert_eq!(late["started_runs"][0]["run_id"], runs[2]["id"], "{late}");
    e.stop().await;
}

#[tokio::test]
async fn a_throttle_queues_past_its_count_or_drops_as_it_says() {
    let e = Engine::start().await;
    e.register(&echo("paced", json!({"throttle": {"count": 2, "period": "1s"}}))).await;
    e.register(&echo("capped", json!({"throttle": {"count": 1, "period": "1h", "excess": "drop"}}))).await;
    let mut now = 0;
    for i in 0..5 {
        let sent = send(&e, &format!("t{i}"), "k", json!({"n": i})).await;
        let started: Vec<&str> =
            sent["started_runs"].as_array().unwrap().iter().map(|r| r["workflow"].as_str().unwrap()).collect();
        now += started.iter().filter(|w| **w == "paced").count();
        let notes: BTreeMap<&str, &str> = sent["held"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["workflow"].as_str().unwrap(), h["note"].as_str().unwrap()))
            .collect();
        if i >= 2 {
            assert!(notes["paced"].starts_with("throttle: queued"), "{sent}");
        }
        if i >= 1 {
            assert!(notes["capped"].contains("drops the rest"), "{sent}");
        }
    }
    assert_eq!(now, 2, "two at once, three queued");
    until_runs(&e, "paced", 5).await;
    let runs = runs_of(&e, "paced").await;
    let order: Vec<i64> = runs.iter().map(|r| r["output"]["echo"]["n"].as_i64().unwrap()).collect();
    assert_eq!(order.iter().copied().collect::<BTreeSet<_>>(), BTreeSet::from([0, 1, 2, 3, 4]));
    let started: Vec<chrono::DateTime<chrono::Utc>> =
        runs.iter().map(|r| r["created_at"].as_str().unwrap().parse().unwrap()).collect();
    assert!(started[4] - started[0] >= chrono::Duration::seconds(2), "three periods: {started:?}");
    assert_eq!(runs_of(&e, "capped").await.len(), 1);
    // An input no row can keep is refused as a start's would be, before it is held.
    e.register(&echo("nul", json!({"throttle": {"count": 1, "period": "1m"}, "input": "${ [0] | implode }"}))).await;
    let sent = send(&e, "t-nul", "k", json!({})).await;
    let refused = sent["trigger_errors"].as_array().unwrap().iter().find(|t| t["workflow"] == "nul").unwrap();
    assert!(refused["error"].as_str().unwrap().starts_with("the run's input"), "{sent}");
    e.stop().await;
}

#[tokio::test]
async fn a_singleton_skips_while_its_key_s_run_runs_or_cancels_it() {
    let e = Engine::start().await;
    let waits = |name: &str, mode: &str| {
        json!({"name": name, "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}],
               "triggers": [{"event": "signal", "singleton": mode}]})
    };
    e.register(&waits("one_at_a_time", "skip")).await;
    e.register(&waits("newest_wins", "cancel")).await;
    let first = send(&e, "s0", "k", json!({})).await;
    let run_of = |sent: &Value, wf: &str| -> Option<Uuid> {
        let r = sent["started_runs"].as_array().unwrap().iter().find(|r| r["workflow"] == wf)?;
        r["run_id"].as_str()?.parse().ok()
    };
    let (skip0, cancel0) = (run_of(&first, "one_at_a_time").unwrap(), run_of(&first, "newest_wins").unwrap());
    let second = send(&e, "s1", "k", json!({})).await;
    assert_eq!(run_of(&second, "one_at_a_time"), None, "{second}");
    let note = second["held"].as_array().unwrap().iter().find(|h| h["workflow"] == "one_at_a_time").unwrap();
    assert!(note["note"].as_str().unwrap().contains(&format!("run {skip0} of the key is still running")), "{second}");
    let cancel1 = run_of(&second, "newest_wins").unwrap();
    let old = e.wait_for_run(cancel0, T).await;
    assert_eq!(old["status"], "CANCELLED", "{old}");
    // Another key runs beside; the skipped key starts again once its run ended.
    assert!(run_of(&send(&e, "s2", "other", json!({})).await, "one_at_a_time").is_some());
    let (status, _) = e.post(&format!("/v1/runs/{skip0}/cancel"), &json!({})).await;
    assert_eq!(status, 200);
    e.wait_for_run(skip0, T).await;
    let third = send(&e, "s3", "k", json!({})).await;
    assert!(run_of(&third, "one_at_a_time").is_some(), "{third}");
    assert_eq!(e.wait_for_run(cancel1, T).await["status"], "CANCELLED", "the newest wins again");
    let (_, newest) = e.get(&format!("/v1/runs/{}", run_of(&third, "newest_wins").unwrap())).await;
    assert_eq!(newest["status"], "RUNNING", "{newest}");
    e.stop().await;
}

/// Events of one key sent all at once: each waits for the key's lock in
/// turn, and each sees the events the one before it held or let go (read
/// once the lock is had, not as they were when its statement began).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_one_key_sent_at_once_are_each_taken_once() {
    let e = Engine::start().await;
    let input = json!({"input": "${ .event.id }"});
    let with = |flow: Value| {
        let mut t = input.clone();
        t.as_object_mut().unwrap().extend(flow.as_object().unwrap().clone());
        t
    };
    e.register(&echo("heaps", with(json!({"batch": {"max_size": 7, "max_wait": "500ms"}})))).await;
    // Long enough that a stalled machine does not split the burst.
    e.register(&echo("settles", with(json!({"debounce": {"period": "5s"}})))).await;
    e.register(&echo("paces", with(json!({"throttle": {"count": 3, "period": "300ms"}})))).await;
    const EVENTS: usize = 40;
    let all: BTreeSet<String> = (0..EVENTS).map(|i| format!("c{i}")).collect();
    futures_util::future::join_all(all.iter().map(|id| send(&e, id, "one", json!({})))).await;
    // Until nothing is held or due (so a run started late, twice, is seen).
    let db = composer_store::client(&e.db.pool()).await.unwrap();
    eventually(T, "nothing held", || async {
        let sql = "SELECT (SELECT count(*) FROM trigger_flow_events)
                        + (SELECT count(*) FROM trigger_flows WHERE due_at IS NOT NULL)";
        (db.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) == 0).then_some(())
    })
    .await;
    // Every event in one batch and one throttled run.
    for wf in ["heaps", "paces"] {
        let mut started: BTreeMap<String, usize> = BTreeMap::new();
        for run in runs_of(&e, wf).await {
            let echoed = &run["output"]["echo"];
            for id in echoed.as_array().cloned().unwrap_or_else(|| vec![echoed.clone()]) {
                *started.entry(id.as_str().unwrap().to_string()).or_insert(0) += 1;
            }
        }
        assert_eq!(started.keys().cloned().collect::<BTreeSet<_>>(), all, "{wf}: every event's run");
        assert!(started.values().all(|n| *n == 1), "{wf}: an event started twice: {started:?}");
    }
    // Debounced: one run, and every other event replaced, none left held.
    let runs = runs_of(&e, "settles").await;
    assert_eq!(runs.len(), 1, "one run for the burst");
    let last = runs[0]["output"]["echo"].as_str().unwrap().to_string();
    assert!(all.contains(&last));
    for id in all.iter().filter(|id| **id != last) {
        let ev = recorded(&e, id).await;
        let held = ev["held"].as_array().unwrap().iter().find(|h| h["workflow"] == "settles");
        let note = held.and_then(|h| h["note"].as_str()).unwrap_or_default();
        assert!(note.contains("took its place"), "{id} was replaced: {ev}");
    }
    e.stop().await;
}

/// Events of 10 keys sent to a coordinator that is SIGKILLed while they go
/// (and while its timer starts held batches and queued throttled events),
/// then every one sent again to the survivor: each event is in exactly one
/// batch run and one throttled run, each key's debounced run starts with
/// its last event once (and its leading one with its first), and each
/// event's singleton run starts once and is cancelled by the next of its
/// key, by whichever coordinator is left to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_held_when_a_coordinator_is_killed_start_each_flow_s_runs_once() {
    let mut c = TwoCoordinators::start("kill-mid-flows", false).await;
    let clients = c.clients();
    let batch = json!({"key": "${ .event.payload.group }", "input": "${ .event.id }",
                       "batch": {"max_size": 7, "max_wait": "500ms"}});
    let debounce = json!({"key": "${ .event.payload.group }", "input": "${ .event.id }",
                          "debounce": {"period": "3s"}});
    assert_eq!(clients[1].post("/v1/workflows", &echo("batched", batch)).await.0, 201);
    assert_eq!(clients[1].post("/v1/workflows", &echo("debounced", debounce)).await.0, 201);
    let throttle = json!({"key": "${ .event.payload.group }", "input": "${ .event.id }",
                          "throttle": {"count": 2, "period": "1s"}});
    assert_eq!(clients[1].post("/v1/workflows", &echo("throttled", throttle)).await.0, 201);
    let leading = json!({"key": "${ .event.payload.group }", "input": "${ .event.id }",
                         "debounce": {"period": "3s", "leading": true}});
    assert_eq!(clients[1].post("/v1/workflows", &echo("leading", leading)).await.0, 201);
    let newest = json!({"name": "newest", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1h"}}],
                        "triggers": [{"event": "signal", "key": "${ .event.payload.group }",
                                      "input": "${ .event.id }", "singleton": "cancel"}]});
    assert_eq!(clients[1].post("/v1/workflows", &newest).await.0, 201);
    const EVENTS: usize = 300;
    let event = |i: usize| json!({"name": "signal", "id": format!("e{i}"), "payload": {"group": i % 10}});
    c.send_events_and_kill((0..EVENTS).map(event).collect(), 50).await;
    for i in 0..EVENTS {
        let (status, sent) = clients[1].post("/v1/events", &event(i)).await;
        assert_eq!(status, 200, "{sent}");
    }
    // Every batch: each event once.
    let all_runs = |wf: &'static str| {
        let client = &clients[1];
        async move {
            let page = client.get(&format!("/v1/runs?workflow={wf}&limit=1000")).await;
            let mut out = Vec::new();
            for r in page["runs"].as_array().unwrap() {
                out.push(client.wait_for_run(r["id"].as_str().unwrap(), T).await);
            }
            out
        }
    };
    let batched = eventually(T, "every event in a batch", || async {
        let mut batched: BTreeMap<String, usize> = BTreeMap::new();
        for run in all_runs("batched").await {
            for id in run["output"]["echo"].as_array().unwrap() {
                *batched.entry(id.as_str().unwrap().to_string()).or_insert(0) += 1;
            }
        }
        (batched.len() == EVENTS).then_some(batched)
    })
    .await;
    assert!(batched.values().all(|n| *n == 1), "an event in two batches: {batched:?}");
    // Debounced: each key's last event started a run, and no event two;
    // leading: each key's first.
    let last: BTreeSet<String> = (EVENTS - 10..EVENTS).map(|i| format!("e{i}")).collect();
    let first: BTreeSet<String> = (0..10).map(|i| format!("e{i}")).collect();
    for (wf, must) in [("debounced", &last), ("leading", &first)] {
        let inputs: Vec<String> = eventually(T, "each key's event to start its run", || async {
            let inputs: Vec<String> =
                all_runs(wf).await.iter().map(|r| r["output"]["echo"].as_str().unwrap().to_string()).collect();
            let got: BTreeSet<String> = inputs.iter().cloned().collect();
            must.is_subset(&got).then_some(inputs)
        })
        .await;
        let distinct: BTreeSet<&String> = inputs.iter().collect();
        assert_eq!(distinct.len(), inputs.len(), "{wf}: no event started two runs: {inputs:?}");
    }
    // Throttled (2 a second a key, so the kill finds events queued): each
    // event's run once, none lost.
    let throttled = eventually(T, "every throttled event's run", || async {
        let mut started: BTreeMap<String, usize> = BTreeMap::new();
        for run in all_runs("throttled").await {
            *started.entry(run["output"]["echo"].as_str().unwrap().to_string()).or_insert(0) += 1;
        }
        (started.len() == EVENTS).then_some(started)
    })
    .await;
    assert!(throttled.values().all(|n| *n == 1), "a throttled event started twice: {throttled:?}");
    // Singleton cancel: one run per event, and only each key's last still runs.
    let listed = |wf: &'static str| {
        let client = &clients[1];
        async move {
            let page = client.get(&format!("/v1/runs?workflow={wf}&limit=1000")).await;
            page["runs"].as_array().unwrap().clone()
        }
    };
    let newest_runs = eventually(T, "each older singleton run to be cancelled", || async {
        let runs = listed("newest").await;
        let cancelled = runs.iter().filter(|r| r["status"] == "CANCELLED").count();
        (runs.len() == EVENTS && cancelled == EVENTS - 10).then_some(runs)
    })
    .await;
    let event_of = |r: &Value| r["trigger"]["event_id"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let events: BTreeSet<String> = newest_runs.iter().map(event_of).collect();
    assert_eq!(events.len(), EVENTS, "one singleton run per event");
    let running: BTreeSet<String> = newest_runs.iter().filter(|r| r["status"] != "CANCELLED").map(event_of).collect();
    assert_eq!(running, last, "each key's last event's run is the one left running");
    c.stop();
}

/// A leading debounce whose first run is refused opens no burst: the next
/// event starts the run. A key past its bytes fails its trigger, and the
/// event stands.
#[tokio::test]
async fn a_refused_first_run_opens_no_burst_and_a_long_key_fails_its_trigger() {
    let e = Engine::start().await;
    let mut strict = echo("strict", json!({"debounce": {"period": "1h", "leading": true}}));
    strict["input_schema"] = json!({"type": "object", "required": ["ok"]});
    e.register(&strict).await;
    let refused = send(&e, "r0", "k", json!({})).await;
    assert!(refused["trigger_errors"][0]["error"].as_str().unwrap().contains("ok"), "{refused}");
    let next = send(&e, "r1", "k", json!({"ok": 1})).await;
    assert_eq!(next["started_runs"].as_array().unwrap().len(), 1, "the burst had not begun: {next}");
    let long = send(&e, "r2", &"é".repeat(300), json!({"ok": 2})).await;
    assert!(long["trigger_errors"][0]["error"].as_str().unwrap().contains("max_flow_key_bytes"), "{long}");
    e.stop().await;
}

/// A batch its workflow refused (an input schema that takes lists of
/// numbers only) is replayed once the workflow is fixed: the replayed
/// events are batched again, and each is in one run, recorded as replayed.
#[tokio::test]
async fn a_refused_batch_is_replayed_into_one_batch_after_the_fix() {
    let e = Engine::start().await;
    let mut wrong = echo("digest", json!({"batch": {"max_size": 3, "max_wait": "300ms"}, "input": "${ .event.id }"}));
    // A list, but of numbers: every batch of event ids is refused (a schema
    // that says "no list" at its root is refused at registration).
    wrong["input_schema"] = json!({"type": "array", "items": {"type": "integer"}});
    e.register(&wrong).await;
    for i in 0..3 {
        send(&e, &format!("d{i}"), "k", json!({})).await;
    }
    let (_, page) = e.get("/v1/events?name=signal&limit=10").await;
    for ev in page["events"].as_array().unwrap() {
        assert!(ev["trigger_errors"][0]["error"].as_str().unwrap().contains("input"), "{ev}");
    }
    e.register(&echo("digest", json!({"batch": {"max_size": 3, "max_wait": "300ms"}, "input": "${ .event.id }"})))
        .await;
    let now = chrono::Utc::now();
    let filter = json!({"name": "signal", "failed_only": true, "from": (now - chrono::Duration::hours(1)).to_rfc3339(),
                        "to": (now + chrono::Duration::minutes(1)).to_rfc3339()});
    // A dry run says the events would go through the batch.
    let (status, dry) = e.post("/v1/events/replay", &json!({"filter": filter, "dry_run": true})).await;
    assert_eq!(status, 200, "{dry}");
    let planned = &dry["preview"][0]["would_start"];
    assert_eq!(planned, &json!([{"workflow": "digest", "trigger": 0, "flow": "batch"}]), "{dry}");
    let (status, job) = e.post("/v1/events/replay", &json!({"filter": filter})).await;
    assert_eq!(status, 202, "{job}");
    until_runs(&e, "digest", 1).await;
    let runs = runs_of(&e, "digest").await;
    assert_eq!(runs.len(), 1, "one batch");
    let mut ids: Vec<String> =
        runs[0]["output"]["echo"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, ["d0", "d1", "d2"]);
    let job = eventually(T, "the replay to end", || async {
        let (_, j) = e.get(&format!("/v1/events/replay/{}", job["id"].as_str().unwrap())).await;
        (j["status"] != "RUNNING").then_some(j)
    })
    .await;
    assert_eq!(job["failed"], 0, "held is not failed: {job}");
    for id in ["d0", "d2"] {
        let ev = recorded(&e, id).await;
        assert_eq!(ev["started_runs"][0]["run_id"], runs[0]["id"], "{ev}");
        assert_eq!(ev["trigger_errors"], json!([]), "{ev}");
    }
    e.stop().await;
}
