//! Hostile expressions against a coordinator process: whatever field they
//! are written in and whatever way they are reached, they fail the run,
//! start or step they belong to with a named error, and the process stays
//! up, answers `/healthz` within a second and serves again after a restart.
//!
//! The reproductions of what aborted coordinators are named after what they
//! did; [`every_expression_field_of_the_schema_holds_every_bomb`] walks the
//! definition schema's marked fields so that a new one is covered unasked.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use composer_testkit::{services, unique_prefix, TestDb};
use serde_json::{json, Value};

use crate::processes::{coordinator_cmd, wait_for_file, Client, Proc};

/// The two closure bombs that aborted coordinators: a function passing
/// itself a closure builds a chain of bindings as long as its budget.
pub(crate) const CLOSURE_BOMBS: [&str; 2] = ["def f(x): f(x); f(0)", "def f(g): f(1); f(0)"];

const T: Duration = Duration::from_secs(60);
const GH_SECRET: &str = "bomb-webhook-secret";

/// A coordinator process of its own database, restartable on its address.
pub(crate) struct Coordinator {
    proc: Option<Proc>,
    pub(crate) client: Client,
    db: TestDb,
    prefix: String,
    listen: String,
    dir: PathBuf,
}

impl Coordinator {
    pub(crate) async fn start(name: &str) -> Coordinator {
        let db = TestDb::create().await;
        let dir = composer_embedded::temp_dir(name).unwrap();
        let listen = format!("127.0.0.1:{}", composer_embedded::free_port().unwrap());
        let mut c =
            Coordinator { proc: None, client: Client::new("http://unset"), db, prefix: unique_prefix(), listen, dir };
        c.spawn().await;
        c
    }

    async fn spawn(&mut self) {
        let addr_file = self.dir.join("c.addr");
        let _ = std::fs::remove_file(&addr_file);
        let redis = services().redis_url.clone();
        let mut cmd = coordinator_cmd(&self.db, &redis, &self.prefix, &self.listen, &addr_file);
        cmd.env("COMPOSER_WEBHOOK_SECRET_BOMB_GH", GH_SECRET).env("COMPOSER_RECOVERY_INTERVAL", "1s");
        self.proc = Some(Proc::spawn(&mut cmd));
        self.client = Client::new(&wait_for_file(&addr_file, Duration::from_secs(30)).await);
    }

    /// Fails the test if the process has ended (an abort) or `/healthz`
    /// takes a second or more.
    pub(crate) async fn assert_alive(&mut self, when: &str) {
        let proc = self.proc.as_mut().unwrap();
        assert!(proc.0.try_wait().unwrap().is_none(), "{when}: the coordinator died");
        let started = Instant::now();
        let answer =
            self.client.http.get(format!("{}/healthz", self.client.base)).timeout(Duration::from_secs(1)).send().await;
        assert!(
            answer.is_ok_and(|r| r.status().is_success()),
            "{when}: /healthz did not answer within a second ({:?})",
            started.elapsed()
        );
    }

    /// SIGTERM and start again on the same address and state directory.
    pub(crate) async fn restart(&mut self) {
        let mut proc = self.proc.take().unwrap();
        assert!(proc.terminate(Duration::from_secs(30)).success(), "a clean stop");
        self.spawn().await;
    }

