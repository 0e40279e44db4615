//! When things go wrong: failure edges, FAIL nodes, a run's failure
//! handler, loops, safe retries of side effects — through the engine on
//! real PostgreSQL, Redis and HTTP, and against simulate.

use std::collections::BTreeMap;
use std::time::Duration;

use composer_core::definition::Workflow;
use composer_core::simulate::{self, Options};
use composer_testkit::{eventually, http_node, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

/// Each node's state in a run as the API shows it, by node id.
fn states(run: &Value) -> BTreeMap<String, String> {
    run["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["node_id"].as_str().unwrap().to_string(), t["state"].as_str().unwrap().to_string()))
        .collect()
}

/// The same of a simulated run (nodes it never reached left out).
/// `simulate` on an evaluation thread, as the CLI runs it.
fn simulated(wf: &Workflow, opts: &Options) -> simulate::Report {
    composer_core::expr::sandboxed(std::time::Instant::now, |sb| simulate::simulate(sb, wf, opts)).unwrap()
}

fn simulated_states(report: &simulate::Report) -> BTreeMap<String, String> {
    report.nodes.iter().filter(|n| n.state != "NOT_REACHED").map(|n| (n.id.clone(), n.state.clone())).collect()
}

fn id_of(v: &Value) -> Uuid {
    v.as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_order_example_refunds_a_declined_charge_in_production_as_simulate_says() {
    let e = Engine::with(EngineOptions {
        worker: |c| c.options.queues = vec!["http".into(), "payments".into()],
        ..Default::default()
    })
    .await;
    let http = FakeHttp::start().await;
    std::env::set_var("COMPOSER_SECRET_PAY_TOKEN", "pay-token-for-the-order-test");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/order.json")).unwrap();
    let example: Value = serde_json::from_str(&text).unwrap();
    let live = text
        .replace("${ .input.target }/pay/charge", &http.url("/status/402/charge"))
        .replace("${ .input.target }/pay/refund", &http.url("/ok/refund"));
    e.register(&serde_json::from_str(&live).unwrap()).await;
    let input = json!({"amount": 500, "order_id": "o-17"});
    let id = e.start_run("order", input.clone()).await;
    let run = e.wait_for_run(id, T).await;

    assert_eq!(run["status"], "FAILED", "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(error.starts_with("order o-17 was not charged (") && error.ends_with("; it was refunded"), "{error}");
    assert_eq!(http.calls("/status/402/charge"), 1, "a 402 is not retried");
    let refund = http.requests("/ok/refund");
    assert_eq!(refund.len(), 1, "the refund runs once");
    assert_eq!(refund[0].body, json!({"order": "o-17", "reason": "http_status", "status": 402}));
    let charge = run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == "charge").unwrap();
    assert_eq!(charge["error_info"], json!({"code": "http_status", "retryable": false, "status": 402}));
    let refund_task = run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == "refund").unwrap().clone();
    let dispatched = e.history(id, "TaskDispatched").await;
    let line = dispatched.iter().find(|h| h["payload"]["task_id"] == refund_task["id"]).unwrap();
    assert_eq!(line["payload"]["via"], json!([{"from": "charge", "on": "failure"}]), "the history names the edge");

    // Simulate takes the same path from a mocked 402 …
    let wf = Workflow::parse(&example).unwrap();
    let opts = Options {
        input: input.clone(),
        mocks: [("charge".to_string(), json!({"status": 402}))].into_iter().collect(),
        ..Default::default()
    };
    let report = simulated(&wf, &opts);
    assert_eq!(report.status.as_str(), "FAILED");
    assert_eq!(simulated_states(&report), states(&run), "simulate and production agree node by node");
    // … and, mocked with what the target answered, ends with the same error.
    let answered = json!({"status": 402, "body": {"path": "/status/402/charge", "call": 1}});
    let opts = Options { input, mocks: [("charge".to_string(), answered)].into_iter().collect(), ..Default::default() };
    let same = simulated(&Workflow::parse(&serde_json::from_str(&live).unwrap()).unwrap(), &opts);
    assert_eq!(same.error.as_deref(), Some(error), "the same words");
    let taken: Vec<(String, String)> =
        report.edges.iter().filter(|e| e.taken).map(|e| (e.from.clone(), e.to.clone())).collect();
    assert_eq!(taken, vec![("charge".into(), "refund".into()), ("refund".into(), "order_failed".into())]);
    e.stop().await;
}

/// A workflow whose one step fails for good, with a handler.
fn failing(name: &str, http: &FakeHttp, on_failure: Value) -> Value {
    json!({"name": name, "on_failure": on_failure, "nodes": [http_node("pay", &http.url(&format!("/bad/{name}")), 1)]})
}

#[tokio::test]
async fn a_failed_run_starts_its_handler_once_and_the_two_link_to_each_other() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "cleanup", "nodes": [{"id": "note", "type": "TRANSFORM",
        "config": {"output": {"saw": "${ .input }"}}}]}))
        .await;
    let spec = failing(
        "charges",
        &http,
        json!({"workflow": "cleanup", "input": {"run": "${ .failed_run.id }", "error": "${ .failed_run.error }",
               "pay": "${ .failed_run.nodes.pay.error.code }", "amount": "${ .input.amount }"}}),
    );
    e.register(&spec).await;
    let id = e.start_run("charges", json!({"amount": 3})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    let handlers = run["failure_handler_run_ids"].as_array().unwrap().clone();
    assert_eq!(handlers.len(), 1, "{run}");
    let handler = e.wait_for_run(id_of(&handlers[0]), T).await;
    assert_eq!(handler["status"], "SUCCEEDED", "{handler}");
    assert_eq!(handler["handles_run_id"], json!(id.to_string()));
    assert_eq!(handler["trigger"], json!({"failure_of": id.to_string()}));
    assert_eq!(
        handler["input"],
        json!({"run": id.to_string(), "error": run["error"], "pay": "http_status", "amount": 3}),
        "{handler}"
    );
    let started = e.history(id, "HandlerStarted").await;
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["payload"]["run_id"], handlers[0]);

    // A retried run that fails again starts a handler for that end too.
    let (status, _) = e.post(&format!("/v1/runs/{id}/retry"), &json!({})).await;
    assert_eq!(status, 200);
    let again = e
        .wait_until(id, T, |r| {
            r["status"] == "FAILED" && r["failure_handler_run_ids"].as_array().is_some_and(|h| h.len() == 2)
        })
        .await;
    assert_eq!(again["failure_handler_run_ids"][0], handlers[0]);
    e.stop().await;
}

