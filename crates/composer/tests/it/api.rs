//! The REST API's answers to bad input, missing things and missing tokens.

use composer_testkit::{http_node, Engine, EngineOptions};
use serde_json::{json, Value};

fn assert_error(status: u16, body: &Value, want: u16, mentions: &str) {
    assert_eq!(status, want, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("JSON error body expected: {body}"));
    assert!(body["error"]["code"].is_string(), "{body}");
    assert!(message.contains(mentions), "message {message:?} should mention {mentions:?}");
}

#[tokio::test]
async fn invalid_definitions_are_400s_naming_the_problem() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let a = http_node("a", "http://127.0.0.1:9/a", 1);
    let b = http_node("b", "http://127.0.0.1:9/b", 1);
    let cases = [
        (json!({"name": "c", "nodes": [a, b], "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}]}), "cycle"),
        (json!({"name": "d", "nodes": [a, a]}), "duplicate node id \"a\""),
        (json!({"name": "u", "nodes": [a], "edges": [{"from": "a", "to": "ghost"}]}), "ghost"),
        (json!({"name": "", "nodes": [a]}), "name"),
        (json!({"name": "m", "nodes": [{"id": "h", "type": "HTTP", "config": {}}]}), "nodes[h].config.url"),
        (json!({"name": "f", "nodes": [a], "colour": "red"}), "colour"),
        (
            json!({"name": "t", "nodes": [{"id": "h", "type": "HTTP", "config": {"url": "http://x", "timeout": "soon"}}]}),
            "nodes[h].config.timeout",
        ),
    ];
    for (spec, mentions) in cases {
        let (status, body) = e.post("/v1/workflows", &spec).await;
        assert_error(status, &body, 400, mentions);
    }
    let (status, body) = e.post_raw("/v1/workflows", "{\"name\": \"x\", \"nodes\": [").await;
    assert_error(status, &body, 400, "invalid JSON");
    let (status, body) = e.post_raw("/v1/runs", "not json").await;
    assert_error(status, &body, 400, "invalid JSON");
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "x", "surprise": 1})).await;
    assert_error(status, &body, 400, "surprise");
    // A value of the wrong type names its field, not only a line and column.
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "x", "priority": "high"})).await;
    assert_error(status, &body, 400, "invalid JSON body: priority: expected ");
    assert!(body.to_string().contains("got \\\"high\\\""), "in words, with what came: {body}");
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "x", "tags": {"team": "a"}, "version": [1]})).await;
    assert_error(status, &body, 400, "invalid JSON body: version: ");
    let (_, list) = e.get("/v1/workflows").await;
    assert_eq!(list["workflows"], json!([]), "nothing was half-registered");
    e.stop().await;
}

