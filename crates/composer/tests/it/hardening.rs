//! Hostile definitions and input, contained engine faults (issue:
//! hardening). Each test is named after the attack or failure it stops.

use std::time::Duration;

use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

fn transform(output: &str) -> Value {
    json!({"name": "x", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": output}}]})
}

#[tokio::test]
async fn a_definition_cannot_read_the_environment_or_stop_the_coordinator() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    for (expr, name) in [
        ("${ env }", "env"),
        ("${ $ENV }", "ENV"),
        ("${ env.COMPOSER_API_TOKEN }", "env"),
        ("${ halt }", "halt"),
        ("${ halt_error(0) }", "halt_error"),
        ("${ input }", "input"),
        ("${ debug }", "debug"),
        ("${ now }", "now"),
    ] {
        let (status, body) = e.post("/v1/workflows", &transform(expr)).await;
        assert_eq!(status, 400, "{expr}: {body}");
        assert_eq!(body["error"]["code"], "invalid_definition", "{expr}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{name} is not available")) && message.contains("nodes[t].config.output"),
            "{expr}: {message}"
        );
    }
    let (status, _) = e.get("/readyz").await;
    assert_eq!(status, 200, "the coordinator is still serving");
    e.stop().await;
}

#[tokio::test]
async fn an_endless_or_huge_expression_fails_its_node_and_the_coordinator_carries_on() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    for (i, (expr, limit)) in [
        // A loop meets the step budget or, on a slow machine, the clock.
        ("${ def f: f; f }", "expr_max_"),
        ("${ last(range(1e15)) }", "expr_max_"),
        ("${ [range(1e9)] }", "expr_max_"),
        (r#"${ "x" * 1000000000 }"#, "expr_max_bytes"),
        (r#"${ reduce range(64) as $i ("x"; . + .) }"#, "expr_max_bytes"),
        ("${ reduce range(1000000) as $i (0; [.]) }", "expr_max_depth"),
        ("${ def f: 1 + f; f }", "expr_max_stack"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut spec = transform(expr);
        spec["name"] = json!(format!("hostile{i}"));
        let id = e.run(&spec).await;
        let run = e.wait_for_run(id, T).await;
        assert_eq!(run["status"], "FAILED", "{expr}: {run}");
        let error = run["error"].as_str().unwrap();
        assert!(error.contains(limit), "{expr}: {error}");
    }
    let id = e.run(&transform("${ [range(10)] | add }")).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["output"], json!({"t": 45}), "other runs are unharmed: {run}");
    let (status, _) = e.get("/readyz").await;
    assert_eq!(status, 200, "every engine loop still runs");
    e.stop().await;
}

#[tokio::test]
async fn a_wait_of_a_hundred_million_days_is_refused_at_registration() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let specs = [
        json!({"name": "w", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "100000000d"}}]}),
        json!({"name": "w", "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT",
            "config": {"event": "e", "key": "k", "timeout": "3651d"}}]}),
        json!({"name": "w", "nodes": [{"id": "w", "type": "HTTP", "config": {"url": "http://x/"},
            "retry": {"max_attempts": 3, "initial_backoff": "99999999999d"}}]}),
    ];
    for spec in specs {
        let (status, body) = e.post("/v1/workflows", &spec).await;
        assert_eq!(status, 400, "{spec}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("10 years"), "{body}");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_value_the_engine_computes_is_bounded_by_the_payload_limit() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.max_payload = 1000, ..Default::default() }).await;
    let id = e.run(&transform(r#"${ "x" * 5000 }"#)).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("COMPOSER_MAX_PAYLOAD"), "{run}");
    let id = e.run(&transform("${ [0] | implode }")).await;
    let run = e.wait_for_run(id, T).await;
    assert!(run["error"].as_str().unwrap().contains("NUL"), "a computed NUL fails the node: {run}");
    e.stop().await;
}

/// A WAIT_FOR_EVENT key computed from data is held to the longest key an
/// event may have: a longer one can never be sent, and the run waited for
/// it forever.
#[tokio::test]
async fn a_computed_event_key_longer_than_an_event_may_have_fails_its_step_naming_the_limit() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let wait = json!({"name": "keyed", "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT",
        "config": {"event": "e", "key": "${ .input.k }"}}]});
    e.register(&wait).await;
    // Text that does not compress (an index entry is compressed first).
    let noise: String =
        (0..8000u32).map(|i| char::from(b'!' + (i.wrapping_mul(2_654_435_761) >> 7) as u8 % 90)).collect();
    let id = e.start_run("keyed", json!({"k": noise})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run:.400}");
    let error = run["error"].as_str().unwrap();
    assert!(error.contains("config.key") && error.contains("1024"), "{error:.400}");
    // One at the limit waits.
    let id = e.start_run("keyed", json!({"k": "k".repeat(1024)})).await;
    let w = composer_testkit::poll_until(T, || async {
        let t = e.task(id, "w").await;
        (t["state"] == "WAITING").then_some(t)
    })
    .await;
    assert!(w.is_ok(), "{w:?}");
    e.stop().await;
}

