//! Attacks on the HTTP surface (issue 26, round two): a worker reporting a
//! task it does not hold, DNS rebinding, the UI's session and login, the
//! metrics endpoint, and a reused idempotency key. Each test is named after
//! the attack it stops.

use std::time::Duration;

use composer_testkit::{eventually, Engine, EngineOptions};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

/// A one-step workflow of a custom type on its own queue, which only the
/// test's hand-made workers (the task API) take.
fn forged_step() -> Value {
    json!({"name": "forgery", "nodes": [{"id": "job", "type": "payout", "queue": "forge"}]})
}

/// Leases the one task of queue `forge` for `worker` through the task API.
async fn lease(e: &Engine, worker: &str) -> Value {
    let (status, body) =
        e.post("/v1/tasks/poll", &json!({"worker_id": worker, "queues": ["forge"], "wait": "10s"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tasks"].as_array().map(Vec::len), Some(1), "{body}");
    body["tasks"][0].clone()
}

fn report(worker: &str, task: &Value) -> Value {
    json!({"worker_id": worker, "run_id": task["run_id"], "attempt": task["attempt"]})
}

#[tokio::test]
async fn a_worker_cannot_report_the_result_of_a_task_another_worker_holds() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let run = e.run(&forged_step()).await;
    let task = lease(&e, "worker-a").await;
    let path = format!("/v1/tasks/{}/complete", task["id"].as_str().unwrap());

    let mut forged = report("worker-b", &task);
    forged["output"] = json!({"paid_to": "mallory"});
    let (status, body) = e.post(&path, &forged).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("lease_lost")), "{body}");
    let mut stale = report("worker-a", &task);
    stale["attempt"] = json!(task["attempt"].as_i64().unwrap() + 1);
    let (status, body) = e.post(&path, &stale).await;
    assert_eq!(status, 409, "another attempt than the lease's: {body}");
    let (_, now) = e.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(now["status"], "RUNNING", "the forgery changed nothing: {now}");

    let mut real = report("worker-a", &task);
    real["output"] = json!({"paid_to": "alice"});
    let (status, body) = e.post(&path, &real).await;
    assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert_eq!(done["output"], json!({"job": {"paid_to": "alice"}}), "{done}");

    let (status, body) = e.post(&path, &forged).await;
    assert_eq!(status, 409, "nobody holds an ended task's lease: {body}");
    e.stop().await;
}

/// One report rule: an error past the task API's cap is refused by name
/// (the Rust worker cuts its own before it sends), and nothing is applied.
#[tokio::test]
async fn an_800_kb_error_is_refused_by_name_and_the_run_goes_on() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let run = e.run(&forged_step()).await;
    let task = lease(&e, "worker-a").await;
    let mut failed = report("worker-a", &task);
    failed["error"] = json!("E".repeat(800 * 1024));
    let path = format!("/v1/tasks/{}/fail", task["id"].as_str().unwrap());
    let (status, body) = e.post(&path, &failed).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("error: at most 65536 characters"), "{body}");
    let (_, now) = e.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(now["tasks"][0]["state"], "RUNNING", "nothing was applied: {now}");
    failed["error"] = json!("E".repeat(65_536));
    failed["retryable"] = json!(false);
    let (status, body) = e.post(&path, &failed).await;
    assert_eq!((status, &body["applied"]), (200, &json!(true)), "at the cap it is taken: {body}");
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["status"], "FAILED", "{done}");
    e.stop().await;
}

