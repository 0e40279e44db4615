//! The operator's repair kit: rerun from a step, complete a step, who and
//! why on every control action, tags and search, bulk actions, and why a
//! run waits — through the API on real PostgreSQL, Redis and HTTP.

use std::time::Duration;

use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

fn id_of(v: &Value) -> Uuid {
    v.as_str().unwrap().parse().unwrap()
}

fn task<'a>(run: &'a Value, node: &str) -> &'a Value {
    run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == node).unwrap()
}

#[tokio::test]
async fn a_run_reruns_from_a_step_with_a_new_input_and_the_history_says_who_and_why() {
    let e = Engine::with(EngineOptions {
        coordinator: |c| {
            c.api_token = Some("repair-token-0123456789".into());
            c.worker_token = Some("repair-workers-0123456789".into());
            c.api_token_name = "ops-team".into();
        },
        worker: |c| c.worker_token = Some("repair-workers-0123456789".into()),
        ..Default::default()
    })
    .await;
    let http = FakeHttp::start().await;
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let req = client.request(method, format!("{}{path}", e.url())).bearer_auth("repair-token-0123456789");
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let spec = json!({"name": "pipeline", "nodes": [
        {"id": "fetch", "type": "TRANSFORM", "config": {"output": {"n": "${ .input.n }"}}},
        http_node("charge", &format!("{}/${{ if .input.n > 0 then \"ok\" else \"bad\" end }}/c", http.url("")), 1),
        {"id": "done", "type": "TRANSFORM", "config": {"output": "${ .nodes.fetch.output.n }"}}],
        "edges": [{"from": "fetch", "to": "charge"}, {"from": "charge", "to": "done"}]});
    let (status, _) = call(reqwest::Method::POST, "/v1/workflows".into(), Some(spec)).await;
    assert_eq!(status, 201);
    let wait = |id: Uuid| {
        let call = &call;
        async move {
            for _ in 0..300 {
                let (_, run) = call(reqwest::Method::GET, format!("/v1/runs/{id}?wait=1s"), None).await;
                if ["SUCCEEDED", "FAILED", "CANCELLED"].contains(&run["status"].as_str().unwrap_or("")) {
                    return run;
                }
            }
            panic!("run {id} did not end");
        }
    };
    let history = |id: Uuid, kind: &'static str| {
        let call = &call;
        async move {
            let (_, h) = call(reqwest::Method::GET, format!("/v1/runs/{id}/events?limit=1000"), None).await;
            h["events"].as_array().unwrap().iter().filter(|e| e["type"] == kind).cloned().collect::<Vec<_>>()
        }
    };
    let (_, run) =
        call(reqwest::Method::POST, "/v1/runs".into(), Some(json!({"workflow": "pipeline", "input": {"n": 0}}))).await;
    let id = id_of(&run["id"]);
    let run = wait(id).await;
    assert_eq!(run["status"], "FAILED");
    let old_charge = task(&run, "charge")["id"].clone();

    // From `fetch`, with an input that makes the charge pass.
    let (status, body) = call(
        reqwest::Method::POST,
        format!("/v1/runs/{id}/rerun"),
        Some(json!({"from": ["fetch"], "input": {"n": 3}, "reason": "fixed the amount"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let run = wait(id).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["input"], json!({"n": 3}));
    assert_eq!(run["output"]["done"], json!(3));
    assert_ne!(task(&run, "charge")["id"], old_charge, "the step ran again as a new task");
    let keys: Vec<String> = http.requests("/ok/c").into_iter().filter_map(|r| r.idempotency_key).collect();
    assert_eq!(keys, vec![format!("{}:1", task(&run, "charge")["id"].as_str().unwrap())], "with a new key");
    let rerun = history(id, "RunRerun").await;
    assert_eq!(rerun.len(), 1);
    assert_eq!(rerun[0]["payload"]["from"], json!(["fetch"]));
    assert_eq!(
        (rerun[0]["payload"]["actor"].as_str(), rerun[0]["payload"]["reason"].as_str()),
        (Some("ops-team"), Some("fixed the amount"))
    );
    assert_eq!(history(id, "TaskReset").await.len(), 2, "the two steps that had run were reset; their history stays");

    // A run that SUCCEEDED is rerun only when asked to be.
    let (status, body) =
        call(reqwest::Method::POST, format!("/v1/runs/{id}/rerun"), Some(json!({"from": ["done"]}))).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("allow_completed"), "{body}");
    let (status, _) = call(
        reqwest::Method::POST,
        format!("/v1/runs/{id}/rerun"),
        Some(json!({"from": ["done"], "allow_completed": true})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(wait(id).await["status"], "SUCCEEDED");
    for (body, want) in [
        (json!({"from": []}), 400),
        (json!({"from": ["nope"]}), 409),
        (json!({"from": ["done"], "reason": "x".repeat(2000), "allow_completed": true}), 400),
    ] {
        let (status, answer) = call(reqwest::Method::POST, format!("/v1/runs/{id}/rerun"), Some(body.clone())).await;
        assert_eq!(status, want, "{body}: {answer}");
    }
    let nobody = Uuid::now_v7();
    let (status, answer) =
        call(reqwest::Method::POST, format!("/v1/runs/{nobody}/rerun"), Some(json!({"from": ["done"]}))).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("run_not_found")), "{answer}");
    // Cancel, too, records who and why (the body is optional).
    let (_, run) =
        call(reqwest::Method::POST, "/v1/runs".into(), Some(json!({"workflow": "pipeline", "input": {"n": 1}}))).await;
    let other = id_of(&run["id"]);
    let (status, _) =
        call(reqwest::Method::POST, format!("/v1/runs/{other}/cancel"), Some(json!({"reason": "test"}))).await;
    assert!(status == 200 || status == 409);
    let (status, _) = call(reqwest::Method::POST, format!("/v1/runs/{other}/cancel"), None).await;
    assert_eq!(status, 409, "a finished run: refused, with or without a body");
    e.stop().await;
}

#[tokio::test]
async fn a_map_item_reruns_alone_and_its_map_gathers_it_again() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // Item 2's target fails its first call only.
    let url = format!("{}/${{ if .item == 2 then \"flaky/1\" else \"ok\" end }}/i${{ .item }}", http.url(""));
    let spec = json!({"name": "items", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": [0, 1, 2, 3], "on_item_failure": "continue",
        "node": {"type": "HTTP", "retry": {"max_attempts": 1}, "config": {"url": url}}}},
        {"id": "count", "type": "TRANSFORM", "config": {"output": "${ [.nodes.each.output[] | select(has(\"error\"))] | length }"}}],
        "edges": [{"from": "each", "to": "count"}]});
    e.register(&spec).await;
    let id = e.start_run("items", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["output"]["count"], json!(1), "{run}");
    // The failing item's target is fine now: rerun it alone (with the input it had).
    let (status, body) =
        e.post(&format!("/v1/runs/{id}/rerun"), &json!({"from": ["each[2]"], "allow_completed": true})).await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED");
    assert_eq!(run["output"]["count"], json!(0), "the MAP gathered the item again, and what follows ran again");
    assert_eq!(http.calls("/ok/i0"), 1, "the other items did not run again");
    assert_eq!(http.calls("/flaky/1/i2"), 2, "item 2 ran again, once");
    e.stop().await;
}

