//! Limits on steps across runs: a concurrency the target's own count never
//! sees exceeded, a rate whose calls are spread out, a 429's Retry-After
//! that holds the key, held steps visible and freed by cancel and pause,
//! and limits set at run time.

use std::time::Duration;

use composer_testkit::{eventually, poll_until, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(60);

fn limited(name: &str, url: &str, limits: Value) -> Value {
    json!({"name": name, "nodes": [{"id": "call", "type": "HTTP", "config": {"url": url}, "limits": limits,
           "retry": {"max_attempts": 3, "initial_backoff": "100ms"}}]})
}

#[tokio::test]
async fn a_concurrency_limit_holds_across_runs_map_items_and_coordinators() {
    let e = Engine::with(EngineOptions { coordinators: 2, workers: 2, ..Default::default() }).await;
    let http = FakeHttp::start().await;
    let url = http.url("/slow/150/crm");
    e.register(&json!({"name": "sync", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(6)] }",
        "node": {"type": "HTTP", "config": {"url": url}, "limits": [{"key": "crm", "concurrency": 2}]}}}]}))
        .await;
    e.register(&limited("one", &url, json!([{"key": "crm"}]))).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(e.start_run("sync", json!({})).await);
        runs.push(e.start_run("one", json!({})).await);
    }
    for id in runs {
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    assert_eq!(http.calls("/slow/150/crm"), 3 * 6 + 3);
    assert_eq!(http.max_in_flight("/slow/150/crm"), 2, "the target's own count: never more than 2 at once");
    let (status, limit) = e.get("/v1/limits/crm").await;
    assert_eq!(status, 200, "{limit}");
    assert_eq!((limit["concurrency"].clone(), limit["set_by"].clone()), (json!(2), json!("definition")));
    assert_eq!((limit["in_use"].clone(), limit["waiting"].clone()), (json!(0), json!(0)), "every slot freed");
}