/// `POST /v1/runs` as a page of `origin` would send it to the name `host`.
async fn start_from_page(e: &Engine, origin: &str, host: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/runs", e.url()))
        .header("origin", origin)
        .header("host", host)
        .json(&json!({"workflow": "rebound", "input": {}}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn rebound() -> Value {
    json!({"name": "rebound", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]})
}

#[tokio::test]
async fn a_page_of_a_rebound_dns_name_cannot_drive_the_tokenless_api() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&rebound()).await;
    let (status, body) = start_from_page(&e, "http://evil.example:18933", "evil.example:18933").await;
    assert_eq!((status, body["error"]["code"].as_str()), (421, Some("host_not_allowed")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("evil.example"), "{body}");
    let (_, runs) = e.get("/v1/runs").await;
    assert_eq!(runs["runs"], json!([]), "nothing started");

    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for (path, want) in [("/v1/runs", 421), ("/ui/runs", 421), ("/metrics", 421), ("/healthz", 200), ("/readyz", 200)] {
        let resp = http.get(format!("{}{path}", e.url())).header("host", "evil.example:18933").send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want, "{path}");
    }
    let (status, body) = start_from_page(&e, "http://localhost:18933", "localhost:18933").await;
    assert_eq!(status, 201, "a loopback name is this coordinator's: {body}");
    e.stop().await;
}

#[tokio::test]
async fn a_host_name_the_operator_allowed_is_served_with_its_own_origin() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.allowed_hosts = vec!["evil.example:18933".into()],
        ..Default::default()
    })
    .await;
    e.register(&rebound()).await;
    let (status, body) = start_from_page(&e, "http://evil.example:18933", "evil.example:18933").await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = start_from_page(&e, "http://evil.example:18933", "evil.example:9999").await;
    assert_eq!(status, 421, "another port of an allowed name: {body}");
    let (status, body) = start_from_page(&e, "http://other.example:18933", "evil.example:18933").await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("origin_not_allowed")), "{body}");
    e.stop().await;
}

#[tokio::test]
async fn an_idempotency_key_reused_with_another_input_is_refused_not_answered_with_the_first_run() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&rebound()).await;
    let start = |input: &str| format!(r#"{{"workflow": "rebound", "idempotency_key": "order-1", "input": {input}}}"#);
    let (status, first) = e.post_raw("/v1/runs", &start(r#"{"amount": 100, "to": "alice"}"#)).await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = e.post_raw("/v1/runs", &start(r#"{"to": "alice", "amount": 1e2}"#)).await;
    assert_eq!((status, &again["id"]), (200, &first["id"]), "the same input, written otherwise: {again}");
    let (status, body) = e.post_raw("/v1/runs", &start(r#"{"amount": 100000, "to": "mallory"}"#)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("order-1"), "{body}");
    let (_, runs) = e.get("/v1/runs").await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(1), "{runs}");
    e.stop().await;
}

/// A browser that shows redirects instead of following them.
fn browser() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

const UI_TOKEN: &str = "ui-token-of-the-operator";

fn with_ui_token(c: &mut composer_coord::Config) {
    c.api_token = Some(UI_TOKEN.to_string());
}

#[tokio::test]
async fn a_login_whose_next_carries_a_header_is_sent_to_the_runs_not_a_500() {
    let e = Engine::with(EngineOptions { workers: 0, coordinator: with_ui_token, ..Default::default() }).await;
    let b = browser();
    for next in ["/ui\r\nSet-Cookie:x=1", "/ui/r\u{e9}sum\u{e9}", "/ui/../v1/runs"] {
        for token in [UI_TOKEN, "a-wrong-token-entirely"] {
            let resp =
                b.post(format!("{}/ui/login", e.url())).form(&[("token", token), ("next", next)]).send().await.unwrap();
            let status = resp.status().as_u16();
            let cookies: Vec<String> =
                resp.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect();
            assert!(!cookies.iter().any(|c| c.starts_with("x=")), "{next:?}: {cookies:?}");
            if token == UI_TOKEN {
                assert_eq!(status, 303, "{next:?}");
                assert_eq!(resp.headers()["location"], "/ui/runs", "{next:?}");
            } else {
                assert_eq!(status, 401, "{next:?}");
                assert!(!resp.text().await.unwrap().contains("Set-Cookie:x=1"), "{next:?}");
            }
        }
    }
    let page = b.get(format!("{}/ui/login?next=%2Fui%0d%0aSet-Cookie:x=1", e.url())).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("value=\"/ui/runs\""));
    e.stop().await;
}

#[tokio::test]
async fn a_link_cannot_put_its_own_words_on_a_runs_page() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let id = e.run(&rebound()).await;
    e.wait_for_run(id, T).await;
    let b = browser();
    let page = |msg: &'static str| {
        let url = format!("{}/ui/runs/{id}?msg={msg}", e.url());
        let b = b.clone();
        async move { b.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let forged = page("Your+session+expired%3A+log+in+at+evil.example").await;
    assert!(!forged.contains("evil.example") && !forged.contains("class=\"notice\""), "free text is not shown");
    assert!(page("retry-refused").await.contains("retry refused: the run&#39;s status does not allow it"));
    let done = b.post(format!("{}/ui/runs/{id}/cancel", e.url())).send().await.unwrap();
    assert_eq!(done.headers()["location"].to_str().unwrap(), format!("/ui/runs/{id}?msg=cancel-refused"));
    e.stop().await;
}

async fn metrics(e: &Engine, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("{}/metrics", e.url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn metrics_are_closed_to_a_caller_without_the_token_when_one_is_set() {
    let e = Engine::with(EngineOptions { workers: 0, coordinator: with_ui_token, ..Default::default() }).await;
    let (status, body) = metrics(&e, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"unauthorized\""), "a JSON error: {body}");
    assert_eq!(metrics(&e, Some("a-wrong-token-entirely")).await.0, 401);
    assert_eq!(metrics(&e, Some(UI_TOKEN)).await.0, 200, "the API token, when no metrics token is set");
    e.stop().await;

    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            with_ui_token(c);
            c.metrics_token = Some("a-token-for-prometheus".into());
        },
        ..Default::default()
    })
    .await;
    assert_eq!(metrics(&e, Some(UI_TOKEN)).await.0, 403, "the metrics token, once set, is the only one");
    let (status, body) = metrics(&e, Some("a-token-for-prometheus")).await;
    assert!(status == 200 && body.contains("composer_runs_started_total"), "{status}");
    let (status, _) = e.get("/healthz").await;
    assert_eq!(status, 200, "health stays open");
    e.stop().await;
}

