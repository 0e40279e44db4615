//! The examples' main workflows written with the Rust builder: each makes
//! exactly the definition its JSON file does (as the server normalizes
//! both), and a typed workflow runs offline through the engine's rules.

#![allow(clippy::unwrap_used)] // a test fails by panicking

use composer_core::definition::{EdgeOn, RetrySpec, Workflow};
use composer_worker::workflow::{engine_node, Mocks, WorkflowBuilder};
use composer_worker::TaskError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A definition as the server stores it.
fn normalized(v: &Value) -> Value {
    let wf = composer_core::expr::on_eval_stack({
        let v = v.clone();
        move || Workflow::parse(&v)
    })
    .unwrap()
    .unwrap();
    serde_json::to_value(&wf.spec).unwrap()
}

fn example(name: &str) -> Value {
    let path = format!("{}/../../examples/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn retry(max: u32, initial: &str) -> Option<RetrySpec> {
    Some(RetrySpec {
        max_attempts: Some(max),
        initial_backoff: Some(initial.into()),
        multiplier: None,
        max_backoff: None,
        on_429: None,
    })
}

fn hello() -> WorkflowBuilder {
    let mut wf = WorkflowBuilder::new("hello");
    wf.spec_mut().description = example("hello")["description"].as_str().map(str::to_string);
    let mut check = engine_node(
        "check",
        "HTTP",
        json!({"method": "GET",
        "url": "${ .input.coordinator // error(\"the input names no coordinator URL\") }/healthz", "timeout": "5s"}),
    );
    check.retry = retry(3, "500ms");
    wf.node(check, &[]);
    wf.node(engine_node("pause", "WAIT", json!({"duration": "1s"})), &["check"]);
    wf.node(
        engine_node("recheck", "HTTP", json!({"method": "GET", "url": "${ .input.coordinator }/healthz"})),
        &["pause"],
    );
    wf
}

fn order() -> WorkflowBuilder {
    let mut wf = WorkflowBuilder::new("order");
    wf.spec_mut().description = example("order")["description"].as_str().map(str::to_string);
    let input = wf.input::<Value>();
    let order_id = input.field::<String>("order_id");
    let mut charge = engine_node(
        "charge",
        "HTTP",
        json!({"method": "POST",
        "url": "${ .input.target }/pay/charge", "idempotency_key": "order-${ .input.order_id }",
        "body": {"amount": input.field::<u64>("amount").template(), "order": order_id.template()}, "timeout": "10s"}),
    );
    charge.retry = Some(RetrySpec { multiplier: Some(2.0), max_backoff: Some("1m".into()), ..retry(5, "1s").unwrap() });
    let charged = wf.node(charge, &[]);
    wf.node(engine_node("cool_off", "WAIT", json!({"duration": "2s"})), &["charge"]);
    let shipped = wf.node(
        engine_node(
            "shipped",
            "WAIT_FOR_EVENT",
            json!({"event": "shipment.sent", "key": order_id.template(), "timeout": "7d"}),
        ),
        &["cool_off"],
    );
    let summary = wf.node(
        engine_node(
            "summary",
            "TRANSFORM",
            json!({"output": {
        "paid": charged.field::<Value>("body").field::<String>("id").template(),
        "carrier": shipped.field::<String>("carrier").template()}}),
        ),
        &["shipped"],
    );
    wf.node(
        engine_node(
            "refund",
            "HTTP",
            json!({"method": "POST", "url": "${ .input.target }/pay/refund",
        "body": {"order": order_id.template(), "reason": "${ .nodes.charge.error.code }",
                 "status": "${ .nodes.charge.error.status }"}}),
        ),
        &[],
    );
    wf.edge("charge", "refund", Some(EdgeOn::Failure), None);
    wf.node(
        engine_node(
            "order_failed",
            "FAIL",
            json!({
        "message": "order ${ .input.order_id } was not charged (${ .nodes.charge.error.message }); it was refunded",
        "code": "charge_failed"}),
        ),
        &["refund"],
    );
    wf.set_output(json!({"summary": summary.template(), "order": order_id.template()}));
    wf
}

fn checkout() -> WorkflowBuilder {
    let mut wf = WorkflowBuilder::new("checkout");
    wf.spec_mut().description = example("checkout")["description"].as_str().map(str::to_string);
    let input = wf.input::<Value>();
    let mut bill = engine_node(
        "bill",
        "SUB_WORKFLOW",
        json!({"workflow": "billing", "input": {
        "target": input.field::<String>("target").template(), "customer": input.field::<String>("customer").template(),
        "amount": input.field::<u64>("amount").template()}}),
    );
    bill.timeout = Some("10m".into());
    bill.retry = retry(2, "30s");
    let billed = wf.node(bill, &[]);
    let receipt = wf.node(
        engine_node(
            "receipt",
            "TRANSFORM",
            json!({"output": {
        "customer": input.field::<String>("customer").template(),
        "invoice": billed.field::<String>("invoice").template()}}),
        ),
        &["bill"],
    );
    wf.set_output(receipt.template());
    wf
}

#[test]
fn each_coded_example_makes_exactly_its_json_definition() {
    for (name, built) in [("hello", hello()), ("order", order()), ("checkout", checkout())] {
        assert_eq!(normalized(&built.definition()), normalized(&example(name)), "{name}");
        built.check().unwrap();
    }
    // A changed field is a different definition: the comparison can fail.
    let mut changed = hello();
    changed.spec_mut().nodes[1].config = json!({"duration": "2s"});
    assert_ne!(normalized(&changed.definition()), normalized(&example("hello")));
}

#[derive(Serialize, Deserialize, Clone)]
struct Order {
    id: String,
    amount: u64,
}

#[derive(Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    amount: u64,
}