/// Issue 51, item 9: a wrong field deep in a definition is named by its
/// whole path with what was expected, and a bad expression in words with
/// its place, never the parser's Debug values.
#[tokio::test]
async fn a_400_names_the_fields_path_and_a_bad_expression_in_words() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let a = http_node("a", "http://127.0.0.1:9/a", 1);
    let b = http_node("b", "http://127.0.0.1:9/b", 1);
    let mut retried = a.clone();
    retried["retry"] = json!({"max_attempts": 1.5});
    let item = json!({"type": "HTTP", "config": {"url": "http://h"}, "limits": [{"key": "k", "burst": "ten"}]});
    let cases = [
        (json!({"name": "r", "nodes": [retried]}), "nodes[a].retry.max_attempts: expected an integer, got 1.5"),
        (
            json!({"name": "e", "nodes": [a, b], "edges": [{"from": "a", "to": "b", "on": "sometimes"}]}),
            "edges[0].on: \"sometimes\" is not accepted (expected one of: success, failure, always)",
        ),
        (
            json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": {"items": [1], "node": item}}]}),
            "nodes[each].config.node.limits[0].burst: expected an integer, got \"ten\"",
        ),
        (json!({"name": "c", "nodes": [a], "concurrency": {"key": "k"}}), "concurrency.max: is required"),
        (
            json!({"name": "x", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": {"v": "${ .x | }"}}}]}),
            "nodes[t].config.output.v: invalid jq \".x |\": expected a term",
        ),
        (
            json!({"name": "w", "nodes": [a, b], "edges": [{"from": "a", "to": "b", "when": "(.ok"}]}),
            "edges[0].when: invalid jq \"(.ok\": \"(\" at offset 0 is not closed: expected \")\" at offset 4",
        ),
    ];
    for (spec, mentions) in cases {
        let (status, body) = e.post("/v1/workflows", &spec).await;
        assert_error(status, &body, 400, mentions);
        let message = body["error"]["message"].as_str().unwrap_or_default();
        for internal in ["Parse(", "Term", "[(", "invalid type", "struct ", "u32"] {
            assert!(!message.contains(internal), "{message:?} shows {internal:?}");
        }
    }
    let (_, list) = e.get("/v1/workflows").await;
    assert_eq!(list["workflows"], json!([]), "nothing was registered");
    e.stop().await;
}

#[tokio::test]
async fn unknown_workflows_and_runs_are_404s() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "nope"})).await;
    assert_error(status, &body, 404, "nope");
    let (status, body) = e.get("/v1/workflows/nope").await;
    assert_error(status, &body, 404, "nope");
    let (status, body) = e.get("/v1/workflows/nope/versions/3").await;
    assert_error(status, &body, 404, "nope");
    let missing = uuid::Uuid::now_v7();
    let (status, body) = e.get(&format!("/v1/runs/{missing}")).await;
    assert_error(status, &body, 404, &missing.to_string());
    let (status, body) = e.post(&format!("/v1/runs/{missing}/cancel"), &json!({})).await;
    assert_error(status, &body, 404, &missing.to_string());
    let (status, body) = e.get("/v1/runs/not-a-uuid").await;
    assert_error(status, &body, 400, "not-a-uuid");
    let (status, body) = e.get("/v1/nothing-here").await;
    assert_error(status, &body, 404, "no such endpoint");
    e.stop().await;
}

#[tokio::test]
async fn long_uris_and_wrong_methods_get_json_errors() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let long = format!("/v1/runs?workflow={}", "w".repeat(composer_coord::http::MAX_URI_BYTES));
    let (status, body) = e.get(&long).await;
    assert_error(status, &body, 414, "URI");
    // Just under the limit the request reaches its handler (a name that long is refused there).
    let under = format!("/v1/runs?workflow={}", "w".repeat(composer_coord::http::MAX_URI_BYTES - 40));
    let (status, body) = e.get(&under).await;
    assert_error(status, &body, 400, "workflow");
    let (status, body) = e.delete("/v1/runs").await;
    assert_error(status, &body, 405, "method not allowed");
    e.stop().await;
}

#[tokio::test]
async fn registered_workflows_can_be_read_back() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let spec = json!({"name": "readable", "nodes": [http_node("a", "http://127.0.0.1:9/a", 2)]});
    let created = e.register(&spec).await;
    let (status, one) = e.get("/v1/workflows/readable").await;
    assert_eq!(status, 200);
    assert_eq!(one["version"], 1);
    assert_eq!(one["spec"]["nodes"][0]["config"]["url"], "http://127.0.0.1:9/a");
    assert_eq!(one["versions"].as_array().unwrap().len(), 1);
    let (_, v1) = e.get("/v1/workflows/readable/versions/1").await;
    assert_eq!(v1["id"], created["id"]);
    let (_, list) = e.get("/v1/workflows").await;
    assert_eq!(list["workflows"][0]["name"], "readable");
    let (status, health) = e.get("/readyz").await;
    assert_eq!((status, &health["status"]), (200, &json!("ready")));
    e.stop().await;
}