#[tokio::test]
async fn a_handler_starts_on_a_cancel_or_a_timeout_only_as_its_definition_says_and_never_for_a_handler() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // The handler fails too, and names itself as its own handler: it must
    // not start another.
    e.register(&json!({"name": "cleanup", "on_failure": {"workflow": "cleanup"},
        "nodes": [http_node("fails", &http.url("/bad/cleanup"), 1)]}))
        .await;
    let slow = |name: &str, on: Value| {
        json!({"name": name, "timeout": "1s", "on_failure": {"workflow": "cleanup", "on": on},
               "nodes": [http_node("wait", &http.url(&format!("/slow/20000/{name}")), 1)]})
    };
    e.register(&slow("only_failed", json!(["FAILED"]))).await;
    e.register(&slow("also_cancelled", json!(["FAILED", "CANCELLED"]))).await;
    let timed_out = e.start_run("only_failed", json!({})).await;
    let cancelled_quietly = e.start_run("only_failed", json!({})).await;
    let cancelled_loudly = e.start_run("also_cancelled", json!({})).await;
    for run in [cancelled_quietly, cancelled_loudly] {
        e.wait_until(run, T, |r| r["tasks"][0]["state"] == "RUNNING" || r["tasks"][0]["state"] == "PENDING").await;
        let (status, body) = e.post(&format!("/v1/runs/{run}/cancel"), &json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    let run = e.wait_for_run(timed_out, T).await;
    assert_eq!(run["error"], "run timed out after 1s");
    let handler = e.wait_for_run(id_of(&run["failure_handler_run_ids"][0]), T).await;
    assert_eq!(handler["status"], "FAILED", "the handler itself fails …");
    assert_eq!(handler["failure_handler_run_ids"], json!([]), "… and starts no handler of its own");
    let quiet = e.wait_for_run(cancelled_quietly, T).await;
    assert_eq!(
        (quiet["status"].as_str(), quiet["failure_handler_run_ids"].as_array().map(Vec::len)),
        (Some("CANCELLED"), Some(0))
    );
    let loud = e.wait_for_run(cancelled_loudly, T).await;
    assert_eq!(loud["failure_handler_run_ids"].as_array().map(Vec::len), Some(1), "{loud}");
    e.stop().await;
}

#[tokio::test]
async fn a_handler_that_cannot_start_leaves_the_failure_written_and_says_why() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&failing("orphaned", &http, json!({"workflow": "not_registered_anywhere"}))).await;
    let id = e.start_run("orphaned", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED");
    assert_eq!(run["failure_handler_run_ids"], json!([]));
    let started = e.history(id, "HandlerStarted").await;
    assert_eq!(started.len(), 1);
    assert!(started[0]["payload"]["error"].as_str().unwrap().contains("not_registered_anywhere"), "{started:?}");
    e.stop().await;
}