/// An item rerun while later ones still wait their turn goes back to the
/// queue below them: the MAP must still start it (the store looks for
/// queued items where the unstarted ones begin, then below).
#[tokio::test]
async fn an_item_rerun_while_later_ones_are_queued_runs_and_the_map_ends() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url = format!("{}/${{ .item | tostring }}", http.url("/slow/60"));
    let spec = json!({"name": "queued", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": (0..12).collect::<Vec<_>>(), "max_concurrency": 1, "collect": "none",
        "node": {"type": "HTTP", "config": {"url": url}}}}]});
    e.register(&spec).await;
    let id = e.start_run("queued", json!({})).await;
    e.wait_until(id, T, |r| task(r, "each")["progress"]["completed"].as_u64() >= Some(2)).await;
    let (status, body) = e.post(&format!("/v1/runs/{id}/rerun"), &json!({"from": ["each[0]"]})).await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["each"]["count"], json!(12), "{run}");
    assert_eq!(http.calls("/slow/60/0"), 2, "the rerun item ran again");
    for i in 1..12 {
        assert_eq!(http.calls(&format!("/slow/60/{i}")), 1, "item {i} ran once");
    }
    e.stop().await;
}

#[tokio::test]
async fn an_operator_completes_a_waiting_step_or_a_failed_one_and_the_run_goes_on() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "waits", "nodes": [
        {"id": "approval", "type": "WAIT_FOR_EVENT", "config": {"event": "approved", "key": "k"}},
        http_node("ship", &http.url("/bad/ship"), 1),
        {"id": "after", "type": "TRANSFORM", "config": {"output": {"by": "${ .nodes.approval.output.by }", "ship": "${ .nodes.ship.output }"}}}],
        "edges": [{"from": "approval", "to": "ship"}, {"from": "ship", "to": "after"}]});
    e.register(&spec).await;
    let id = e.start_run("waits", json!({})).await;
    e.wait_until(id, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let (status, body) = e
        .post(&format!("/v1/runs/{id}/tasks/approval/complete"), &json!({"output": {"by": "hand"}, "reason": "phoned"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "the shipment then failed: {run}");
    let (status, body) =
        e.post(&format!("/v1/runs/{id}/tasks/ship/complete"), &json!({"output": "shipped by hand"})).await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["after"], json!({"by": "hand", "ship": "shipped by hand"}));
    let (status, _) = e.post(&format!("/v1/runs/{id}/tasks/ship/complete"), &json!({"output": 1})).await;
    assert_eq!(status, 409, "a step that ended is not completed again");
    e.stop().await;
}

#[tokio::test]
async fn runs_are_found_by_their_tags_and_creation_time() {
    let e = Engine::start().await;
    e.register(&json!({"name": "tagged", "tags": {"customer": "${ .input.customer }", "env": "test"},
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    let started = chrono::Utc::now() - chrono::Duration::seconds(1);
    let mut ids = Vec::new();
    for (customer, region) in [(42, "eu"), (42, "us"), (7, "eu")] {
        let (status, run) = e
            .post(
                "/v1/runs",
                &json!({"workflow": "tagged", "input": {"customer": customer}, "tags": {"region": region}}),
            )
            .await;
        assert_eq!(status, 201, "{run}");
        ids.push(run["id"].as_str().unwrap().to_string());
    }
    let found = |q: String| {
        let e = &e;
        async move {
            let (status, page) = e.get(&format!("/v1/runs?{q}")).await;
            assert_eq!(status, 200, "{page}");
            page["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    assert_eq!(found("tag.customer=42".into()).await, vec![ids[1].clone(), ids[0].clone()]);
    assert_eq!(found("tag.customer=42&tag.region=eu".into()).await, vec![ids[0].clone()]);
    assert_eq!(found("tag.env=test&workflow=tagged".into()).await.len(), 3);
    let after = urlencode(&started.to_rfc3339());
    assert_eq!(found(format!("tag.customer=7&created_after={after}")).await, vec![ids[2].clone()]);
    let before = urlencode(&started.to_rfc3339());
    assert!(found(format!("tag.customer=7&created_before={before}")).await.is_empty());
    let (_, run) = e.get(&format!("/v1/runs/{}", ids[0])).await;
    assert_eq!(run["tags"], json!({"customer": "42", "env": "test", "region": "eu"}));
    for bad in ["tag.=x", "tag.a%20b=x", "created_after=yesterday"] {
        let (status, _) = e.get(&format!("/v1/runs?{bad}")).await;
        assert_eq!(status, 400, "{bad}");
    }
    let (status, body) =
        e.post("/v1/runs", &json!({"workflow": "tagged", "input": {"customer": 1}, "tags": {"bad key": "x"}})).await;
    assert_eq!(status, 400, "{body}");
    e.stop().await;
}

fn urlencode(s: &str) -> String {
    s.replace(':', "%3A").replace('+', "%2B")
}

#[tokio::test]
async fn a_bulk_job_retries_every_matching_failed_run_once_and_can_be_counted_first() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "flaky_batch", "tags": {"batch": "${ .input.batch }"},
        "nodes": [http_node("call", &format!("{}/${{ if .input.fixed then \"ok\" else \"bad\" end }}/x", http.url("")), 1)]}))
    .await;
    let mut ids = Vec::new();
    for i in 0..25 {
        let id = e.start_run("flaky_batch", json!({"batch": if i < 20 { "b1" } else { "b2" }, "fixed": false})).await;
        ids.push(id);
    }
    for id in &ids {
        assert_eq!(e.wait_for_run(*id, T).await["status"], "FAILED");
    }
    let filter = json!({"workflow": "flaky_batch", "status": "FAILED", "tags": {"batch": "b1"}});
    let (status, dry) = e.post("/v1/runs/bulk", &json!({"filter": filter, "action": "retry", "dry_run": true})).await;
    assert_eq!((status, &dry["matched"]), (200, &json!(20)), "{dry}");
    let (status, job) =
        e.post("/v1/runs/bulk", &json!({"filter": filter, "action": "retry", "reason": "the bank is back"})).await;
    assert_eq!(status, 202, "{job}");
    let job_id = job["id"].as_str().unwrap().to_string();
    let done = e.wait_for_bulk_job(&job_id, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!((done["acted_on"].as_i64(), done["matched"].as_i64()), (Some(20), Some(20)), "{done}");
    for (i, id) in ids.iter().enumerate() {
        let retried = e.history(*id, "RunRetried").await;
        let want = if i < 20 { 1 } else { 0 };
        assert_eq!(retried.len(), want, "run {i}");
        if want == 1 {
            assert_eq!(retried[0]["payload"]["reason"], "the bank is back");
        }
    }
    for (body, want) in [
        (json!({"filter": {}, "action": "cancel"}), 400),
        (json!({"filter": {"workflow": "x"}, "action": "explode"}), 400),
        (json!({"filter": {"workflow": "x"}, "action": "rerun"}), 400),
        (json!({"filter": {"workflow": "x"}, "action": "cancel", "from": ["a"]}), 400),
    ] {
        let (status, answer) = e.post("/v1/runs/bulk", &body).await;
        assert_eq!(status, want, "{body}: {answer}");
    }
    let (status, _) = e.get(&format!("/v1/bulk/{}", Uuid::now_v7())).await;
    assert_eq!(status, 404);
    e.stop().await;
}

/// A bulk dry run of `rerun` from a step the matched runs do not have
/// matched them without a word; the real job would have refused each run.
#[tokio::test]
async fn a_bulk_rerun_from_a_step_no_matched_run_has_is_refused_by_name_dry_run_or_not() {
    let e = Engine::start().await;
    let id = e
        .run(&json!({"name": "two_steps", "nodes": [
        {"id": "a", "type": "TRANSFORM", "config": {"output": 1}},
        {"id": "b", "type": "FAIL", "config": {"message": "no"}}], "edges": [{"from": "a", "to": "b"}]}))
        .await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "FAILED");
    let filter = json!({"workflow": "two_steps", "status": "FAILED"});
    for dry_run in [true, false] {
        let body = json!({"filter": filter, "action": "rerun", "from": ["b", "nope"], "dry_run": dry_run});
        let (status, answer) = e.post("/v1/runs/bulk", &body).await;
        assert_eq!(status, 400, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("\"nope\"") && message.contains("no run the filter matches"), "{answer}");
    }
    let ok = json!({"filter": filter, "action": "rerun", "from": ["b"], "dry_run": true});
    let (status, answer) = e.post("/v1/runs/bulk", &ok).await;
    assert_eq!((status, &answer["matched"]), (200, &json!(1)), "{answer}");
    e.stop().await;
}

#[tokio::test]
async fn why_a_run_waits_names_the_queue_the_retry_the_event_and_the_pause() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "stuck", "nodes": [
        {"id": "gpu", "type": "render-frame", "queue": "gpu-nobody-serves"},
        {"id": "flaky", "type": "HTTP", "config": {"url": http.url("/fail/x")}, "retry": {"max_attempts": 3, "initial_backoff": "1h"}},
        {"id": "ok", "type": "WAIT_FOR_EVENT", "config": {"event": "signed", "key": "${ .input.k }"}}]}))
    .await;
    let id = e.start_run("stuck", json!({"k": "contract-9"})).await;
    e.wait_until(id, T, |r| {
        r["tasks"].as_array().is_some_and(|t| t.iter().any(|t| t["node_id"] == "flaky" && t["state"] == "WAITING"))
    })
    .await;
    let (status, why) = e.get(&format!("/v1/runs/{id}/explain")).await;
    assert_eq!(status, 200, "{why}");
    let node = |id: &str| why["nodes"].as_array().unwrap().iter().find(|n| n["node_id"] == id).cloned().unwrap();
    let gpu = node("gpu");
    assert_eq!(gpu["waiting_for"], "worker");
    assert!(
        gpu["reason"].as_str().unwrap().contains("gpu-nobody-serves")
            && gpu["reason"].as_str().unwrap().contains("no worker"),
        "{gpu}"
    );
    assert_eq!(gpu["detail"]["backlog"], json!(1));
    let flaky = node("flaky");
    assert_eq!(flaky["waiting_for"], "retry", "{flaky}");
    assert!(flaky["detail"]["retry_at"].is_string());
    let ok = node("ok");
    assert_eq!(
        (ok["waiting_for"].as_str(), &ok["detail"]["key"], &ok["detail"]["buffered"]),
        (Some("event"), &json!("contract-9"), &json!(false))
    );
    assert!(why["summary"].as_str().unwrap().contains("3 steps"), "{why}");
    let (status, _) = e.post(&format!("/v1/runs/{id}/pause"), &json!({})).await;
    assert_eq!(status, 200);
    let (_, why) = e.get(&format!("/v1/runs/{id}/explain")).await;
    assert!(why["summary"].as_str().unwrap().starts_with("paused"), "{why}");
    e.stop().await;
}

