//! API keys, scopes and the audit log. The scope test is generated from
//! the served OpenAPI document: every operation, with a key of each scope,
//! so a route added later is covered without anyone listing it here.

use std::process::Command;
use std::time::Duration;

use composer_testkit::{services, unique_prefix, Engine, EngineOptions, TestDb};
use serde_json::{json, Value};

use crate::processes::{composer, coordinator_cmd, wait_for_file, Proc};

const ADMIN: &str = "access-admin-token-0123456789";

fn options() -> EngineOptions {
    EngineOptions {
        workers: 0,
        coordinator: |c| {
            c.api_token = Some(ADMIN.into());
            c.api_token_name = "root".into();
            c.worker_token = Some("access-worker-token-0123456789".into());
            c.metrics_token = Some("access-metrics-token-0123456789".into());
        },
        ..Default::default()
    }
}

async fn call(e: &Engine, token: Option<&str>, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let http = reqwest::Client::new();
    let mut req = http.request(method.parse().unwrap(), format!("{}{path}", e.url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn new_key(e: &Engine, name: &str, scopes: &[&str], namespace: Option<&str>) -> (String, Value) {
    let spec = json!({"name": name, "scopes": scopes, "namespace": namespace});
    let (status, created) = call(e, Some(ADMIN), "POST", "/v1/keys", Some(&spec)).await;
    assert_eq!(status, 201, "{created}");
    (created["key"].as_str().unwrap().to_string(), created)
}

/// A path of the document's with every parameter filled with a value of
/// its kind that names nothing.
fn concrete(path: &str) -> String {
    let mut out = path.to_string();
    for (param, value) in [
        ("{id}", "0190b7a4-0000-7000-8000-000000000000"),
        ("{run_id}", "0190b7a4-0000-7000-8000-000000000000"),
        ("{name}", "nothing-here"),
        ("{version}", "1"),
        ("{key}", "nothing-here"),
        ("{node}", "nothing-here"),
        ("{object}", "0190b7a4-0000-7000-8000-000000000001"),
    ] {
        out = out.replace(param, value);
    }
    assert!(!out.contains('{'), "a parameter this test cannot fill: {path}");
    out
}

/// Every operation the document names a scope for, with a key of each
/// scope, once of every namespace (called in `default`) and once bound to
/// namespace `alpha` (called in `alpha` and in `beta`): a key without the
/// operation's scope gets a 403 naming it; a key with it (and an
/// administrator's, but for a worker's or the metrics reader's route) gets
/// past the guard (any answer but 401 and 403) in its namespace; a bound
/// key is refused in the other by its binding, whatever its scopes;
/// without a key, a 401.
#[tokio::test]
async fn every_route_of_the_document_refuses_a_key_without_its_scope_and_admits_one_with_it() {
    let e = Engine::with(options()).await;
    let (_, doc) = call(&e, None, "GET", "/openapi.json", None).await;
    for ns in ["alpha", "beta"] {
        let (status, made) = call(&e, Some(ADMIN), "POST", "/v1/namespaces", Some(&json!({"name": ns}))).await;
        assert_eq!(status, 201, "{made}");
    }
    let mut keys = Vec::new();
    for scope in composer_api::Scope::ALL {
        let name = format!("only-{}", scope.name().replace(':', "-"));
        keys.push((scope.name(), None, new_key(&e, &name, &[scope.name()], None).await.0));
        let bound = new_key(&e, &format!("alpha-{name}"), &[scope.name()], Some("alpha")).await.0;
        keys.push((scope.name(), Some("alpha"), bound));
    }
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(needed) = op.get("x-composer-scope").and_then(Value::as_str) else { continue };
            let body = op.get("requestBody").map(|_| json!({}));
            let url = concrete(path);
            let m = method.to_uppercase();
            let (status, _) = call(&e, None, &m, &url, body.as_ref()).await;
            assert_eq!(status, 401, "{m} {path} without a token");
            let role = matches!(needed, "tasks:work" | "metrics:read");
            // Creating, deleting and setting quotas of namespaces: a key of every namespace's alone.
            let cluster_admin = path.starts_with("/v1/namespaces") && m != "GET";
            for (scope, bound, key) in &keys {
                let admitted = *scope == needed || (*scope == "admin" && !role);
                let (status, answer) = crate::namespaces::call(&e, key, *bound, &m, &url, body.as_ref()).await;
                let message = answer["error"]["message"].as_str().unwrap_or_default().to_string();
                match (admitted, bound) {
                    (true, Some(_)) if cluster_admin => {
                        assert_eq!(status, 403, "{m} {path} with {scope} bound to alpha: {answer}");
                        assert!(message.contains("bound to namespace alpha"), "{m} {path}: {message}");
                    }
                    (true, _) => assert!(!matches!(status, 401 | 403), "{m} {path} with {scope}: {status} {answer}"),
                    (false, _) => {
                        assert_eq!(status, 403, "{m} {path} with {scope} (it needs {needed}): {answer}");
                        assert_eq!(answer["error"]["code"], "forbidden");
                        assert!(message.contains(&format!("scope {needed}")), "{m} {path}: {message}");
                    }
                }
                if bound.is_none() {
                    continue;
                }
                let (status, answer) = crate::namespaces::call(&e, key, Some("beta"), &m, &url, body.as_ref()).await;
                let message = answer["error"]["message"].as_str().unwrap_or_default();
                assert_eq!(status, 403, "{m} {path} in beta with alpha's {scope}: {answer}");
                assert!(
                    message.contains("bound to namespace alpha"),
                    "{m} {path} in beta with alpha's {scope}: {message}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 50, "the document named a scope for {checked} operations only");
    e.stop().await;
}

/// The environment's tokens keep their roles: the API token is an
/// administrator (who neither reports steps' results nor reads metrics
/// while their own tokens are set), the worker token works queues only,
/// the metrics token reads metrics only.
#[tokio::test]
async fn the_environment_s_tokens_are_an_administrator_a_worker_and_a_metrics_reader() {
    let e = Engine::with(options()).await;
    let worker = "access-worker-token-0123456789";
    let metrics = "access-metrics-token-0123456789";
    assert_eq!(call(&e, Some(ADMIN), "GET", "/v1/keys", None).await.0, 200);
    assert_eq!(call(&e, Some(ADMIN), "GET", "/metrics", None).await.0, 403, "the metrics token is set");
    assert_eq!(call(&e, Some(metrics), "GET", "/metrics", None).await.0, 200);
    let (status, body) = call(&e, Some(metrics), "GET", "/v1/runs", None).await;
    assert!(status == 403 && body.to_string().contains("scope read"), "{status} {body}");
    let poll = json!({"worker_id": "w", "queues": ["q"], "wait": "0ms"});
    assert_eq!(call(&e, Some(worker), "POST", "/v1/tasks/poll", Some(&poll)).await.0, 200);
    assert_eq!(call(&e, Some(ADMIN), "POST", "/v1/tasks/poll", Some(&poll)).await.0, 403);
    assert_eq!(call(&e, Some(worker), "GET", "/v1/runs", None).await.0, 403);
    assert_eq!(call(&e, Some(worker), "GET", "/metrics", None).await.0, 403);
    e.stop().await;
}

/// A key with `tasks:work` and named queues polls those queues only, and
/// reports on their tasks only: a `billing` task, leased by the worker
/// token, can be neither heartbeaten, logged, completed nor failed with an
/// `images` key (nor can a report take `billing` tasks as its `next`).
#[tokio::test]
async fn a_worker_key_limited_to_queues_polls_and_reports_only_those() {
    let e = Engine::with(options()).await;
    let spec = json!({"name": "images-worker", "scopes": ["tasks:work"], "queues": ["images"]});
    let (status, created) = call(&e, Some(ADMIN), "POST", "/v1/keys", Some(&spec)).await;
    assert_eq!(status, 201, "{created}");
    let key = created["key"].as_str().unwrap();
    let poll = |queues: Value| json!({"worker_id": "w", "queues": queues, "wait": "0ms"});
    assert_eq!(call(&e, Some(key), "POST", "/v1/tasks/poll", Some(&poll(json!(["images"])))).await.0, 200);
    let (status, body) = call(&e, Some(key), "POST", "/v1/tasks/poll", Some(&poll(json!(["images", "billing"])))).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("billing"), "{body}");

    let wf = json!({"name": "billing", "nodes": [{"id": "charge", "type": "charge", "queue": "billing"}]});
    assert_eq!(call(&e, Some(ADMIN), "POST", "/v1/workflows", Some(&wf)).await.0, 201);
    assert_eq!(call(&e, Some(ADMIN), "POST", "/v1/runs", Some(&json!({"workflow": "billing"}))).await.0, 201);
    let worker = "access-worker-token-0123456789";
    let mut leased = json!([]);
    for _ in 0..50 {
        let (_, batch) = call(
            &e,
            Some(worker),
            "POST",
            "/v1/tasks/poll",
            Some(&json!({"worker_id": "w", "queues": ["billing"], "wait": "1s"})),
        )
        .await;
        leased = batch["tasks"].clone();
        if leased.as_array().is_some_and(|t| !t.is_empty()) {
            break;
        }
    }
    let task = &leased[0];
    let (id, run) = (task["id"].as_str().unwrap(), task["run_id"].clone());
    let report = json!({"worker_id": "w", "run_id": run, "attempt": task["attempt"]});
    let mut logs = report.clone();
    logs["lines"] = json!(["forged"]);
    let mut done = report.clone();
    done["output"] = json!({"forged": true});
    let mut failed = report.clone();
    failed["error"] = json!("forged");
    for (what, body) in [("heartbeat", &report), ("logs", &logs), ("complete", &done), ("fail", &failed)] {
        let (status, answer) = call(&e, Some(key), "POST", &format!("/v1/tasks/{id}/{what}"), Some(body)).await;
        assert_eq!(status, 403, "{what}: {answer}");
        assert!(answer.to_string().contains("billing"), "{what}: {answer}");
    }
    let mut next = failed.clone();
    next["next"] = json!({"queues": ["billing"]});
    assert_eq!(call(&e, Some(key), "POST", &format!("/v1/tasks/{id}/fail"), Some(&next)).await.0, 403);
    let (status, ack) = call(&e, Some(worker), "POST", &format!("/v1/tasks/{id}/complete"), Some(&done)).await;
    assert_eq!(status, 200, "the worker token still reports: {ack}");
    let bad = json!({"name": "x", "scopes": ["read"], "queues": ["images"]});
    assert_eq!(call(&e, Some(ADMIN), "POST", "/v1/keys", Some(&bad)).await.0, 400, "queues without tasks:work");
    e.stop().await;
}

/// A key may hold only scopes its creator holds: an administrator's key
/// cannot make a worker's or a metrics reader's key (the API token can),
/// and no key takes an environment token's name.
#[tokio::test]
async fn a_key_grants_no_more_than_its_creator_holds_and_takes_no_reserved_name() {
    let e = Engine::with(options()).await;
    let (admin, _) = new_key(&e, "second-admin", &["admin"], None).await;
    for role in ["tasks:work", "metrics:read"] {
        let spec = json!({"name": "sneaky", "scopes": [role]});
        let (status, body) = call(&e, Some(&admin), "POST", "/v1/keys", Some(&spec)).await;
        assert_eq!(status, 403, "{role}: {body}");
        assert!(body.to_string().contains(role), "{body}");
        assert_eq!(call(&e, Some(ADMIN), "POST", "/v1/keys", Some(&spec)).await.0, 201, "the API token may");
    }
    assert_eq!(
        call(&e, Some(&admin), "POST", "/v1/keys", Some(&json!({"name": "ok", "scopes": ["read"]}))).await.0,
        201
    );
    for name in ["root", "anonymous", "worker", "metrics"] {
        let (status, body) =
            call(&e, Some(ADMIN), "POST", "/v1/keys", Some(&json!({"name": name, "scopes": ["read"]}))).await;
        assert_eq!(status, 400, "{name}: {body}");
    }
    e.stop().await;
}

/// Rotation: the successor and the old key work at once; once the old one
/// is revoked it is refused, and the successor goes on. An expired key is
/// refused like a revoked one.
#[tokio::test]
async fn a_key_is_rotated_without_downtime_and_refused_once_revoked_or_expired() {
    let e = Engine::with(options()).await;
    let (old, old_view) = new_key(&e, "deployer", &["read"], None).await;
    let (new, _) = new_key(&e, "deployer", &["read"], None).await;
    for key in [&old, &new] {
        assert_eq!(call(&e, Some(key), "GET", "/v1/runs", None).await.0, 200);
    }
    let id = old_view["id"].as_str().unwrap();
    let (status, revoked) = call(&e, Some(ADMIN), "DELETE", &format!("/v1/keys/{id}"), None).await;
    assert!(status == 200 && revoked["revoked_at"].is_string(), "{status} {revoked}");
    assert_eq!(call(&e, Some(&old), "GET", "/v1/runs", None).await.0, 401, "revoked");
    assert_eq!(call(&e, Some(&new), "GET", "/v1/runs", None).await.0, 200, "the successor goes on");
    let (status, short) = call(
        &e,
        Some(ADMIN),
        "POST",
        "/v1/keys",
        Some(&json!({"name": "brief", "scopes": ["read"], "expires_in": "1s"})),
    )
    .await;
    assert_eq!(status, 201);
    let short = short["key"].as_str().unwrap();
    // Waiting out the key's one-second life.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(call(&e, Some(short), "GET", "/v1/runs", None).await.0, 401, "expired");
    let other = if new.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{other}", &new[..new.len() - 1]);
    assert_eq!(call(&e, Some(&forged), "GET", "/v1/runs", None).await.0, 401, "another secret for the same id");
    e.stop().await;
}

/// Each change made with a key is in the audit log under the key's name,
/// with the request and the answer; reads, starts and events are not;
/// the log refuses to be changed; a run's history names the key too.
#[tokio::test]
async fn the_audit_log_records_each_change_by_its_key_and_cannot_be_changed() {
    let e = Engine::with(options()).await;
    let (ops, _) =
        new_key(&e, "ops-alice", &["workflows:write", "runs:control", "schedules:write", "limits:write"], None).await;
    let wf = json!({"name": "audited", "nodes": [{"id": "wait", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "k"}}]});
    assert_eq!(call(&e, Some(&ops), "POST", "/v1/workflows", Some(&wf)).await.0, 201);
    let (status, run) = call(&e, Some(&ops), "POST", "/v1/runs", Some(&json!({"workflow": "audited"}))).await;
    assert_eq!(status, 201, "{run}");
    let run_id = run["id"].as_str().unwrap();
    let cancel = json!({"reason": "audit test"});
    assert_eq!(call(&e, Some(&ops), "POST", &format!("/v1/runs/{run_id}/cancel"), Some(&cancel)).await.0, 200);
    let limit = json!({"concurrency": 3});
    assert_eq!(call(&e, Some(&ops), "PUT", "/v1/limits/stripe", Some(&limit)).await.0, 200);
    let schedule = json!({"id": "nightly", "workflow": "audited", "cron": "0 3 * * *"});
    assert_eq!(call(&e, Some(&ops), "POST", "/v1/schedules", Some(&schedule)).await.0, 201);
    assert_eq!(call(&e, Some(&ops), "DELETE", "/v1/schedules/nightly", None).await.0, 200);
    let (refused, _) = call(&e, Some(&ops), "POST", "/v1/webhooks", Some(&json!({}))).await;
    assert_eq!(refused, 403, "a refused call is not a change");

    let (status, page) = call(&e, Some(ADMIN), "GET", "/v1/audit?actor=ops-alice", None).await;
    assert_eq!(status, 200, "{page}");
    let seen: Vec<(String, String, u64)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (x["method"].as_str().unwrap().into(), x["route"].as_str().unwrap().into(), x["status"].as_u64().unwrap())
        })
        .collect();
    let want = [
        ("DELETE", "/v1/schedules/{id}", 200),
        ("POST", "/v1/schedules", 201),
        ("PUT", "/v1/limits/{key}", 200),
        ("POST", "/v1/runs/{id}/cancel", 200),
        ("POST", "/v1/workflows", 201),
    ];
    let want: Vec<(String, String, u64)> = want.iter().map(|(m, r, s)| (m.to_string(), r.to_string(), *s)).collect();
    assert_eq!(seen, want, "newest first; the start of the run is in its history instead");
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries[2]["request"], limit, "what was asked");
    assert_eq!(entries[2]["result"]["concurrency"], 3, "what it left");
    assert_eq!(entries[3]["path"], format!("/v1/runs/{run_id}/cancel"));
    assert!(entries.iter().all(|x| x["key_id"].is_string() && x["source"] == "127.0.0.1"), "{page}");

    let (_, history) = call(&e, Some(ADMIN), "GET", &format!("/v1/runs/{run_id}/events"), None).await;
    assert!(history.to_string().contains("\"actor\":\"ops-alice\""), "the run's history names the key: {history}");

    let (client, conn) = tokio_postgres::connect(&e.db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    for statement in ["UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log", "TRUNCATE audit_log"] {
        let err = client.batch_execute(statement).await.unwrap_err();
        assert!(format!("{err:?}").contains("append-only"), "{statement}: {err:?}");
    }
    e.stop().await;
}

/// A key is stored only as the hash of its secret part and never logged:
/// a coordinator process logging at debug level creates one through the
/// CLI, uses it and revokes it; neither its log, the database's dump nor
/// the audit log holds the key.
#[tokio::test]
async fn a_key_is_never_stored_or_logged_in_clear() {
    let db = TestDb::create().await;
    let redis = services().redis_url.clone();
    let dir = composer_embedded::temp_dir("keys").unwrap();
    let addr_file = dir.join("c.addr");
    let log = std::fs::File::create(dir.join("coordinator.log")).unwrap();
    let mut coordinator = Proc::spawn(
        coordinator_cmd(&db, &redis, &unique_prefix(), "127.0.0.1:0", &addr_file)
            .env("COMPOSER_API_TOKEN", ADMIN)
            .env("COMPOSER_LOG", "debug")
            .stderr(log),
    );
    let url = wait_for_file(&addr_file, Duration::from_secs(30)).await;
    let cli = |token: &str, args: &[&str]| {
        let out = composer(args).env("COMPOSER_URL", &url).env("COMPOSER_API_TOKEN", token).output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, key, err) = cli(ADMIN, &["key", "create", "ci-bot", "--scope", "read,runs:control", "-o", "table"]);
    assert_eq!(code, Some(0), "{err}");
    let key = key.trim().to_string();
    assert!(key.starts_with("cmp_") && err.contains("not shown again"), "{key} {err}");
    let (code, out, err) = cli(&key, &["run", "list", "-o", "json"]);
    assert_eq!(code, Some(0), "the key works: {out} {err}");
    let (code, _, err) = cli(&key, &["key", "list"]);
    assert_eq!(code, Some(2), "a key without admin cannot list keys: {err}");
    assert!(err.contains("scope admin"), "{err}");
    let (_, list, _) = cli(ADMIN, &["key", "list", "-o", "json"]);
    let list: Value = serde_json::from_str(&list).unwrap();
    let id = list["keys"][0]["id"].as_str().unwrap().to_string();
    assert!(!list.to_string().contains(&key[20..]), "a list never shows a key");
    let (code, _, err) = cli(ADMIN, &["key", "revoke", &id]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, _) = cli(&key, &["run", "list"]);
    assert_eq!(code, Some(2), "revoked");
    let (code, audit, err) = cli(ADMIN, &["audit", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let audit: Value = serde_json::from_str(&audit).unwrap();
    let routes: Vec<&str> = audit["entries"].as_array().unwrap().iter().map(|x| x["route"].as_str().unwrap()).collect();
    assert_eq!(routes, ["/v1/keys/{id}", "/v1/keys"], "{audit}");
    // A namespace's work is logged in a span that names it.
    let (code, _, err) = cli(ADMIN, &["namespace", "create", "logged"]);
    assert_eq!(code, Some(0), "{err}");
    let spec = json!({"name": "logged-flow", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    let registered = reqwest::Client::new()
        .post(format!("{url}/v1/workflows"))
        .bearer_auth(ADMIN)
        .header("composer-namespace", "logged")
        .json(&spec)
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 201);

    let secret = key.rsplit('_').next().unwrap();
    let pg_dump = composer_embedded::postgres_bin_dir().unwrap().join("pg_dump");
    let dump = Command::new(pg_dump).arg("--data-only").arg(&db.url).output().expect("pg_dump");
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("ci-bot"), "the dump holds the key's row");
    assert!(!dump.contains(secret), "but never its secret");
    assert!(coordinator.terminate(Duration::from_secs(30)).success());
    let text = std::fs::read_to_string(dir.join("coordinator.log")).unwrap();
    assert!(text.contains("API key created"), "the log names the key's creation");
    assert!(!text.contains(secret), "the log never holds the key");
    let line = text.lines().find(|l| l.contains("logged-flow")).unwrap_or_default();
    assert!(line.contains("namespace{namespace=logged}") && line.contains("workflow registered"), "{line}");
    let _ = std::fs::remove_dir_all(dir);
}
