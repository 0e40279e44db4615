//! APPROVAL steps: the inbox, votes by assignees (by name, by group, an
//! administrator for one), a quorum, a rejection, a deadline that
//! escalates then fails, the notification run, keys' scopes, the CLI —
//! and votes sent while a coordinator is SIGKILLed, each counted once.

use std::time::Duration;

use composer_testkit::{Engine, EngineOptions};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::processes::{kill9, TwoCoordinators};

const T: Duration = Duration::from_secs(60);

/// A refund that two of ana, bo and the finance group approve (the amount
/// in a form), then pays; `notify-approvers` is told when it is assigned.
fn refund(extra: Value) -> Value {
    let mut config = json!({
        "prompt": "Refund ${ .input.amount } to ${ .input.customer }?",
        "assignees": {"people": ["ana", "${ .input.manager }"], "groups": ["finance"]},
        "quorum": 2,
        "form": {"type": "object", "properties": {"amount": {"type": "integer", "maximum": 1000}},
                 "required": ["amount"]},
        "notify": {"workflow": "notify-approvers"}});
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    json!({"name": "refund", "nodes": [
        {"id": "ok", "type": "APPROVAL", "config": config},
        {"id": "pay", "type": "TRANSFORM", "config": {"output": "${ .nodes.ok.output.data.amount }"}}],
        "edges": [{"from": "ok", "to": "pay"}]})
}

fn notifier() -> Value {
    json!({"name": "notify-approvers", "nodes": [{"id": "say", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]})
}

async fn decide(e: &Engine, run: Uuid, body: Value) -> (u16, Value) {
    e.post(&format!("/v1/approvals/{run}/ok/decide"), &body).await
}

/// Until `n` runs of `notify-approvers` have started (a notification is
/// moot once its step is decided, so a test waits for it before deciding).
async fn notified(e: &Engine, n: usize) {
    composer_testkit::eventually(T, "the notification", || async {
        let (_, page) = e.get("/v1/runs?workflow=notify-approvers&limit=100").await;
        (page["runs"].as_array().map_or(0, Vec::len) >= n).then_some(())
    })
    .await;
}

/// The runs `notify-approvers` ran, oldest first.
async fn notifications(e: &Engine) -> Vec<Value> {
    let (_, page) = e.get("/v1/runs?workflow=notify-approvers&limit=100").await;
    let mut runs = page["runs"].as_array().cloned().unwrap_or_default();
    runs.reverse();
    let mut out = Vec::new();
    for r in runs {
        let id = r["id"].as_str().unwrap().parse().unwrap();
        out.push(e.wait_for_run(id, T).await["output"]["say"].clone());
    }
    out
}

#[tokio::test]
async fn an_approval_takes_its_quorum_of_assignees_and_records_each_vote_once() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&notifier()).await;
    e.register(&refund(json!({}))).await;
    let run = e.start_run("refund", json!({"amount": 120, "customer": "c-7", "manager": "bo"})).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;

    // In the inbox, as evaluated when it began to wait.
    let (status, inbox) = e.get("/v1/approvals?view=all").await;
    assert_eq!(status, 200, "{inbox}");
    let item = &inbox["approvals"][0];
    assert_eq!(item["prompt"], "Refund 120 to c-7?");
    assert_eq!(item["assignees"], json!({"people": ["ana", "bo"], "groups": ["finance"]}));
    assert_eq!((item["needed"].clone(), item["node"].clone()), (json!(2), json!("ok")));
    // The dev server's caller is `anonymous`, who is assigned nothing.
    assert_eq!(e.get("/v1/approvals").await.1["approvals"], json!([]));

    notified(&e, 1).await;
    // Refused, each with its status: a stranger, bad data, a long comment.
    let (status, body) = decide(&e, run, json!({"answer": "approve", "as": "eve", "data": {"amount": 1}})).await;
    assert_eq!((status, body["error"]["code"].clone()), (403, json!("forbidden")), "{body}");
    let (status, body) = decide(&e, run, json!({"answer": "approve", "as": "ana", "data": {"amount": "lots"}})).await;
    assert_eq!((status, body["error"]["code"].clone()), (422, json!("vote_refused")), "{body}");
    let long = "c".repeat(2001);
    let (status, _) = decide(&e, run, json!({"answer": "approve", "as": "ana", "comment": long})).await;
    assert_eq!(status, 422);
    let (status, body) = decide(&e, run, json!({"answer": "maybe", "as": "ana"})).await;
    assert_eq!(status, 400, "{body}");

    // The first approval is recorded; the same person again is a 409.
    let (status, after) =
        decide(&e, run, json!({"answer": "approve", "as": "ana", "data": {"amount": 120}, "comment": "fine"})).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!((after["state"].clone(), after["votes"][0]["via"].clone()), (json!("WAITING"), json!("anonymous")));
    let (status, body) = decide(&e, run, json!({"answer": "reject", "as": "ana"})).await;
    assert_eq!((status, body["error"]["code"].clone()), (409, json!("conflict")), "{body}");
    // An administrator decides only for a person named: not for a group's member.
    let (status, body) = decide(&e, run, json!({"answer": "approve", "as": "fin-1", "data": {"amount": 1}})).await;
    assert_eq!(status, 403, "{body}");
    // bo makes two: the step completes with the decision.
    let (status, done) = decide(&e, run, json!({"answer": "approve", "as": "bo", "data": {"amount": 100}})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["state"], "COMPLETED");
    assert_eq!(done["output"]["decided_by"], "bo");
    let finished = e.wait_for_run(run, T).await;
    assert_eq!((finished["status"].as_str(), finished["output"]["pay"].clone()), (Some("SUCCEEDED"), json!(100)));
    let (status, body) = decide(&e, run, json!({"answer": "approve", "as": "ana", "data": {"amount": 1}})).await;
    assert_eq!(status, 409, "{body}");
    let votes = e.history(run, "ApprovalVoted").await;
    assert_eq!(votes.len(), 2);
    assert_eq!(votes[0]["payload"]["actor"], "anonymous");
    assert_eq!(votes[1]["payload"]["vote"], json!({"person": "bo", "answer": "approve", "via": "anonymous"}));
    assert_eq!(e.get("/v1/approvals?view=all").await.1["approvals"], json!([]), "no longer waiting");

    // Its notification ran once, with the approval and its link.
    let sent = notifications(&e).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["approval"]["prompt"], "Refund 120 to c-7?");
    assert_eq!(sent[0]["link"], format!("/ui/approvals/{run}/ok"));
    e.stop().await;
}

