//! The web UI's pages over real services (the browser test, in
//! `tests/ui/browser_test.py`, clicks through them in Chromium): what they
//! show, and what they refuse.

use std::time::Duration;

use composer_testkit::{Engine, EngineOptions, FakeHttp};
use serde_json::json;

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "ui-token-0123456789";

fn browser() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

#[tokio::test]
async fn pages_need_the_token_login_sets_an_httponly_strict_cookie_and_a_wrong_token_is_refused() {
    let e =
        Engine::with(EngineOptions { coordinator: |c| c.api_token = Some(TOKEN.to_string()), ..Default::default() })
            .await;
    let b = browser();
    let resp = b.get(format!("{}/ui/runs?status=FAILED", e.url())).send().await.unwrap();
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/ui/login?next=%2Fui%2Fruns%3Fstatus%3DFAILED");
    let wrong =
        b.post(format!("{}/ui/login", e.url())).form(&[("token", "nope"), ("next", "/ui/runs")]).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let ok = b
        .post(format!("{}/ui/login", e.url()))
        .form(&[("token", TOKEN), ("next", "https://evil.example/")])
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 303);
    assert_eq!(ok.headers()["location"], "/ui/runs", "never sent to another site");
    let set = ok.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/ui"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    assert!(cookie.starts_with("composer_session=") && !cookie.contains(TOKEN), "a session, not the token: {set}");
    let page = b.get(format!("{}/ui/runs", e.url())).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let forged = b.get(format!("{}/ui/runs", e.url())).header("cookie", "composer_session=00").send().await.unwrap();
    assert_eq!(forged.status(), 303);
    e.stop().await;
}

#[tokio::test]
async fn a_runs_data_is_shown_as_text_and_a_form_from_another_site_changes_nothing() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // The run's data (here, the step's input) carries markup.
    let spec = json!({"name": "shows", "nodes": [
        {"id": "call", "type": "HTTP", "retry": {"max_attempts": 1},
         "config": {"method": "POST", "url": http.url("/bad/x"), "body": {"note": "<img src=x onerror=alert(1)>"}}}]});
    let id = e.run(&spec).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "FAILED");
    let b = browser();
    let page = b.get(format!("{}/ui/runs/{id}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("class=\"node failed\" data-node=\"call\""), "the failed node is drawn failed");
    assert!(!page.contains("<img src=x") && page.contains("&lt;img src=x onerror=alert(1)&gt;"), "escaped");
    assert!(page.contains("button type=\"submit\" class=\"retry\""));

    let cancel = b
        .post(format!("{}/ui/runs/{id}/retry", e.url()))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 403);
    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(run["status"], "FAILED", "nothing changed");
    let retried = b.post(format!("{}/ui/runs/{id}/retry", e.url())).send().await.unwrap();
    assert_eq!(retried.status(), 303);
    assert!(retried.headers()["location"].to_str().unwrap().contains("msg=retry"));
    for path in
        ["/ui/workflows", "/ui/workflows/shows", "/ui/schedules", "/ui/runs?status=FAILED&since=2020-01-01T00:00"]
    {
        let resp = b.get(format!("{}{path}", e.url())).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    for (path, status) in [
        ("/ui/runs/not-a-uuid", 400),
        ("/ui/runs/00000000-0000-7000-8000-000000000000", 404),
        ("/ui/runs?status=NOPE", 400),
        ("/ui/runs?since=yesterday", 400),
        ("/ui/workflows/none", 404),
    ] {
        let resp = b.get(format!("{}{path}", e.url())).send().await.unwrap();
        assert_eq!(resp.status(), status, "{path}");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_run_page_draws_the_edges_taken_links_its_failure_handler_and_resolves_a_step_in_doubt() {
    let mut e =
        Engine::with(EngineOptions { workers: 0, lease_ttl: Duration::from_secs(1), ..Default::default() }).await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "tell", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    let spec = json!({"name": "declined", "on_failure": {"workflow": "tell"}, "nodes": [
        {"id": "charge", "type": "HTTP", "config": {"url": http.url("/status/402/c")}, "retry": {"max_attempts": 1}},
        {"id": "refund", "type": "HTTP", "config": {"url": http.url("/ok/r")}},
        {"id": "stop", "type": "FAIL", "config": {"message": "refunded"}}],
        "edges": [{"from": "charge", "to": "refund", "on": "failure"}, {"from": "refund", "to": "stop"}]});
    e.register(&spec).await;
    e.start_worker("w", 2).await;
    let id = e.start_run("declined", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let handler = run["failure_handler_run_ids"][0].as_str().unwrap().to_string();
    let b = browser();
    let page = b.get(format!("{}/ui/runs/{id}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("class=\"edge failure taken\""), "the failure edge taken is drawn so");
    assert!(page.contains(&format!("its failure handler: <a href=\"/ui/runs/{handler}\"")), "links its handler");
    let handler_page = b.get(format!("{}/ui/runs/{handler}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(handler_page.contains(&format!("failure handler of <a href=\"/ui/runs/{id}\"")), "and back");

    // An at-most-once step whose worker died waits IN_DOUBT with its forms.
    let mut once = composer_testkit::http_node("pay", &http.url("/ok/pay"), 1);
    once["delivery"] = json!("at_most_once");
    e.register(&json!({"name": "once", "nodes": [once]})).await;
    e.workers.pop().unwrap().stop().await;
    let id = e.start_run("once", json!({})).await;
    let run = e.wait_until(id, T, |r| r["tasks"][0]["state"] == "PENDING").await;
    let task = run["tasks"][0]["id"].as_str().unwrap().parse().unwrap();
    let leases = composer_store::leases::LeaseManager::new(e.db.pool());
    assert!(leases.acquire(id, task, "gone", Duration::from_millis(200), 1).await.unwrap().is_granted());
    e.wait_until(id, T, |r| r["tasks"][0]["state"] == "IN_DOUBT").await;
    let page = b.get(format!("{}/ui/runs/{id}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("class=\"badge doubt\">IN_DOUBT") && page.contains("class=\"resolve-completed\""), "{page}");
    let bad = b
        .post(format!("{}/ui/runs/{id}/tasks/pay/resolve", e.url()))
        .form(&[("outcome", "completed"), ("output", "{not json")])
        .send()
        .await
        .unwrap();
    assert!(bad.headers()["location"].to_str().unwrap().ends_with("msg=resolve-invalid"));
    let done = b
        .post(format!("{}/ui/runs/{id}/tasks/pay/resolve", e.url()))
        .form(&[("outcome", "completed"), ("output", "{\"by\": \"hand\"}")])
        .send()
        .await
        .unwrap();
    assert!(done.headers()["location"].to_str().unwrap().ends_with("msg=resolve-done"));
    let run = e.wait_for_run(id, T).await;
    assert_eq!((run["status"].as_str(), &run["output"]["pay"]), (Some("SUCCEEDED"), &json!({"by": "hand"})));
    e.stop().await;
}