#[tokio::test]
async fn a_rate_spreads_a_keys_steps_out_and_other_keys_are_not_held_by_it() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = http.url("/ok/${ .input.account }");
    e.register(&limited("charge", &url, json!([{"key": "stripe:${ .input.account }", "rate": "5/1s", "burst": 1}])))
        .await;
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(e.start_run("charge", json!({"account": "a"})).await);
    }
    let other = e.start_run("charge", json!({"account": "b"})).await;
    for id in runs.iter().chain([&other]) {
        assert_eq!(e.wait_for_run(*id, T).await["status"], "SUCCEEDED");
    }
    let mut at: Vec<_> = http.requests("/ok/a").iter().map(|r| r.at).collect();
    at.sort();
    assert_eq!(at.len(), 6);
    // A bucket of one token, refilled every 200 ms: the k-th call is let go
    // no sooner than k × 200 ms after the first. The sink sees each call
    // after its own way from the limiter (publish, read, lease, request),
    // and on a busy machine any one way can be slow (the first by far: its
    // worker's first connection to the sink, every cache cold), which
    // bunches it up with the next. So the spacing is checked over the
    // span of calls 1 to 5, let go at least 800 ms apart, with 150 ms of
    // slack for the two ends' ways: six let go at once would come within a
    // few milliseconds of each other.
    let span = at[5].duration_since(at[1]);
    assert!(span + Duration::from_millis(150) >= Duration::from_millis(800), "calls 1 to 5 span {span:?}: {at:?}");
    let (_, a) = e.get("/v1/limits/stripe:a").await;
    assert_eq!((a["rate"].clone(), a["burst"].clone()), (json!("5/1s"), json!(1)), "{a}");
    let (_, page) = e.get("/v1/limits").await;
    let keys: Vec<&str> = page["limits"].as_array().unwrap().iter().map(|l| l["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["stripe:a", "stripe:b"], "one bucket per account");
}

#[tokio::test]
async fn a_429_with_retry_after_waits_that_long_and_holds_the_key_for_other_runs() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = http.url("/busy/1/2/api");
    e.register(&limited("call", &url, json!([{"key": "partner", "rate": "100/1s"}]))).await;
    let first = e.start_run("call", json!({})).await;
    // Its retry waits out the 2 s the target asked for.
    e.wait_until(first, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let second = e.start_run("call", json!({})).await;
    let (_, held) = e.get(&format!("/v1/runs/{second}")).await;
    let task = &held["tasks"][0];
    assert_eq!(task["state"], "PENDING", "{held}");
    assert_eq!((task["held"]["key"].clone(), task["held"]["reason"].clone()), (json!("partner"), json!("retry_after")));
    assert!(task["held"]["until"].is_string(), "{task}");
    for id in [first, second] {
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    let at: Vec<_> = http.requests("/busy/1/2/api").iter().map(|r| r.at).collect();
    assert_eq!(at.len(), 3, "one 429, then each run once");
    for later in &at[1..] {
        let waited = later.duration_since(at[0]);
        assert!(waited >= Duration::from_millis(1900), "a call {waited:?} after the 429 asked for 2 s");
    }
    // Ignored, the retry goes on its backoff.
    e.register(&json!({"name": "blind", "nodes": [{"id": "call", "type": "HTTP",
        "config": {"url": http.url("/busy/1/30/blind")}, "retry": {"initial_backoff": "100ms", "on_429": "ignore"}}]}))
        .await;
    let blind = e.start_run("blind", json!({})).await;
    assert_eq!(e.wait_for_run(blind, Duration::from_secs(10)).await["status"], "SUCCEEDED", "30 s not waited");
}

#[tokio::test]
async fn a_held_step_shows_why_and_cancelling_or_pausing_its_run_frees_its_place() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&limited("solo", &http.url("/slow/1500/solo"), json!([{"key": "solo", "concurrency": 1}]))).await;
    let running = e.start_run("solo", json!({})).await;
    e.wait_until(running, T, |r| r["tasks"][0]["state"] == "RUNNING").await;
    let cancelled = e.start_run("solo", json!({})).await;
    let paused = e.start_run("solo", json!({})).await;
    let (_, held) = e.get(&format!("/v1/runs/{cancelled}")).await;
    assert_eq!(held["tasks"][0]["held"], json!({"key": "solo", "reason": "concurrency"}), "{held}");
    let (status, _) = e.post(&format!("/v1/runs/{cancelled}/cancel"), &json!({})).await;
    assert_eq!(status, 200);
    let (status, _) = e.post(&format!("/v1/runs/{paused}/pause"), &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(e.wait_for_run(running, T).await["status"], "SUCCEEDED");
    // The first run ended: nothing else holds the slot, and the paused run's step still waits.
    let limit = wait_for_limit(&e, "solo", |l| l["in_use"] == 0 && l["waiting"] == 1).await;
    assert_eq!(limit["waiting"], 1, "{limit}");
    // An absence, so a fixed time: the paused run's step is not sent in this window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(e.task(paused, "call").await["state"], "PENDING", "not sent while paused");
    let (status, _) = e.post(&format!("/v1/runs/{paused}/resume"), &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(e.wait_for_run(paused, T).await["status"], "SUCCEEDED");
    assert_eq!(http.calls("/slow/1500/solo"), 2, "the cancelled run's step was never sent");
}

#[tokio::test]
async fn a_named_limit_set_at_run_time_applies_and_definitions_no_longer_change_it() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = http.url("/slow/300/named");
    e.register(&limited("named", &url, json!([{"key": "partner"}]))).await;
    let (status, set) = e.put("/v1/limits/partner", &json!({"concurrency": 1})).await;
    assert_eq!(status, 200, "{set}");
    assert_eq!((set["set_by"].clone(), set["concurrency"].clone()), (json!("api"), json!(1)));
    let runs: Vec<Uuid> = futures_util::future::join_all((0..4).map(|_| e.start_run("named", json!({})))).await;
    for id in &runs {
        assert_eq!(e.wait_for_run(*id, T).await["status"], "SUCCEEDED");
    }
    assert_eq!(http.max_in_flight("/slow/300/named"), 1);
    // A definition that gives the key values does not undo the operator's.
    e.register(&limited("named", &url, json!([{"key": "partner", "concurrency": 50}]))).await;
    let id = e.start_run("named", json!({})).await;
    e.wait_for_run(id, T).await;
    assert_eq!(e.get("/v1/limits/partner").await.1["concurrency"], 1);
    for (body, field) in [
        (json!({"rate": "0/1s"}), "rate"),
        (json!({"rate": "5/1s", "burst": 0}), "burst"),
        (json!({"concurrency": 0}), "concurrency"),
        (json!({"concurrency": -1}), "out of range"),
        (json!({"burst": 5}), "burst"),
        (json!({"rates": "5/1s"}), "rates"),
        (json!([null, null]), "expected a JSON object"),
        (json!("5/1s"), "expected a JSON object"),
    ] {
        let (status, err) = e.put("/v1/limits/partner", &body).await;
        assert_eq!(status, 400, "{body}: {err}");
        assert!(err["error"]["message"].as_str().unwrap().contains(field), "{body}: {err}");
    }
    let (status, _) = e.delete("/v1/limits/partner").await;
    assert_eq!(status, 200);
    assert_eq!(e.get("/v1/limits/partner").await.0, 404, "back to its definitions");
    assert_eq!(e.delete("/v1/limits/partner").await.0, 404);
    let (status, err) = e.get(&format!("/v1/limits/{}", "k".repeat(300))).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(e.get("/v1/limits?after=").await.0, 200, "an empty cursor is the first page");
    let (status, err) = e.get("/v1/limits/%FF").await;
    assert_eq!((status, err["error"]["code"].clone()), (400, json!("invalid_request")), "JSON, as every error: {err}");
}

#[tokio::test]
async fn a_key_that_does_not_evaluate_fails_its_step_with_the_limit_named() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&limited("bad", &http.url("/ok/x"), json!([{"key": "${ .input.account }"}]))).await;
    let id = e.start_run("bad", json!({"account": {"nested": 1}})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED");
    let error = run["tasks"][0]["error"].as_str().unwrap();
    assert!(error.contains("limits[0].key") && error.contains("text or a number"), "{error}");
    assert_eq!(http.calls("/ok/x"), 0);
}