/// Typed steps: edges from what each reads, the input schema checked at
/// the start, mocks as functions, retries by the engine's rules.
#[test]
fn a_typed_workflow_runs_offline_with_its_mocks_and_retries() {
    let mut wf = WorkflowBuilder::new("pay");
    wf.set_input_schema(json!({"type": "object", "required": ["id", "amount"],
        "properties": {"id": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}}}));
    let order = wf.input::<Order>();
    let charge = wf.step("charge", order.clone(), |_ctx, o: Order| async move {
        Ok(Charge { charge_id: format!("ch-{}", o.id), amount: o.amount })
    });
    if let Some(node) = wf.node_mut(&charge) {
        node.retry = retry(3, "1s");
    }
    let receipt = wf.step("receipt", (order, charge.output()), |_ctx, (o, c): (Order, Charge)| async move {
        Ok(format!("{} paid {} by {}", o.id, c.amount, c.charge_id))
    });
    wf.set_output(receipt.output().template());
    let def = wf.definition();
    assert_eq!(def["edges"], json!([{"from": "charge", "to": "receipt"}]), "{def}");
    assert_eq!(def["nodes"][1]["config"], json!({"input": ["${ .input }", "${ .nodes.charge.output }"]}));

    let mut attempts = 0;
    let mut mocks = Mocks::new();
    mocks.on(&charge, move |o: Order| {
        attempts += 1;
        match attempts {
            1 => Err(TaskError::retryable("card network down")),
            _ => Ok(Charge { charge_id: "ch-1".into(), amount: o.amount }),
        }
    });
    mocks.on(&receipt, |(o, c): (Order, Charge)| Ok(format!("{} paid {} by {}", o.id, c.amount, c.charge_id)));
    let report = wf.simulate(json!({"id": "o-1", "amount": 30}), &mut mocks).unwrap();
    assert_eq!(report.output, Some(json!("o-1 paid 30 by ch-1")), "{report:?}");
    assert_eq!(report.nodes[0].attempts, 2);

    let refused = wf.simulate(json!({"id": "o-1", "amount": 0}), &mut mocks).unwrap_err();
    assert!(refused.contains("input_schema at /amount"), "{refused}");
    let mut failing = Mocks::new();
    failing.on(&charge, |_: Order| -> Result<Charge, TaskError> { Err(TaskError::fatal("declined")) });
    let report = wf.simulate(json!({"id": "o-1", "amount": 30}), &mut failing).unwrap();
    assert_eq!(format!("{:?}", report.status), "Failed");
}

#[derive(Serialize, Deserialize, utoipa::ToSchema)]
struct Line {
    sku: String,
    qty: u32,
}

#[derive(Serialize, Deserialize, utoipa::ToSchema)]
struct Basket {
    customer: String,
    lines: Vec<Line>,
    note: Option<String>,
}

/// The input type is the schema: serde reads the input, its
/// `utoipa::ToSchema` derive says what the server checks at every start.
#[test]
fn the_input_schema_is_made_from_the_input_type() {
    let mut wf = WorkflowBuilder::new("basket");
    wf.set_input_type::<Basket>();
    let basket = wf.input::<Basket>();
    let count = wf.step("count", basket, |_ctx, b: Basket| async move { Ok(b.lines.len()) });
    wf.set_output(count.output().template());
    let schema = wf.definition()["input_schema"].clone();
    assert_eq!(schema["properties"]["lines"]["items"]["$ref"], "#/$defs/Line", "{schema}");
    wf.check().unwrap();
    let mut mocks = Mocks::new();
    mocks.on(&count, |b: Basket| Ok(b.lines.len()));
    let good = json!({"customer": "c", "lines": [{"sku": "tea", "qty": 2}], "note": null});
    assert_eq!(wf.simulate(good, &mut mocks).unwrap().output, Some(json!(1)));
    for (bad, at) in [
        (json!({"customer": "c", "lines": [{"sku": "tea", "qty": -2}]}), "/lines/0/qty"),
        (json!({"customer": "c", "lines": [{"sku": "tea"}]}), "/lines/0"),
        (json!({"lines": []}), "input_schema:"),
    ] {
        let refused = wf.simulate(bad.clone(), &mut mocks).unwrap_err();
        assert!(refused.contains(at), "{bad}: {refused}");
    }
}
