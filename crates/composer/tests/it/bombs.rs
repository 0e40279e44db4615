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
    // A fixed span of the every-second schedule's fires, as the point is
    // what did not happen in it: no crash, no run started.
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.assert_alive("after the schedule fired a few times").await;
    let runs = c.client.get("/v1/runs?workflow=tagged").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 0, "no fire started a run: {runs}");

    for round in 0..2 {
        c.restart().await;
        // A fixed span of fires after the restart: the process must outlive it.
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

/// What a bomb is planted as: the bomb's jq in a template, or bare.
fn planted(mark: &str, source: &str) -> Value {
    match mark {
        "jq" => json!(source),
        _ => json!(bomb(source)),
    }
}

/// Every hostile kind of expression: both closure forms, a long range, a
/// large string, a regular expression whose program is huge (jq's regexes
/// do not backtrack; counted repetitions are what costs).
const BOMBS: [(&str, &str); 5] = [
    ("closure", CLOSURE_BOMBS[0]),
    ("closure_arg", CLOSURE_BOMBS[1]),
    ("range", "[range(1e9)] | length"),
    ("string", "\"x\" * 1000000000"),
    ("regex", r#"("a" * 1000) | test("(\\w{1,250}){1,250}b")"#),
];

/// Every way a field's expression can be evaluated: a start by the API, an
/// event, a webhook or a schedule; as a child, as a MAP's item, as a
/// failure handler (or its input); and again by a rerun or a bulk rerun.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    Api,
    Event,
    Webhook,
    Schedule,
    Child,
    Item,
    Handler,
    HandlerInput,
    DeadlineInput,
    Update,
    Rerun,
    BulkRerun,
}

/// The routes a field is evaluated on: those of its class (found by the
/// first route: a start refused is a start-time field), the first being
/// the one every bomb takes.
fn routes_of(f: &composer_testkit::schema::SchemaField, start_time: bool) -> Vec<Route> {
    use Route::*;
    match f.def.as_str() {
        "TriggerSpec" => vec![Event, Webhook],
        "OnFailureSpec" | "HookSpec" => vec![HandlerInput],
        "DeadlineStartSpec" => vec![DeadlineInput],
        "UpdateSpec" => vec![Update],
        _ if start_time => vec![Api, Event, Webhook, Schedule, Child, Handler],
        _ if f.is_node_config() => vec![Api, Child, Item, Handler, Rerun, BulkRerun],
        _ => vec![Api, Child, Handler, Rerun, BulkRerun],
    }
}

/// One bomb in one field: its workflow (`case`), what it is and how to
/// reach it.
struct Case {
    name: String,
    field: String,
    bomb: &'static str,
    def: Value,
}

/// Whether `text` names an exceeded limit, as every bomb's error must.
fn named(text: &str) -> bool {
    text.contains("expr_max_")
}

impl Coordinator {
    async fn start_run(&self, workflow: &str) -> Result<Option<String>, String> {
        let (status, body) = self.client.post("/v1/runs", &json!({"workflow": workflow})).await;
        match status {
            201 => Ok(Some(body["id"].as_str().unwrap().to_string())),
            400 if named(&body.to_string()) => Ok(None),
            _ => Err(format!("start: {status} {body}")),
        }
    }

    /// The run ends FAILED with a named error.
    async fn failed(&self, id: &str) -> Result<Value, String> {
        let run = self.client.wait_for_run(id, T).await;
        match (run["status"].as_str(), run["error"].as_str()) {
            (Some("FAILED"), Some(e)) if named(e) => Ok(run),
            _ => Err(format!("run {id}: {run}")),
        }
    }

    /// What an event (or a webhook's delivery) did: a trigger's named error,
    /// or the run it started failed with one.
    async fn event_failed(&self, answer: (u16, Value)) -> Result<(), String> {
        let (status, sent) = answer;
        if status != 200 {
            return Err(format!("event: {status} {sent}"));
        }
        if let Some(error) = sent["trigger_errors"][0]["error"].as_str() {
            return if named(error) { Ok(()) } else { Err(format!("event: {sent}")) };
        }
        match sent["started_runs"][0]["run_id"].as_str() {
            Some(id) => self.failed(id).await.map(|_| ()),
            None => Err(format!("the event started nothing and said nothing: {sent}")),
        }
    }

    /// The failed run's failure handler did not start (its start-time
    /// expressions or input failed, named) or started and failed.
    async fn handler_failed(&self, failed_run: &str) -> Result<(), String> {
        let run = self.client.wait_for_run(failed_run, T).await;
        let history = self.history(failed_run).await;
        let Some(noted) = history.iter().find(|h| h["type"] == "HandlerStarted") else {
            return Err(format!("no handler noted for {run}"));
        };
        match (noted["payload"]["error"].as_str(), noted["payload"]["run_id"].as_str()) {
            (Some(e), _) if named(e) => Ok(()),
            (None, Some(handler)) => self.failed(handler).await.map(|_| ()),
            _ => Err(format!("handler: {noted}")),
        }
    }

    /// The run's deadline passed and its run did not start (its input
    /// failed, named) or started and failed.
    async fn deadline_failed(&self, run: &str) -> Result<(), String> {
        let until = Instant::now() + T;
        let noted = loop {
            let history = self.history(run).await;
            if let Some(noted) = history.into_iter().find(|h| h["type"] == "DeadlinePassed") {
                break noted;
            }
            if Instant::now() > until {
                return Err(format!("no deadline noted for {run}"));
            }
            // The poll interval (the loop checks its own deadline), kept
            // slow so as not to add to a bombed coordinator's load.
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        match (noted["payload"]["error"].as_str(), noted["payload"]["run_id"].as_str()) {
            (Some(e), _) if named(e) => Ok(()),
            (None, Some(started)) => self.failed(started).await.map(|_| ()),
            _ => Err(format!("deadline: {noted}")),
        }
    }

    async fn reach(&self, case: &Case, route: Route) -> Result<(), String> {
        let c = &case.name;
        match route {
            Route::Api => match self.start_run(c).await? {
                Some(id) => self.failed(&id).await.map(|_| ()),
                None => Ok(()),
            },
            Route::Event => {
                self.event_failed(self.client.post("/v1/events", &json!({"name": format!("ev.{c}")})).await).await
            }
            Route::Webhook => {
                let hook = Coordinator::webhook(
                    &format!("wh_{c}"),
                    json!({"name": format!("ev.{c}"), "payload": "${ .body }"}),
                );
                let (status, body) = self.client.post("/v1/webhooks", &hook).await;
                if status >= 300 {
                    return Err(format!("webhook: {status} {body}"));
                }
                self.event_failed(self.deliver(&format!("wh_{c}"), "{}").await).await
            }
            Route::Schedule => {
                let id = format!("s_{c}");
                let spec = json!({"id": id, "workflow": c, "cron": "* * * * * *"});
                let (status, body) = self.client.post("/v1/schedules", &spec).await;
                if status >= 300 {
                    return Err(format!("schedule: {status} {body}"));
                }
                let until = Instant::now() + T;
                let outcome = loop {
                    let view = self.client.get(&format!("/v1/schedules/{id}")).await;
                    if let Some(e) = view["last_fire_error"].as_str() {
                        break if named(e) { Ok(()) } else { Err(format!("schedule: {view}")) };
                    }
                    if Instant::now() > until {
                        break Err(format!("the schedule's fires said nothing: {view}"));
                    }
                    // The poll interval (the loop checks its own deadline),
                    // kept slow so as not to add to a bombed coordinator's load.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                let _ = self.client.http.delete(format!("{}/v1/schedules/{id}", self.client.base)).send().await;
                outcome
            }
            Route::Child => {
                let parent = format!("p_{c}");
                // A failed child is retried by default: once is enough here.
                self.register(&json!({"name": parent, "nodes": [{"id": "call", "type": "SUB_WORKFLOW",
                    "config": {"workflow": c}, "retry": {"max_attempts": 1}}]}))
                    .await;
                let id = self.start_run(&parent).await?.ok_or("the parent's start was refused")?;
                self.failed(&id).await.map(|_| ())
            }
            Route::Item => {
                let node = &case.def["nodes"][0];
                let item = format!("i_{c}");
                let spec = json!({"name": item, "nodes": [{"id": "each", "type": "MAP", "config": {
                    "items": [1], "node": {"type": node["type"], "config": node["config"]}}}]});
                let (status, body) = self.client.post("/v1/workflows", &spec).await;
                if status == 400 && body.to_string().contains("per item") {
                    return Ok(());
                }
                if status >= 300 {
                    return Err(format!("item: {status} {body}"));
                }
                let id = self.start_run(&item).await?.ok_or("the MAP's start was refused")?;
                self.failed(&id).await.map(|_| ())
            }
            Route::Handler => {
                let failing = format!("f_{c}");
                self.register(&json!({"name": failing, "on_failure": {"workflow": c},
                    "nodes": [{"id": "x", "type": "FAIL", "config": {"message": "no"}}]}))
                    .await;
                let id = self.start_run(&failing).await?.ok_or("the failing run's start was refused")?;
                self.handler_failed(&id).await
            }
            Route::HandlerInput => {
                let id = self.start_run(c).await?.ok_or("the run's start was refused")?;
                self.handler_failed(&id).await
            }
            Route::DeadlineInput => {
                let id = self.start_run(c).await?.ok_or("the run's start was refused")?;
                self.deadline_failed(&id).await
            }
            Route::Update => {
                let id = self.start_run(c).await?.ok_or("the run's start was refused")?;
                let update = json!({"name": "u", "payload": {"a": 1}, "timeout": "30s"});
                let (status, body) = self.client.post(&format!("/v1/runs/{id}/update"), &update).await;
                match (status, body["accepted"].as_bool(), body["reason"].as_str()) {
                    (200, Some(false), Some(why)) if named(why) => Ok(()),
                    _ => Err(format!("update: {status} {body}")),
                }
            }
            Route::Rerun | Route::BulkRerun => {
                let id = self.start_run(c).await?.ok_or("the run's start was refused")?;
                self.failed(&id).await?;
                let (status, body) = if route == Route::Rerun {
                    self.client.post(&format!("/v1/runs/{id}/rerun"), &json!({"from": ["n"]})).await
                } else {
                    let filter = json!({"workflow": c});
                    self.client
                        .post("/v1/runs/bulk", &json!({"filter": filter, "action": "rerun", "from": ["n"]}))
                        .await
                };
                if status >= 300 {
                    return Err(format!("{route:?}: {status} {body}"));
                }
                // Bulk jobs are worked one at a time: this one may wait for
                // every other case's.
                let until = Instant::now() + if route == Route::BulkRerun { 5 * T } else { T };
                loop {
                    let history = self.history(&id).await;
                    let failures = history.iter().filter(|h| h["type"] == "RunFailed").count();
                    if failures >= 2 {
                        return self.failed(&id).await.map(|_| ());
                    }
                    if Instant::now() > until {
                        return Err(format!("{route:?}: the run did not fail again: {history:?}"));
                    }
                    // The poll interval, slow as above.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Every field the schema marks as taking an expression, with every bomb,
/// reached every way it can be evaluated: each fails its run, start or
/// step with a named error in bounded time, `/healthz` answers within a
/// second all the while, the process stays up, and a restarted coordinator
/// serves. The fields come from the schema (`testkit::schema`), so a new
/// one is covered without touching this test.
///
/// By default every bomb takes each field's first route and the first bomb
/// every route; `COMPOSER_BOMB_SOAK=1` takes every bomb every route.
#[tokio::test]
async fn every_expression_field_of_the_schema_holds_every_bomb() {
    use composer_testkit::schema;
    use futures_util::StreamExt;
    let soak = std::env::var("COMPOSER_BOMB_SOAK").is_ok_and(|v| v == "1");
    let mut coordinator = Coordinator::start("bomb-schema").await;
    coordinator.register(&json!({"name": "echo", "nodes": [transform("t")]})).await;
    coordinator.register(&json!({"name": "handler", "nodes": [transform("h")]})).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let health = {
        let (http, url) = (coordinator.client.http.clone(), format!("{}/healthz", coordinator.client.base));
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut slow = Vec::new();
            while !stop.is_cancelled() {
                let started = Instant::now();
                let answer = http.get(&url).timeout(Duration::from_secs(1)).send().await;
                if !answer.is_ok_and(|r| r.status().is_success()) {
                    slow.push(started.elapsed());
                }
                // The pace of the health probe, as a load balancer's would be.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            slow
        })
    };

    let schema = schema::schema();
    // COMPOSER_BOMB_FIELDS=HttpConfig.url,MapConfig.items takes only those.
    let only = std::env::var("COMPOSER_BOMB_FIELDS").ok();
    let marked: Vec<schema::SchemaField> = schema::fields(&schema)
        .into_iter()
        .filter(|f| f.is_expression())
        .filter(|f| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == f.name())))
        .collect();
    assert!(marked.len() >= 20 || only.is_some(), "{} marked fields", marked.len());
    let mut cases = Vec::new();
    for (i, f) in marked.iter().enumerate() {
        for (b, (bomb_name, source)) in BOMBS.iter().enumerate() {
            let name = format!("c{i}_{bomb_name}");
            let mut def = schema::definition_with(&schema, &name, f, planted(f.mark.as_deref().unwrap(), source));
            match f.def.as_str() {
                "TriggerSpec" => def["triggers"][0]["event"] = json!(format!("ev.{name}")),
                "DeadlineStartSpec" => {
                    def["nodes"] = json!([{"id": "n", "type": "WAIT", "config": {"duration": "3s"}}])
                }
                "OnFailureSpec" | "HookSpec" => {
                    def["nodes"] = json!([{"id": "n", "type": "FAIL", "config": {"message": "no"}}])
                }
                _ => def["triggers"] = json!([{"event": format!("ev.{name}")}]),
            }
            cases.push((b, Case { name, field: f.name(), bomb: bomb_name, def }));
        }
    }
    let by_field = |field: &str| marked.iter().find(|f| f.name() == field).unwrap();
    let reached = {
        let c = &coordinator;
        for (_, case) in &cases {
            let (status, body) = c.client.post("/v1/workflows", &case.def).await;
            assert!(status < 300, "{} with {}: {status} {body}\n{}", case.field, case.bomb, case.def);
        }
        // The first route of each field tells its class; then the rest.
        let first: Vec<(usize, bool)> = futures_util::stream::iter(cases.iter().enumerate())
            .map(|(k, (_, case))| async move {
                let f = by_field(&case.field);
                let start_time = match f.def.as_str() {
                    "TriggerSpec" | "OnFailureSpec" | "HookSpec" | "DeadlineStartSpec" => false,
                    _ => c.client.post("/v1/runs", &json!({"workflow": case.name})).await.0 == 400,
                };
                let route = routes_of(f, start_time)[0];
                let outcome = c.reach(case, route).await;
                assert!(outcome.is_ok(), "{} with {} by {route:?}: {}", case.field, case.bomb, outcome.unwrap_err());
                (k, start_time)
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let mut more = Vec::new();
        for (k, start_time) in first {
            let (b, case) = &cases[k];
            if soak || *b == 0 {
                let routes = routes_of(by_field(&case.field), start_time);
                more.extend(routes.into_iter().skip(1).map(|r| (case, r)));
            }
        }
        let reached = more.len();
        // A bulk rerun reruns every run of its case's workflow: it goes last,
        // so that it does not reset a step a rerun of the same case names.
        let (bulk, rest): (Vec<_>, Vec<_>) = more.into_iter().partition(|(_, r)| *r == Route::BulkRerun);
        for phase in [rest, bulk] {
            futures_util::stream::iter(phase)
                .for_each_concurrent(8, |(case, route)| async move {
                    let outcome = c.reach(case, route).await;
                    assert!(
                        outcome.is_ok(),
                        "{} with {} by {route:?}: {}",
                        case.field,
                        case.bomb,
                        outcome.unwrap_err()
                    );
                })
                .await;
        }
        reached
    };
    stop.cancel();
    let slow = health.await.unwrap();
    assert!(slow.is_empty(), "/healthz took a second or more {} times: {slow:?}", slow.len());
    eprintln!(
        "{} marked fields, {} bombs: {} cases, then {reached} more routes",
        marked.len(),
        BOMBS.len(),
        cases.len()
    );
    coordinator.assert_alive("after every bomb").await;
    coordinator.restart().await;
    coordinator.assert_serves("after a restart").await;
}