#[tokio::test]
async fn tokens_guard_the_api_and_the_task_api() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            c.api_token = Some("api-secret-0123456789".into());
            c.worker_token = Some("worker-secret-0123456789".into());
        },
        ..Default::default()
    })
    .await;
    let http = reqwest::Client::new();
    let url = e.url();
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(status(http.get(format!("{url}/v1/workflows")).send().await.unwrap()), 401);
    assert_eq!(status(http.get(format!("{url}/v1/workflows")).bearer_auth("wrong").send().await.unwrap()), 401);
    assert_eq!(
        status(http.get(format!("{url}/v1/workflows")).bearer_auth("api-secret-0123456789").send().await.unwrap()),
        200
    );
    let task = uuid::Uuid::now_v7();
    let report = json!({"run_id": uuid::Uuid::now_v7(), "attempt": 1, "worker_id": "w"});
    let complete = format!("{url}/v1/tasks/{task}/complete");
    assert_eq!(
        status(http.post(&complete).bearer_auth("api-secret-0123456789").json(&report).send().await.unwrap()),
        403,
        "the API token is an administrator's, and reporting a result is a worker's alone"
    );
    assert_eq!(
        status(http.get(format!("{url}/v1/workflows")).bearer_auth("worker-secret-0123456789").send().await.unwrap()),
        403,
        "the worker token works queues only"
    );
    assert_eq!(
        status(http.post(&complete).bearer_auth("worker-secret-0123456789").json(&report).send().await.unwrap()),
        409,
        "past the token: no lease of a run that does not exist is held"
    );
    assert_eq!(status(http.get(format!("{url}/healthz")).send().await.unwrap()), 200, "health needs no token");
    e.stop().await;
}

#[tokio::test]
async fn a_coordinator_refuses_to_listen_openly_without_tokens() {
    let mut c = composer_coord::Config::new("postgres://unused", "redis://unused");
    c.listen = "0.0.0.0:0".parse().unwrap();
    let err = c.clone().validated().unwrap_err().to_string();
    assert!(err.contains("COMPOSER_API_TOKEN") && err.contains("COMPOSER_ALLOW_NO_AUTH"), "{err}");
    c.allow_no_auth = true;
    assert!(c.validated().is_ok());
}

#[tokio::test]
async fn oversized_run_input_is_refused_with_413() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.max_payload = 1000, ..Default::default() }).await;
    e.register(&json!({"name": "small", "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]})).await;
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "small", "input": {"blob": "x".repeat(2000)}})).await;
    assert_error(status, &body, 413, "1000 bytes");
    e.stop().await;
}

/// A request sent with its path as written. reqwest, a browser and fetch
/// read a segment `.` or `..`, even as `%2E%2E`, as "here" and "the parent"
/// and send another path: only a client that keeps it (curl with `%2E%2E`)
/// reaches the server with one.
async fn as_written(e: &Engine, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = e.url().trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&host).await.unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    let json = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (status, serde_json::from_str(json).unwrap_or(Value::String(json.into())))
}