#[tokio::test]
async fn one_rejection_fails_the_step_and_a_failure_edge_can_take_it() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&notifier()).await;
    let mut def = refund(json!({}));
    def["nodes"].as_array_mut().unwrap().push(json!({"id": "declined", "type": "TRANSFORM",
        "config": {"output": "${ .nodes.ok.error.code }"}}));
    def["edges"].as_array_mut().unwrap().push(json!({"from": "ok", "to": "declined", "on": "failure"}));
    e.register(&def).await;
    let run = e.start_run("refund", json!({"amount": 5, "customer": "c", "manager": "bo"})).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let (status, after) = decide(&e, run, json!({"answer": "reject", "as": "bo", "comment": "duplicate"})).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!((after["state"].clone(), after["error"].clone()), (json!("FAILED"), json!("rejected by bo: duplicate")));
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["output"]["declined"], "approval_rejected", "{done}");
    e.stop().await;
}

#[tokio::test]
async fn a_deadline_escalates_once_notifying_again_then_fails() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&notifier()).await;
    let escalating = json!({"quorum": 1, "timeout": "3s", "escalate": {"people": ["${ .input.boss }"], "after": "1s"}});
    e.register(&refund(escalating)).await;
    let input = json!({"amount": 5, "customer": "c", "manager": "bo", "boss": "cy"});
    let run = e.start_run("refund", input.clone()).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let (status, body) = decide(&e, run, json!({"answer": "approve", "as": "cy", "data": {"amount": 1}})).await;
    assert_eq!(status, 403, "cy is not assigned before the escalation: {body}");
    let failed = e.wait_for_run(run, T).await;
    assert_eq!(failed["status"], "FAILED");
    assert_eq!(failed["tasks"][0]["error_info"]["code"], "approval_timeout", "{failed}");
    let escalated = e.history(run, "ApprovalEscalated").await;
    assert_eq!(escalated.len(), 1);
    assert_eq!(escalated[0]["payload"]["assignees"]["people"], json!(["ana", "bo", "cy"]));
    let sent = notifications(&e).await;
    assert_eq!(sent.len(), 2, "assigned, then escalated: {sent:?}");
    assert_eq!(sent[1]["approval"]["escalated"], true);

    // Another run: the one escalated to decides in the escalation's time.
    let run = e.start_run("refund", input).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    composer_testkit::eventually(T, "the escalation", || async {
        (!e.history(run, "ApprovalEscalated").await.is_empty()).then_some(())
    })
    .await;
    let (status, body) = decide(&e, run, json!({"answer": "approve", "as": "cy", "data": {"amount": 2}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

const ADMIN: &str = "approvals-admin-token-0123456789";

async fn call(e: &Engine, token: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let http = reqwest::Client::new();
    let mut req = http.request(method.parse().unwrap(), format!("{}{path}", e.url())).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_key_of_approvals_decide_votes_as_its_holder_and_only_an_administrator_for_another() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            c.api_token = Some(ADMIN.into());
            c.api_token_name = "root".into();
        },
        ..Default::default()
    })
    .await;
    let key = |name: &'static str, scopes: Value| {
        let e = &e;
        async move {
            let (status, k) = call(e, ADMIN, "POST", "/v1/keys", Some(&json!({"name": name, "scopes": scopes}))).await;
            assert_eq!(status, 201, "{k}");
            k["key"].as_str().unwrap().to_string()
        }
    };
    let (ana, eve, reader) = (
        key("ana", json!(["read", "approvals:decide"])).await,
        key("eve", json!(["read", "approvals:decide"])).await,
        key("reader", json!(["read"])).await,
    );
    for def in [notifier(), refund(json!({"quorum": "any"}))] {
        assert_eq!(call(&e, ADMIN, "POST", "/v1/workflows", Some(&def)).await.0, 201);
    }
    let (_, run) = call(
        &e,
        ADMIN,
        "POST",
        "/v1/runs",
        Some(&json!({"workflow": "refund",
        "input": {"amount": 3, "customer": "c", "manager": "bo"}})),
    )
    .await;
    let run: Uuid = run["id"].as_str().unwrap().parse().unwrap();
    composer_testkit::eventually(T, "the approval to wait", || async {
        let (_, r) = call(&e, ADMIN, "GET", &format!("/v1/runs/{run}"), None).await;
        (r["tasks"][0]["state"] == "WAITING").then_some(())
    })
    .await;
    // ana's inbox has it; eve's does not.
    assert_eq!(call(&e, &ana, "GET", "/v1/approvals", None).await.1["approvals"][0]["run_id"], json!(run));
    assert_eq!(call(&e, &eve, "GET", "/v1/approvals", None).await.1["approvals"], json!([]));
    let path = format!("/v1/approvals/{run}/ok/decide");
    let approve = json!({"answer": "approve", "data": {"amount": 3}});
    assert_eq!(call(&e, &reader, "POST", &path, Some(&approve)).await.0, 403, "read alone may not decide");
    assert_eq!(call(&e, &eve, "POST", &path, Some(&approve)).await.0, 403, "eve is not assigned");
    let mut for_ana = approve.clone();
    for_ana["as"] = json!("ana");
    let (status, body) = call(&e, &eve, "POST", &path, Some(&for_ana)).await;
    assert_eq!(status, 403, "only an administrator decides for another: {body}");
    let (status, body) = call(&e, &ana, "POST", &path, Some(&approve)).await;
    assert_eq!((status, body["state"].clone()), (200, json!("COMPLETED")), "{body}");
    assert_eq!(body["votes"][0]["person"], "ana");
    assert!(body["votes"][0].get("via").is_none(), "{body}");
    e.stop().await;
}