#[tokio::test]
async fn a_loop_runs_a_child_per_iteration_until_its_condition_and_keeps_only_the_last_output() {
    let e = Engine::start().await;
    e.register(&json!({"name": "step", "output": "${ .nodes.next.output }", "nodes": [{"id": "next",
        "type": "TRANSFORM", "config": {"output": {"n": "${ .input.n + 1 }", "seen": "${ .input.at }"}}}]}))
        .await;
    let spec = json!({"name": "counter", "nodes": [{"id": "count", "type": "LOOP", "config": {
        "workflow": "step", "input": {"n": "${ .previous.n // .input.from }", "at": "${ .iteration.index }"},
        "until": ".iteration.output.n >= 5", "max_iterations": 10}}]});
    e.register(&spec).await;
    let id = e.start_run("counter", json!({"from": 1})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["count"], json!({"output": {"n": 5, "seen": 3}, "iterations": 4}));
    let (_, children) = e.get(&format!("/v1/runs?parent_run_id={id}&limit=100")).await;
    let mut iterations: Vec<i64> =
        children["runs"].as_array().unwrap().iter().map(|c| c["parent_iteration"].as_i64().unwrap()).collect();
    iterations.sort();
    assert_eq!(iterations, vec![0, 1, 2, 3], "one child per iteration: {children}");
    e.stop().await;
}

#[tokio::test]
async fn a_cancelled_parent_cancels_its_loops_child_unless_told_to_abandon_it() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "slow_step", "nodes": [http_node("s", &http.url("/slow/3000/step"), 1)]})).await;
    let looping = |name: &str, close: &str| {
        json!({"name": name, "nodes": [{"id": "l", "type": "LOOP", "config": {"workflow": "slow_step",
            "until": "false", "max_iterations": 3, "on_parent_close": close}}]})
    };
    e.register(&looping("cancels", "cancel")).await;
    e.register(&looping("abandons", "abandon")).await;
    let mut children = Vec::new();
    for name in ["cancels", "abandons"] {
        let id = e.start_run(name, json!({})).await;
        let child = eventually(T, format!("{name}: the loop's first child"), || async {
            let (_, c) = e.get(&format!("/v1/runs?parent_run_id={id}")).await;
            c["runs"].as_array().and_then(|r| r.first()).map(|first| id_of(&first["id"]))
        })
        .await;
        let (status, _) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
        assert_eq!(status, 200);
        children.push(child);
    }
    let cancelled = e.wait_for_run(children[0], T).await;
    assert_eq!(cancelled["status"], "CANCELLED");
    let abandoned = e.wait_for_run(children[1], T).await;
    assert_eq!(abandoned["status"], "SUCCEEDED", "an abandoned child runs to its end");
    e.stop().await;
}

#[tokio::test]
async fn the_retries_of_one_execution_send_one_idempotency_key_unless_the_node_says_otherwise() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let node = |id: &str, key: Option<&str>| {
        let mut n = http_node(id, &http.url(&format!("/flaky/2/{id}")), 3);
        if let Some(k) = key {
            n["config"]["idempotency_key"] = json!(k);
        }
        n
    };
    let spec = json!({"name": "keys", "nodes": [node("stable", None), node("each", Some("per_attempt")),
        node("own", Some("order-${ .input.order }"))]});
    e.register(&spec).await;
    let id = e.start_run("keys", json!({"order": 42})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let keys = |id: &str| -> Vec<String> {
        http.requests(&format!("/flaky/2/{id}")).into_iter().filter_map(|r| r.idempotency_key).collect()
    };
    let task =
        |node: &str| run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == node).unwrap()["id"].clone();
    let stable = task("stable");
    assert_eq!(keys("stable"), vec![format!("{}:1", stable.as_str().unwrap()); 3], "one key for the 3 attempts");
    let each = task("each");
    assert_eq!(
        keys("each"),
        (1..=3).map(|a| format!("{}:{a}", each.as_str().unwrap())).collect::<Vec<_>>(),
        "per_attempt"
    );
    assert_eq!(keys("own"), vec!["order-42".to_string(); 3], "the node's own key");
    e.stop().await;
}