/// Every workflow label value of `metric` in a /metrics text.
fn workflow_labels(text: &str, metric: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with(metric))
        .filter_map(|l| l.split("workflow=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_thousand_workflow_names_do_not_grow_metrics_past_a_bound() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let url = e.url();
    let mut starts = tokio::task::JoinSet::new();
    for batch in 0..8 {
        let url = url.clone();
        starts.spawn(async move {
            let http = reqwest::Client::new();
            for i in (batch..1000).step_by(8) {
                let name = format!("many-{i}");
                let spec = json!({"name": name, "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": i}}]});
                let r = http.post(format!("{url}/v1/workflows")).json(&spec).send().await.unwrap();
                assert!(r.status().is_success(), "{name}: {}", r.status());
                let r = http.post(format!("{url}/v1/runs")).json(&json!({"workflow": name})).send().await.unwrap();
                assert!(r.status().is_success(), "{name}: {}", r.status());
            }
        });
    }
    while let Some(done) = starts.join_next().await {
        done.unwrap();
    }
    let (status, text) = metrics(&e, None).await;
    assert_eq!(status, 200);
    let metric = "composer_run_duration_seconds_count{";
    let labels = workflow_labels(&text, metric);
    assert!(labels.len() <= composer_metrics::MAX_LABEL_VALUES + 1, "{} workflow labels", labels.len());
    assert!(labels.contains(composer_metrics::OTHER), "the rest are counted as other");
    // Unbounded, these runs alone wrote 1.9 MB (3.4 MB with their queues and
    // statuses); bounded, at most 200 workflows × 3 end statuses × 17 lines.
    assert!(text.len() < 1_500_000, "/metrics is {} bytes", text.len());
    e.stop().await;
}

/// Logs in to the UI and returns the `Set-Cookie` of the session.
async fn log_in(e: &Engine, extra: &[(&str, &str)]) -> String {
    let mut req = browser().post(format!("{}/ui/login", e.url())).form(&[("token", UI_TOKEN), ("next", "/ui/runs")]);
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 303);
    resp.headers()["set-cookie"].to_str().unwrap().to_string()
}