#[tokio::test]
async fn the_cli_lists_the_inbox_and_decides() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let url = e.url();
    e.register(&notifier()).await;
    e.register(&refund(json!({"quorum": "any"}))).await;
    let run = e.start_run("refund", json!({"amount": 9, "customer": "c", "manager": "bo"})).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let cli = |args: Vec<String>| {
        let url = url.clone();
        async move { crate::cli::cli(&url, &args.iter().map(String::as_str).collect::<Vec<_>>(), None).await }
    };
    let list = cli(vec!["approval".into(), "list".into(), "--all".into()]).await;
    assert_eq!(list.code, 0, "{} {}", list.stdout, list.stderr);
    assert!(list.stdout.contains("Refund 9 to c?") && list.stdout.contains(&run.to_string()), "{}", list.stdout);
    let mine = cli(vec!["approval".into(), "list".into(), "--mine".into()]).await;
    let mine: Value = serde_json::from_str(&mine.stdout).unwrap();
    assert_eq!(mine["approvals"], json!([]), "anonymous is assigned nothing");
    let decide = |answer: &str, data: &str| {
        let run = run.to_string();
        vec!["approval", "decide", &run, "ok", answer, "--as", "bo", "--data", data]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let bad = cli(decide("approve", r#"{"amount": "x"}"#)).await;
    assert_eq!(bad.code, 2, "{} {}", bad.stdout, bad.stderr);
    assert!(bad.stderr.contains("does not match the form"), "{}", bad.stderr);
    let ok = cli(decide("approve", r#"{"amount": 9}"#)).await;
    assert_eq!(ok.code, 0, "{} {}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("COMPLETED"), "{}", ok.stdout);
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

/// Two votes per run, sent at once to a coordinator that is SIGKILLed
/// while they go, then sent again to the survivor: every run completes,
/// with each person's vote recorded once and the step decided once.
#[tokio::test]
async fn votes_sent_when_a_coordinator_is_killed_are_each_counted_once() {
    let mut c = TwoCoordinators::start("kill-mid-approvals", false).await;
    let clients = c.clients();
    let mut def = refund(json!({}));
    def["nodes"][0]["config"].as_object_mut().unwrap().remove("notify");
    assert_eq!(clients[0].post("/v1/workflows", &def).await.0, 201);
    let mut runs = Vec::new();
    for i in 0..30 {
        let (status, run) = clients[1]
            .post("/v1/runs", &json!({"workflow": "refund", "input": {"amount": i, "customer": "c", "manager": "bo"}}))
            .await;
        assert_eq!(status, 201, "{run}");
        runs.push(run["id"].as_str().unwrap().to_string());
    }
    for id in &runs {
        composer_testkit::eventually(T, "the approval to wait", || async {
            let r = clients[1].get(&format!("/v1/runs/{id}")).await;
            (r["tasks"][0]["state"] == "WAITING").then_some(())
        })
        .await;
    }
    let vote = |who: &str, i: usize| json!({"answer": "approve", "as": who, "data": {"amount": i}});
    let http = reqwest::Client::new();
    let mut sends = Vec::new();
    for (i, id) in runs.iter().enumerate() {
        for who in ["ana", "bo"] {
            let (http, url, body) = (http.clone(), clients[0].base.clone(), vote(who, i));
            let path = format!("{url}/v1/approvals/{id}/ok/decide");
            sends.push(tokio::spawn(async move { http.post(path).json(&body).send().await.ok() }));
        }
    }
    composer_testkit::eventually(T, "a first approval decided", || async {
        for id in &runs {
            if clients[1].get(&format!("/v1/runs/{id}")).await["tasks"][0]["state"] == "COMPLETED" {
                return Some(());
            }
        }
        None
    })
    .await;
    kill9(&mut c.coordinators[0]);
    for s in sends {
        let _ = s.await;
    }
    // Every voter sends again to the survivor: cast now, or already counted.
    for (i, id) in runs.iter().enumerate() {
        for who in ["ana", "bo"] {
            let (status, body) = clients[1].post(&format!("/v1/approvals/{id}/ok/decide"), &vote(who, i)).await;
            assert!(status == 200 || status == 409, "{status} {body}");
        }
        let run = clients[1].wait_for_run(id, T).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
        let history = clients[1].get(&format!("/v1/runs/{id}/events?limit=100")).await;
        let count = |kind: &str| history["events"].as_array().unwrap().iter().filter(|e| e["type"] == kind).count();
        assert_eq!((count("ApprovalVoted"), count("TaskCompleted")), (2, 2), "run {id}: {history}");
        let approval = clients[1].get(&format!("/v1/approvals/{id}/ok")).await;
        let people: Vec<&str> =
            approval["votes"].as_array().unwrap().iter().map(|v| v["person"].as_str().unwrap()).collect();
        assert_eq!(people.len(), 2, "{approval}");
        assert!(people.contains(&"ana") && people.contains(&"bo"), "{approval}");
    }
    c.stop();
}

#[tokio::test]
async fn a_failed_approval_is_rerun_and_waits_again() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "gate", "nodes": [{"id": "n", "type": "APPROVAL",
        "config": {"prompt": "ok?", "assignees": {"people": ["${ .input.who }"]}}}]}))
        .await;
    let run = e.start_run("gate", json!({})).await;
    let failed = e.wait_for_run(run, T).await;
    assert_eq!(failed["status"], "FAILED", "no one to ask: {failed}");
    let (status, body) =
        e.post(&format!("/v1/runs/{run}/rerun"), &json!({"from": ["n"], "input": {"who": "ana"}})).await;
    assert!(status < 300, "{status} {body}");
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let (status, body) =
        e.post(&format!("/v1/approvals/{run}/n/decide"), &json!({"answer": "approve", "as": "ana"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

/// A request past the offload threshold is kept as an object: the inbox,
/// the approval, a decision and the notification read it back.
#[tokio::test]
async fn an_offloaded_request_is_read_back_to_list_decide_and_notify() {
    let dir = composer_embedded::temp_dir("approvals-offload").unwrap();
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut config = e.coordinator_config();
    config.offload_url = Some(dir.display().to_string());
    config.offload_threshold = 512;
    e.start_coordinator_with(config).await;
    e.register(&notifier()).await;
    e.register(&refund(json!({"quorum": "any", "prompt": "${ .input.note }"}))).await;
    let note = "refund in full: ".repeat(64);
    let run = e.start_run("refund", json!({"amount": 9, "customer": "c", "manager": "bo", "note": note})).await;
    e.wait_until(run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    let client = composer_store::client(&e.db.pool()).await.unwrap();
    let sql = "SELECT input_json::text FROM task_instances WHERE run_id = $1";
    let row = client.query_one(sql, &[&run]).await.unwrap();
    assert!(row.get::<_, String>(0).contains("$composer_offloaded"), "the request is offloaded");
    let (_, inbox) = e.get("/v1/approvals?view=all").await;
    assert_eq!(inbox["approvals"][0]["prompt"], note.as_str(), "{inbox}");
    notified(&e, 1).await;
    let (status, done) = decide(&e, run, json!({"answer": "approve", "as": "bo", "data": {"amount": 9}})).await;
    assert_eq!((status, done["state"].clone()), (200, json!("COMPLETED")), "{done}");
    let sent = notifications(&e).await;
    assert_eq!(sent[0]["approval"]["prompt"], note.as_str());
    e.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The inbox pages by a cursor (when each last changed, then its id): runs
/// that reach their approval in one commit are each listed once.
#[tokio::test]
async fn the_inbox_pages_through_every_waiting_approval_once() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&notifier()).await;
    e.register(&refund(json!({}))).await;
    let mut runs = Vec::new();
    for i in 0..5 {
        runs.push(e.start_run("refund", json!({"amount": i, "customer": "c", "manager": "bo"})).await);
    }
    for run in &runs {
        e.wait_until(*run, T, |r| r["tasks"][0]["state"] == "WAITING").await;
    }
    let (mut seen, mut cursor) = (Vec::new(), String::new());
    loop {
        let (status, page) = e.get(&format!("/v1/approvals?view=all&limit=2{cursor}")).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(page["approvals"].as_array().unwrap().iter().map(|a| a["run_id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={}", c.replace('+', "%2B")),
            None => break,
        }
    }
    seen.sort();
    let mut want: Vec<String> = runs.iter().map(Uuid::to_string).collect();
    want.sort();
    assert_eq!(seen, want);
    assert_eq!(e.get("/v1/approvals?cursor=nonsense").await.0, 400);
    assert_eq!(e.get("/v1/approvals?limit=500").await.0, 200);
    assert_eq!(e.get("/v1/approvals?limit=501").await.0, 400, "MAX_APPROVAL_PAGE");
    e.stop().await;
}
