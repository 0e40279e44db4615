//! Namespaces share nothing. The isolation test is generated from the
//! served OpenAPI document: every operation outside the cluster-wide ones
//! (keys, namespaces, health, the document, `/metrics`) is called in one
//! namespace with the names and ids of the other's things, so a route
//! added later is covered without anyone listing it here (and one whose
//! call this test cannot make fails it until it can).

use std::time::Duration;

use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};

const ADMIN: &str = "namespaces-admin-token-0123456789";
const WORKER: &str = "namespaces-worker-token-0123456789";

fn options() -> EngineOptions {
    EngineOptions {
        workers: 0,
        // Alpha's leased task must stay leased through every route's calls
        // (the test checks that beta's reports did not end the lease).
        lease_ttl: Duration::from_secs(120),
        coordinator: |c| {
            c.api_token = Some(ADMIN.into());
            c.worker_token = Some(WORKER.into());
        },
        ..Default::default()
    }
}

/// One call, in namespace `ns` when there is one (by the header).
pub(crate) async fn call(
    e: &Engine,
    token: &str,
    ns: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let http = reqwest::Client::new();
    let mut req = http.request(method.parse().unwrap(), format!("{}{path}", e.url())).bearer_auth(token);
    if let Some(ns) = ns {
        req = req.header("composer-namespace", ns);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn ok(e: &Engine, ns: &str, method: &str, path: &str, body: Value) -> Value {
    let (status, answer) = call(e, ADMIN, Some(ns), method, path, Some(&body)).await;
    assert!((200..300).contains(&status), "{method} {path} in {ns}: {status} {answer}");
    answer
}

/// The run `id` of namespace `ns` once it has ended, or after `T`.
async fn run_when_ended(e: &Engine, ns: &str, id: &str) -> Value {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, run) = call(e, ADMIN, Some(ns), "GET", &format!("/v1/runs/{id}"), None).await;
        assert_eq!(status, 200, "{run}");
        let ended = matches!(run["status"].as_str(), Some("SUCCEEDED" | "FAILED" | "CANCELLED"));
        if ended || tokio::time::Instant::now() > until {
            return run;
        }
        // Polling a run a worker and the engine finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What namespace `alpha` holds, by which its routes' parameters are filled.
struct Held {
    done: String,
    waiting: String,
    /// A task of alpha's leased by `alpha-poller` (attempt 1), and its run.
    task: String,
    leased: String,
    bulk: String,
    replay: String,
    /// A run whose step `t` is an APPROVAL waiting for a decision.
    approving: String,
}

impl Held {
    /// `path` (a route of the document) with alpha's names and ids.
    /// A read names the run that ended (it has a MAP, whose items are
    /// read); a change names the one still waiting, which a change that
    /// reached it would change (a cancel, a pause), as the last check sees.
    fn fill(&self, method: &str, path: &str) -> String {
        let id = if (path.starts_with("/v1/runs/") || path.starts_with("/v1/archive/")) && method == "get" {
            self.done.as_str()
        } else if path.starts_with("/v1/runs/") {
            self.waiting.as_str()
        } else if path.starts_with("/v1/bulk/") {
            self.bulk.as_str()
        } else if path.starts_with("/v1/events/replay/") {
            self.replay.as_str()
        } else if path.starts_with("/v1/schedules/") {
            "alpha-nightly"
        } else if path.starts_with("/v1/tasks/") {
            self.task.as_str()
        } else {
            "no-such-thing"
        };
        let name = if path.starts_with("/v1/webhooks/") { "alpha-hook" } else { "alpha-orders" };
        let out = path
            .replace("{id}", id)
            .replace("{run_id}", &self.approving)
            .replace("{name}", name)
            .replace("{version}", "1")
            .replace("{key}", "alpha-limit")
            .replace("{node}", "t")
            .replace("{object}", "0190b7a4-0000-7000-8000-000000000001");
        assert!(!out.contains('{'), "a parameter this test cannot fill: {path}");
        out
    }

    /// What alpha's own things are called in answers: none may show in beta's.
    fn marks(&self) -> Vec<&str> {
        vec!["alpha-", &self.done, &self.waiting, &self.task, &self.bulk, &self.replay, &self.approving]
    }
}

/// The body a call of `op` (`METHOD path`) is made with in the other
/// namespace: the one that would act on alpha's thing of that name. A route
/// without one here fails the test: it must be given one.
fn body_of(op: &str, held: &Held) -> Option<Value> {
    let task = json!({"worker_id": "alpha-poller", "run_id": held.leased, "attempt": 1});
    let body = match op {
        "POST /v1/workflows" => {
            json!({"name": "beta-orders", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]})
        }
        "POST /v1/runs" => json!({"workflow": "alpha-orders"}),
        "POST /v1/runs/bulk" => {
            json!({"filter": {"workflow": "alpha-orders"}, "action": "cancel", "reason": "from beta"})
        }
        "POST /v1/events" => json!({"name": "alpha-go", "key": "k"}),
        "POST /v1/events/replay" => json!({"filter": {"from": "2026-01-01T00:00:00Z", "to": "2099-01-01T00:00:00Z"}}),
        "POST /v1/schedules" => json!({"id": "beta-nightly", "workflow": "beta-orders", "cron": "0 3 * * *"}),
        "POST /v1/webhooks" => json!({"name": "beta-hook", "scheme": "github", "secret": "NS_SECRET"}),
        "POST /v1/tasks/poll" => json!({"worker_id": "w", "queues": ["http"], "wait": "0s"}),
        "PUT /v1/limits/{key}" => json!({"concurrency": 99}),
        "PUT /v1/runs/{id}/priority" => json!({"priority": 1}),
        "POST /v1/runs/{id}/rerun" => json!({"from": ["t"]}),
        "POST /v1/runs/{id}/update" => json!({"name": "approve", "timeout": "0s"}),
        "POST /v1/approvals/{run_id}/{node}/decide" => json!({"answer": "approve"}),
        "POST /v1/runs/{id}/tasks/{node}/complete" => json!({"output": {}}),
        "POST /v1/runs/{id}/tasks/{node}/resolve" => json!({"outcome": "completed", "output": {}}),
        "POST /v1/schedules/{id}/backfill" => json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}),
        "POST /v1/tasks/{id}/complete" | "POST /v1/tasks/{id}/heartbeat" => task,
        "POST /v1/tasks/{id}/fail" => {
            json!({"worker_id": "alpha-poller", "run_id": held.leased, "attempt": 1, "error": "x"})
        }
        "POST /v1/tasks/{id}/logs" => {
            json!({"worker_id": "alpha-poller", "run_id": held.leased, "attempt": 1, "lines": ["x"]})
        }
        "POST /v1/webhooks/{name}" => json!({}),
        "POST /v1/workflows/{name}/migrate" => json!({"from_version": 1, "to_version": 2}),
        _ => return None,
    };
    Some(body)
}

