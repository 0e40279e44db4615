//! Runs started by events and webhooks: each (event, trigger) starts one
//! run, an event sent again starts nothing, a webhook's delivery counts only
//! when its signature holds.

use std::time::Duration;

use composer_testkit::{Engine, EngineOptions};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

fn order_workflow() -> Value {
    json!({"name": "fulfil", "nodes": [{"id": "pack", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
           "triggers": [{"event": "order.created", "when": ".event.payload.total > 0",
                         "idempotency_key": "order-${ .event.payload.order }"}]})
}

fn run_ids(sent: &Value) -> Vec<String> {
    sent["started_runs"].as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn an_event_starts_one_run_per_matching_trigger_and_sending_it_again_starts_nothing() {
    let e = Engine::start().await;
    e.register(&order_workflow()).await;
    e.register(
        &json!({"name": "audit", "nodes": [{"id": "log", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
        "triggers": [{"event": "order.created", "input": {"seen": "${ .event.id }", "name": "${ .event.name }"}},
                     {"event": "order.created", "input": "${ .event.payload.missing | error(\"no such field\") }"},
                     {"event": "order.cancelled"}]}),
    )
    .await;
    let ev = json!({"name": "order.created", "id": "evt-1", "payload": {"order": 7, "total": 30}});
    let (status, sent) = e.post("/v1/events", &ev).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!((sent["id"].clone(), sent["duplicate"].clone()), (json!("evt-1"), json!(false)));
    let started = sent["started_runs"].as_array().unwrap();
    assert_eq!(started.len(), 2, "fulfil and audit's first trigger: {sent}");
    let errors = sent["trigger_errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{sent}");
    assert_eq!((errors[0]["workflow"].clone(), errors[0]["trigger"].clone()), (json!("audit"), json!(1)));
    assert!(errors[0]["error"].as_str().unwrap().contains("no such field"), "{sent}");
    for r in started {
        let id: Uuid = r["run_id"].as_str().unwrap().parse().unwrap();
        let run = e.wait_for_run(id, T).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
        assert_eq!(run["trigger"]["event"], "order.created");
        assert_eq!(run["trigger"]["event_id"], "evt-1");
        match run["workflow"].as_str().unwrap() {
            "fulfil" => assert_eq!(run["output"]["pack"], json!({"order": 7, "total": 30}), "the payload by default"),
            _ => assert_eq!(run["output"]["log"], json!({"seen": "evt-1", "name": "order.created"})),
        }
    }

    // The same id again (a sender's retry): nothing new, the same answer.
    let (_, again) = e.post("/v1/events", &ev).await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(run_ids(&again), run_ids(&sent));
    assert_eq!((again["buffered"].clone(), again["matched"].clone()), (json!(true), json!(0)), "as the first said");
    // The same id for another event: refused, nothing recorded.
    let reused = json!({"name": "order.created", "id": "evt-1", "payload": {"order": 8, "total": 30}});
    let (status, body) = e.post("/v1/events", &reused).await;
    assert_eq!((status, body["error"]["code"].clone()), (422, json!("event_id_reused")), "{body}");
    let same_data = json!({"name": "order.created", "id": "evt-1", "payload": {"total": 30.0, "order": 7}});
    assert_eq!(e.post("/v1/events", &same_data).await.1["duplicate"], true, "the same data, however it is written");
    // Another id for the same order: fulfil's idempotency key finds its run.
    let (_, other) = e
        .post("/v1/events", &json!({"name": "order.created", "id": "evt-2", "payload": {"order": 7, "total": 30}}))
        .await;
    let fulfil = |s: &Value| {
        s["started_runs"].as_array().unwrap().iter().find(|r| r["workflow"] == "fulfil").unwrap()["run_id"].clone()
    };
    assert_eq!(fulfil(&other), fulfil(&sent), "the idempotency key: {other}");
    // A condition that does not hold starts nothing of that workflow.
    let (_, free) = e.post("/v1/events", &json!({"name": "order.created", "payload": {"order": 8, "total": 0}})).await;
    assert_eq!(free["started_runs"].as_array().unwrap().len(), 1, "audit only: {free}");
    assert!(!free["id"].as_str().unwrap().is_empty(), "an id is made");

    let (_, runs) = e.get("/v1/runs?workflow=fulfil").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);

    // The log: newest first, with what each did.
    let (_, log) = e.get("/v1/events?name=order.created&limit=2").await;
    let events = log["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["id"], "evt-2");
    assert_eq!(events[0]["source"], "api");
    let (_, next) = e.get(&format!("/v1/events?name=order.created&before={}", log["next_before"])).await;
    assert_eq!(next["events"][0]["id"], "evt-1");
    assert_eq!(next["events"][0]["started_runs"].as_array().unwrap().len(), 2);

    // A new version without triggers stops them.
    e.register(&json!({"name": "fulfil", "nodes": [{"id": "pack", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    let (_, after) = e.post("/v1/events", &json!({"name": "order.created", "payload": {"order": 9, "total": 5}})).await;
    assert!(after["started_runs"].as_array().unwrap().iter().all(|r| r["workflow"] != "fulfil"), "{after}");
    e.stop().await;
}

#[tokio::test]
async fn an_event_sent_at_once_to_two_coordinators_starts_each_run_once_and_still_wakes_its_waiters() {
    let e = Engine::with(EngineOptions { coordinators: 2, ..Default::default() }).await;
    e.register(&order_workflow()).await;
    let waiter = e
        .run(&json!({"name": "await_order", "nodes": [
            {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "order.created", "key": "o-3"}}]}))
        .await;
    e.wait_until(waiter, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let urls = e.coordinator_urls();
    let http = reqwest::Client::new();
    let ev = json!({"name": "order.created", "key": "o-3", "id": "evt-race", "payload": {"order": 3, "total": 1}});
    let sends = (0..10).map(|i| {
        let (http, url, ev) = (http.clone(), urls[i % 2].clone(), ev.clone());
        tokio::spawn(async move {
            let r = http.post(format!("{url}/v1/events")).json(&ev).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        })
    });
    let answers: Vec<Value> = futures_util::future::join_all(sends).await.into_iter().map(Result::unwrap).collect();
    let firsts: Vec<&Value> = answers.iter().filter(|a| a["duplicate"] == false).collect();
    assert_eq!(firsts.len(), 1, "recorded once: {answers:?}");
    assert_eq!(firsts[0]["delivered_to_waiters"], 1, "{answers:?}");
    let run = run_ids(firsts[0]);
    assert!(answers.iter().all(|a| run_ids(a) == run), "every answer names the one run: {answers:?}");
    let (_, runs) = e.get("/v1/runs?workflow=fulfil").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);
    assert_eq!(e.wait_for_run(waiter, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

#[tokio::test]
async fn triggers_are_checked_when_registered_and_a_hostile_one_fails_alone() {
    let e = Engine::start().await;
    for (bad, path) in [
        (json!([{"event": ""}]), "triggers[0].event"),
        (json!([{"event": "x", "when": ".secrets.TOKEN == 1"}]), "triggers[0].when"),
        (json!([{"event": "x", "input": "${ .nodes.a.output }"}]), "triggers[0].input"),
        (json!([{"event": "x", "when": "(("}]), "triggers[0].when"),
        (json!([{"event": "x", "extra": 1}]), "triggers[0]"),
        (json!({"event": "x"}), "triggers"),
        (json!((0..17).map(|i| json!({"event": format!("e{i}")})).collect::<Vec<_>>()), "triggers"),
    ] {
        let spec = json!({"name": "bad", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}], "triggers": bad});
        let (status, body) = e.post("/v1/workflows", &spec).await;
        assert_eq!(status, 400, "{spec}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().starts_with(path), "{path}: {body}");
    }
    // An expression that never ends, or recurses without end, is stopped by
    // the sandbox: the trigger fails, the event and the other triggers stand.
    e.register(&json!({"name": "hostile", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}],
        "triggers": [{"event": "ping", "when": "def f(x): f(x); f(0)"},
                     {"event": "ping", "when": "[limit(100000000; repeat(1))] | length > 0"},
                     {"event": "ping", "idempotency_key": "${ [1,2] }"},
                     {"event": "ping"}]}))
        .await;
    let (status, sent) = e.post("/v1/events", &json!({"name": "ping"})).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["trigger_errors"].as_array().unwrap().len(), 3, "{sent}");
    assert_eq!(sent["started_runs"].as_array().unwrap().len(), 1, "{sent}");
    let (status, _) = e.get("/healthz").await;
    assert_eq!(status, 200, "the coordinator lives");
    for (bad, words) in [
        (json!({"name": "ping", "id": ""}), "id must be"),
        (json!({"name": "ping", "id": "x".repeat(257)}), "id must be"),
        (json!({"name": ""}), "name must be"),
    ] {
        let (status, body) = e.post("/v1/events", &bad).await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(words), "{body}");
    }
    let (status, _) = e.get("/v1/events?before=0").await;
    assert_eq!(status, 400);
    assert_eq!(e.get("/v1/events?limit=101").await.0, 400, "a page holds at most 100 events");

    // What a trigger makes is checked as a run's input is: a NUL, a value
    // past the payload limit, a huge key — each fails its trigger alone, with
    // an error of bounded size; the event and the plain trigger stand.
    e.register(&json!({"name": "makes", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}],
        "triggers": [{"event": "make", "input": "${ {s: ([0] | implode)} }"},
                     {"event": "make", "input": "${ [range(3000000)] }"},
                     {"event": "make", "idempotency_key": "${ \"K\" * 300000 }"},
                     {"event": "make"}]}))
        .await;
    let (status, sent) = e.post("/v1/events", &json!({"name": "make"})).await;
    assert_eq!(status, 200, "{}", composer_core::clipped(&sent.to_string(), 2000));
    let errors = sent["trigger_errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3, "{sent}");
    assert!(errors[0]["error"].as_str().unwrap().contains("NUL"), "{sent}");
    assert!(errors[1]["error"].as_str().unwrap().contains("input"), "{sent}");
    assert!(sent.to_string().len() < 8000, "errors are clipped: {} bytes", sent.to_string().len());
    assert_eq!(sent["started_runs"].as_array().unwrap().len(), 1, "{sent}");

    // A definition or transform nesting deep compiles on the evaluation
    // stack (it overflowed a tokio worker's and aborted the coordinator); a
    // longer one is refused naming the limit.
    let chain = vec!["1"; 3000].join("+");
    let deep = json!({"name": "deep", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": format!("${{ {chain} }}")}}],
                      "triggers": [{"event": "deep", "when": format!("({chain}) > 0")}]});
    let (status, body) = e.post("/v1/workflows", &deep).await;
    assert_eq!(status, 201, "{body}");
    // Evaluating it meets the sandbox's own stack limit: an error that names
    // it, for the trigger and for a run of the TRANSFORM alike.
    let (status, sent) = e.post("/v1/events", &json!({"name": "deep"})).await;
    assert_eq!(status, 200);
    let error = sent["trigger_errors"][0]["error"].as_str().unwrap_or_else(|| panic!("{sent}"));
    assert!(error.contains("expr_max_stack") && error.len() < 1200, "{error}");
    let run = e.start_run("deep", json!({})).await;
    let run = e.wait_for_run(run, T).await;
    assert!(run["error"].as_str().is_some_and(|e| e.contains("expr_max_stack")), "{run}");
    let hook = json!({"name": "deep", "scheme": "github", "secret": "IT_DEEP", "event": {"name": format!("${{ {chain} | tostring }}")}});
    assert_eq!(e.post("/v1/webhooks", &hook).await.0, 201);
    let longer = vec!["1"; 9000].join("+");
    let (status, body) = e
        .post(
            "/v1/webhooks",
            &json!({"name": "long", "scheme": "github", "secret": "IT_DEEP", "event": format!("${{ {longer} }}")}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_expression_bytes"), "{body}");
    let (status, _) = e.get("/healthz").await;
    assert_eq!(status, 200, "the coordinator lives");
    e.stop().await;
}

// ---- webhooks ----

fn stripe_header(secret: &str, t: i64, body: &str) -> String {
    use ring::hmac;
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()), format!("{t}.{body}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

async fn deliver(e: &Engine, hook: &str, headers: &[(&str, String)], body: &str) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/webhooks/{hook}", e.url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_signed_webhook_delivery_becomes_an_event_once_and_a_bad_or_stale_one_records_nothing() {
    const SECRET: &str = "whsec_it_test_4f9a";
    std::env::set_var("COMPOSER_WEBHOOK_SECRET_IT_SHOP", SECRET);
    std::env::set_var("COMPOSER_WEBHOOK_SECRET_IT_GH", "gh-secret-it");
    let e = Engine::start().await;
    e.register(
        &json!({"name": "on_payment", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input }"}}],
        "triggers": [{"event": "payment.succeeded", "input": "${ .event.payload.data }"}]}),
    )
    .await;
    let hook = json!({"name": "shop", "scheme": "stripe", "secret": "IT_SHOP", "tolerance": "2m",
                      "event": {"name": "${ .body.type }", "key": "${ .body.data.id }", "payload": "${ .body }"}});
    let (status, created) = e.post("/v1/webhooks", &hook).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!((created["secret_set"].clone(), created["url"].clone()), (json!(true), json!("/v1/webhooks/shop")));
    assert!(!created.to_string().contains(SECRET), "the secret is never shown");

    let body = r#"{"id": "evt_100", "type": "payment.succeeded", "data": {"id": "pi_1", "amount": 500}}"#;
    let now = chrono::Utc::now().timestamp();
    let signed = vec![("stripe-signature", stripe_header(SECRET, now, body))];
    let (status, sent) = deliver(&e, "shop", &signed, body).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!((sent["id"].clone(), sent["duplicate"].clone()), (json!("evt_100"), json!(false)), "Stripe's own id");
    let run: Uuid = sent["started_runs"][0]["run_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(e.wait_for_run(run, T).await["output"]["t"], json!({"id": "pi_1", "amount": 500}));
    let (status, replay) = deliver(&e, "shop", &signed, body).await;
    assert_eq!((status, replay["duplicate"].clone()), (200, json!(true)), "a replay is accepted once: {replay}");
    assert_eq!(replay["started_runs"][0]["run_id"], sent["started_runs"][0]["run_id"]);

    let events_now = || async { e.get("/v1/events?source=webhook:shop").await.1["events"].as_array().unwrap().len() };
    assert_eq!(events_now().await, 1);
    let forged = body.replace("500", "50000");
    // Why is in the log (and in webhooks::tests); every refusal answers the
    // same, as does a name no webhook has.
    let (_, unknown) = deliver(&e, "nowhere", &[], &forged).await;
    for (headers, words) in [
        (vec![], "no stripe-signature header"),
        (vec![("stripe-signature", "t=1,v1=zz".to_string())], "malformed"),
        (signed.clone(), "does not match"),
        (vec![("stripe-signature", stripe_header("wrong", now, &forged))], "does not match"),
        (vec![("stripe-signature", stripe_header(SECRET, now - 600, &forged))], "tolerance"),
        (vec![("stripe-signature", stripe_header(SECRET, now + 600, &forged))], "tolerance"),
    ] {
        let (status, body) = deliver(&e, "shop", &headers, &forged).await;
        assert_eq!((status, body["error"]["code"].clone()), (401, json!("bad_signature")), "{words}: {body}");
        assert_eq!(body, unknown, "{words}: the same answer as for a webhook that does not exist");
    }
    assert_eq!(events_now().await, 1, "a refused delivery records nothing");
    let (_, runs) = e.get("/v1/runs?workflow=on_payment").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);

    // GitHub's scheme: the body signed, the delivery's id in a header.
    let gh = json!({"name": "repo", "scheme": "github", "secret": "IT_GH"});
    assert_eq!(e.post("/v1/webhooks", &gh).await.0, 201);
    let push = r#"{"ref": "refs/heads/main"}"#;
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"gh-secret-it"), push.as_bytes());
    let sig = format!("sha256={}", tag.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>());
    let headers = vec![("x-hub-signature-256", sig.clone()), ("x-github-delivery", "d-77".to_string())];
    let (status, sent) = deliver(&e, "repo", &headers, push).await;
    assert_eq!(status, 200, "{sent}");
    assert!(sent["id"].as_str().unwrap().starts_with("sha256:"), "named by the signed body: {sent}");
    // X-GitHub-Delivery is not signed: a replay under another one is the same event.
    let other = vec![
        ("x-hub-signature-256", sig.to_uppercase().replace("SHA256=", "sha256=")),
        ("x-github-delivery", "d-78".to_string()),
    ];
    let (_, replay) = deliver(&e, "repo", &other, push).await;
    assert_eq!((replay["duplicate"].clone(), replay["id"].clone()), (json!(true), sent["id"].clone()), "{replay}");
    let (_, log) = e.get("/v1/events?source=webhook:repo").await;
    assert_eq!(log["events"][0]["name"], "repo", "the webhook's name by default");
    assert_eq!(log["events"][0]["payload"], json!({"ref": "refs/heads/main"}));

    // Without the secret on this coordinator: 503, nothing recorded; an
    // unknown webhook: 401, as a bad signature is; a bad spec: 400 naming the field.
    let none = json!({"name": "nosecret", "scheme": "github", "secret": "IT_NOT_SET_ANYWHERE"});
    let (_, view) = e.post("/v1/webhooks", &none).await;
    assert_eq!(view["secret_set"], false);
    let (status, body) = deliver(&e, "nosecret", &headers, push).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("COMPOSER_WEBHOOK_SECRET_IT_NOT_SET_ANYWHERE"));
    assert_eq!(deliver(&e, "nowhere", &headers, push).await.0, 401);
    for (bad, words) in [
        (json!({"name": "x", "scheme": "stripe", "secret": "whsec_live_123"}), "secret"),
        (
            json!({"name": "x", "scheme": "paypal", "secret": "X"}),
            "scheme: \"paypal\" is not accepted (expected one of: stripe, github)",
        ),
        (json!({"name": "x", "scheme": "stripe", "secret": "X", "tolerance": "1d"}), "tolerance"),
    ] {
        let (status, body) = e.post("/v1/webhooks", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(words), "{bad}: {body}");
    }
    // A body whose transform makes text PostgreSQL cannot store: a 400, not a 500.
    let nul = r#"{"id": "evt_nul", "type": "payment\u0000succeeded", "data": {"id": "pi_2"}}"#;
    let headers = vec![("stripe-signature", stripe_header(SECRET, now, nul))];
    let (status, body) = deliver(&e, "shop", &headers, nul).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("NUL"), "{body}");
    // A body over the limit: the API's JSON error, nothing recorded.
    let huge = format!("{{\"id\": \"evt_big\", \"pad\": \"{}\"}}", "x".repeat(2 << 20));
    let headers = vec![("stripe-signature", stripe_header(SECRET, now, &huge))];
    let (status, body) = deliver(&e, "shop", &headers, &huge).await;
    assert_eq!((status, body["error"]["code"].clone()), (413, json!("payload_too_large")), "{body}");
    let (_, list) = e.get("/v1/webhooks").await;
    assert_eq!(list["webhooks"].as_array().unwrap().len(), 3);
    assert_eq!(e.delete("/v1/webhooks/repo").await.0, 200);
    assert_eq!(deliver(&e, "repo", &headers, push).await.0, 401, "a deleted webhook takes nothing");
    e.stop().await;
}

#[tokio::test]
async fn a_webhook_delivery_needs_no_api_token_but_configuring_one_does() {
    std::env::set_var("COMPOSER_WEBHOOK_SECRET_IT_TOKENED", "tokened-secret");
    let e = Engine::with(EngineOptions {
        coordinator: |c| c.api_token = Some("it-webhook-api-token-0123456789".into()),
        ..Default::default()
    })
    .await;
    let hook = json!({"name": "tokened", "scheme": "github", "secret": "IT_TOKENED"});
    assert_eq!(e.post("/v1/webhooks", &hook).await.0, 401, "configuring takes the API token");
    let authed = reqwest::Client::new()
        .post(format!("{}/v1/webhooks", e.url()))
        .bearer_auth("it-webhook-api-token-0123456789")
        .json(&hook)
        .send()
        .await
        .unwrap();
    assert_eq!(authed.status(), 201);
    let body = "{}";
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"tokened-secret"), body.as_bytes());
    let sig = format!("sha256={}", tag.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>());
    let (status, sent) = deliver(&e, "tokened", &[("x-hub-signature-256", sig)], body).await;
    assert_eq!(status, 200, "the signature is the proof: {sent}");
    assert!(sent["id"].as_str().unwrap().starts_with("sha256:"), "named by what was signed: {sent}");
    e.stop().await;
}

/// Webhook names could be found out without credentials: 404 for a name no
/// webhook has, 401 for one that exists. Both are the same 401 now.
#[tokio::test]
async fn a_webhook_name_cannot_be_found_out_without_its_secret() {
    std::env::set_var("COMPOSER_WEBHOOK_SECRET_IT_HIDDEN", "hidden-secret-it");
    let e = Engine::start().await;
    let hook = json!({"name": "hidden", "scheme": "github", "secret": "IT_HIDDEN"});
    assert_eq!(e.post("/v1/webhooks", &hook).await.0, 201);
    let unsigned = deliver(&e, "hidden", &[], "{}").await;
    let forged = deliver(&e, "hidden", &[("x-hub-signature-256", format!("sha256={}", "0".repeat(64)))], "{}").await;
    let nowhere = deliver(&e, "no_such_hook", &[], "{}").await;
    assert_eq!(unsigned.0, 401, "{}", unsigned.1);
    assert_eq!(unsigned, nowhere, "a known name answers as an unknown one");
    assert_eq!(forged, nowhere);
    e.stop().await;
}