#[tokio::test]
async fn why_an_ended_run_ended_names_the_step_that_failed_it_and_its_error() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "ends", "nodes": [
        {"id": "first", "type": "HTTP", "config": {"url": http.url("/ok/a")}},
        {"id": "charge", "type": "HTTP", "config": {"url": http.url("/fail/b")}, "retry": {"max_attempts": 1}}],
        "edges": [{"from": "first", "to": "charge"}]}))
        .await;
    let id = e.start_run("ends", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let (status, why) = e.get(&format!("/v1/runs/{id}/explain")).await;
    assert_eq!(status, 200, "{why}");
    let summary = why["summary"].as_str().unwrap();
    assert!(summary.starts_with("the run FAILED: ") && summary.contains("\"charge\""), "{why}");
    let failed = why["detail"]["failed_steps"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{why}");
    assert_eq!((&failed[0]["node_id"], &failed[0]["attempt"]), (&json!("charge"), &json!(1)), "{why}");
    assert!(failed[0]["error"].as_str().is_some_and(|e| !e.is_empty()) && failed[0]["code"].is_string(), "{why}");

    e.register(&json!({"name": "fine", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": http.url("/ok/c")}}]}))
        .await;
    let id = e.start_run("fine", json!({})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    let (_, why) = e.get(&format!("/v1/runs/{id}/explain")).await;
    assert_eq!(why["summary"], "the run SUCCEEDED: nothing waits", "{why}");
    assert_eq!(why["detail"]["failed_steps"], json!([]), "{why}");
    e.stop().await;
}