fn cluster_wide(path: &str) -> bool {
    path.starts_with("/v1/keys") || path.starts_with("/v1/namespaces") || !path.starts_with("/v1/")
}

/// Alpha's things: workflows, a run that ended (an HTTP step worked by a
/// worker of alpha's), one waiting for an event, a schedule, a webhook, a
/// limit, an event and a bulk job.
async fn fill_alpha(e: &mut Engine, target: &FakeHttp) -> Held {
    let mut c = e.worker_config("alpha-worker", 4);
    c.worker_token = Some(WORKER.into());
    c.namespace = Some("alpha".into());
    let worker = e.worker(composer_worker::Worker::new(c));
    e.spawn_worker(worker);
    let map = json!({"id": "m", "type": "MAP", "config": {"items": [1, 2], "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}});
    let orders = json!({"name": "alpha-orders", "nodes": [http_node("t", &target.url("/ok/alpha"), 1), map]});
    ok(e, "alpha", "POST", "/v1/workflows", orders).await;
    let waits = json!({"name": "alpha-waits", "nodes": [{"id": "t", "type": "WAIT_FOR_EVENT", "config": {"event": "alpha-go", "key": "k"}}]});
    ok(e, "alpha", "POST", "/v1/workflows", waits).await;
    let done = ok(e, "alpha", "POST", "/v1/runs", json!({"workflow": "alpha-orders"})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let waiting = ok(e, "alpha", "POST", "/v1/runs", json!({"workflow": "alpha-waits"})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let run = run_when_ended(e, "alpha", &done).await;
    assert_eq!(run["status"], "SUCCEEDED", "alpha's worker works alpha's step: {run}");
    assert_eq!(target.calls("/ok/alpha"), 1);
    ok(
        e,
        "alpha",
        "POST",
        "/v1/schedules",
        json!({"id": "alpha-nightly", "workflow": "alpha-orders", "cron": "0 3 * * *"}),
    )
    .await;
    ok(e, "alpha", "POST", "/v1/webhooks", json!({"name": "alpha-hook", "scheme": "github", "secret": "NS_SECRET"}))
        .await;
    ok(e, "alpha", "PUT", "/v1/limits/alpha-limit", json!({"concurrency": 5})).await;
    ok(e, "alpha", "POST", "/v1/events", json!({"name": "alpha-other", "key": "k"})).await;
    let bulk = json!({"filter": {"workflow": "alpha-orders"}, "action": "retry", "reason": "alpha's own"});
    let bulk = ok(e, "alpha", "POST", "/v1/runs/bulk", bulk).await;
    let bulk = bulk["id"].as_str().map(str::to_string).unwrap_or_else(|| panic!("a bulk job: {bulk}"));
    // A step of a type no worker runs, leased by hand.
    let leasing = json!({"name": "alpha-leased", "nodes": [{"id": "t", "type": "resize", "queue": "alpha-q"}]});
    ok(e, "alpha", "POST", "/v1/workflows", leasing).await;
    let leased = ok(e, "alpha", "POST", "/v1/runs", json!({"workflow": "alpha-leased"})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let poll = json!({"worker_id": "alpha-poller", "queues": ["alpha-q"], "wait": "10s"});
    let (status, batch) = call(e, WORKER, Some("alpha"), "POST", "/v1/tasks/poll", Some(&poll)).await;
    assert_eq!(status, 200, "{batch}");
    let task = batch["tasks"][0]["id"].as_str().unwrap_or_else(|| panic!("a leased task: {batch}")).to_string();
    let replay =
        json!({"filter": {"from": "2026-01-01T00:00:00Z", "to": "2099-01-01T00:00:00Z"}, "reason": "alpha's own"});
    let replay = ok(e, "alpha", "POST", "/v1/events/replay", replay).await;
    let replay = replay["id"].as_str().map(str::to_string).unwrap_or_else(|| panic!("a replay: {replay}"));
    let approves = json!({"name": "alpha-approves", "nodes": [{"id": "t", "type": "APPROVAL",
        "config": {"prompt": "alpha's", "assignees": {"people": ["alpha-person"]}}}]});
    ok(e, "alpha", "POST", "/v1/workflows", approves).await;
    let approving = ok(e, "alpha", "POST", "/v1/runs", json!({"workflow": "alpha-approves"})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    Held { done, waiting, task, leased, bulk, replay, approving }
}

/// Two namespaces, every route of the document: beta's lists show nothing
/// of alpha's, beta's reads of alpha's things find nothing, beta's changes
/// of them change nothing, and alpha's own reads find them all.
#[tokio::test]
async fn two_namespaces_share_nothing_on_any_route_of_the_document() {
    let mut e = Engine::with(options()).await;
    let target = FakeHttp::start().await;
    for ns in ["alpha", "beta"] {
        let (status, created) = call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": ns}))).await;
        assert_eq!(status, 201, "{created}");
    }
    let (status, _) = call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "alpha"}))).await;
    assert_eq!(status, 200, "creating one that exists answers it");
    let held = fill_alpha(&mut e, &target).await;

    let (_, doc) = call(&e, ADMIN, None, "GET", "/openapi.json", None).await;
    let mut checked = 0;
    let mut changes = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if cluster_wide(path) {
            continue;
        }
        for (method, _) in item.as_object().unwrap() {
            let m = method.to_uppercase();
            let op = format!("{m} {path}");
            let mut url = held.fill(method, path);
            // Required query parameters: the MAP node's name is the one
            // there is; an offloaded value's reference names none.
            let required: Vec<&str> = item[method]["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query" && p["required"] == true)
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            for (i, name) in required.iter().enumerate() {
                let value = match *name {
                    "node" => "m".to_string(),
                    "sha256" => "0".repeat(64),
                    "bytes" => "1".to_string(),
                    _ => panic!("{path}: a required parameter this test cannot fill: {name}"),
                };
                url.push_str(&format!("{}{name}={value}", if i == 0 { "?" } else { "&" }));
            }
            if m != "GET" {
                changes.push((op, url));
                continue;
            }
            let (status, answer) = call(&e, ADMIN, Some("beta"), &m, &url, None).await;
            let (own, mine) = call(&e, ADMIN, Some("alpha"), &m, &url, None).await;
            // No archive is set here (an archived run is read back in
            // it::archive): alpha's own run is not in one either.
            let archived = path.starts_with("/v1/archive/");
            // Nor is any value offloaded (one is read back in it::archive).
            let offloaded = path.ends_with("/values/{object}");
            let found = if archived || offloaded { 404 } else { 200 };
            assert_eq!(own, found, "{op} in alpha, with alpha's things: {mine}");
            if path.contains('{') {
                assert_eq!(status, 404, "{op} in beta, with alpha's things: {answer}");
            } else {
                assert_eq!(status, 200, "{op} in beta: {answer}");
                let text = answer.to_string();
                for mark in held.marks() {
                    assert!(!text.contains(mark), "{op} in beta shows alpha's {mark}: {text}");
                }
            }
            checked += 1;
        }
    }
    for (op, url) in &changes {
        let body = body_of(op, &held);
        let needs_body = doc["paths"][op.split_once(' ').unwrap().1][op.split_once(' ').unwrap().0.to_lowercase()]
            .get("requestBody")
            .is_some();
        assert!(body.is_some() || !needs_body, "{op}: this test has no body for it; give it one");
        let (m, path) = op.split_once(' ').unwrap();
        // The workers' routes with the worker token, every other with the API token's.
        let token = if path.starts_with("/v1/tasks/") { WORKER } else { ADMIN };
        let (status, answer) = call(&e, token, Some("beta"), m, url, body.as_ref()).await;
        assert!(status < 500, "{op} in beta: {status} {answer}");
        // A change naming one of alpha's things finds nothing in beta: a
        // 404, but for a limit (a PUT makes beta's own) and a webhook's
        // delivery (refused as unsigned for any name, 401, so that a
        // sender cannot learn which webhooks exist).
        let expected = match op.as_str() {
            "PUT /v1/limits/{key}" => 200,
            // A worker's report on a task its namespace does not hold: as on
            // any task it holds no lease of (a run that does not exist too).
            _ if path.starts_with("/v1/tasks/{id}") => 409,
            "POST /v1/webhooks/{name}" => 401,
            "POST /v1/runs" => 404,
            _ if path.contains('{') => 404,
            _ => status,
        };
        assert_eq!(status, expected, "{op} in beta, with alpha's things: {answer}");
        checked += 1;
    }
    assert!(checked >= 45, "only {checked} operations were called");

    // `/metrics` is the cluster's: alpha's series carry its name, and a
    // reader bound to beta sees beta's alone.
    let (_, all) = call(&e, ADMIN, None, "GET", "/metrics", None).await;
    assert!(all.as_str().unwrap().contains("namespace=\"alpha\""), "{all}");
    let reader = json!({"name": "beta-metrics", "scopes": ["metrics:read"], "namespace": "beta"});
    let (status, reader) = call(&e, ADMIN, None, "POST", "/v1/keys", Some(&reader)).await;
    assert_eq!(status, 201, "{reader}");
    let (status, theirs) = call(&e, reader["key"].as_str().unwrap(), Some("beta"), "GET", "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(!theirs.to_string().contains("alpha"), "beta's reader sees alpha's metrics: {theirs}");
    assert!(theirs.as_str().unwrap().contains("# HELP composer_"), "{theirs}");

    // Alpha's things are as they were: its leased task still leased to its poller.
    let beat = json!({"worker_id": "alpha-poller", "run_id": held.leased, "attempt": 1});
    let (status, answer) =
        call(&e, WORKER, Some("alpha"), "POST", &format!("/v1/tasks/{}/heartbeat", held.task), Some(&beat)).await;
    assert_eq!(status, 200, "beta's reports did not end alpha's lease: {answer}");
    assert_eq!(run_when_ended(&e, "alpha", &held.done).await["status"], "SUCCEEDED");
    let (_, waiting) = call(&e, ADMIN, Some("alpha"), "GET", &format!("/v1/runs/{}", held.waiting), None).await;
    assert_eq!(waiting["status"], "RUNNING", "beta's event and bulk cancel did not reach it: {waiting}");
    let (_, schedule) = call(&e, ADMIN, Some("alpha"), "GET", "/v1/schedules/alpha-nightly", None).await;
    assert_eq!(schedule["paused"], false, "{schedule}");
    let (_, limit) = call(&e, ADMIN, Some("alpha"), "GET", "/v1/limits/alpha-limit", None).await;
    assert_eq!(limit["concurrency"], 5, "{limit}");
    let (_, hook) = call(&e, ADMIN, Some("alpha"), "GET", "/v1/webhooks/alpha-hook", None).await;
    assert_eq!(hook["url"], "/v1/webhooks/alpha-hook?namespace=alpha", "its sender names the namespace: {hook}");
    let (_, versions) = call(&e, ADMIN, Some("alpha"), "GET", "/v1/workflows/alpha-orders", None).await;
    assert_eq!(versions["versions"].as_array().map(Vec::len), Some(1), "{versions}");
    // Alpha's event reaches alpha's run.
    ok(&e, "alpha", "POST", "/v1/events", json!({"name": "alpha-go", "key": "k"})).await;
    assert_eq!(run_when_ended(&e, "alpha", &held.waiting).await["status"], "SUCCEEDED");
    // The same workflow name in another namespace is another workflow.
    let beta_orders =
        json!({"name": "alpha-orders", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 2}}]});
    assert_eq!(ok(&e, "beta", "POST", "/v1/workflows", beta_orders).await["version"], 1);
    e.stop().await;
}

