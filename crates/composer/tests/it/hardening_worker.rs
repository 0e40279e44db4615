//! Hostile definitions and targets against the worker, and lost dispatch
//! after Redis forgets (issue: hardening, round two). Each test is named
//! after the attack or failure it stops.

use std::time::Duration;

use composer_testkit::{eventually, http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

/// The secret of the reproduction: a space, a slash, a plus, an
/// ampersand and an equals sign, so every encoding changes it.
const MIX: &str = "AbC d/Ef+xYz&q=1";

/// Pieces of MIX in the forms it takes when it leaks: as is, in capitals or
/// small letters, URL-encoded with `%20` or `+`.
const LEAKS: [&str; 9] = ["AbC d", "ABC D", "abc d", "AbC%20d", "AbC+d", "ABC%20D", "d/Ef+xYz", "D/EF+XYZ", "xYz&q=1"];

fn assert_no_leak(what: &str, text: &str) {
    for leak in LEAKS {
        assert!(!text.contains(leak), "{what} holds {leak:?}: {text}");
    }
}

/// A one-node workflow calling with `config`, retried quickly.
fn calling(name: &str, config: Value) -> Value {
    json!({"name": name, "nodes": [{"id": "call", "type": "HTTP", "config": config,
        "retry": {"max_attempts": 3, "initial_backoff": "10ms"}}]})
}

/// Runs `spec`, expects it to fail at its first attempt, and returns the
/// run's error after checking that neither the run, its history nor the
/// web UI's page of it holds the secret.
async fn fails_without_leaking(e: &Engine, spec: &Value) -> String {
    let id = e.run(spec).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 1, "not retried: {run}");
    assert_no_leak("the run", &run.to_string());
    let (_, history) = e.get(&format!("/v1/runs/{id}/events?limit=1000")).await;
    assert_no_leak("the history", &history.to_string());
    let (_, page) = e.get(&format!("/ui/runs/{id}")).await;
    assert_no_leak("the UI", &page.to_string());
    run["error"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_secret_in_a_method_url_header_or_echoed_body_never_reaches_an_error() {
    std::env::set_var("COMPOSER_SECRET_HW_MIX", MIX);
    let e = Engine::start().await;
    let http = FakeHttp::start().await;

    let by_method = calling("by_method", json!({"method": "${ .secrets.HW_MIX }", "url": http.url("/ok/m")}));
    let error = fails_without_leaking(&e, &by_method).await;
    assert!(error.contains("the method (which holds a secret) is not a valid HTTP method"), "{error}");

    // The target answers 400 with the request as it received it: the URL
    // (percent-encoded), the headers, the body and the body in capitals.
    let echoed = calling(
        "echoed",
        json!({"method": "POST", "url": http.url("/mirror/u?token=${ .secrets.HW_MIX }"),
               "headers": {"X-Token": "t ${ .secrets.HW_MIX }"}, "body": {"card": "${ .secrets.HW_MIX }"}}),
    );
    let error = fails_without_leaking(&e, &echoed).await;
    assert!(error.contains("answered 400") && error.contains("[secret]"), "{error}");
    assert!(error.contains("(the URL holds a secret)"), "the URL is not quoted: {error}");
    let sent = &http.requests("/mirror/u")[0];
    assert_eq!(sent.headers["x-token"], format!("t {MIX}"), "the target did get the secret");

    let bad_header =
        calling("bad_header", json!({"url": http.url("/ok/h"), "headers": {"X-Token": "${ .secrets.HW_MIX }\u{1}"}}));
    let error = fails_without_leaking(&e, &bad_header).await;
    assert!(error.contains("its value (which holds a secret) is not a valid header value"), "{error}");
    e.stop().await;
}

#[tokio::test]
async fn a_secret_bound_to_hosts_is_never_sent_to_another_host() {
    std::env::set_var("COMPOSER_SECRET_HW_BOUND", "bound-token-4711");
    std::env::set_var("COMPOSER_SECRET_HW_BOUND_HOSTS", "127.0.0.1");
    let mut e = Engine::start().await;
    let here = FakeHttp::start().await;
    let there = FakeHttp::start().await;
    let there_by_name = there.url("/headers/b").replace("127.0.0.1", "localhost");
    let auth = json!({"Authorization": "Bearer ${ .secrets.HW_BOUND }"});

    let id = e.run(&calling("allowed", json!({"url": here.url("/headers/a"), "headers": auth}))).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED", "127.0.0.1 is allowed");
    assert_eq!(here.requests("/headers/a")[0].headers["authorization"], "Bearer bound-token-4711");

    let direct = calling("direct", json!({"url": there_by_name, "headers": auth}));
    let error = fails_without_leaking(&e, &direct).await;
    assert!(
        error.contains("secret HW_BOUND may be sent only to 127.0.0.1") && error.contains("not to localhost"),
        "{error}"
    );
    assert!(!error.contains("bound-token"), "{error}");

    // In the body, with no custom header: a redirect to another host is refused too.
    let bounce = here.url(&format!("/redirect/r?to={there_by_name}"));
    let redirected = calling(
        "redirected",
        json!({"url": bounce, "follow_redirects": true, "body": {"t": "${ .secrets.HW_BOUND }"}}),
    );
    let error = fails_without_leaking(&e, &redirected).await;
    assert!(error.contains("secret HW_BOUND may be sent only to 127.0.0.1") && error.contains("localhost"), "{error}");
    assert_eq!(there.calls("/headers/b"), 0, "the other host never saw the secret");

    // A custom type could send it anywhere: a bound secret is for the HTTP node only.
    let mut worker = composer_worker::Worker::new(e.worker_config("custom", 2));
    worker.handle("forward", |_ctx, input| async move { Ok(input) });
    e.spawn_worker(worker);
    let custom =
        json!({"name": "custom", "nodes": [{"id": "f", "type": "forward", "config": {"t": "${ .secrets.HW_BOUND }"}}]});
    let error = fails_without_leaking(&e, &custom).await;
    assert!(error.contains("secret HW_BOUND is bound to hosts") && error.contains("forward"), "{error}");
    e.stop().await;
}

#[tokio::test]
async fn a_redirect_to_another_host_never_resends_the_body() {
    let e = Engine::start().await;
    let here = FakeHttp::start().await;
    let there = FakeHttp::start().await;
    // 127.0.0.1 and localhost are different hosts.
    let away = |path: &str| there.url(path).replace("127.0.0.1", "localhost");
    let card = json!({"card": "4242 4242 4242 4242"});

    for (status, method) in [(307, "POST"), (308, "POST"), (302, "PUT"), (301, "PATCH")] {
        let to = away(&format!("/echo/{status}"));
        let url = here.url(&format!("/moved/{status}/x?to={to}"));
        let spec = calling(
            &format!("moved{status}"),
            json!({"method": method, "url": url, "follow_redirects": true, "body": card}),
        );
        let id = e.run(&spec).await;
        let run = e.wait_for_run(id, T).await;
        assert_eq!(run["status"], "FAILED", "{status}: {run}");
        assert_eq!(run["tasks"][0]["attempt"], 1, "not retried: {run}");
        let error = run["error"].as_str().unwrap();
        let host = to.trim_start_matches("http://").split('/').next().unwrap().to_string();
        assert!(error.contains(&format!("a {status} redirect to another host ({host}) refused")), "{error}");
        assert!(error.contains("body"), "{error}");
        assert_eq!(there.calls(&format!("/echo/{status}")), 0, "{status} {method}: the body never left");
    }

    // On the same host a 307 keeps its body; a 303 (and a POST's 302) to
    // another host go on as a GET without it.
    let same = here.url(&format!("/moved/307/s?to={}", here.url("/echo/same")));
    let id =
        e.run(&calling("same", json!({"method": "POST", "url": same, "follow_redirects": true, "body": card}))).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    assert_eq!(here.requests("/echo/same")[0].body, card);
    for status in [303, 302] {
        let url = here.url(&format!("/moved/{status}/g?to={}", away(&format!("/echo/get{status}"))));
        let id = e
            .run(&calling(
                &format!("get{status}"),
                json!({"method": "POST", "url": url, "follow_redirects": true, "body": card}),
            ))
            .await;
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
        let got = &there.requests(&format!("/echo/get{status}"))[0];
        assert_eq!((got.method.as_str(), &got.body), ("GET", &Value::Null), "{status}");
    }
    // Without a body any redirect is followed.
    let url = here.url(&format!("/moved/307/n?to={}", away("/ok/n")));
    let id = e.run(&calling("nobody", json!({"method": "POST", "url": url, "follow_redirects": true}))).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

#[tokio::test]
async fn a_schedule_whose_cron_never_fires_is_refused() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "report", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    for cron in ["0 0 30 2 *", "0 0 31 2,4,6,9,11 *"] {
        let (status, body) = e.post("/v1/schedules", &json!({"id": "never", "workflow": "report", "cron": cron})).await;
        assert_eq!(status, 400, "{cron}: {body}");
        assert_eq!(body["error"]["code"], "invalid_schedule", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(cron) && message.contains("never fires"), "{message}");
    }
    let (status, _) = e.get("/v1/schedules/never").await;
    assert_eq!(status, 404, "nothing was stored");
    let (status, body) =
        e.post("/v1/schedules", &json!({"id": "leap", "workflow": "report", "cron": "0 0 29 2 *"})).await;
    assert_eq!(status, 201, "29 February fires in leap years: {body}");
    e.stop().await;
}

/// Messages on the engine's streams of `queue`.
async fn queued(e: &Engine, queue: &str) -> usize {
    let mut redis =
        redis::Client::open(e.redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut n = 0;
    for shard in 0..e.coordinator_config().stream_shards {
        let len: usize =
            redis::cmd("XLEN").arg(format!("{}tasks:{queue}.{shard}", e.prefix)).query_async(&mut redis).await.unwrap();
        n += len;
    }
    n
}

/// Deletes every key of this engine (its prefix): what a Redis restarted
/// without persistence holds, without touching other tests' keys.
async fn forget_everything(e: &Engine) {
    let mut redis =
        redis::Client::open(e.redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}*", e.prefix)).query_async(&mut redis).await.unwrap();
    assert!(!keys.is_empty(), "the engine had keys to lose");
    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_redis_that_lost_everything_redispatches_at_once() {
    // The lost-dispatch age is left at its default (10 minutes).
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    assert_eq!(e.coordinator_config().lost_dispatch_age, Duration::from_secs(600));
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "lost", "nodes": [http_node("a", &http.url("/ok/lost"), 1)]})).await;
    // Published, and its outbox row gone: only the stream holds the dispatch.
    let pool = e.db.pool();
    let db = pool.get().await.unwrap();
    eventually(T, "the task to be dispatched (on a stream, its outbox row gone)", || async {
        let outbox: i64 = db.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0);
        (outbox == 0 && queued(&e, "http").await > 0).then_some(())
    })
    .await;

    // `composer dev` killed: its coordinator gone, its embedded Redis empty.
    e.coordinators.pop().unwrap().abort();
    forget_everything(&e).await;
    assert_eq!(queued(&e, "http").await, 0);
    e.start_coordinator().await;
    eventually(Duration::from_secs(10), "the task to be dispatched again within seconds", || async {
        (queued(&e, "http").await > 0).then_some(())
    })
    .await;
    e.start_worker("after", 2).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    assert_eq!(http.calls("/ok/lost"), 1, "run once");
    e.stop().await;
}

/// A handler whose result is too large to send (past the coordinator's
/// body limit, so the coordinator answers 413) used to be retried until the
/// report's deadline, then run again on every redelivery. Now the refusal
/// fails the attempt, once, naming it.
#[tokio::test]
async fn a_result_the_coordinator_refuses_fails_the_attempt_once_instead_of_running_it_again() {
    let mut e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.max_payload = 2000, ..Default::default() }).await;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut worker = composer_worker::Worker::new(e.worker_config("huge", 2));
    let counted = runs.clone();
    worker.handle("huge", move |_ctx, _input| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok(json!({"blob": "x".repeat(200_000)})) }
    });
    e.spawn_worker(worker);
    let id = e
        .run(&json!({"name": "huge", "nodes": [{"id": "h", "type": "huge",
            "retry": {"max_attempts": 3, "initial_backoff": "10ms"}}]}))
        .await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let error = run["tasks"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("refused the attempt's result (HTTP 413"), "{error}");
    assert_eq!(run["tasks"][0]["attempt"], 1, "not retried: the same result would be refused again");
    assert_eq!(run["tasks"][0]["error_info"]["code"], "report_refused", "{run}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "the handler ran once");
    e.stop().await;
}