fn at_most_once(name: &str, url: &str, config: Value) -> Value {
    let mut node = http_node("pay", url, 3);
    node["delivery"] = json!("at_most_once");
    if let (Some(c), Some(extra)) = (node["config"].as_object_mut(), config.as_object()) {
        c.extend(extra.clone());
    }
    json!({"name": name, "nodes": [node]})
}

#[tokio::test]
async fn an_at_most_once_attempt_whose_worker_died_waits_in_doubt_and_is_never_sent_again_by_itself() {
    let mut e =
        Engine::with(EngineOptions { workers: 0, lease_ttl: Duration::from_secs(1), ..Default::default() }).await;
    let http = FakeHttp::start().await;
    e.register(&at_most_once("pay_once", &http.url("/ok/pay"), json!({}))).await;
    let leases = composer_store::leases::LeaseManager::new(e.db.pool());
    let mut doubted = Vec::new();
    for _ in 0..4 {
        let id = e.start_run("pay_once", json!({})).await;
        let run = e.wait_until(id, T, |r| r["tasks"][0]["state"] == "PENDING").await;
        let task = id_of(&run["tasks"][0]["id"]);
        // A worker leases the attempt (and, maybe, sends the request), then dies.
        let ghost = leases.acquire(id, task, "ghost", Duration::from_millis(300), 1).await.unwrap();
        assert!(ghost.is_granted());
        doubted.push((id, task));
    }
    for (id, task) in &doubted {
        let run = e.wait_until(*id, T, |r| r["tasks"][0]["state"] == "IN_DOUBT").await;
        assert_eq!(run["status"], "RUNNING", "the run waits");
        assert_eq!(run["tasks"][0]["error_info"]["code"], "in_doubt");
        let thief = leases.acquire(*id, *task, "thief", Duration::from_secs(5), 1).await.unwrap();
        assert!(!thief.is_granted(), "nobody takes an in-doubt attempt over");
    }
    e.start_worker("live", 4).await;
    // An absence, so a fixed time: a live worker's polls in this window
    // must not send the attempt again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(http.calls("/ok/pay"), 0, "never sent again by itself");
    assert_eq!(e.history(doubted[0].0, "TaskInDoubt").await.len(), 1);

    let resolve = |id: Uuid, body: Value| {
        let e = &e;
        async move { e.post(&format!("/v1/runs/{id}/tasks/pay/resolve"), &body).await }
    };
    // It took effect: the run goes on with the operator's output.
    let (status, run) = resolve(doubted[0].0, json!({"outcome": "completed", "output": {"charge": "ch_1"}})).await;
    assert_eq!(status, 200, "{run}");
    let done = e.wait_for_run(doubted[0].0, T).await;
    assert_eq!((done["status"].as_str(), &done["output"]["pay"]), (Some("SUCCEEDED"), &json!({"charge": "ch_1"})));
    // It did not: the step fails for good.
    let (status, _) = resolve(doubted[1].0, json!({"outcome": "failed", "error": "the bank says no"})).await;
    assert_eq!(status, 200);
    let failed = e.wait_for_run(doubted[1].0, T).await;
    assert_eq!(failed["status"], "FAILED");
    assert_eq!(failed["tasks"][0]["error_info"]["code"], "resolved");
    // Send it again: once more, under the same key.
    let (status, _) = resolve(doubted[2].0, json!({"outcome": "retry"})).await;
    assert_eq!(status, 200);
    let retried = e.wait_for_run(doubted[2].0, T).await;
    assert_eq!((retried["status"].as_str(), retried["tasks"][0]["attempt"].as_i64()), (Some("SUCCEEDED"), Some(2)));
    let keys: Vec<String> = http.requests("/ok/pay").into_iter().filter_map(|r| r.idempotency_key).collect();
    assert_eq!(keys, vec![format!("{}:1", doubted[2].1)], "one call, with the execution's key");
    // Cancel still works on a run that waits in doubt.
    let (status, _) = e.post(&format!("/v1/runs/{}/cancel", doubted[3].0), &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(e.wait_for_run(doubted[3].0, T).await["tasks"][0]["state"], "CANCELLED");

    // Only an IN_DOUBT step can be resolved, and only sensibly.
    let (status, body) = resolve(doubted[0].0, json!({"outcome": "retry"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("conflict")), "{body}");
    let (status, _) = resolve(doubted[0].0, json!({"outcome": "failed"})).await;
    assert_eq!(status, 400);
    let (status, _) = resolve(doubted[0].0, json!({"outcome": "completed", "error": "x"})).await;
    assert_eq!(status, 400);
    let (status, _) =
        e.post(&format!("/v1/runs/{}/tasks/nope/resolve", doubted[0].0), &json!({"outcome": "retry"})).await;
    assert_eq!(status, 404);
    e.stop().await;
}

#[tokio::test]
async fn an_at_most_once_request_that_timed_out_is_in_doubt_not_retried() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&at_most_once("slow_pay", &http.url("/slow/2000/pay"), json!({"timeout": "300ms"}))).await;
    e.register(&at_most_once("down_pay", "http://127.0.0.1:9/refused", json!({}))).await;
    let slow = e.start_run("slow_pay", json!({})).await;
    let down = e.start_run("down_pay", json!({})).await;
    let run = e.wait_until(slow, T, |r| r["tasks"][0]["state"] == "IN_DOUBT").await;
    assert!(run["tasks"][0]["error"].as_str().unwrap().contains("timed out"), "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 1, "not retried");
    // "Why is it waiting?" names the command that resolves it.
    let (_, why) = e.get(&format!("/v1/runs/{slow}/explain")).await;
    let reason = why["nodes"][0]["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("composer run resolve {slow} ")) && reason.contains("--outcome"), "{why}");
    // A connection that was refused sent nothing: that is retried as usual.
    let run = e.wait_for_run(down, T).await;
    assert_eq!((run["status"].as_str(), run["tasks"][0]["attempt"].as_i64()), (Some("FAILED"), Some(3)), "{run}");
    assert_eq!(run["tasks"][0]["error_info"]["code"], "connect");
    // An absence, so a fixed time: past the slow request's 2 s, no retry.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(http.calls("/slow/2000/pay"), 1);
    e.stop().await;
}

#[tokio::test]
async fn a_map_of_thousands_creates_its_items_a_chunk_at_a_time_and_collects_their_counts() {
    let e = Engine::with(EngineOptions { worker_concurrency: 32, ..Default::default() }).await;
    let http = FakeHttp::start().await;
    let spec = json!({"name": "many", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(.input.n)] }", "max_concurrency": 64, "collect": "none", "tolerated_failures": "1%",
        "node": {"type": "HTTP", "retry": {"max_attempts": 1},
                 "config": {"url": format!("{}/${{ if .item % 500 == 7 then \"bad\" else \"ok\" end }}/${{ .item }}", http.url(""))}}}}]});
    e.register(&spec).await;
    let id = e.start_run("many", json!({"n": 2500})).await;
    let running = e.wait_until(id, T, |r| r["tasks"][0]["progress"]["completed"].as_u64().unwrap_or(0) > 0).await;
    let created = running["tasks"][0]["progress"]["created"].as_u64().unwrap();
    assert!(created < 2500, "not every item is created at once: {running}");
    let run = e.wait_for_run(id, Duration::from_secs(120)).await;
    assert_eq!(run["status"], "SUCCEEDED", "5 of 2,500 failures are under 1%: {}", run["error"]);
    assert_eq!(run["output"]["each"], json!({"count": 2500, "succeeded": 2495, "failed": 5}));
    assert_eq!(http.calls_prefix("/ok/") + http.calls_prefix("/bad/"), 2500, "each item called once");
    let (_, page) = e.get(&format!("/v1/runs/{id}/items?node=each&after=2489&limit=100")).await;
    let indices: Vec<i64> =
        page["items"].as_array().unwrap().iter().map(|i| i["item_index"].as_i64().unwrap()).collect();
    assert_eq!(indices, (2490..2500).collect::<Vec<i64>>(), "the items stay readable, paged");
    let client = e.db.pool().get().await.unwrap();
    let kept: i64 = client.query_one("SELECT count(*) FROM map_sources", &[]).await.unwrap().get(0);
    assert_eq!(kept, 0, "the MAP's list goes when the MAP ends");
    e.stop().await;
}