/// Issue 51, item 7: `.` and `..` were taken as names (201) that no client
/// could then reach. Each is refused with a 400 naming its field; `a.b` is
/// a name as before.
#[tokio::test]
async fn names_a_url_cannot_carry_are_refused_everywhere() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let why = "may not be \".\" or \"..\": a URL path cannot carry it";
    let config = json!({"url": "http://127.0.0.1:9/"});
    let node = |id: &str, key: &str| json!({"id": id, "type": "HTTP", "config": config, "limits": [{"key": key}]});
    let schedule = |id: &str| json!({"id": id, "workflow": "a.b", "cron": "0 * * * *"});
    let webhook = |name: &str| json!({"name": name, "scheme": "github", "secret": "NAMES"});
    for bad in [".", ".."] {
        for (path, body, field) in [
            ("/v1/workflows", json!({"name": bad, "nodes": [node("a", "k")]}), "name".to_string()),
            ("/v1/workflows", json!({"name": "w", "nodes": [node(bad, "k")]}), format!("nodes[{bad}].id")),
            ("/v1/workflows", json!({"name": "w", "nodes": [node("a", bad)]}), "nodes[a].limits[0].key".into()),
            ("/v1/schedules", schedule(bad), "id".into()),
            ("/v1/webhooks", webhook(bad), "name".into()),
            ("/v1/tasks/poll", json!({"worker_id": "w", "queues": [bad], "wait": "0s"}), "queues".into()),
        ] {
            let (status, answer) = e.post(path, &body).await;
            assert_error(status, &answer, 400, &format!("{field}: {why}"));
        }
        let (status, answer) = e.get(&format!("/v1/runs?workflow={bad}")).await;
        assert_error(status, &answer, 400, &format!("workflow: {why}"));
        let key = format!("/v1/limits/{}", bad.replace('.', "%2E"));
        let (status, answer) = as_written(&e, "PUT", &key, Some(&json!({"concurrency": 1}))).await;
        assert_error(status, &answer, 400, &format!("key: {why}"));
    }
    assert_eq!(e.post("/v1/workflows", &json!({"name": "a.b", "nodes": [node("a.b", "a.b")]})).await.0, 201);
    assert_eq!(e.post("/v1/schedules", &schedule("a.b")).await.0, 201);
    assert_eq!(e.post("/v1/webhooks", &webhook("a.b")).await.0, 201);
    assert_eq!(e.put("/v1/limits/a.b", &json!({"concurrency": 1})).await.0, 200);
    for path in ["/v1/workflows/a.b", "/v1/schedules/a.b", "/v1/webhooks/a.b", "/v1/limits/a.b"] {
        let (status, answer) = e.get(path).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    e.stop().await;
}

/// A webhook, schedule or limit key named `.` or `..` before they were
/// refused can still be deleted, by a URL that keeps the dots.
#[tokio::test]
async fn names_a_url_cannot_carry_stored_before_can_still_be_deleted() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let mut db = composer_store::client(&e.db.pool()).await.unwrap();
    let hook = json!({"name": "..", "scheme": "github", "secret": "NAMES"});
    composer_store::webhooks::upsert(&db, "..", &hook).await.unwrap();
    let spec = json!({"id": "..", "workflow": "w", "cron": "0 * * * *"});
    composer_store::schedules::upsert(&mut db, "..", &spec, "w", true, None).await.unwrap();
    let values = composer_core::definition::limit::LimitValues { rate: None, concurrency: Some(1) };
    composer_store::limits::set(&db, "..", &values).await.unwrap();
    for path in ["/v1/webhooks/%2E%2E", "/v1/limits/%2E%2E"] {
        let (status, answer) = as_written(&e, "GET", path, None).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    for path in ["/v1/webhooks/%2E%2E", "/v1/schedules/%2E%2E", "/v1/limits/%2E%2E"] {
        let (status, answer) = as_written(&e, "DELETE", path, None).await;
        assert_eq!((status, &answer["deleted"]), (200, &json!("..")), "{path}: {answer}");
    }
    e.stop().await;
}

/// A definition stored before a rule it breaks (here: a node id `.`) is
/// refused by name when a run of it starts, not answered with a 500.
#[tokio::test]
async fn a_definition_stored_before_a_rule_it_breaks_is_refused_by_name_not_a_500() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let mut db = composer_store::client(&e.db.pool()).await.unwrap();
    let spec = json!({"name": "old", "nodes": [{"id": ".", "type": "TRANSFORM", "config": {"output": 1}}]});
    composer_store::definitions::register(&mut db, "old", &spec, &[], None).await.unwrap();
    let (status, answer) = e.post("/v1/runs", &json!({"workflow": "old"})).await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"old\" version 1") && message.contains("register a new version"), "{answer}");
    e.stop().await;
}