/// A key bound to a namespace acts there only, sees only that namespace
/// and its keys, makes keys of that namespace only, and can neither create
/// nor delete namespaces.
#[tokio::test]
async fn a_key_bound_to_a_namespace_acts_there_only() {
    let e = Engine::with(options()).await;
    for ns in ["alpha", "beta"] {
        assert_eq!(call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": ns}))).await.0, 201);
    }
    let bound = json!({"name": "alpha-admin", "scopes": ["admin"], "namespace": "alpha"});
    let (status, created) = call(&e, ADMIN, None, "POST", "/v1/keys", Some(&bound)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["namespace"], "alpha");
    let key = created["key"].as_str().unwrap();
    assert_eq!(call(&e, key, Some("alpha"), "GET", "/v1/runs", None).await.0, 200);
    for other in [Some("beta"), None] {
        let (status, answer) = call(&e, key, other, "GET", "/v1/runs", None).await;
        assert_eq!(status, 403, "{other:?}: {answer}");
        assert!(answer.to_string().contains("bound to namespace alpha"), "{answer}");
    }
    let (_, list) = call(&e, key, Some("alpha"), "GET", "/v1/namespaces", None).await;
    let names: Vec<&str> = list["namespaces"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha"]);
    assert_eq!(call(&e, key, Some("alpha"), "GET", "/v1/namespaces/beta", None).await.0, 404);
    let (status, _) = call(&e, key, Some("alpha"), "POST", "/v1/namespaces", Some(&json!({"name": "gamma"}))).await;
    assert_eq!(status, 403);
    assert_eq!(call(&e, key, Some("alpha"), "DELETE", "/v1/namespaces/beta", None).await.0, 403);
    let (status, made) =
        call(&e, key, Some("alpha"), "POST", "/v1/keys", Some(&json!({"name": "alpha-ci", "scopes": ["read"]}))).await;
    assert_eq!((status, &made["namespace"]), (201, &json!("alpha")), "a bound key's keys are bound too: {made}");
    let escape = json!({"name": "escape", "scopes": ["read"], "namespace": "beta"});
    assert_eq!(call(&e, key, Some("alpha"), "POST", "/v1/keys", Some(&escape)).await.0, 403);
    let (_, keys) = call(&e, key, Some("alpha"), "GET", "/v1/keys", None).await;
    assert!(keys["keys"].as_array().unwrap().iter().all(|k| k["namespace"] == "alpha"), "{keys}");
    let (status, unbound) =
        call(&e, ADMIN, None, "POST", "/v1/keys", Some(&json!({"name": "everywhere", "scopes": ["read"]}))).await;
    assert_eq!(status, 201, "{unbound}");
    let (_, keys) = call(&e, key, Some("alpha"), "GET", "/v1/keys", None).await;
    assert!(!keys.to_string().contains("everywhere"), "{keys}");
    let revoke = format!("/v1/keys/{}", unbound["id"].as_str().unwrap());
    let (status, _) = call(&e, key, Some("alpha"), "DELETE", &revoke, None).await;
    assert_eq!(status, 404, "a key of every namespace is not its to revoke");
    let unbound_key = unbound["key"].as_str().unwrap();
    assert_eq!(call(&e, unbound_key, Some("beta"), "GET", "/v1/runs", None).await.0, 200, "still live");
    e.stop().await;
}

/// A namespace's name is checked at the door; one that does not exist is a
/// 404; `default` is what a call naming none reaches and cannot be deleted;
/// a cluster has at most `COMPOSER_MAX_NAMESPACES`, `default` included.
#[tokio::test]
async fn the_door_refuses_bad_and_unknown_namespaces() {
    let e = Engine::with(EngineOptions {
        coordinator: |c| {
            c.api_token = Some(ADMIN.into());
            c.worker_token = Some(WORKER.into());
            c.max_namespaces = 2;
        },
        ..options()
    })
    .await;
    assert_eq!(call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "one"}))).await.0, 201);
    let (status, answer) = call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "two"}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer.to_string().contains("COMPOSER_MAX_NAMESPACES"), "{answer}");
    assert_eq!(
        call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "one"}))).await.0,
        200,
        "it exists"
    );
    let wordy = json!({"name": "three", "description": "x".repeat(1001)});
    let (status, answer) = call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&wordy)).await;
    assert!(
        status == 400 && answer.to_string().contains("at most 1000"),
        "MAX_NAMESPACE_DESCRIPTION: {status} {answer}"
    );
    for bad in ["Alpha", "a_b", "-a", "a/b"] {
        let (status, answer) = call(&e, ADMIN, Some(bad), "GET", "/v1/runs", None).await;
        assert_eq!(status, 400, "{bad}: {answer}");
    }
    let (status, answer) = call(&e, ADMIN, Some("nowhere"), "GET", "/v1/runs", None).await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("namespace \"nowhere\""), "{answer}");
    // A stranger learns nothing of which namespaces exist: one that does and
    // one that does not answer alike, without a key or with a wrong one.
    for token in ["", "cmp_0190b7a40000700080000000000000000_nope", "not-a-key"] {
        for ns in ["one", "nowhere"] {
            let (status, answer) = call(&e, token, Some(ns), "GET", "/v1/runs", None).await;
            assert_eq!(status, 401, "{ns} with {token:?}: {answer}");
        }
    }
    for ns in ["one", "nowhere"] {
        let (status, answer) = call(&e, "", Some(ns), "GET", "/v1/no-such-route", None).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{ns}: {answer}");
        let (status, answer) = call(&e, "", Some(ns), "POST", "/v1/webhooks/hook", Some(&json!({}))).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("bad_signature")), "{ns}: {answer}");
    }
    // A key bound to a namespace learns nothing of the others: refused by its binding alike.
    let bound = json!({"name": "one-reader", "scopes": ["read"], "namespace": "one"});
    let (_, bound) = call(&e, ADMIN, None, "POST", "/v1/keys", Some(&bound)).await;
    for ns in ["default", "nowhere"] {
        let (status, answer) = call(&e, bound["key"].as_str().unwrap(), Some(ns), "GET", "/v1/runs", None).await;
        assert_eq!(status, 403, "{ns}: {answer}");
        assert!(answer.to_string().contains("bound to namespace one"), "{ns}: {answer}");
    }
    // The workers' token is known: a namespace that does not exist is named as such.
    assert_eq!(call(&e, WORKER, Some("nowhere"), "POST", "/v1/tasks/poll", Some(&json!({}))).await.0, 404);
    let b = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for ns in ["one", "nowhere"] {
        let page = b.get(format!("{}/ui/runs", e.url())).header("cookie", format!("composer_namespace={ns}"));
        let page = page.send().await.unwrap();
        assert_eq!(page.status(), 303, "{ns}");
        assert_eq!(page.headers()["location"], "/ui/login?next=%2Fui%2Fruns", "{ns}: as for any page");
    }
    assert_eq!(call(&e, ADMIN, Some("default"), "GET", "/v1/runs", None).await.0, 200);
    assert_eq!(call(&e, ADMIN, None, "DELETE", "/v1/namespaces/default", None).await.0, 409);
    let long = "a".repeat(64);
    assert_eq!(call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": long}))).await.0, 400);
    e.stop().await;
}