#[tokio::test]
async fn a_map_of_more_items_than_one_transaction_creates_carries_on_and_reduces_them() {
    let e = Engine::start().await;
    let spec = json!({"name": "sum", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(.input.n)] }", "collect": {"init": 0, "reduce": ".acc + .item.output"},
        "node": {"type": "TRANSFORM", "config": {"output": "${ .item * 2 }"}}}}]});
    e.register(&spec).await;
    let n: u64 = 25_000;
    let id = e.start_run("sum", json!({"n": n})).await;
    let run = e.wait_for_run(id, Duration::from_secs(120)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{}", run["error"]);
    assert_eq!(run["output"]["each"], json!(n * (n - 1)), "the reduction saw every item once");
    e.stop().await;
}

#[tokio::test]
async fn a_map_that_gathers_every_output_fails_an_item_over_its_share_not_the_map_after_all_ran() {
    let e = Engine::with(EngineOptions { coordinator: |c| c.max_payload = 16 * 1024, ..Default::default() }).await;
    let spec = |name: &str, n: u32, size: usize| {
        json!({"name": name, "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": format!("${{ [range({n})] }}"), "on_item_failure": "continue",
        "node": {"type": "TRANSFORM", "config": {"output": format!("${{ \"{}\" }}", "x".repeat(size))}}}}]})
    };
    // 100 items share 16 KiB: about 145 bytes each; 200-byte outputs do not fit.
    e.register(&spec("too_big", 100, 200)).await;
    let run = e.wait_for_run(e.start_run("too_big", json!({})).await, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let entries = run["output"]["each"].as_array().unwrap();
    assert_eq!(entries.len(), 100);
    assert!(entries[0]["error"].as_str().unwrap().contains("share"), "{}", entries[0]);
    // 1,000 items cannot share 16 KiB: the MAP fails before any item runs.
    e.register(&spec("too_many", 1000, 1)).await;
    let run = e.wait_for_run(e.start_run("too_many", json!({})).await, T).await;
    assert_eq!(run["status"], "FAILED");
    assert!(run["error"].as_str().unwrap().contains("collect: \"none\""), "{run}");
    e.stop().await;
}

