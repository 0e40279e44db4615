//! A definition's contract with its callers: `input_schema` checked at every
//! start, whoever starts the run (the API, a trigger, a parent, a bulk
//! rerun's start), and registration idempotent by content with declared
//! versions.

use std::time::Duration;

use composer_testkit::Engine;
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

/// An order's input: a customer and lines of a SKU and a quantity of one
/// or more, pydantic's shape (`$defs`, `$ref`, `title`).
fn order(name: &str) -> Value {
    json!({"name": name,
        "input_schema": {
            "$defs": {"Line": {"type": "object", "title": "Line",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"], "additionalProperties": false}},
            "type": "object", "title": "Order",
            "properties": {"customer": {"type": "string"}, "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}}},
            "required": ["customer", "lines"]},
        "nodes": [{"id": "count", "type": "TRANSFORM", "config": {"output": "${ .input.lines | length }"}}],
        "output": "${ .nodes.count.output }"})
}

#[tokio::test]
async fn a_start_whose_input_does_not_match_the_input_schema_is_a_400_naming_the_path() {
    let e = Engine::start().await;
    e.register(&order("order")).await;
    let good = json!({"customer": "c1", "lines": [{"sku": "a", "qty": 2}]});
    let run = e.start_run("order", good).await;
    assert_eq!(e.wait_for_run(run, T).await["output"], 1);
    for (input, at, says) in [
        (
            json!({"customer": "c1", "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 0}]}),
            "/lines/1/qty",
            "less than the minimum",
        ),
        (
            json!({"customer": "c1", "lines": [{"sku": "a", "qty": "2"}]}),
            "/lines/0/qty",
            "expected integer, got string \"2\"",
        ),
        (
            json!({"customer": "c1", "lines": [{"sku": "a", "qty": 1, "gift": true}]}),
            "/lines/0",
            "\"gift\" is not allowed",
        ),
        (json!({"lines": []}), "", "\"customer\" is required"),
        (json!([1]), "", "expected object, got an array"),
    ] {
        let (status, body) = e.post("/v1/runs", &json!({"workflow": "order", "input": input})).await;
        assert_eq!(status, 400, "{input}: {body}");
        let error = body["error"]["message"].as_str().or(body["error"].as_str()).unwrap_or_default().to_string();
        let place = if at.is_empty() { "input_schema:".to_string() } else { format!("input_schema at {at}:") };
        assert!(error.contains(&place) && error.contains(says), "{input}: {body}");
        assert!(error.contains("workflow \"order\""), "{body}");
    }
    let (_, runs) = e.get("/v1/runs?workflow=order").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "no run was created for a refused start: {runs}");
    e.stop().await;
}

/// A bad schema is refused at registration, naming the keyword.
#[tokio::test]
async fn a_bad_input_schema_is_refused_at_registration_naming_the_keyword() {
    let e = Engine::start().await;
    for (schema, says) in [
        (json!({"properties": {"a": {"type": "int"}}}), "input_schema.properties.a.type"),
        (json!({"$ref": "file:///etc/passwd"}), "only references within input_schema"),
        (json!({"pattern": "(?<=a)b"}), "input_schema.pattern"),
        (json!({"unevaluatedProperties": false}), "input_schema.unevaluatedProperties"),
    ] {
        let def = json!({"name": "bad", "input_schema": schema,
            "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 1}}]});
        let (status, body) = e.post("/v1/workflows", &def).await;
        assert_eq!(status, 400, "{schema}: {body}");
        assert!(body.to_string().contains(says), "{schema}: {body}");
    }
    e.stop().await;
}

/// Every other door a run comes in by checks the same schema: a trigger's
/// run is a trigger error, a child's is its SUB_WORKFLOW step's failure.
#[tokio::test]
async fn runs_from_triggers_and_parents_are_checked_against_the_input_schema_too() {
    let e = Engine::start().await;
    let mut triggered = order("fulfil");
    triggered["triggers"] = json!([{"event": "order.created"}]);
    e.register(&triggered).await;
    let (_, sent) =
        e.post("/v1/events", &json!({"name": "order.created", "payload": {"customer": 7, "lines": []}})).await;
    assert_eq!(sent["started_runs"].as_array().unwrap().len(), 0, "{sent}");
    let why = sent["trigger_errors"][0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("input_schema at /customer: expected string"), "{sent}");
    let (_, ok) =
        e.post("/v1/events", &json!({"name": "order.created", "payload": {"customer": "c", "lines": []}})).await;
    assert_eq!(ok["started_runs"].as_array().unwrap().len(), 1, "{ok}");

    let parent = json!({"name": "parent", "nodes": [{"id": "child", "type": "SUB_WORKFLOW", "retry": {"max_attempts": 1},
        "config": {"workflow": "fulfil", "input": {"customer": "${ .input.who }", "lines": []}}}]});
    e.register(&parent).await;
    let good = e.start_run("parent", json!({"who": "c"})).await;
    assert_eq!(e.wait_for_run(good, T).await["status"], "SUCCEEDED");
    let bad = e.start_run("parent", json!({"who": 5})).await;
    let run = e.wait_for_run(bad, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let task = run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == "child").unwrap().clone();
    assert!(task["error"].to_string().contains("input_schema at /customer"), "{task}");
    e.stop().await;
}

async fn register(e: &Engine, def: &Value, version: Option<i32>) -> (u16, Value) {
    let path = match version {
        Some(v) => format!("/v1/workflows?version={v}"),
        None => "/v1/workflows".to_string(),
    };
    e.post(&path, def).await
}

fn with_output(v: i64) -> Value {
    json!({"name": "greet", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": v}}]})
}

/// Two builds of a worker rolling over each other: each registers its
/// definition at start, and neither mints a version per start.
#[tokio::test]
async fn registering_a_definition_equal_to_any_version_answers_that_version() {
    let e = Engine::start().await;
    let (s, one) = register(&e, &with_output(1), None).await;
    assert_eq!((s, one["version"].clone()), (201, json!(1)));
    let (s, two) = register(&e, &with_output(2), None).await;
    assert_eq!((s, two["version"].clone()), (201, json!(2)));
    for _ in 0..3 {
        let (s, old) = register(&e, &with_output(1), None).await;
        assert_eq!((s, old["version"].clone()), (200, json!(1)), "the old build's definition is version 1: {old}");
        let (s, new) = register(&e, &with_output(2), None).await;
        assert_eq!((s, new["version"].clone()), (200, json!(2)), "{new}");
    }
    // The same definition written otherwise (key order) is the same; a
    // number written otherwise (2.0 for 2) is not: a run's output shows it.
    let (s, same) = e
        .post(
            "/v1/workflows",
            &json!({"nodes": [{"config": {"output": 2}, "type": "TRANSFORM", "id": "a"}], "name": "greet"}),
        )
        .await;
    assert_eq!((s, same["version"].clone()), (200, json!(2)), "{same}");
    let (s, float) = register(
        &e,
        &json!({"name": "greet", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 2.0}}]}),
        None,
    )
    .await;
    assert_eq!((s, float["version"].clone()), (201, json!(3)), "{float}");
    let (s, again) = register(
        &e,
        &json!({"name": "greet", "nodes": [{"id": "a", "type": "TRANSFORM", "config": {"output": 2.0}}]}),
        None,
    )
    .await;
    assert_eq!((s, again["version"].clone()), (200, json!(3)), "{again}");
    // A start without a version takes the latest: the old build names its own.
    let (_, started) = e.post("/v1/runs", &json!({"workflow": "greet", "version": 1})).await;
    let id: Uuid = started["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(e.wait_for_run(id, T).await["output"]["a"], 1);
    let (_, wf) = e.get("/v1/workflows/greet").await;
    assert_eq!(wf["version"], 3);
    e.stop().await;
}

/// Two workers declaring one version differently: the second is refused,
/// naming the workflow and the version.
#[tokio::test]
async fn a_declared_version_is_answered_created_or_refused_by_name() {
    let e = Engine::start().await;
    let (s, body) = register(&e, &with_output(1), Some(1)).await;
    assert_eq!((s, body["version"].clone()), (201, json!(1)), "{body}");
    let (s, body) = register(&e, &with_output(1), Some(1)).await;
    assert_eq!((s, body["version"].clone()), (200, json!(1)), "{body}");
    let (s, body) = register(&e, &with_output(9), Some(1)).await;
    assert_eq!(s, 409, "{body}");
    let said = body.to_string();
    assert!(said.contains("workflow \\\"greet\\\" version 1 is registered with a different definition"), "{said}");
    let (s, body) = register(&e, &with_output(9), Some(3)).await;
    assert_eq!(s, 409, "{body}");
    assert!(body.to_string().contains("has versions up to 1: version 3 would not be the next one (2)"), "{body}");
    let (s, body) = register(&e, &with_output(9), Some(0)).await;
    assert_eq!(s, 400, "{body}");
    let (s, body) = register(&e, &with_output(9), Some(2)).await;
    assert_eq!((s, body["version"].clone()), (201, json!(2)), "{body}");
    let (_, wf) = e.get("/v1/workflows/greet").await;
    assert_eq!(wf["versions"].as_array().unwrap().len(), 2, "nothing else was written: {wf}");
    // A rollback: version 1's definition declared as the next version is
    // the latest again (without a version it would answer version 1).
    let (s, body) = register(&e, &with_output(1), Some(3)).await;
    assert_eq!((s, body["version"].clone()), (201, json!(3)), "{body}");
    let (_, wf) = e.get("/v1/workflows/greet").await;
    assert_eq!((wf["version"].clone(), wf["spec"]["nodes"][0]["config"]["output"].clone()), (json!(3), json!(1)));
    e.stop().await;
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    id: String,
    amount: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Charge {
    charge_id: String,
    amount: u64,
}

/// A workflow in Rust, deployed from its worker: the worker registers it
/// (idempotent by content, so a second start of the worker mints no
/// version), its typed steps run on the worker, and the run ends with
/// what they computed.
#[tokio::test]
async fn a_workflow_coded_in_rust_is_registered_by_its_worker_and_runs_its_typed_steps() {
    use composer_worker::workflow::{register, WorkflowBuilder};
    let mut e =
        composer_testkit::Engine::with(composer_testkit::EngineOptions { workers: 0, ..Default::default() }).await;
    let mut wf = WorkflowBuilder::new("pay");
    let order = wf.input::<Order>();
    let charge = wf.step("charge", order.clone(), |_ctx, o: Order| async move {
        Ok(Charge { charge_id: format!("ch-{}", o.id), amount: o.amount * 100 })
    });
    let receipt = wf.step("receipt", (order, charge.output()), |_ctx, (o, c): (Order, Charge)| async move {
        Ok(format!("{} paid {} cents by {}", o.id, c.amount, c.charge_id))
    });
    wf.set_output(receipt.output().template());
    let first = register(&e.url(), None, &wf.definition(), Some(1)).await.unwrap();
    let again = register(&e.url(), None, &wf.definition(), None).await.unwrap();
    assert_eq!((first.version, first.created, again.version, again.created), (1, true, 1, false));
    let mut worker = composer_worker::Worker::new(e.worker_config("rust", 2));
    wf.install(&mut worker);
    e.spawn_worker(e.worker(worker));
    let run = e.start_run("pay", json!({"id": "o-7", "amount": 3})).await;
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["output"], "o-7 paid 300 cents by ch-o-7", "{done}");
    let mut other = wf.definition();
    other["description"] = json!("another build");
    let refused = register(&e.url(), None, &other, Some(1)).await.unwrap_err();
    assert!(refused.contains("workflow \"pay\" version 1 is registered with a different definition"), "{refused}");
    e.stop().await;
}

/// The Rust starter's workflow (what `composer init --lang rust` writes).
#[path = "../../templates/rust/src/workflow.rs"]
mod starter;

/// The Rust starter, live: its worker's registration and steps, as its
/// `cargo run` does, on a real coordinator.
#[tokio::test]
async fn the_rust_starters_workflow_runs_on_a_coordinator() {
    let mut e =
        composer_testkit::Engine::with(composer_testkit::EngineOptions { workers: 0, ..Default::default() }).await;
    let wf = starter::workflow();
    composer_worker::workflow::register(&e.url(), None, &wf.definition(), None).await.unwrap();
    let mut worker = composer_worker::Worker::new(e.worker_config("starter", 2));
    wf.install(&mut worker);
    e.spawn_worker(e.worker(worker));
    let run = e.start_run("greet", json!({"name": "Ada"})).await;
    let done = e.wait_for_run(run, T).await;
    assert_eq!(done["output"], json!({"for": "Ada", "said": "Hello, Ada!", "shouted": "HELLO, ADA!"}), "{done}");
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "greet", "input": {"name": ""}})).await;
    assert_eq!(status, 400, "{body}");
    e.stop().await;
}