/// Where the deletion test's coordinator keeps offloaded values.
fn offloaded_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("composer-ns-offload-{}", std::process::id()))
}

/// Deleting a namespace stops it being served at once, drops everything it
/// held (its offloaded values too) once every coordinator has let go of
/// it, and the name can then be created again, empty.
#[tokio::test]
async fn a_deleted_namespace_is_gone_with_its_data_and_can_be_made_again() {
    let e = Engine::with(EngineOptions {
        coordinator: |c| {
            c.api_token = Some(ADMIN.into());
            c.worker_token = Some(WORKER.into());
            c.offload_url = Some(offloaded_dir().display().to_string());
            c.offload_threshold = 1024;
        },
        ..options()
    })
    .await;
    assert_eq!(call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "brief"}))).await.0, 201);
    let wf = json!({"name": "kept", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    ok(&e, "brief", "POST", "/v1/workflows", wf).await;
    let input = json!({"workflow": "kept", "input": {"blob": "b".repeat(4096)}});
    let run = ok(&e, "brief", "POST", "/v1/runs", input).await;
    run_when_ended(&e, "brief", run["id"].as_str().unwrap()).await;
    let files = || walk(&offloaded_dir());
    assert!(files().iter().any(|p| p.to_string_lossy().contains("brief-")), "{:?}", files());
    let bound = json!({"name": "brief-key", "scopes": ["read"], "namespace": "brief"});
    let (_, bound) = call(&e, ADMIN, None, "POST", "/v1/keys", Some(&bound)).await;
    let old_key = bound["key"].as_str().unwrap().to_string();
    assert_eq!(call(&e, &old_key, Some("brief"), "GET", "/v1/workflows", None).await.0, 200);
    let (status, deleting) = call(&e, ADMIN, None, "DELETE", "/v1/namespaces/brief", None).await;
    assert_eq!((status, deleting["state"].as_str()), (202, Some("deleting")), "{deleting}");
    let (status, answer) = call(&e, ADMIN, Some("brief"), "GET", "/v1/workflows", None).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(call(&e, ADMIN, None, "GET", "/v1/namespaces/brief", None).await.0, 404, "gone to its callers");
    // Made again once its schema is dropped (a 409 until then).
    let made = composer_testkit::poll_until(Duration::from_secs(40), || async {
        (call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "brief"}))).await.0 == 201).then_some(())
    })
    .await;
    assert!(made.is_ok(), "the namespace was not dropped");
    let (_, list) = call(&e, ADMIN, Some("brief"), "GET", "/v1/workflows", None).await;
    assert_eq!(list["workflows"], json!([]), "made again, empty: {list}");
    let (status, _) = call(&e, &old_key, Some("brief"), "GET", "/v1/workflows", None).await;
    assert_eq!(status, 401, "the keys of the namespace deleted were revoked with it");
    assert_eq!(files(), Vec::<std::path::PathBuf>::new(), "its offloaded values went with it");
    e.stop().await;
    let _ = std::fs::remove_dir_all(offloaded_dir());
}