    /// A run of a definition without expressions starts and succeeds.
    pub(crate) async fn assert_serves(&mut self, when: &str) {
        let plain = json!({"name": "plain", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]});
        assert!(self.client.post("/v1/workflows", &plain).await.0 < 300);
        let (status, run) = self.client.post("/v1/runs", &json!({"workflow": "plain"})).await;
        assert_eq!(status, 201, "{when}: {run}");
        let run = self.client.wait_for_run(run["id"].as_str().unwrap(), T).await;
        assert_eq!(run["status"], "SUCCEEDED", "{when}: {run}");
    }

    pub(crate) async fn register(&self, spec: &Value) {
        let (status, body) = self.client.post("/v1/workflows", spec).await;
        assert!(status == 201 || status == 200, "{spec}: {body}");
    }

    /// Signs and delivers `body` to the GitHub-scheme webhook `name`.
    pub(crate) async fn deliver(&self, name: &str, body: &str) -> (u16, Value) {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, GH_SECRET.as_bytes());
        let tag = ring::hmac::sign(&key, body.as_bytes());
        let sig = format!("sha256={}", tag.as_ref().iter().map(|b| format!("{b:02x}")).collect::<String>());
        let r = self
            .client
            .http
            .post(format!("{}/v1/webhooks/{name}", self.client.base))
            .header("x-hub-signature-256", sig)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// A webhook of the GitHub scheme whose secret this coordinator has.
    pub(crate) fn webhook(name: &str, event: Value) -> Value {
        json!({"name": name, "scheme": "github", "secret": "BOMB_GH", "event": event})
    }

    pub(crate) async fn history(&self, run: &str) -> Vec<Value> {
        let h = self.client.get(&format!("/v1/runs/{run}/events?limit=1000")).await;
        h["events"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.proc.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bomb(source: &str) -> String {
    format!("${{ {source} }}")
}

fn transform(id: &str) -> Value {
    json!({"id": id, "type": "TRANSFORM", "config": {"output": 1}})
}

/// Finding 1: in a definition's `tags`, `concurrency.key`, `fairness_key`
/// or `on_failure.input`, and through an event or a signed webhook routed
/// to a trigger of such a definition, the closure bombs overflowed a tokio
/// worker's stack: they were evaluated off the evaluation threads.
#[tokio::test]
async fn a_closure_bomb_in_tags_keys_a_handlers_input_or_a_trigger_fails_its_start_not_the_coordinator() {
    let mut c = Coordinator::start("bomb-fields").await;
    c.register(&json!({"name": "handler", "nodes": [transform("h")]})).await;
    for (i, source) in CLOSURE_BOMBS.iter().enumerate() {
        let b = bomb(source);
        let fields: [(&str, Value); 3] = [
            ("tags.t", json!({"tags": {"t": b}})),
            ("concurrency.key", json!({"concurrency": {"key": b, "max": 1}})),
            ("fairness_key", json!({"fairness_key": b})),
        ];
        for (field, extra) in fields {
            let name = format!("b{i}_{}", field.replace('.', "_"));
            let mut spec = json!({"name": name, "nodes": [transform("t")],
                "triggers": [{"event": format!("ev.{name}")}]});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            c.register(&spec).await;
            let (status, body) = c.client.post("/v1/runs", &json!({"workflow": name})).await;
            assert_eq!(status, 400, "{name}: {body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains(field) && message.contains("expr_max_"), "{name}: {body}");
            let (status, sent) = c.client.post("/v1/events", &json!({"name": format!("ev.{name}")})).await;
            assert_eq!(status, 200, "{name}: {sent}");
            let error = sent["trigger_errors"][0]["error"].as_str().unwrap_or_default();
            assert!(error.contains(field) && error.contains("expr_max_"), "{name}: {sent}");
            let hook = format!("hook_{name}");
            let webhook = Coordinator::webhook(&hook, json!({"name": format!("ev.{name}"), "payload": "${ .body }"}));
            assert_eq!(c.client.post("/v1/webhooks", &webhook).await.0, 201);
            let (status, sent) = c.deliver(&hook, &format!(r#"{{"n": "{name}"}}"#)).await;
            assert_eq!(status, 200, "{name}: {sent}");
            assert!(sent["trigger_errors"][0]["error"].as_str().unwrap_or_default().contains(field), "{sent}");
            c.assert_alive(&name).await;
        }
        let name = format!("b{i}_handler_input");
        c.register(&json!({"name": name, "nodes": [{"id": "f", "type": "FAIL", "config": {"message": "no"}}],
            "on_failure": {"workflow": "handler", "input": {"x": b}}}))
            .await;
        let (_, run) = c.client.post("/v1/runs", &json!({"workflow": name})).await;
        let id = run["id"].as_str().unwrap().to_string();
        assert_eq!(c.client.wait_for_run(&id, T).await["status"], "FAILED");
        let noted = c.history(&id).await.into_iter().find(|h| h["type"] == "HandlerStarted").expect("noted");
        let error = noted["payload"]["error"].as_str().unwrap_or_default();
        assert!(error.contains("on_failure.input") && error.contains("expr_max_"), "{noted}");
        assert!(noted["payload"]["run_id"].is_null(), "no handler run: {noted}");
        // A webhook's own transform.
        let hook = format!("hook_{i}_transform");
        assert_eq!(c.client.post("/v1/webhooks", &Coordinator::webhook(&hook, json!({"name": b}))).await.0, 201);
        let (status, refused) = c.deliver(&hook, "{}").await;
        assert_eq!(status, 400, "{refused}");
        assert!(refused.to_string().contains("webhook transform") && refused.to_string().contains("expr_max_"));
        c.assert_alive("after the handler's input").await;
    }
    c.restart().await;
    c.assert_serves("after a restart").await;
}

/// Finding 2: behind a `WAIT`, the bombs aborted the coordinator when the
/// run got to them, and again within seconds of every restart: (a) a failure
/// handler's input, (b) a child's concurrency key, (c) a schedule's tags at
/// every fire. They fail their run, child or fire now, and a restart finds
/// nothing to evaluate again.
#[tokio::test]
async fn a_closure_bomb_behind_a_wait_a_child_or_a_schedule_makes_no_crash_loop() {
    let mut c = Coordinator::start("bomb-loops").await;
    let b = bomb(CLOSURE_BOMBS[0]);
    c.register(&json!({"name": "handler", "nodes": [transform("h")]})).await;
    c.register(&json!({"name": "later_fail", "nodes": [
        {"id": "pause", "type": "WAIT", "config": {"duration": "3s"}},
        {"id": "f", "type": "FAIL", "config": {"message": "no"}}],
        "edges": [{"from": "pause", "to": "f"}],
        "on_failure": {"workflow": "handler", "input": {"x": b}}}))
        .await;
    c.register(&json!({"name": "keyed_child", "concurrency": {"key": b, "max": 1}, "nodes": [transform("t")]})).await;
    c.register(&json!({"name": "parent", "nodes": [
        {"id": "pause", "type": "WAIT", "config": {"duration": "3s"}},
        {"id": "call", "type": "SUB_WORKFLOW", "config": {"workflow": "keyed_child"}}],
        "edges": [{"from": "pause", "to": "call"}]}))
        .await;
    c.register(&json!({"name": "tagged", "tags": {"t": b}, "nodes": [transform("t")]})).await;
    let schedule = json!({"id": "every_second", "workflow": "tagged", "cron": "* * * * * *"});
    let (status, body) = c.client.post("/v1/schedules", &schedule).await;
    assert_eq!(status, 201, "{body}");
    let (_, failing) = c.client.post("/v1/runs", &json!({"workflow": "later_fail"})).await;
    let (_, parent) = c.client.post("/v1/runs", &json!({"workflow": "parent"})).await;
    let (failing, parent) = (failing["id"].as_str().unwrap(), parent["id"].as_str().unwrap());

    let run = c.client.wait_for_run(failing, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let noted = c.history(failing).await.into_iter().find(|h| h["type"] == "HandlerStarted").expect("noted");
    assert!(noted["payload"]["error"].as_str().unwrap().contains("expr_max_"), "{noted}");
    let run = c.client.wait_for_run(parent, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("concurrency.key"), "{run}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.assert_alive("after the schedule fired a few times").await;
    let runs = c.client.get("/v1/runs?workflow=tagged").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 0, "no fire started a run: {runs}");

    for round in 0..2 {
        c.restart().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        c.assert_alive(&format!("{round}: seconds after a restart, the schedule firing")).await;
        c.assert_serves(&format!("{round}: after a restart")).await;
    }
}

/// Finding 3: a MAP's `items` may take ten million steps, and the closure
/// bombs built chains of bindings that overflowed an evaluation thread's
/// 256 MiB stack when dropped (2 tries in 5). Every try fails its MAP.
#[tokio::test]
async fn a_closure_bomb_in_map_items_fails_the_map_on_every_try() {
    let mut c = Coordinator::start("bomb-items").await;
    let mut runs = Vec::new();
    for (i, source) in CLOSURE_BOMBS.iter().enumerate() {
        let name = format!("items_{i}");
        c.register(&json!({"name": name, "nodes": [{"id": "each", "type": "MAP", "config": {
            "items": bomb(source), "node": {"type": "TRANSFORM", "config": {"output": "${ .item }"}}}}]}))
            .await;
        for _ in 0..3 {
            let (_, run) = c.client.post("/v1/runs", &json!({"workflow": name})).await;
            runs.push(run["id"].as_str().unwrap().to_string());
        }
    }
    for id in runs {
        let run = c.client.wait_for_run(&id, T).await;
        assert_eq!(run["status"], "FAILED", "{run}");
        let error = run["error"].as_str().unwrap();
        assert!(error.contains("config.items") && error.contains("expr_max_"), "{run}");
        c.assert_alive("after a MAP's items").await;
    }
}

/// The schema's marks are what compiles: every field of the schema is
/// probed with an expression (a template and a bare jq one) that names it,
/// and the definition is compiled noting every expression compiled. A
/// marked field's probe compiles; an unmarked field's never does in a
/// definition that is accepted. So a field that takes an expression and
/// is not marked (or the reverse) fails here the day it is added.
#[test]
fn the_schema_marks_exactly_the_fields_that_compile_an_expression() {
    use composer_testkit::schema;
    let schema = schema::schema();
    let fields = schema::fields(&schema);
    let mut checked = 0;
    for f in &fields {
        let marker = format!("probe:{}", f.name());
        let template = json!(format!("${{ \"{marker}\" }}"));
        let jq = json!(format!("\"{marker}\" | length > 0"));
        for (form, value) in [("template", template), ("jq", jq)] {
            let def = schema::definition_with(&schema, "probe", f, value);
            let (parsed, sources) = composer_core::expr::on_eval_stack(|| {
                composer_core::expr::noting_sources(|| composer_core::definition::Workflow::parse(&def))
            })
            .unwrap();
            let compiled = sources.iter().any(|s| s.contains(&marker));
            match f.mark.as_deref() {
                Some(mark) if mark == form => {
                    assert!(parsed.is_ok(), "{}: marked {mark}, refused: {:?}\n{def}", f.name(), parsed.err());
                    assert!(compiled, "{}: marked {mark}, but its {form} probe is not compiled\n{def}", f.name());
                }
                _ => assert!(
                    !(parsed.is_ok() && compiled),
                    "{}: not marked {form}, but a {form} probe in it is compiled: mark it in the schema\n{def}",
                    f.name()
                ),
            }
            checked += 1;
        }
    }
    assert!(checked > 120, "{checked}");
}