/// A small deterministic generator, for the DAGs below.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[tokio::test]
async fn random_dags_with_failure_and_always_edges_end_in_production_as_simulate_says() {
    let e = Engine::with(EngineOptions { worker_concurrency: 16, ..Default::default() }).await;
    let http = FakeHttp::start().await;
    let mut rng = Lcg(0x5eed);
    let mut cases = Vec::new();
    for case in 0..12 {
        let n = 3 + (rng.next() % 5) as usize;
        let fails: Vec<bool> = (0..n).map(|_| rng.next() % 10 < 3).collect();
        let nodes: Vec<Value> = (0..n)
            .map(|i| {
                let path = if fails[i] { format!("/bad/c{case}n{i}") } else { format!("/ok/c{case}n{i}") };
                http_node(&format!("n{i}"), &http.url(&path), 1)
            })
            .collect();
        let mut edges = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                let on = match rng.next() % 6 {
                    0 | 1 => continue,
                    2 | 3 => "success",
                    4 => "failure",
                    _ => "always",
                };
                edges.push(json!({"from": format!("n{i}"), "to": format!("n{j}"), "on": on}));
            }
        }
        let spec = json!({"name": format!("dag{case}"), "nodes": nodes, "edges": edges});
        e.register(&spec).await;
        let id = e.start_run(&format!("dag{case}"), json!({})).await;
        cases.push((spec, fails, id));
    }
    for (spec, fails, id) in cases {
        let run = e.wait_for_run(id, T).await;
        let wf = Workflow::parse(&spec).unwrap();
        let failures =
            fails.iter().enumerate().filter(|(_, f)| **f).map(|(i, _)| (format!("n{i}"), "no".to_string())).collect();
        let mocks = (0..fails.len()).map(|i| (format!("n{i}"), json!({"status": 200}))).collect();
        let report = simulated(&wf, &Options { failures, mocks, ..Default::default() });
        assert_eq!(run["status"].as_str(), Some(report.status.as_str()), "{spec}\n{run}");
        if report.status.as_str() == "SUCCEEDED" {
            assert_eq!(states(&run), simulated_states(&report), "{spec}");
        }
    }
    e.stop().await;
}