async fn wait_for_limit(e: &Engine, key: &str, check: impl Fn(&Value) -> bool) -> Value {
    let check = &check;
    eventually(T, format!("limit {key} to get there"), || async move {
        let (_, l) = e.get(&format!("/v1/limits/{key}")).await;
        if check(&l) {
            Ok(l)
        } else {
            Err(l)
        }
    })
    .await
}

#[tokio::test]
async fn pausing_and_resuming_held_steps_over_and_over_loses_none_and_never_exceeds_the_limit() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&limited("flip", &http.url("/slow/300/flip"), json!([{"key": "flip", "concurrency": 1}]))).await;
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(e.start_run("flip", json!({})).await);
    }
    for _ in 0..4 {
        for id in &runs[1..] {
            e.post(&format!("/v1/runs/{id}/pause"), &json!({})).await;
            e.post(&format!("/v1/runs/{id}/resume"), &json!({})).await;
        }
    }
    for id in &runs {
        assert_eq!(e.wait_for_run(*id, T).await["status"], "SUCCEEDED", "not left to the lost-dispatch sweep");
    }
    assert_eq!((http.calls("/slow/300/flip"), http.max_in_flight("/slow/300/flip")), (6, 1));
}

#[tokio::test]
async fn a_slot_stays_taken_while_a_timed_out_or_cancelled_attempt_may_still_run_at_its_worker() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // The attempt times out after 1 s; its request runs on until the worker sees its lease gone.
    e.register(&json!({"name": "slowpoke", "nodes": [{"id": "call", "type": "HTTP",
        "config": {"url": http.url("/slow/2500/t")}, "timeout": "1s", "retry": {"max_attempts": 1},
        "limits": [{"key": "t", "concurrency": 1}]}]}))
        .await;
    let runs: Vec<Uuid> = futures_util::future::join_all((0..3).map(|_| e.start_run("slowpoke", json!({})))).await;
    for id in &runs {
        assert_eq!(e.wait_for_run(*id, T).await["status"], "FAILED");
    }
    assert_eq!(http.max_in_flight("/slow/2500/t"), 1, "the target never saw two at once");
    e.register(&limited("cancelled", &http.url("/slow/2500/c"), json!([{"key": "c", "concurrency": 1}]))).await;
    let first = e.start_run("cancelled", json!({})).await;
    e.wait_until(first, T, |r| r["tasks"][0]["state"] == "RUNNING").await;
    let second = e.start_run("cancelled", json!({})).await;
    e.post(&format!("/v1/runs/{first}/cancel"), &json!({})).await;
    assert_eq!(e.wait_for_run(second, T).await["status"], "SUCCEEDED");
    assert_eq!(http.max_in_flight("/slow/2500/c"), 1);
}