/// PostgreSQL gives a jsonb number back as its exact decimal digits; one
/// near f64::MAX read back with serde_json's fast parser overflowed, so the
/// definition was stored and every read of it (and the list of workflows)
/// answered 500 (schemathesis found it).
#[tokio::test]
async fn a_number_near_the_largest_double_is_stored_and_read_back_as_it_was() {
    let e = Engine::start().await;
    let big = r#"{"name": "huge", "nodes": [{"id": "t", "type": "TRANSFORM",
        "config": {"output": {"max": 1.7976931348623155e+308, "small": -7.541989275705528e+134, "tiny": 5e-324}}}]}"#;
    let (status, answer) = e.post_raw("/v1/workflows", big).await;
    assert_eq!(status, 201, "{answer}");
    let (status, listed) = e.get("/v1/workflows").await;
    assert_eq!(status, 200, "{listed}");
    let (status, got) = e.get("/v1/workflows/huge").await;
    assert_eq!(status, 200, "{got}");
    let output = &got["spec"]["nodes"][0]["config"]["output"];
    assert_eq!(output["max"].as_f64(), Some(1.7976931348623155e308), "{output}");
    assert_eq!(output["small"].as_f64(), Some(-7.541989275705528e134), "{output}");
    assert_eq!(output["tiny"].as_f64(), Some(5e-324), "{output}");
    let (status, run) =
        e.post_raw("/v1/runs", r#"{"workflow": "huge", "input": {"n": 1.7976931348623155e+308}}"#).await;
    assert_eq!(status, 201, "{run}");
    let run = e.wait_for_run(run["id"].as_str().unwrap().parse().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(run["input"]["n"].as_f64(), Some(1.7976931348623155e308), "{run}");
    assert_eq!(run["output"]["t"]["max"].as_f64(), Some(1.7976931348623155e308), "{run}");
    e.stop().await;
}

#[tokio::test]
async fn a_nul_character_is_a_400_naming_the_field_not_a_500() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&transform("${ .input }")).await;
    let cases = [
        ("/v1/runs", r#"{"workflow": "x", "input": {"a": ["ok", "b\u0000"]}}"#, "field .input.a[1]"),
        ("/v1/runs", r#"{"workflow": "x\u0000"}"#, "field .workflow"),
        ("/v1/runs", r#"{"workflow": "x", "idempotency_key": "k\u0000"}"#, "field .idempotency_key"),
        ("/v1/runs", r#"{"workflow": "x", "input": {"k\u0000": 1}}"#, "field .input.k"),
        ("/v1/events", r#"{"name": "n\u0000", "key": "k"}"#, "field .name"),
        ("/v1/events", r#"{"name": "n", "key": "k", "payload": "\u0000"}"#, "field .payload"),
        (
            "/v1/workflows",
            r#"{"name": "y", "description": "\u0000", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {}}]}"#,
            "field .description",
        ),
    ];
    for (path, body, field) in cases {
        let (status, answer) = e.post_raw(path, body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field) && message.contains("NUL"), "{body}: {message}");
    }
    let (status, _) = e.post_raw("/v1/runs", r#"{"workflow": "x", "input": {"a": "\\u0000"}}"#).await;
    assert_eq!(status, 201, "an escaped backslash before u0000 is text, not a NUL");
    for path in ["/v1/workflows/a%00b", "/v1/workflows/a%00b/versions/1", "/v1/runs?workflow=a%00"] {
        let (status, answer) = e.get(path).await;
        assert_eq!(status, 400, "{path}: {answer}");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_target_answering_a_nul_fails_the_attempt_once_instead_of_looping() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "nul", "nodes": [http_node("call", &http.url("/nul/call"), 3)]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("NUL"), "{run}");
    assert_eq!(http.calls("/nul/call"), 1, "an output that cannot be stored is not retried");
    e.stop().await;
}

#[tokio::test]
async fn a_poisoned_run_fails_on_the_repeat_and_the_engine_keeps_going() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let wait = json!({"name": "poison", "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "e", "key": "k"}}]});
    let id = e.run(&wait).await;
    e.wait_until(id, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    // A stored value no JSON reader accepts (written behind our back):
    // every event of this run fails to load it.
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let client = e.db.pool().get().await.unwrap();
    client
        .execute(&format!("UPDATE task_instances SET output_json = '{deep}' WHERE run_id = $1"), &[&id])
        .await
        .unwrap();

    let (first, body) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(first, 500, "the first failure fails the event: {body}");
    let _ = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    let row = client.query_one("SELECT status, error FROM workflow_runs WHERE id = $1", &[&id]).await.unwrap();
    let (status, error): (String, Option<String>) = (row.get(0), row.get(1));
    assert_eq!(status, "FAILED", "the repeat fails the run");
    assert!(error.unwrap_or_default().contains("run failed"));
    let open: i64 = client
        .query_one("SELECT count(*) FROM task_instances WHERE run_id = $1 AND state = 'WAITING'", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "its open tasks are cancelled, so no timer re-fires the poison");

    let other = e.run(&transform("${ 1 }")).await;
    assert_eq!(e.wait_for_run(other, T).await["status"], "SUCCEEDED", "other runs are unharmed");
    let (ready, _) = e.get("/readyz").await;
    assert_eq!(ready, 200);
    e.stop().await;
}

#[tokio::test]
async fn every_session_has_a_statement_and_idle_transaction_timeout() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let client = e.db.pool().get().await.unwrap();
    let statement: String = client.query_one("SHOW statement_timeout", &[]).await.unwrap().get(0);
    let idle: String = client.query_one("SHOW idle_in_transaction_session_timeout", &[]).await.unwrap().get(0);
    assert_eq!((statement.as_str(), idle.as_str()), ("1min", "1min"));
    // A transaction that reads or writes objects may sit idle longer, to
    // its end only: a 100 MB value's write on a loaded machine outlasted
    // the minute (the connection was closed under it).
    let mut client = client;
    let tx = composer_store::transaction::begin(&mut client).await.unwrap();
    tx.allow_object_io().await.unwrap();
    tx.allow_object_io().await.unwrap();
    let idle: String = tx.query_one("SHOW idle_in_transaction_session_timeout", &[]).await.unwrap().get(0);
    assert_eq!(idle, composer_store::transaction::OBJECT_IO_IDLE);
    tx.commit().await.unwrap();
    let idle: String = client.query_one("SHOW idle_in_transaction_session_timeout", &[]).await.unwrap().get(0);
    assert_eq!(idle, "1min");
    // One that holds a pass's lock (archiving, sweeping objects) while the
    // pass runs on other connections sits idle with no limit: at a minute
    // the lock went, half way through a pass.
    type Lock = for<'a> fn(
        &'a composer_store::Transaction<'_>,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = composer_store::Result<bool>> + 'a>>;
    let locks: [Lock; 2] = [
        |tx| Box::pin(composer_store::partitions::try_lock_archiving(tx)),
        |tx| Box::pin(composer_store::partitions::try_lock_payload_sweep(tx)),
    ];
    for lock in locks {
        let tx = composer_store::transaction::begin(&mut client).await.unwrap();
        assert!(lock(&tx).await.unwrap());
        let idle: String = tx.query_one("SHOW idle_in_transaction_session_timeout", &[]).await.unwrap().get(0);
        assert_eq!(idle, "0");
        tx.commit().await.unwrap();
    }
    let idle: String = client.query_one("SHOW idle_in_transaction_session_timeout", &[]).await.unwrap().get(0);
    assert_eq!(idle, "1min");
    e.stop().await;
}

#[tokio::test]
async fn data_cannot_inject_a_secret_reference() {
    std::env::set_var("COMPOSER_SECRET_HARDENING_PAY", "pay-token-123");
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "inject", "nodes": [
        {"id": "call", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/call"),
            "headers": {"Authorization": "Bearer ${ .secrets.HARDENING_PAY }"},
            "body": {"m": "${ .input.m }", "note": "about ${ .input.m }", "all": "${ .input }"}}}]});
    e.register(&spec).await;
    let hostile = "${ .secrets.HARDENING_PAY }";
    let id = e.start_run("inject", json!({"m": hostile})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    let request = &http.requests("/echo/call")[0];
    assert_eq!(request.headers["authorization"], "Bearer pay-token-123", "the definition's own reference resolves");
    assert_eq!(
        request.body,
        json!({"m": hostile, "note": format!("about {hostile}"), "all": {"m": hostile}}),
        "a reference arriving as data is sent as text"
    );
    e.stop().await;
}

#[tokio::test]
async fn a_worker_leases_only_what_it_can_start_so_slow_steps_run_once() {
    let e = Engine::with(EngineOptions {
        worker_concurrency: 1,
        lease_ttl: Duration::from_secs(1),
        coordinator: |c| {
            c.stream_shards = 4;
            c.recovery_interval = Duration::from_millis(200);
        },
        ..Default::default()
    })
    .await;
    let http = FakeHttp::start().await;
    let mut runs = Vec::new();
    for i in 0..5 {
        let spec =
            json!({"name": format!("slow{i}"), "nodes": [http_node("call", &http.url(&format!("/slow/1500/{i}")), 1)]});
        runs.push(e.run(&spec).await);
    }
    for id in runs {
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    for i in 0..5 {
        assert_eq!(http.calls(&format!("/slow/1500/{i}")), 1, "step {i}: a task waiting for a slot was not leased");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_type_no_handler_serves_on_a_served_queue_fails_at_once() {
    let e = Engine::start().await;
    let spec =
        json!({"name": "orphan", "nodes": [{"id": "c", "type": "nobody-handles", "queue": "http", "config": {}}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(error.contains("no handler for type nobody-handles on queue http"), "{error}");
    e.stop().await;
}

fn waits_for(name: &str, key: &str) -> Value {
    json!({"name": format!("waits-{key}"), "nodes": [{"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": name, "key": key}}]})
}

#[tokio::test]
async fn an_event_whose_waiter_ignores_it_stays_buffered_for_the_next() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let first = e.run(&waits_for("paid", "o-1")).await;
    e.wait_until(first, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    // The waiter's run ended between the match and the delivery (a timeout,
    // say): it ignores the event.
    let client = e.db.pool().get().await.unwrap();
    client.execute("UPDATE workflow_runs SET status = 'CANCELLED' WHERE id = $1", &[&first]).await.unwrap();
    let (status, sent) = e.post("/v1/events", &json!({"name": "paid", "key": "o-1", "payload": {"n": 1}})).await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(
        (sent["matched"].clone(), sent["buffered"].clone()),
        (json!(0), json!(true)),
        "no waiter took it, so it is kept: {sent}"
    );
    let second = e.run(&waits_for("paid", "o-1")).await;
    let run = e.wait_for_run(second, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "the next waiter gets it: {run}");
    assert_eq!(run["output"]["w"], json!({"n": 1}));
    e.stop().await;
}

#[tokio::test]
async fn an_event_whose_sender_died_before_delivery_is_delivered_by_recovery() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let id = e.run(&waits_for("shipped", "o-2")).await;
    e.wait_until(id, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    // What a sender leaves when it dies after recording the event.
    let client = e.db.pool().get().await.unwrap();
    client
        .execute(
            "INSERT INTO events (name, key, payload, created_at, expires_at)
             VALUES ('shipped', 'o-2', '{\"n\": 2}', now() - interval '1 minute', now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    composer_coord::loops::recover_tasks(&e.coordinators[0].shared).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["w"], json!({"n": 2}));
    e.stop().await;
}

/// A worker whose coordinators include a wrong URL (a proxy that answers
/// 404 to everything): a result that lands there first is sent on to the
/// next coordinator, never dropped — each step runs once.
#[tokio::test]
async fn a_404_from_a_proxy_does_not_make_a_worker_drop_its_result() {
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let proxy = FakeHttp::start().await;
    let http = FakeHttp::start().await;
    let mut misrouted = e.worker_config("misrouted", 1);
    misrouted.options.coordinator_urls = vec![proxy.url("/wrong-path"), e.url()];
    e.spawn_worker(composer_worker::Worker::new(misrouted));
    let spec = json!({"name": "proxied", "nodes": [http_node("a", &http.url("/ok/a"), 1)]});
    e.register(&spec).await;
    // Calls alternate between the two: run steps until a result went to the
    // proxy first.
    let mut runs = Vec::new();
    let results_to_proxy = || proxy.all().iter().filter(|r| r.path.ends_with("/complete")).count();
    while results_to_proxy() == 0 {
        assert!(runs.len() < 30, "no result ever went to the proxy first");
        let id = e.start_run("proxied", json!({})).await;
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
        runs.push(id);
    }
    let stats = &e.workers[0].stats;
    assert_eq!((stats.reported(), stats.report_failed()), (runs.len() as u64, 0), "every result was delivered");
    assert_eq!(http.calls("/ok/a"), runs.len(), "no step ran twice: no result was dropped on the 404");
    e.stop().await;
}

#[tokio::test]
async fn a_web_page_of_another_origin_cannot_drive_the_tokenless_api() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.allowed_origins = vec!["https://ops.example".into()],
        ..Default::default()
    })
    .await;
    let http = reqwest::Client::new();
    let spec = transform("${ 1 }").to_string();
    let url = format!("{}/v1/workflows", e.url());
    // What a page on evil.example can send without a CORS preflight.
    for (origin, kind) in [
        (Some("http://evil.example"), "application/json"),
        (Some("http://evil.example"), "text/plain"),
        (None, "text/plain"),
        (None, "application/x-www-form-urlencoded"),
    ] {
        let mut req = http.post(&url).header("content-type", kind).body(spec.clone());
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        let status = req.send().await.unwrap().status().as_u16();
        assert!(status == 403 || status == 415, "{origin:?} {kind}: {status}");
    }
    let status = |r: reqwest::Response| r.status().as_u16();
    let cancel = format!("{}/v1/runs/{}/cancel", e.url(), uuid::Uuid::now_v7());
    let r = http.post(&cancel).header("origin", "http://evil.example").send().await.unwrap();
    assert_eq!(status(r), 403, "a bodiless POST from a foreign page is refused too");
    let (_, workflows) = e.get("/v1/workflows").await;
    assert_eq!(workflows["workflows"], json!([]), "nothing was registered");

    let allowed = http.post(&url).header("origin", "https://ops.example").header("content-type", "application/json");
    assert_eq!(status(allowed.body(spec.clone()).send().await.unwrap()), 201, "an allowed origin may");
    let own = format!("http://{}", e.coordinators[0].addr);
    let same = http.post(&url).header("origin", own).header("content-type", "application/json; charset=utf-8");
    assert_eq!(status(same.body(spec).send().await.unwrap()), 200, "the coordinator's own origin may");
    e.stop().await;
}

#[tokio::test]
async fn the_task_api_needs_a_token_whenever_one_is_set_and_tokens_must_differ() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.api_token = Some("only-the-api-token".into()),
        ..Default::default()
    })
    .await;
    let report = json!({"run_id": uuid::Uuid::now_v7(), "attempt": 1, "worker_id": "w"});
    let url = format!("{}/v1/tasks/{}/complete", e.url(), uuid::Uuid::now_v7());
    let http = reqwest::Client::new();
    let open = http.post(&url).json(&report).send().await.unwrap();
    assert_eq!(open.status().as_u16(), 401, "no token, no task API");
    let with = http.post(&url).bearer_auth("only-the-api-token").json(&report).send().await.unwrap();
    assert_ne!(with.status().as_u16(), 401, "the only token set opens it");

    let mut same = e.coordinator_config();
    same.worker_token = Some("same".into());
    same.api_token = Some("same".into());
    let err = same.validated().unwrap_err().to_string();
    assert!(err.contains("COMPOSER_WORKER_TOKEN") && err.contains("differ"), "{err}");
    e.stop().await;
}

fn call(url: &str, extra: Value) -> Value {
    let mut config = json!({"url": url});
    config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    json!({"name": "egress", "nodes": [{"id": "call", "type": "HTTP", "config": config,
        "retry": {"max_attempts": 3, "initial_backoff": "10ms"}}]})
}

async fn fails_at_once(e: &Engine, spec: &Value, reason: &str) {
    let id = e.run(spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains(reason), "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 1, "a refused connection is not retried: {run}");
}

#[tokio::test]
async fn the_http_node_cannot_reach_the_metadata_service_directly_or_by_redirect() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    fails_at_once(&e, &call("http://169.254.169.254/latest/meta-data/", json!({})), "COMPOSER_HTTP_DENY").await;
    fails_at_once(&e, &call("http://[fe80::1]/", json!({})), "COMPOSER_HTTP_DENY").await;
    let bounce = http.url("/redirect/a?to=http://169.254.169.254/latest/meta-data/");
    fails_at_once(&e, &call(&bounce, json!({"follow_redirects": true})), "COMPOSER_HTTP_DENY").await;
    // Without follow_redirects, a redirect is an answer, not a new request.
    let id = e.run(&call(&http.url("/redirect/b?to=http://169.254.169.254/"), json!({}))).await;
    let run = e.wait_for_run(id, T).await;
    assert!(run["error"].as_str().unwrap().contains("answered 302"), "{run}");
    e.stop().await;
}

#[tokio::test]
async fn a_hostname_resolving_to_a_denied_range_is_refused_after_dns() {
    let e = Engine::with(EngineOptions {
        worker: |w| w.options.egress.http_deny = vec!["127.0.0.0/8".into(), "::1/128".into()],
        ..Default::default()
    })
    .await;
    let http = FakeHttp::start().await;
    let by_name = http.url("/ok/a").replace("127.0.0.1", "localhost");
    fails_at_once(&e, &call(&by_name, json!({})), "COMPOSER_HTTP_DENY").await;
    assert_eq!(http.calls("/ok/a"), 0);
    e.stop().await;
}

#[tokio::test]
async fn custom_headers_are_never_carried_to_another_host_and_timeouts_are_capped() {
    let e = Engine::with(EngineOptions {
        worker: |w| w.options.egress.http_max_timeout = Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let here = FakeHttp::start().await;
    let there = FakeHttp::start().await;
    let away = here.url(&format!("/redirect/x?to={}", there.url("/headers/x")));
    let with_key = json!({"follow_redirects": true, "headers": {"X-Api-Key": "k-123"}});
    fails_at_once(&e, &call(&away, with_key), "never sent to another host").await;
    assert_eq!(there.calls("/headers/x"), 0, "the other host never saw the key");
    let id = e.run(&call(&away, json!({"follow_redirects": true}))).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED", "without custom headers it is followed");

    let looping = here.url("/redirect/loop?to=/redirect/loop");
    fails_at_once(
        &e,
        &call(&here.url("/redirect/loop?to=/redirect/loop"), json!({"follow_redirects": true})),
        "more than 10 redirects",
    )
    .await;
    assert_eq!(here.calls("/redirect/loop"), 11, "{looping}: the first call and 10 redirects");

    let slow = call(&here.url("/slow/3000/t"), json!({"timeout": "1h"}));
    let id = e.run(&slow).await;
    let run = e.wait_for_run(id, T).await;
    assert!(run["error"].as_str().unwrap().contains("timed out"), "1h is capped by COMPOSER_HTTP_MAX_TIMEOUT: {run}");
    e.stop().await;
}

#[tokio::test]
async fn lists_carry_no_data_and_versions_come_in_pages_of_metadata() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let id = e.run(&transform("${ .input }")).await;
    e.wait_for_run(id, T).await;
    let (_, page) = e.get("/v1/runs").await;
    let listed = &page["runs"][0];
    assert_eq!(listed["id"], json!(id.to_string()));
    assert!(listed.get("input").is_none() && listed.get("output").is_none(), "a list is summaries: {listed}");
    let (_, one) = e.get(&format!("/v1/runs/{id}")).await;
    assert!(one.get("input").is_some(), "one run carries its data: {one}");

    for n in 1..=3 {
        let mut spec = transform("${ 1 }");
        spec["description"] = json!(format!("v{n}"));
        e.register(&spec).await;
    }
    let (_, wf) = e.get("/v1/workflows/x?limit=2").await;
    assert_eq!(wf["version"], 4, "the run's version and three more");
    assert!(wf["spec"].is_object(), "the latest carries its spec");
    let versions: Vec<i64> =
        wf["versions"].as_array().unwrap().iter().map(|v| v["version"].as_i64().unwrap()).collect();
    assert_eq!(versions, vec![4, 3]);
    assert!(wf["versions"][0].get("spec").is_none(), "versions are metadata");
    assert_eq!(wf["versions_next"], 3);
    let (_, next) = e.get("/v1/workflows/x?limit=3&before=3").await;
    let versions: Vec<i64> =
        next["versions"].as_array().unwrap().iter().map(|v| v["version"].as_i64().unwrap()).collect();
    assert_eq!(versions, vec![2, 1]);
    assert!(next.get("versions_next").is_none(), "the last page says so");
    e.stop().await;
}

#[tokio::test]
async fn api_errors_are_counted_by_status() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let (status, _) = e.get("/v1/runs/not-a-uuid").await;
    assert_eq!(status, 400);
    let text = reqwest::get(format!("{}/metrics", e.url())).await.unwrap().text().await.unwrap();
    let counted = "composer_api_errors_total{status=\"400\"} ";
    let line = text.lines().find(|l| l.starts_with(counted)).unwrap_or_else(|| panic!("{text}"));
    assert!(line[counted.len()..].parse::<f64>().unwrap() >= 1.0, "counted, not only exported from zero: {line}");
    e.stop().await;
}

#[tokio::test]
async fn an_attempt_recovery_keeps_dispatching_is_failed_after_max_dispatches() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            c.recovery_interval = Duration::from_millis(100);
            c.lost_dispatch_age = Duration::from_millis(100);
            c.max_dispatches = 2;
        },
        ..Default::default()
    })
    .await;
    // Nobody reads this queue: every dispatch looks lost, and is redone.
    let spec = json!({"name": "unread", "nodes": [{"id": "c", "type": "lonely", "config": {},
        "retry": {"max_attempts": 2, "initial_backoff": "10ms"}}]});
    let id = e.run(&spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("COMPOSER_MAX_DISPATCHES"), "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 2, "the retry policy applied to the exhausted attempt: {run}");
    e.stop().await;
}

async fn count(e: &Engine, sql: &str) -> i64 {
    let client = e.db.pool().get().await.unwrap();
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_workflow_that_calls_itself_twice_stops_at_its_trees_run_budget() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.max_tree_runs = 20, ..Default::default() }).await;
    let call = json!({"type": "SUB_WORKFLOW", "config": {"workflow": "again", "input": {}}});
    let mut a = call.clone();
    a["id"] = json!("a");
    let mut b = call;
    b["id"] = json!("b");
    e.register(&json!({"name": "again", "nodes": [a, b]})).await;
    let root = e.start_run("again", json!({})).await;
    let run = e.wait_for_run(root, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let runs = count(&e, "SELECT count(*) FROM workflow_runs").await;
    assert!(runs <= 20, "{runs} runs in a tree whose budget is 20");
    let (_, events) = e.get(&format!("/v1/runs/{root}/events?limit=1000")).await;
    assert!(events.to_string().contains("COMPOSER_MAX_TREE_RUNS"), "the failure names the budget: {events}");
    let (status, _) = e.get("/healthz").await;
    assert_eq!(status, 200);
    let other = e.run(&transform("${ 1 }")).await;
    assert_eq!(e.wait_for_run(other, T).await["status"], "SUCCEEDED", "other runs are unaffected");
    e.stop().await;
}