/// The status of `/ui/runs` for a browser sending `cookie`.
async fn runs_page_status(e: &Engine, cookie: &str) -> u16 {
    browser().get(format!("{}/ui/runs", e.url())).header("cookie", cookie).send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn a_stolen_ui_cookie_is_a_session_that_logout_revokes_and_time_ends_not_the_token() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            with_ui_token(c);
            c.ui_session_ttl = Duration::from_secs(2);
        },
        ..Default::default()
    })
    .await;
    let set = log_in(&e, &[]).await;
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=2"] {
        assert!(set.contains(flag), "{flag}: {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = set.split(';').next().unwrap().to_string();
    let id = cookie.strip_prefix("composer_session=").unwrap();
    assert_eq!(id.len(), 64, "256 random bits");
    let token_hex: String = UI_TOKEN.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(!id.contains(&token_hex) && !id.contains(UI_TOKEN));
    assert_eq!(runs_page_status(&e, &format!("composer_token={token_hex}")).await, 303, "the old cookie is nothing");

    let page = browser().get(format!("{}/ui/runs", e.url())).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["cache-control"], "no-store");
    // Another site's page cannot sign the user out.
    let forged = browser()
        .post(format!("{}/ui/logout", e.url()))
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert_eq!(runs_page_status(&e, &cookie).await, 200, "a forged logout revokes nothing");
    let logout = browser().post(format!("{}/ui/logout", e.url())).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(logout.status(), 303);
    assert_eq!(runs_page_status(&e, &cookie).await, 303, "revoked by logout");

    let cookie = log_in(&e, &[]).await.split(';').next().unwrap().to_string();
    assert_eq!(runs_page_status(&e, &cookie).await, 200);
    eventually(Duration::from_secs(10), "the session to end after its 2s", || async {
        (runs_page_status(&e, &cookie).await == 303).then_some(())
    })
    .await;
    let behind_tls = log_in(&e, &[("x-forwarded-proto", "https")]).await;
    assert!(behind_tls.contains("; Secure"), "{behind_tls}");
    e.stop().await;
}

#[tokio::test]
async fn guessing_the_ui_token_is_slowed_to_ten_tries_a_minute() {
    let e = Engine::with(EngineOptions { workers: 0, coordinator: with_ui_token, ..Default::default() }).await;
    let guess = |token: &'static str| {
        let url = format!("{}/ui/login", e.url());
        async move { browser().post(url).form(&[("token", token), ("next", "/ui/runs")]).send().await.unwrap() }
    };
    for _ in 0..10 {
        assert_eq!(guess("a-wrong-guess-of-the-token").await.status(), 401);
    }
    let slowed = guess("a-wrong-guess-of-the-token").await;
    assert_eq!(slowed.status(), 429);
    let wait: u64 = slowed.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(slowed.text().await.unwrap().contains("LOGIN_FAILURES_PER_ADDRESS"));
    assert_eq!(guess(UI_TOKEN).await.status(), 429, "not even checked until the minute is over");
    e.stop().await;
}

#[tokio::test]
async fn run_data_in_api_answers_is_not_kept_by_caches() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let id = e.run(&rebound()).await;
    for path in [format!("/v1/runs/{id}"), "/v1/runs".to_string(), format!("/ui/runs/{id}")] {
        let resp = reqwest::get(format!("{}{path}", e.url())).await.unwrap();
        assert_eq!(resp.headers()["cache-control"], "no-store", "{path}");
    }
    e.stop().await;
}

#[test]
fn a_token_shorter_than_sixteen_characters_is_refused_at_start_naming_it() {
    let mut c = composer_coord::Config::new("postgres://unused", "redis://unused");
    c.api_token = Some("hunter2".into());
    let err = c.validated().unwrap_err().to_string();
    assert!(err.contains("COMPOSER_API_TOKEN") && err.contains("at least 16 characters"), "{err}");
}