/// Every file under `dir`, at any depth.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .flat_map(|e| match e.path().is_dir() {
            true => walk(&e.path()),
            false => vec![e.path()],
        })
        .collect()
}

/// One call's status, `Retry-After` and body.
async fn call_with_retry_after(
    e: &Engine,
    ns: &str,
    method: &str,
    path: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let http = reqwest::Client::new();
    let req = http.request(method.parse().unwrap(), format!("{}{path}", e.url())).bearer_auth(ADMIN);
    let resp = req.header("composer-namespace", ns).json(body).send().await.unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (status, retry_after, resp.json().await.unwrap_or(Value::Null))
}

/// A namespace's quotas: a start past its open runs, a schedule or a limit
/// past its count, and any of them once it stores more than its bytes, is
/// a 429 naming the quota, with `Retry-After`; what it uses is shown; the
/// default namespace, without quotas, is not held by another's.
#[tokio::test]
async fn a_namespace_s_quotas_refuse_by_name_and_its_usage_is_shown() {
    let e = Engine::with(EngineOptions {
        coordinator: |c| {
            c.api_token = Some(ADMIN.into());
            c.worker_token = Some(WORKER.into());
            c.metrics_interval = Duration::from_millis(300);
        },
        ..options()
    })
    .await;
    assert_eq!(call(&e, ADMIN, None, "POST", "/v1/namespaces", Some(&json!({"name": "small"}))).await.0, 201);
    let waits = json!({"name": "waits", "nodes": [{"id": "t", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "k"}}]});
    for ns in ["small", "default"] {
        ok(&e, ns, "POST", "/v1/workflows", waits.clone()).await;
    }
    let (status, _) = call(
        &e,
        ADMIN,
        None,
        "PUT",
        "/v1/namespaces/small/quotas",
        Some(&json!({"open_runs": 1_000_000_000_000_001_i64})),
    )
    .await;
    assert_eq!(status, 400, "MAX_QUOTA");
    let quotas = json!({"open_runs": 2, "schedules": 1, "limits": 1});
    let set = ok(&e, "default", "PUT", "/v1/namespaces/small/quotas", quotas.clone()).await;
    assert_eq!(set["quotas"], quotas, "{set}");

    let start = json!({"workflow": "waits"});
    for _ in 0..2 {
        ok(&e, "small", "POST", "/v1/runs", start.clone()).await;
    }
    let (status, retry_after, answer) = call_with_retry_after(&e, "small", "POST", "/v1/runs", &start).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{answer}");
    assert_eq!(answer["error"]["code"], "over_quota");
    assert!(answer["error"]["message"].as_str().unwrap().contains("quota open_runs (2)"), "{answer}");
    for _ in 0..3 {
        ok(&e, "default", "POST", "/v1/runs", start.clone()).await;
    }

    let schedule = |id: &str| json!({"id": id, "workflow": "waits", "cron": "0 3 * * *"});
    ok(&e, "small", "POST", "/v1/schedules", schedule("first")).await;
    let (status, retry_after, answer) =
        call_with_retry_after(&e, "small", "POST", "/v1/schedules", &schedule("second")).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("60")), "{answer}");
    assert!(answer.to_string().contains("quota schedules (1)"), "{answer}");
    ok(&e, "small", "POST", "/v1/schedules", json!({"id": "first", "workflow": "waits", "cron": "0 4 * * *"})).await;
    over_open_runs_from_outside(&e).await;

    ok(&e, "small", "PUT", "/v1/limits/one", json!({"concurrency": 1})).await;
    let (status, _, answer) =
        call_with_retry_after(&e, "small", "PUT", "/v1/limits/two", &json!({"concurrency": 1})).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.to_string().contains("quota limits (1)"), "{answer}");
    ok(&e, "small", "PUT", "/v1/limits/one", json!({"concurrency": 2})).await;

    let (_, described) = call(&e, ADMIN, None, "GET", "/v1/namespaces/small", None).await;
    let usage = &described["usage"];
    assert_eq!(
        (usage["open_runs"].as_i64(), usage["schedules"].as_i64(), usage["limits"].as_i64()),
        (Some(2), Some(1), Some(1)),
        "{described}"
    );
    assert!(usage["stored_bytes"].as_i64().unwrap() > 0, "{described}");

    // Stored bytes, as the metrics loop measures them.
    ok(&e, "default", "PUT", "/v1/namespaces/small/quotas", json!({"stored_bytes": 1})).await;
    let refused = composer_testkit::poll_until(Duration::from_secs(20), || async {
        let (status, retry_after, answer) = call_with_retry_after(&e, "small", "POST", "/v1/runs", &start).await;
        (status == 429).then_some((retry_after, answer))
    })
    .await;
    let (retry_after, answer) = refused.unwrap_or_else(|_| panic!("no start was refused for stored_bytes"));
    assert_eq!(retry_after.as_deref(), Some("60"));
    assert!(answer.to_string().contains("quota stored_bytes (1)"), "{answer}");
    // The gauges, at the metrics loop's next sample.
    let sampled = composer_testkit::poll_until(Duration::from_secs(20), || async {
        let (_, metrics) = call(&e, ADMIN, None, "GET", "/metrics", None).await;
        let metrics = metrics.as_str().unwrap_or_default().to_string();
        let both = metrics.contains("composer_namespace_quota{quota=\"stored_bytes\",namespace=\"small\"} 1")
            && metrics.contains("composer_namespace_usage{quota=\"schedules\",namespace=\"small\"} 1");
        both.then_some(())
    })
    .await;
    assert!(sampled.is_ok(), "composer_namespace_quota and _usage of small");

    // Starts per second, counted across coordinators.
    ok(&e, "default", "PUT", "/v1/namespaces/small/quotas", json!({"starts_per_second": 1})).await;
    ok(
        &e,
        "small",
        "POST",
        "/v1/workflows",
        json!({"name": "quick", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}),
    )
    .await;
    let quick = json!({"workflow": "quick"});
    let mut refused = None;
    for _ in 0..5 {
        let (status, retry_after, answer) = call_with_retry_after(&e, "small", "POST", "/v1/runs", &quick).await;
        if status == 429 {
            refused = Some((retry_after, answer));
            break;
        }
    }
    let (retry_after, answer) = refused.expect("five starts at once, one allowed a second: one was refused");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(answer.to_string().contains("quota starts_per_second (1)"), "{answer}");

    let bound = json!({"name": "small-admin", "scopes": ["admin"], "namespace": "small"});
    let (_, bound) = call(&e, ADMIN, None, "POST", "/v1/keys", Some(&bound)).await;
    let key = bound["key"].as_str().unwrap();
    let (status, _) = call(&e, key, Some("small"), "PUT", "/v1/namespaces/small/quotas", Some(&json!({}))).await;
    assert_eq!(status, 403, "a namespace's own administrator does not set its quotas");
    e.stop().await;
}