#[tokio::test]
async fn a_map_of_children_that_each_map_stops_at_its_trees_item_budget() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.max_tree_items = 50, ..Default::default() }).await;
    e.register(&json!({"name": "inner", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(.input.n)] }",
        "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}}]}))
        .await;
    e.register(&json!({"name": "outer", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(10)] }", "max_concurrency": 10,
        "node": {"type": "SUB_WORKFLOW", "config": {"workflow": "inner", "input": {"n": 20}}}}}]}))
        .await;
    let root = e.start_run("outer", json!({})).await;
    let run = e.wait_for_run(root, T).await;
    assert_eq!(run["status"], "FAILED", "10 + 10 x 20 items do not fit in 50: {run}");
    let items = count(&e, "SELECT count(*) FROM task_instances WHERE parent_task_id IS NOT NULL").await;
    assert!(items <= 50, "{items} MAP items in a tree whose budget is 50");
    let children = count(&e, "SELECT count(*) FROM workflow_runs WHERE parent_run_id IS NOT NULL").await;
    let failed = count(
        &e,
        "SELECT count(*) FROM task_instances WHERE error LIKE '%COMPOSER_MAX_TREE_ITEMS%' AND node_id = 'each'",
    )
    .await;
    assert!(children >= 1 && failed >= 1, "a child's MAP failed naming the budget ({children} children, {failed})");

    let fits = e.start_run("inner", json!({"n": 40})).await;
    assert_eq!(e.wait_for_run(fits, T).await["status"], "SUCCEEDED", "another tree has its own budget");
    e.stop().await;
}
