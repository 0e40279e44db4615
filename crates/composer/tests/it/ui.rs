//! The web UI's pages over real services (the browser test, in
//! `tests/ui/browser_test.py`, clicks through them in Chromium): what they
//! show, and what they refuse.

use std::time::Duration;

use composer_testkit::{eventually, Engine, EngineOptions, FakeHttp};
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
    assert!(page.contains("formaction=\"/ui/runs/") && page.contains("class=\"retry\""));

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

/// The token-less UI accepted a cross-site form's POST that had a `Referer`
/// and `Sec-Fetch-Site: cross-site` but no `Origin`.
#[tokio::test]
async fn a_cross_site_form_without_an_origin_is_refused_by_its_referer_or_sec_fetch_site() {
    let e = Engine::start().await;
    let id = e.run(&json!({"name": "f", "nodes": [{"id": "x", "type": "FAIL", "config": {"message": "no"}}]})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "FAILED");
    let b = browser();
    let retry = format!("{}/ui/runs/{id}/retry", e.url());
    for headers in [
        vec![("referer", "https://evil.example/page"), ("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("referer", "https://evil.example/page")],
    ] {
        let mut req = b.post(&retry);
        for (k, v) in &headers {
            req = req.header(*k, *v);
        }
        assert_eq!(req.send().await.unwrap().status(), 403, "{headers:?}");
        let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
        assert_eq!(run["status"], "FAILED", "nothing changed: {headers:?}");
    }
    let own = format!("{}/ui/runs/{id}", e.url());
    let same = b.post(&retry).header("referer", own).header("sec-fetch-site", "same-origin").send().await.unwrap();
    assert_eq!(same.status(), 303, "the page's own form");
    // A link from another site (a chat, an email) to a page or the API is
    // followed: it changes nothing.
    for path in [format!("/ui/runs/{id}"), format!("/v1/runs/{id}")] {
        let link = b.get(format!("{}{path}", e.url())).header("sec-fetch-site", "cross-site");
        let followed = link.header("referer", "https://chat.example/").send().await.unwrap();
        assert_eq!(followed.status(), 200, "{path}");
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

#[tokio::test]
async fn the_repair_forms_act_with_who_and_why_and_refuse_what_is_wrong() {
    let e = Engine::start().await;
    let b = browser();
    e.register(&json!({"name": "awaits", "tags": {"customer": "${ .input.customer }"}, "nodes": [
        {"id": "approval", "type": "WAIT_FOR_EVENT", "config": {"event": "approved", "key": "${ .input.customer }"}},
        {"id": "done", "type": "TRANSFORM", "config": {"output": "${ .nodes.approval.output }"}}],
        "edges": [{"from": "approval", "to": "done"}]}))
        .await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(e.start_run("awaits", json!({"customer": n.to_string()})).await);
    }
    for id in &ids {
        e.wait_until(*id, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    }
    let url = |p: &str| format!("{}{p}", e.url());
    let page = b.get(url(&format!("/ui/runs/{}", ids[0]))).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("class=\"explain\"") && page.contains("approved"), "why it waits: {page}");
    assert!(page.contains("class=\"tag\"") && page.contains("customer=0"), "its tags");
    assert!(page.contains("details class=\"complete\"") && page.contains("svg class=\"timeline\""));

    // Complete by hand: bad JSON is refused, a good output ends the step and the run goes on.
    let complete = url(&format!("/ui/runs/{}/tasks/approval/complete", ids[0]));
    let bad = b.post(&complete).form(&[("output", "{nope")]).send().await.unwrap();
    assert!(bad.headers()["location"].to_str().unwrap().ends_with("msg=complete-invalid"));
    let long = "x".repeat(1025);
    let bad = b.post(&complete).form(&[("output", "1"), ("reason", long.as_str())]).send().await.unwrap();
    assert!(bad.headers()["location"].to_str().unwrap().ends_with("msg=reason-invalid"));
    let foreign =
        b.post(&complete).header("origin", "https://evil.example").form(&[("output", "1")]).send().await.unwrap();
    assert_eq!(foreign.status(), 403);
    let ok = b.post(&complete).form(&[("output", "{\"by\": \"ops\"}"), ("reason", "phoned")]).send().await.unwrap();
    assert!(ok.headers()["location"].to_str().unwrap().ends_with("msg=complete-done"));
    let run = e.wait_for_run(ids[0], T).await;
    assert_eq!(run["output"]["done"], json!({"by": "ops"}), "{run}");
    let page = b.get(url(&format!("/ui/runs/{}", ids[0]))).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("<td class=\"actor\">anonymous</td><td class=\"reason\">phoned</td>"), "who and why shown");

    // Rerun: a step it never reached, no step, or a SUCCEEDED run without consent are refused.
    let rerun = url(&format!("/ui/runs/{}/rerun", ids[0]));
    for form in [vec![("from", "nowhere")], vec![("reason", "x")], vec![("from", "done"), ("input", "{bad")]] {
        let r = b.post(&rerun).form(&form).send().await.unwrap();
        assert!(r.headers()["location"].to_str().unwrap().ends_with("msg=rerun-invalid"), "{form:?}");
    }
    let r = b.post(&rerun).form(&[("from", "done")]).send().await.unwrap();
    assert!(r.headers()["location"].to_str().unwrap().ends_with("msg=rerun-refused"));
    let r = b
        .post(&rerun)
        .form(&[("from", "done"), ("allow_completed", "1"), ("input", "{\"customer\": \"0\", \"again\": true}")])
        .send()
        .await
        .unwrap();
    assert!(r.headers()["location"].to_str().unwrap().ends_with("msg=rerun-done"));
    assert_eq!(e.history(ids[0], "RunRerun").await.len(), 1);

    // The list: by tag, the chosen runs, and a bulk job over the filter.
    let listed = b.get(url("/ui/runs?tag=customer%3D2")).send().await.unwrap().text().await.unwrap();
    assert_eq!(listed.matches("name=\"run\" value=").count(), 1, "one run has customer=2");
    for (q, status) in [("/ui/runs?tag=customer", 400), ("/ui/runs?tag=b%20d%3D1", 400)] {
        assert_eq!(b.get(url(q)).send().await.unwrap().status(), status, "{q}");
    }
    let act = url("/ui/runs/act");
    let chosen = [
        ("action", "cancel"),
        ("scope", "selected"),
        ("reason", "dup"),
        ("run", &ids[1].to_string()),
        ("run", &ids[0].to_string()),
    ];
    let r = b.post(&act).form(&chosen).send().await.unwrap();
    assert_eq!(r.headers()["location"], "/ui/runs?action=cancel&acted=1&refused=1", "the finished run refuses");
    let foreign = b.post(&act).header("origin", "https://evil.example").form(&chosen).send().await.unwrap();
    assert_eq!(foreign.status(), 403);
    for form in [
        vec![("action", "delete"), ("scope", "selected"), ("run", "x")],
        vec![("action", "cancel"), ("scope", "filter")],
        vec![("action", "rerun"), ("scope", "selected"), ("run", &ids[2].to_string())],
    ] {
        assert_eq!(b.post(&act).form(&form).send().await.unwrap().status(), 400, "{form:?}");
    }
    let every = [("action", "cancel"), ("scope", "filter"), ("f_workflow", "awaits"), ("f_status", "RUNNING")];
    let r = b.post(&act).form(&every).send().await.unwrap();
    let job = r.headers()["location"].to_str().unwrap().to_string();
    assert!(job.starts_with("/ui/bulk/"), "{job}");
    for id in &ids[2..] {
        assert_eq!(e.wait_for_run(*id, T).await["status"], "CANCELLED");
    }
    let page = b.get(url(&job)).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("2 acted on"), "{page}");
    assert_eq!(b.get(url("/ui/bulk/00000000-0000-7000-8000-000000000000")).send().await.unwrap().status(), 404);

    for path in ["/ui/overview", "/ui/queues", "/ui/overview?fragment=1"] {
        let resp = b.get(url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("CANCELLED") || path == "/ui/queues", "{path}: {text}");
    }
    e.stop().await;
}

#[tokio::test]
async fn the_events_page_shows_webhooks_and_events_with_their_runs_and_the_schedules_page_backfills() {
    let e = Engine::start().await;
    e.register(&json!({"name": "on_signup", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}],
        "triggers": [{"event": "user.<signup>"}, {"event": "user.<signup>", "input": "${ error(\"<b>boom</b>\") }"}]}))
        .await;
    assert_eq!(
        e.post("/v1/webhooks", &json!({"name": "crm", "scheme": "github", "secret": "UI_NOT_SET"})).await.0,
        201
    );
    let (_, sent) =
        e.post("/v1/events", &json!({"name": "user.<signup>", "id": "<i>e1</i>", "payload": {"x": "<script>"}})).await;
    let run = sent["started_runs"][0]["run_id"].as_str().unwrap().to_string();
    let b = browser();
    let page = b.get(format!("{}/ui/events", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("/v1/webhooks/crm") && page.contains("COMPOSER_WEBHOOK_SECRET_UI_NOT_SET"), "{page}");
    assert!(page.contains("not set on this coordinator"), "the missing secret is said");
    assert!(page.contains(&format!("href=\"/ui/runs/{run}\"")), "the run the event started");
    assert!(page.contains("on_signup: failed"), "the trigger that failed");
    for raw in ["<script>", "<i>e1</i>", "<b>boom", "user.<signup>"] {
        assert!(!page.contains(raw), "{raw} is shown as text");
    }
    let run_page = b.get(format!("{}/ui/runs/{run}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(run_page.contains("started by event"), "the run says what started it");
    let one = b.get(format!("{}/ui/events?name=nothing", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(one.contains("No events in the last week."));

    // The schedules page's backfill form: queued, counted, and refused when wrong.
    e.register(&json!({"name": "hourly_ui", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    let spec = json!({"id": "hourly_ui", "workflow": "hourly_ui", "cron": "0 * * * *", "paused": true});
    assert_eq!(e.post("/v1/schedules", &spec).await.0, 201);
    let from = (chrono::Utc::now() - chrono::Duration::hours(5)).format("%Y-%m-%dT%H:%M").to_string();
    let to = (chrono::Utc::now() - chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M").to_string();
    let form = |from: &str, to: &str| {
        b.post(format!("{}/ui/schedules/hourly_ui/backfill", e.url())).form(&[
            ("from", from.to_string()),
            ("to", to.to_string()),
            ("overlap", "buffer_all".to_string()),
        ])
    };
    let done = form(&from, &to).send().await.unwrap();
    assert_eq!(done.status(), 303);
    assert_eq!(done.headers()["location"], "/ui/schedules?msg=backfill-done&queued=4");
    let page = b
        .get(format!("{}/ui/schedules?msg=backfill-done&queued=4", e.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("(4 queued)") && page.contains("4 queued"), "{page}");
    let refused = form(&to, &from).send().await.unwrap();
    assert_eq!(refused.headers()["location"], "/ui/schedules?msg=backfill-invalid");
    let foreign = form(&from, &to).header("origin", "https://evil.example").send().await.unwrap();
    assert_eq!(foreign.status(), 403);
    assert_eq!(e.get("/v1/schedules/hourly_ui").await.1["backfill_queued"], 4, "nothing more queued");
    e.stop().await;
}

#[tokio::test]
async fn the_limits_page_shows_each_keys_use_sets_and_deletes_and_a_run_page_says_what_holds_a_step() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "held_ui", "nodes": [{"id": "call", "type": "HTTP",
        "config": {"url": http.url("/slow/2000/held")}, "limits": [{"key": "<crm>", "concurrency": 1}]}]}))
        .await;
    let first = e.start_run("held_ui", json!({})).await;
    e.wait_until(first, T, |r| r["tasks"][0]["state"] == "RUNNING").await;
    let second = e.start_run("held_ui", json!({})).await;
    let b = browser();
    let run_page = b.get(format!("{}/ui/runs/{second}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(run_page.contains("held by its limit") && run_page.contains("every slot of its concurrency"), "{run_page}");
    let page = b.get(format!("{}/ui/limits", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("&lt;crm&gt;") && !page.contains("<crm>"), "the key is shown as text: {page}");
    assert!(page.contains("<td>1</td><td>1</td>"), "one in use, one waiting: {page}");

    let form = |fields: &[(&str, &str)]| {
        let fields: Vec<(String, String)> = fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        b.post(format!("{}/ui/limits", e.url())).form(&fields)
    };
    let done = form(&[("key", "partner:1"), ("rate", "10/1s"), ("burst", "20")]).send().await.unwrap();
    assert_eq!(done.headers()["location"], "/ui/limits?msg=limit-done");
    let set = e.get("/v1/limits/partner:1").await.1;
    assert_eq!(
        (set["rate"].clone(), set["burst"].clone(), set["set_by"].clone()),
        (json!("10/1s"), json!(20), json!("api"))
    );
    // The form's change is in the audit log, and its page shows it.
    let audit = b.get(format!("{}/ui/audit", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(audit.contains("POST <code>/ui/limits</code>") && audit.contains("partner:1"), "{audit}");
    assert!(audit.contains("anonymous") && audit.contains("<td>303</td>"), "who, and the answer: {audit}");
    for bad in [
        vec![("key", "k"), ("rate", "fast")],
        vec![("key", ""), ("concurrency", "2")],
        vec![("key", "k"), ("burst", "-1"), ("rate", "1/1s")],
        // A key a URL path cannot carry, as the API refuses it.
        vec![("key", ".."), ("concurrency", "2")],
        vec![("key", "."), ("concurrency", "2")],
    ] {
        let refused = form(&bad).send().await.unwrap();
        assert_eq!(refused.headers()["location"], "/ui/limits?msg=limit-invalid", "{bad:?}");
    }
    let foreign =
        form(&[("key", "partner:1"), ("delete", "1")]).header("origin", "https://evil.example").send().await.unwrap();
    assert_eq!(foreign.status(), 403);
    assert_eq!(e.get("/v1/limits/partner:1").await.0, 200, "a form from another site deletes nothing");
    let deleted = form(&[("key", "partner:1"), ("delete", "1")]).send().await.unwrap();
    assert_eq!(deleted.headers()["location"], "/ui/limits?msg=limit-deleted");
    assert_eq!(e.get("/v1/limits/partner:1").await.0, 404);
    for id in [first, second] {
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    e.stop().await;
}

/// U+202E (right-to-left override) in a run's error, an event and a limit's
/// key showed raw, turning what follows it around on the page.
#[tokio::test]
async fn a_bidi_override_shows_by_name_on_the_run_events_and_limits_pages() {
    const RLO: &str = "\u{202E}";
    let e = Engine::start().await;
    let id = e
        .run(&json!({"name": "bidi", "nodes": [
            {"id": "x", "type": "FAIL", "config": {"message": format!("invoice{RLO}fdp.exe")}}]}))
        .await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "FAILED");
    let (status, _) = e.post("/v1/events", &json!({"name": format!("ev{RLO}x"), "key": format!("k{RLO}")})).await;
    assert_eq!(status, 200);
    let form = [("key", format!("lim{RLO}it")), ("concurrency", "2".to_string())];
    let b = browser();
    let set = b.post(format!("{}/ui/limits", e.url())).form(&form).send().await.unwrap();
    assert_eq!(set.headers()["location"], "/ui/limits?msg=limit-done");
    for (path, shown) in [
        (format!("/ui/runs/{id}"), "invoice[U+202E]fdp.exe"),
        ("/ui/events".to_string(), "ev[U+202E]x"),
        ("/ui/limits".to_string(), "lim[U+202E]it"),
    ] {
        let page = b.get(format!("{}{path}", e.url())).send().await.unwrap().text().await.unwrap();
        assert!(page.contains(shown), "{path}: {shown} not in the page");
        assert!(!page.contains(RLO), "{path}: the override is never in the page");
    }
    e.stop().await;
}

/// Issue 51: each worker was listed once per stream shard, and one
/// long-polling for work as "last read 146 s ago".
#[tokio::test]
async fn the_queues_page_lists_a_worker_once_per_queue_and_a_long_poll_as_waiting_for_work() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let id =
        e.run(&json!({"name": "calls", "nodes": [composer_testkit::http_node("call", &http.url("/ok/c"), 1)]})).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    let worker = e.workers[0].id.clone();
    let b = browser();
    let url = format!("{}/ui/queues?fragment=1", e.url());
    // Its poll waits between short reads: the page sees it waiting almost always.
    let row = eventually(T, "the worker shown waiting for work", || async {
        let page = b.get(&url).send().await.unwrap().text().await.unwrap();
        let rows: Vec<&str> = page.split("<tr data-worker=").filter(|r| r.contains("<td>http</td>")).collect();
        let mine: Vec<&str> = rows.iter().copied().filter(|r| r.contains(&format!("<code>{worker}</code>"))).collect();
        // One row, not one per stream shard (the engine has two).
        match mine[..] {
            [row] if row.contains("waiting for work") => Ok(row.to_string()),
            _ => Err(page),
        }
    })
    .await;
    assert!(row.contains("<td class=\"poll\">"), "{row}");
    let page = b.get(&url).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("on that coordinator's page only"), "says whose polls it sees");
    e.stop().await;
}

/// Issue 51: an event kept for a step that began to wait after it came
/// completed that step, and the events page said "waiting steps 0".
#[tokio::test]
async fn the_events_page_counts_a_step_that_began_to_wait_after_its_event_came() {
    let e = Engine::start().await;
    e.register(&json!({"name": "awaits_ui", "nodes": [
        {"id": "approval", "type": "WAIT_FOR_EVENT", "config": {"event": "approved", "key": "${ .input.k }"}}]}))
        .await;
    let early = e.post("/v1/events", &json!({"name": "approved", "key": "early", "id": "ev-early"})).await.1;
    assert_eq!(early["delivered_to_waiters"], 0, "nothing waited yet: {early}");
    let later = e.start_run("awaits_ui", json!({"k": "early"})).await;
    let first = e.start_run("awaits_ui", json!({"k": "first"})).await;
    e.wait_until(first, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let sent = e.post("/v1/events", &json!({"name": "approved", "key": "first", "id": "ev-first"})).await.1;
    assert_eq!(sent["delivered_to_waiters"], 1, "{sent}");
    for id in [later, first] {
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    let listed = e.get("/v1/events?name=approved").await.1;
    let counts: Vec<(String, i64)> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["id"].as_str().unwrap().to_string(), v["delivered_to_waiters"].as_i64().unwrap()))
        .collect();
    assert_eq!(counts, [("ev-first".to_string(), 1), ("ev-early".to_string(), 1)], "the API counts both");
    let page = browser().get(format!("{}/ui/events", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("<th>Steps completed</th>"), "{page}");
    for id in ["ev-first", "ev-early"] {
        let row = page.split("<tr>").find(|r| r.contains(&format!("<code>{id}</code>"))).unwrap();
        assert!(row.contains("<td class=\"n completed\">1</td>"), "{id}: {row}");
    }
    e.stop().await;
}

/// Issue 51: a running run's header read "· finished" with nothing after it.
#[tokio::test]
async fn a_running_runs_header_says_when_it_started_and_only_an_ended_one_when_it_finished() {
    let e = Engine::start().await;
    e.register(&json!({"name": "header_ui", "nodes": [
        {"id": "approval", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "h"}}]}))
        .await;
    let id = e.start_run("header_ui", json!({})).await;
    e.wait_until(id, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let b = browser();
    let status =
        |page: String| page.split("<p class=\"status\">").nth(1).unwrap().split("</p>").next().unwrap().to_string();
    let running = status(b.get(format!("{}/ui/runs/{id}", e.url())).send().await.unwrap().text().await.unwrap());
    assert!(running.contains("RUNNING") && running.contains(" · started 20"), "{running}");
    assert!(!running.contains("finished"), "{running}");
    assert_eq!(e.post("/v1/events", &json!({"name": "go", "key": "h"})).await.0, 200);
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    let ended = status(b.get(format!("{}/ui/runs/{id}", e.url())).send().await.unwrap().text().await.unwrap());
    assert!(ended.contains(" · started 20") && ended.contains(" · finished 20"), "{ended}");
    e.stop().await;
}

/// Issue 51: "Log out" showed on a coordinator with no API token, which has
/// no login.
#[tokio::test]
async fn log_out_shows_only_in_a_session() {
    let b = browser();
    let open = Engine::start().await;
    for path in ["/ui/runs", "/ui/queues", "/ui/runs/not-a-uuid"] {
        let page = b.get(format!("{}{path}", open.url())).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("<nav>") && !page.contains("Log out"), "{path}: {page}");
    }
    open.stop().await;
    let e =
        Engine::with(EngineOptions { coordinator: |c| c.api_token = Some(TOKEN.to_string()), ..Default::default() })
            .await;
    let login = b.get(format!("{}/ui/login", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(login.contains("<nav>") && !login.contains("Log out"), "not logged in yet: {login}");
    let ok = b.post(format!("{}/ui/login", e.url())).form(&[("token", TOKEN), ("next", "/ui/runs")]).send();
    let ok = ok.await.unwrap();
    let cookie = ok.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let page = b.get(format!("{}/ui/runs", e.url())).header("cookie", &cookie).send().await.unwrap();
    assert!(page.text().await.unwrap().contains("class=\"logout\">Log out</button>"), "in a session");
    e.stop().await;
}

/// Issue 51: a node's id of up to 22 characters was drawn whole, wider
/// than its box.
#[tokio::test]
async fn a_long_node_label_is_cut_to_its_box_and_shown_whole_in_its_title() {
    let e = Engine::start().await;
    let long = "W".repeat(30);
    e.register(&json!({"name": "wide_ui", "nodes": [{"id": long, "type": "TRANSFORM", "config": {"output": 1}}]}))
        .await;
    let page = browser().get(format!("{}/ui/workflows/wide_ui", e.url())).send().await.unwrap().text().await.unwrap();
    let label = page.split("class=\"id\">").nth(1).and_then(|s| s.split("</text>").next()).unwrap();
    // DejaVu Sans Bold draws W 1.103 em wide: at 13 px, 11 and the ellipsis fill the 180 px inside the box.
    assert!(label.ends_with('…') && label.chars().count() <= 12, "{label}");
    assert!(page.contains(&format!("<title>{long} (TRANSFORM): NOT REACHED</title>")), "the whole id on hover");
    e.stop().await;
}

/// Issue 51: the runs page's button that acts on the ticked runs was called
/// "The chosen runs".
#[tokio::test]
async fn the_runs_pages_act_buttons_say_what_they_do() {
    let e = Engine::start().await;
    let b = browser();
    let page = b.get(format!("{}/ui/runs?workflow=any", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("value=\"selected\">Apply to the checked runs</button>"), "{page}");
    assert!(page.contains("Apply to every run that matches (a bulk job)</button>"), "{page}");
    assert!(!page.contains("The chosen runs"));
    e.stop().await;
}

/// Issue 55: the pages are a namespace's, chosen on the namespaces page (a
/// cookie the door reads); a session, kept by the cluster, works in every
/// namespace; nothing of one namespace shows in another's pages; a cookie
/// naming a namespace that is gone sends the browser to choose again.
#[tokio::test]
async fn the_pages_show_the_chosen_namespace_alone_and_the_namespaces_page_creates_shows_and_deletes() {
    let e =
        Engine::with(EngineOptions { coordinator: |c| c.api_token = Some(TOKEN.to_string()), ..Default::default() })
            .await;
    let b = browser();
    let api = |method: reqwest::Method, path: &str, ns: &str| {
        b.request(method, format!("{}{path}", e.url())).bearer_auth(TOKEN).header("composer-namespace", ns)
    };
    let made = api(reqwest::Method::POST, "/v1/namespaces", "default").json(&json!({"name": "ui-alpha"})).send();
    assert_eq!(made.await.unwrap().status(), 201);
    let mut runs = Vec::new();
    for ns in ["default", "ui-alpha"] {
        let spec = json!({"name": format!("shown-in-{ns}"), "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
        assert!(api(reqwest::Method::POST, "/v1/workflows", ns)
            .json(&spec)
            .send()
            .await
            .unwrap()
            .status()
            .is_success());
        let start = json!({"workflow": format!("shown-in-{ns}"), "input": {}});
        let run: serde_json::Value =
            api(reqwest::Method::POST, "/v1/runs", ns).json(&start).send().await.unwrap().json().await.unwrap();
        runs.push(run["id"].as_str().unwrap().to_string());
    }
    let login = b.post(format!("{}/ui/login", e.url())).form(&[("token", TOKEN), ("next", "/ui/runs")]).send();
    let login = login.await.unwrap();
    let session = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let page = |path: &str, ns: Option<&str>| {
        let cookie = match ns {
            Some(ns) => format!("{session}; composer_namespace={ns}"),
            None => session.clone(),
        };
        b.get(format!("{}{path}", e.url())).header("cookie", cookie).send()
    };
    let text = |r: reqwest::Response| async move { (r.status().as_u16(), r.text().await.unwrap()) };
    let (status, default) = text(page("/ui/runs", None).await.unwrap()).await;
    assert_eq!(status, 200);
    assert!(default.contains(&runs[0]) && !default.contains(&runs[1]), "default shows its run alone: {default}");
    let (status, alpha) = text(page("/ui/runs", Some("ui-alpha")).await.unwrap()).await;
    assert_eq!(status, 200, "the session is the cluster's: {alpha}");
    assert!(alpha.contains(&runs[1]) && !alpha.contains(&runs[0]), "ui-alpha shows its run alone: {alpha}");
    assert!(alpha.contains("class=\"namespace\" href=\"/ui/namespaces\" title=\"the namespace shown\">ui-alpha</a>"));
    // Its forms act in it, whatever another tab chooses meanwhile.
    assert!(alpha.contains("action=\"/ui/runs/act?namespace=ui-alpha\""), "{alpha}");
    assert!(alpha.contains("<input type=\"hidden\" name=\"namespace\" value=\"ui-alpha\">"), "{alpha}");
    for (path, ns) in [(format!("/ui/runs/{}", runs[1]), None), (format!("/ui/runs/{}", runs[0]), Some("ui-alpha"))] {
        assert_eq!(page(&path, ns).await.unwrap().status(), 404, "{path} in {ns:?}");
    }
    let (_, workflows) = text(page("/ui/workflows", Some("ui-alpha")).await.unwrap()).await;
    assert!(workflows.contains("shown-in-ui-alpha") && !workflows.contains("shown-in-default"), "{workflows}");

    // The namespaces page: each with its use, the one shown marked.
    let (status, list) = text(page("/ui/namespaces", Some("ui-alpha")).await.unwrap()).await;
    assert_eq!(status, 200, "{list}");
    assert!(list.contains("data-namespace=\"default\"") && list.contains("data-namespace=\"ui-alpha\""), "{list}");
    assert!(list.contains("now <code>ui-alpha</code>") && list.contains("Create a namespace"), "{list}");
    let form = |path: &str, fields: &[(&str, &str)]| {
        b.post(format!("{}{path}", e.url())).header("cookie", session.clone()).form(fields).send()
    };
    let chosen = form("/ui/namespaces/switch", &[("namespace", "ui-alpha")]).await.unwrap();
    assert_eq!((chosen.status().as_u16(), chosen.headers()["location"].to_str().unwrap()), (303, "/ui/runs"));
    let set = chosen.headers()["set-cookie"].to_str().unwrap();
    assert!(set.starts_with("composer_namespace=ui-alpha;") && set.contains("SameSite=Strict"), "{set}");
    for nothing in ["ui-nothing", "../x", ""] {
        let refused = form("/ui/namespaces/switch", &[("namespace", nothing)]).await.unwrap();
        assert!(refused.headers().get("set-cookie").is_none(), "{nothing}");
        assert_eq!(refused.headers()["location"], "/ui/namespaces?msg=namespace-refused", "{nothing}");
    }

    // Created and deleted by the page's forms; a cookie naming it then sends the browser back to choose.
    let created = form("/ui/namespaces", &[("name", "ui-beta"), ("description", "made in the UI")]).await.unwrap();
    assert_eq!(created.headers()["location"], "/ui/namespaces?msg=namespace-created");
    assert_eq!(page("/ui/runs", Some("ui-beta")).await.unwrap().status(), 200);
    let bad = form("/ui/namespaces", &[("name", "Bad Name")]).await.unwrap();
    assert_eq!(bad.headers()["location"], "/ui/namespaces?msg=namespace-invalid");
    let kept = form("/ui/namespaces/default/delete", &[]).await.unwrap();
    assert_eq!(kept.headers()["location"], "/ui/namespaces?msg=namespace-refused", "default stays");
    let deleted = form("/ui/namespaces/ui-beta/delete", &[]).await.unwrap();
    assert_eq!(deleted.headers()["location"], "/ui/namespaces?msg=namespace-deleted");
    let (status, shown) = text(page("/ui/runs", Some("Not_A_Name")).await.unwrap()).await;
    assert_eq!(status, 200, "a cookie that names no namespace is passed over");
    assert!(shown.contains("title=\"the namespace shown\">default</a>"), "{shown}");
    for gone in ["ui-beta", "ui-never"] {
        let back = page("/ui/runs", Some(gone)).await.unwrap();
        assert_eq!(back.status(), 303, "{gone}");
        assert_eq!(back.headers()["location"], "/ui/namespaces", "{gone}");
        assert!(back.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"), "{gone}: the cookie is dropped");
    }
    // What the forms did is in the audit log (the cluster's forms in default's).
    let audit: serde_json::Value =
        api(reqwest::Method::GET, "/v1/audit", "default").send().await.unwrap().json().await.unwrap();
    let routes: Vec<&str> = audit["entries"].as_array().unwrap().iter().map(|a| a["route"].as_str().unwrap()).collect();
    for route in ["/ui/namespaces", "/ui/namespaces/{name}/delete", "/ui/namespaces/switch", "/v1/namespaces"] {
        assert!(routes.contains(&route), "{route} is not in the audit log: {routes:?}");
    }
    e.stop().await;
}

/// Issue 56: the migrate page shows the dry run's verdict for each open run
/// (which moves, which stays and why, what would change), and its form
/// starts the job that moves the movable ones.
#[tokio::test]
async fn the_migrate_page_shows_each_runs_verdict_and_its_form_moves_the_movable_ones() {
    let e = Engine::start().await;
    let b = browser();
    let wait = |id: &str, event: &str| json!({"id": id, "type": "WAIT_FOR_EVENT", "config": {"event": event, "key": "${ .input.k }"}});
    let v1 = json!({"name": "moving", "nodes": [wait("w1", "one"), wait("w2", "two")], "edges": [{"from": "w1", "to": "w2"}]});
    e.register(&v1).await;
    let early = e.start_run("moving", json!({"k": "early"})).await;
    let late = e.start_run("moving", json!({"k": "late"})).await;
    for id in [early, late] {
        e.wait_until(id, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    }
    let (status, _) = e.post("/v1/events", &json!({"name": "one", "key": "late"})).await;
    assert_eq!(status, 200);
    e.wait_until(late, T, |r| r["tasks"][1]["state"] == "WAITING").await;
    let v2 = json!({"name": "moving", "nodes": [wait("w1", "one"), {"id": "audit", "type": "TRANSFORM", "config": {"output": 1}},
        wait("w2", "two")], "edges": [{"from": "w1", "to": "audit"}, {"from": "audit", "to": "w2"}]});
    e.register(&v2).await;
    let url = |p: &str| format!("{}{p}", e.url());

    let workflow = b.get(url("/ui/workflows/moving")).send().await.unwrap().text().await.unwrap();
    assert!(workflow.contains("href=\"/ui/workflows/moving/migrate\""), "{workflow}");
    let page = b.get(url("/ui/workflows/moving/migrate?from=1&to=2")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("1 can move · 1 cannot"), "{page}");
    let row = |id: uuid::Uuid| {
        let at = page.find(&format!("data-run=\"{id}\"")).unwrap_or_else(|| panic!("{id}'s row: {page}"));
        page[at..].split("</tr>").next().unwrap().to_string()
    };
    let moves = row(early);
    assert!(moves.contains("class=\"moves\"") && moves.contains("audit is new: it runs when reached"), "{moves}");
    let stays = row(late);
    assert!(stays.contains("class=\"stays\"") && stays.contains("puts `audit` before it"), "{stays}");
    let bad = b.get(url("/ui/workflows/moving/migrate?from=1&to=x")).send().await.unwrap();
    assert_eq!(bad.status(), 400);

    let form = [("from", "1"), ("to", "2"), ("map", ""), ("reason", "audit every order")];
    let moved = b.post(url("/ui/workflows/moving/migrate")).form(&form).send().await.unwrap();
    assert_eq!(moved.status(), 303);
    let job = moved.headers()["location"].to_str().unwrap().to_string();
    assert!(job.starts_with("/ui/bulk/"), "{job}");
    eventually(T, "the job to move the run", || async {
        let shown = b.get(url(&job)).send().await.unwrap().text().await.unwrap();
        shown.contains("1 acted on").then_some(()).ok_or(shown)
    })
    .await;
    let moved = e.history(early, "RunMigrated").await;
    assert_eq!(moved[0]["payload"]["reason"], "audit every order", "{moved:?}");
    assert!(e.history(late, "RunMigrated").await.is_empty());
    e.stop().await;
}