/// With `small` at its quota of open runs, the runs started from outside
/// a run but not through `POST /v1/runs` are held to it too: a schedule's
/// trigger is a 429, its fire times (here, backfilled) start nothing and
/// say why, and an event's trigger says why it started no run.
async fn over_open_runs_from_outside(e: &Engine) {
    let (status, retry_after, answer) =
        call_with_retry_after(e, "small", "POST", "/v1/schedules/first/trigger", &json!({})).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{answer}");
    assert!(answer.to_string().contains("quota open_runs (2)"), "{answer}");
    let triggered = json!({"name": "on-ping", "triggers": [{"event": "ping"}],
        "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
    ok(e, "small", "POST", "/v1/workflows", triggered).await;
    let sent = ok(e, "small", "POST", "/v1/events", json!({"name": "ping"})).await;
    assert_eq!(sent["started_runs"], json!([]), "{sent}");
    assert!(sent["trigger_errors"][0]["error"].as_str().unwrap().contains("quota open_runs (2)"), "{sent}");
    let now = chrono::Utc::now();
    let range = json!({"from": now - chrono::Duration::days(3), "to": now});
    ok(e, "small", "POST", "/v1/schedules/first/backfill", range).await;
    let said = composer_testkit::poll_until(Duration::from_secs(20), || async {
        let (_, schedule) = call(e, ADMIN, Some("small"), "GET", "/v1/schedules/first", None).await;
        let error = schedule["last_fire_error"].as_str().unwrap_or_default().to_string();
        error.contains("quota open_runs (2)").then_some(())
    })
    .await;
    assert!(said.is_ok(), "a backfilled fire time past the quota says why it started nothing");
    let (_, runs) = call(e, ADMIN, Some("small"), "GET", "/v1/runs", None).await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(2), "no run past the quota: {runs}");
}

/// `composer namespace` and `--namespace`, as a person types them (the
/// CLI's calls block a thread; the coordinator serves on another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_makes_a_namespace_sets_its_quotas_and_works_in_it() {
    let e = Engine::with(options()).await;
    let cli = |args: &[&str]| {
        let out = crate::processes::composer(args)
            .env("COMPOSER_URL", e.url())
            .env("COMPOSER_API_TOKEN", ADMIN)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.code(), text, String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (code, made, err) = cli(&["namespace", "create", "team-cli", "--description", "by hand", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&made).unwrap()["name"], "team-cli");
    let (code, _, err) = cli(&["namespace", "quotas", "team-cli", "--open-runs", "3", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let (_, described, _) = cli(&["namespace", "describe", "team-cli", "-o", "json"]);
    let described: Value = serde_json::from_str(&described).unwrap();
    assert_eq!(described["quotas"], json!({"open_runs": 3}), "{described}");
    let (_, listed, _) = cli(&["namespace", "list", "-o", "json"]);
    assert!(listed.contains("team-cli") && listed.contains("default"), "{listed}");
    let file = std::env::temp_dir().join(format!("ns-cli-{}.json", std::process::id()));
    std::fs::write(
        &file,
        r#"{"name": "in-team", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]}"#,
    )
    .unwrap();
    let (code, _, err) = cli(&["workflow", "apply", "-f", file.to_str().unwrap(), "--namespace", "team-cli"]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(code, Some(0), "{err}");
    let (_, theirs, _) = cli(&["workflow", "list", "-o", "json", "--namespace", "team-cli"]);
    let (_, default, _) = cli(&["workflow", "list", "-o", "json"]);
    assert!(theirs.contains("in-team") && !default.contains("in-team"), "{theirs} / {default}");
    let (code, _, err) = cli(&["workflow", "list", "--namespace", "Team_CLI"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("namespace"), "{err}");
    e.stop().await;
}