#[tokio::test]
async fn a_retry_after_too_long_to_count_is_cut_not_refused() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "huge", "nodes": [{"id": "call", "type": "HTTP",
        "config": {"url": http.url("/busy/1/99999999999999999999/huge")},
        "retry": {"initial_backoff": "100ms", "on_429": "ignore"}}]}))
        .await;
    let id = e.start_run("huge", json!({})).await;
    assert_eq!(e.wait_for_run(id, Duration::from_secs(15)).await["status"], "SUCCEEDED");
    assert_eq!(http.calls("/busy/1/99999999999999999999/huge"), 2, "the 429, then the retry: nothing redelivered");
}

#[tokio::test]
async fn a_key_with_a_long_held_queue_does_not_hold_up_the_steps_of_another_key() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "flood", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(2100)] }",
        "node": {"type": "HTTP", "config": {"url": http.url("/ok/hol")}, "limits": [{"key": "hol", "rate": "1/1d"}]}}}]}))
    .await;
    let flood = e.start_run("flood", json!({})).await;
    wait_for_limit(&e, "hol", |l| l["waiting"] == 2099).await;
    e.register(&limited("free", &http.url("/ok/free"), json!([{"key": "free", "concurrency": 10}]))).await;
    let free = e.start_run("free", json!({})).await;
    assert_eq!(e.wait_for_run(free, Duration::from_secs(20)).await["status"], "SUCCEEDED");
    e.post(&format!("/v1/runs/{flood}/cancel"), &json!({})).await;
    wait_for_limit(&e, "hol", |l| l["waiting"] == 0).await;
}

#[tokio::test]
async fn two_limits_whose_keys_come_out_the_same_are_one_with_both_values_and_a_new_rate_starts_full() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = http.url("/ok/same");
    e.register(&limited(
        "same",
        &url,
        json!([{"key": "c:${ .input.a }", "concurrency": 5},
                                             {"key": "c:${ .input.b }", "rate": "1/1h", "burst": 1}]),
    ))
    .await;
    let runs: Vec<Uuid> =
        futures_util::future::join_all((0..3).map(|_| e.start_run("same", json!({"a": "x", "b": "x"})))).await;
    let limit = wait_for_limit(&e, "c:x", |l| l["waiting"] == 2).await;
    assert_eq!((limit["rate"].clone(), limit["concurrency"].clone()), (json!("1/1h"), json!(5)), "{limit}");
    // The one admitted may still be on its way to the target.
    let _ = poll_until(Duration::from_secs(10), || async { (http.calls("/ok/same") > 0).then_some(()) }).await;
    assert_eq!(http.calls("/ok/same"), 1, "the rate holds: one an hour");
    for id in &runs {
        e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    }
    // A key that had only a concurrency gets a rate: its bucket starts full.
    e.register(&limited("grow", &http.url("/ok/grow"), json!([{"key": "grow", "concurrency": 2}]))).await;
    let id = e.start_run("grow", json!({})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    e.register(&limited("grow", &http.url("/ok/grow"), json!([{"key": "grow", "concurrency": 2, "rate": "1/1h"}])))
        .await;
    let id = e.start_run("grow", json!({})).await;
    assert_eq!(e.wait_for_run(id, Duration::from_secs(15)).await["status"], "SUCCEEDED", "not an hour's wait");
}
