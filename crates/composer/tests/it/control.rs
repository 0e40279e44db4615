//! Control flow beyond a fixed DAG: MAP over a list computed at run time,
//! SUB_WORKFLOW.

use chrono::{DurationRound, SecondsFormat};
use std::time::Duration;

use composer_testkit::{eventually, poll_until, Engine, EngineOptions, FakeHttp};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(60);

fn map_spec(name: &str, url: &str, max_concurrency: u32, on_item_failure: &str) -> Value {
    json!({"name": name, "nodes": [
        {"id": "ship", "type": "MAP", "config": {
            "items": "${ .input.orders }", "max_concurrency": max_concurrency, "on_item_failure": on_item_failure,
            "node": {"type": "HTTP", "retry": {"max_attempts": 1},
                     "config": {"method": "POST", "url": url, "body": {"order": "${ .item }", "at": "${ .index }"}}}}},
        {"id": "count", "type": "TRANSFORM", "config": {"output": "${ .nodes.ship.output | length }"}}],
        "edges": [{"from": "ship", "to": "count"}]})
}

/// Every item of a MAP, through the items API's pages.
async fn all_items(e: &Engine, run: Uuid, page: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after = -1i64;
    loop {
        let (status, body) = e.get(&format!("/v1/runs/{run}/items?node=ship&after={after}&limit={page}")).await;
        assert_eq!(status, 200, "{body}");
        items.extend(body["items"].as_array().unwrap().iter().cloned());
        match body["next_after"].as_i64() {
            Some(n) => after = n,
            None => return items,
        }
    }
}

#[tokio::test]
async fn a_map_calls_each_item_under_its_concurrency_and_outputs_in_item_order() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&map_spec("ship_all", &http.url("/slow/20/ship"), 4, "fail")).await;
    let orders: Vec<String> = (0..30).map(|i| format!("o-{i}")).collect();
    let id = e.start_run("ship_all", json!({"orders": orders})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.calls("/slow/20/ship"), 30, "each item called once");
    assert!(http.max_in_flight("/slow/20/ship") <= 4, "max_concurrency: {}", http.max_in_flight("/slow/20/ship"));
    let ship = e.task(id, "ship").await;
    assert_eq!(
        ship["progress"],
        json!({"total": 30, "queued": 0, "open": 0, "completed": 30, "failed": 0, "created": 30})
    );
    let echoed: Vec<i64> = ship["output"].as_array().unwrap().iter().map(|o| o["status"].as_i64().unwrap()).collect();
    assert_eq!(echoed, vec![200; 30]);
    assert_eq!(e.task(id, "count").await["output"], json!(30));
    assert_eq!(run["tasks"].as_array().unwrap().len(), 2, "the run view lists node tasks; items are paged");

    let items = all_items(&e, id, 7).await;
    assert_eq!(items.len(), 30);
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item["node_id"], json!(format!("ship[{i}]")));
        assert_eq!(item["item_index"], json!(i));
        assert_eq!(item["parent_task_id"], ship["id"]);
        assert_eq!(item["state"], "COMPLETED");
        assert_eq!(item["input"]["body"], json!({"order": format!("o-{i}"), "at": i}));
    }
    let mut bodies: Vec<Value> = http.requests("/slow/20/ship").into_iter().map(|r| r.body["order"].clone()).collect();
    bodies.sort_by_key(|b| b.as_str().unwrap()[2..].parse::<u32>().unwrap());
    assert_eq!(bodies, orders.iter().map(|o| json!(o)).collect::<Vec<_>>());
    let completed = e.history(id, "TaskCompleted").await;
    assert_eq!(completed.iter().filter(|h| h["payload"]["item_index"].is_number()).count(), 30, "once per item");
    assert_eq!(e.history(id, "MapStarted").await.len(), 1);

    let (status, body) = e.get(&format!("/v1/runs/{id}/items?node=count")).await;
    assert_eq!(status, 404, "a TRANSFORM has no items: {body}");
    let (status, body) = e.get(&format!("/v1/runs/{id}/items")).await;
    assert_eq!(status, 400, "{body}");
    e.stop().await;
}

#[tokio::test]
async fn the_first_failed_item_fails_the_map_and_a_retry_reruns_only_what_did_not_complete() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // Item 2 answers 503 once: it fails (one attempt), the MAP fails, the
    // items after it never start; a retry of the run calls it again.
    let url = format!("{}/${{ if .index == 2 then \"flaky/1\" else \"ok\" end }}/item-${{ .index }}", http.url(""));
    let url = url.replace("//$", "/$");
    e.register(&map_spec("fragile", &url, 1, "fail")).await;
    let id = e.start_run("fragile", json!({"orders": [10, 11, 12, 13, 14]})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("item 2 failed"), "{run}");
    let states: Vec<Value> = all_items(&e, id, 100).await.into_iter().map(|i| i["state"].clone()).collect();
    assert_eq!(
        states,
        vec![json!("COMPLETED"), json!("COMPLETED"), json!("FAILED"), json!("CANCELLED"), json!("CANCELLED")]
    );
    assert_eq!((http.calls("/ok/item-3"), http.calls("/ok/item-4")), (0, 0), "no item after the failure started");

    let (status, body) = e.post(&format!("/v1/runs/{id}/retry"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!((http.calls("/ok/item-0"), http.calls("/ok/item-1")), (1, 1), "completed items are not called again");
    assert_eq!((http.calls("/flaky/1/item-2"), http.calls("/ok/item-3"), http.calls("/ok/item-4")), (2, 1, 1));
    assert_eq!(e.task(id, "ship").await["output"].as_array().unwrap().len(), 5);
    e.stop().await;
}

#[tokio::test]
async fn with_continue_a_failed_item_is_an_error_entry_and_the_map_completes() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let url =
        format!("{}/${{ if .item == \"bad\" then \"bad\" else \"ok\" end }}/x", http.url("")).replace("//$", "/$");
    e.register(&map_spec("tolerant", &url, 2, "continue")).await;
    let id = e.start_run("tolerant", json!({"orders": ["a", "bad", "c"]})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let out = e.task(id, "ship").await["output"].clone();
    assert_eq!(out[0]["status"], 200);
    assert!(out[1]["error"].as_str().unwrap().contains("400"), "{out}");
    assert_eq!(out[2]["status"], 200);
    e.stop().await;
}

#[tokio::test]
async fn cancelling_a_run_cancels_every_queued_and_running_item_at_once() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&map_spec("big", &http.url("/slow/300/ship"), 2, "fail")).await;
    let id = e.start_run("big", json!({"orders": (0..2000).collect::<Vec<_>>()})).await;
    e.wait_until(id, T, |r| r["tasks"][0]["progress"]["completed"].as_u64().unwrap_or(0) >= 2).await;
    let (status, run) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("CANCELLED")), "{run}");
    let items = all_items(&e, id, 1000).await;
    assert!(!items.is_empty() && items.len() < 2000, "the items not created yet never will be: {}", items.len());
    let open = items.iter().filter(|i| !["COMPLETED", "CANCELLED"].contains(&i["state"].as_str().unwrap())).count();
    assert_eq!(open, 0, "no item is left open");
    let calls = http.calls("/slow/300/ship");
    // An absence, so a fixed time: no item may start in this window.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(http.calls("/slow/300/ship") <= calls + 2, "no new item starts after the cancel");
    e.stop().await;
}

#[tokio::test]
async fn a_bad_map_definition_is_a_400_naming_node_and_field() {
    let e = Engine::start().await;
    let spec = json!({"name": "bad_map", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ .input.x }", "max_concurrency": -1, "node": {"type": "HTTP", "config": {"url": "http://h/x"}}}}]});
    let (status, body) = e.post("/v1/workflows", &spec).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("nodes[each].config.max_concurrency"), "{body}");
    e.stop().await;
}

/// The runs a run started (its SUB_WORKFLOW children), oldest first.
async fn children(e: &Engine, parent: Uuid) -> Vec<Value> {
    let (status, page) = e.get(&format!("/v1/runs?parent_run_id={parent}&limit=1000")).await;
    assert_eq!(status, 200, "{page}");
    let mut runs = page["runs"].as_array().unwrap().clone();
    runs.reverse();
    runs
}

/// The children of `parent` once there are `n` of them: a child starts
/// right after its parent's commit, in a transaction of its own.
/// (Fewer, once `T` has passed: the caller says what it needs of them.)
async fn children_when(e: &Engine, parent: Uuid, n: usize) -> Vec<Value> {
    let enough = poll_until(T, || async {
        let runs = children(e, parent).await;
        (runs.len() >= n).then_some(runs)
    })
    .await;
    match enough {
        Ok(runs) => runs,
        Err(_) => children(e, parent).await,
    }
}

#[tokio::test]
async fn a_sub_workflow_runs_a_child_whose_output_is_the_node_output() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "quote", "nodes": [
        {"id": "price", "type": "TRANSFORM", "config": {"output": {"total": "${ .input.qty * 3 }"}}}],
        "output": "${ .nodes.price.output }"}))
        .await;
    e.register(&json!({"name": "notify", "nodes": [
        {"id": "send", "type": "HTTP", "config": {"method": "POST", "url": http.url("/echo/notify"), "body": "${ .input }"}}],
        "output": "${ .nodes.send.output.body.body }"})).await;
    e.register(&json!({"name": "order", "nodes": [
        {"id": "quote", "type": "SUB_WORKFLOW", "config": {"workflow": "quote", "input": {"qty": "${ .input.qty }"}}},
        {"id": "notify", "type": "SUB_WORKFLOW", "config": {"workflow": "notify", "version": 1,
            "input": {"total": "${ .nodes.quote.output.total }"}}}],
        "edges": [{"from": "quote", "to": "notify"}]}))
        .await;
    let id = e.start_run("order", json!({"qty": 4})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(e.task(id, "quote").await["output"], json!({"total": 12}), "a child that ends as it starts");
    assert_eq!(run["output"], json!({"notify": {"total": 12}}), "a child that calls a worker");
    let kids = children(&e, id).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    let (quote, notify) = (e.task(id, "quote").await, e.task(id, "notify").await);
    assert_eq!((kids[0]["workflow"].clone(), kids[0]["parent_task_id"].clone()), (json!("quote"), quote["id"].clone()));
    assert_eq!(
        (kids[1]["workflow"].clone(), kids[1]["parent_task_id"].clone()),
        (json!("notify"), notify["id"].clone())
    );
    let (_, child) = e.get(&format!("/v1/runs/{}", kids[1]["id"].as_str().unwrap())).await;
    assert_eq!(child["parent_run_id"], json!(id.to_string()));
    assert_eq!(child["input"], json!({"total": 12}));
    e.stop().await;
}

#[tokio::test]
async fn a_failed_child_fails_the_attempt_and_the_retry_starts_one_new_child() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // The child's only step answers 503 once: the first child fails, the
    // parent's retry starts a second, which succeeds.
    e.register(&json!({"name": "charge", "nodes": [
        {"id": "pay", "type": "HTTP", "retry": {"max_attempts": 1}, "config": {"url": http.url("/flaky/1/pay")}}]}))
        .await;
    e.register(&json!({"name": "checkout", "nodes": [
        {"id": "charge", "type": "SUB_WORKFLOW", "retry": {"max_attempts": 2, "initial_backoff": "100ms"},
         "config": {"workflow": "charge"}}]}))
        .await;
    let id = e.start_run("checkout", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let kids = children(&e, id).await;
    let statuses: Vec<&str> = kids.iter().map(|k| k["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, vec!["FAILED", "SUCCEEDED"], "one child per attempt");
    let retry = e.history(id, "TaskRetryScheduled").await;
    assert!(retry[0]["payload"]["error"].as_str().unwrap().contains("FAILED"), "{retry:?}");
    assert_eq!(e.task(id, "charge").await["attempt"], 2);

    // A workflow that is not registered fails the node for good.
    e.register(&json!({"name": "dangling", "nodes": [
        {"id": "x", "type": "SUB_WORKFLOW", "config": {"workflow": "nowhere"}}]}))
        .await;
    let id = e.start_run("dangling", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED");
    assert!(run["error"].as_str().unwrap().contains("workflow \"nowhere\" is not registered"), "{run}");
    // ... with a code that says the child never started, not that it failed.
    assert_eq!(e.task(id, "x").await["error_info"]["code"], "child_not_started");
    e.stop().await;
}

/// A failed attempt owes the cancel of what it left open, run after its
/// commit. Late (a loaded coordinator), it ran when the retry's child had
/// started, and cancelled that one too: the model test saw a child
/// CANCELLED that should have FAILED. The cancel now reaches the attempts
/// up to its own, never a later one's.
#[tokio::test]
async fn a_failed_attempts_cancel_run_late_leaves_the_retrys_child_alone() {
    use composer_store::runs::{stale_children, ChildHolder};
    let e = Engine::start().await;
    e.register(&json!({"name": "held", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "k"}}]}))
        .await;
    e.register(&json!({"name": "again", "nodes": [
        {"id": "down", "type": "SUB_WORKFLOW", "retry": {"max_attempts": 3, "initial_backoff": "10ms"},
         "config": {"workflow": "held"}}]}))
        .await;
    let id = e.start_run("again", json!({})).await;
    let first: Uuid = children_when(&e, id, 1).await[0]["id"].as_str().unwrap().parse().unwrap();
    // The first child ends: the attempt fails, and the retry starts another.
    let (status, body) = e.post(&format!("/v1/runs/{first}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let kids = children_when(&e, id, 2).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    let second: Uuid = kids[1]["id"].as_str().unwrap().parse().unwrap();
    let task: Uuid = e.task(id, "down").await["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(e.task(id, "down").await["attempt"], 2);

    let client = composer_store::client(&e.db.pool()).await.unwrap();
    let holder = |attempt, current| ChildHolder { task_id: task, attempt, iteration: 0, current };
    let stale = |holders: Vec<ChildHolder>| {
        let client = &client;
        async move { stale_children(client, &holders).await.unwrap() }
    };
    assert_eq!(stale(vec![holder(1, true)]).await, Vec::<Uuid>::new(), "the first attempt's cancel, late");
    assert_eq!(stale(vec![holder(2, false)]).await, Vec::<Uuid>::new(), "the second attempt, not yet started");
    assert_eq!(stale(vec![holder(2, true)]).await, vec![second], "the second attempt, ended");
    assert_eq!(stale(vec![holder(3, false)]).await, vec![second], "a third attempt, reset before it ran");
    let run = e.get(&format!("/v1/runs/{second}")).await.1;
    assert_eq!(run["status"], "RUNNING", "{run}");
    e.stop().await;
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_open_children_and_theirs() {
    let e = Engine::start().await;
    e.register(&json!({"name": "forever", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "k"}}]}))
        .await;
    e.register(&json!({"name": "middle", "nodes": [
        {"id": "down", "type": "SUB_WORKFLOW", "config": {"workflow": "forever"}}]}))
        .await;
    e.register(&json!({"name": "top", "nodes": [
        {"id": "down", "type": "SUB_WORKFLOW", "config": {"workflow": "middle"}}]}))
        .await;
    let id = e.start_run("top", json!({})).await;
    let kids = children_when(&e, id, 1).await;
    assert_eq!(kids.len(), 1);
    let middle: Uuid = kids[0]["id"].as_str().unwrap().parse().unwrap();
    let grandkids = children_when(&e, middle, 1).await;
    assert_eq!(grandkids.len(), 1, "started right after its parent's commit");
    let grandchild: Uuid = grandkids[0]["id"].as_str().unwrap().parse().unwrap();
    let (status, _) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200);
    for run in [middle, grandchild] {
        let r = e.wait_for_run(run, T).await;
        assert_eq!(r["status"], "CANCELLED", "{r}");
    }
    e.stop().await;
}

/// The children of a MAP's SUB_WORKFLOW items stayed RUNNING after their
/// parent was cancelled or failed, until the recovery sweep (28 s measured),
/// so their steps could still start after the operator's cancel. Here the
/// sweep never runs: the commit that ends the MAP owes their cancel.
#[tokio::test]
async fn cancelling_or_failing_a_parent_cancels_the_children_of_its_map_items_without_the_sweep() {
    let e = Engine::with(EngineOptions {
        coordinator: |c| c.recovery_interval = Duration::from_secs(3600),
        ..EngineOptions::default()
    })
    .await;
    e.register(&json!({"name": "forever", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "${ .input.k }"}}]}))
        .await;
    e.register(&json!({"name": "fan", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(12)] }",
        "node": {"type": "SUB_WORKFLOW", "config": {"workflow": "forever", "input": {"k": "${ .index }"}}}}}]}))
        .await;
    // The fail case: item 0's child fails, the MAP fails (on_item_failure:
    // fail) and the run with it.
    e.register(&json!({"name": "maybe", "nodes": [
        {"id": "look", "type": "TRANSFORM", "config": {"output": 1}},
        {"id": "no", "type": "FAIL", "config": {"message": "item 0 fails"}},
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "k"}}],
        "edges": [{"from": "look", "to": "no", "when": ".input.k == 0"},
                  {"from": "look", "to": "w", "when": ".input.k != 0"}]}))
        .await;
    e.register(&json!({"name": "fragile", "nodes": [{"id": "each", "type": "MAP", "config": {
        "items": "${ [range(12)] }", "max_concurrency": 12,
        "node": {"type": "SUB_WORKFLOW", "config": {"workflow": "maybe", "input": {"k": "${ .index }"}}}}}]}))
        .await;

    for (workflow, cancel) in [("fan", true), ("fragile", false)] {
        let id = e.start_run(workflow, json!({})).await;
        assert!(!children_when(&e, id, 12).await.is_empty(), "{workflow}: the items' children started");
        if cancel {
            let (status, _) = e.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
            assert_eq!(status, 200);
        }
        let parent = e.wait_for_run(id, T).await;
        assert_eq!(parent["status"], if cancel { "CANCELLED" } else { "FAILED" }, "{parent}");
        let kids = children(&e, id).await;
        assert!(kids.len() > 1, "{workflow}: {}", kids.len());
        for kid in kids {
            let kid: Uuid = kid["id"].as_str().unwrap().parse().unwrap();
            let r = e.wait_for_run(kid, T).await;
            assert!(r["status"] == "CANCELLED" || r["status"] == "FAILED", "{workflow}: {r}");
        }
    }
    e.stop().await;
}

#[tokio::test]
async fn a_workflow_calling_itself_stops_at_the_nesting_limit_without_retrying_it() {
    let e = Engine::start().await;
    e.register(&json!({"name": "recurse", "nodes": [
        {"id": "again", "type": "SUB_WORKFLOW", "config": {"workflow": "recurse"}}]}))
        .await;
    let id = e.start_run("recurse", json!({})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "FAILED", "{run}");
    assert!(run["error"].as_str().unwrap().contains("sub_workflow_max_depth"), "{run}");
    let (_, all) = e.get("/v1/runs?workflow=recurse&limit=1000").await;
    assert_eq!(all["runs"].as_array().unwrap().len(), 33, "the run and 32 levels of children, each started once");
    e.stop().await;
}

/// A coordinator that commits a child's end, or its parent's move, and dies
/// before telling the other run: the recovery sweep tells it.
#[tokio::test]
async fn what_a_dead_coordinator_did_not_tell_parent_or_child_the_recovery_sweep_does() {
    let e = Engine::start().await;
    e.register(&json!({"name": "held", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "never", "key": "k"}}]}))
        .await;
    e.register(&json!({"name": "holder", "nodes": [
        {"id": "call", "type": "SUB_WORKFLOW", "config": {"workflow": "held"}}]}))
        .await;
    let pool = e.db.pool();
    let db = pool.get().await.unwrap();

    // The child ended; its parent never heard.
    let parent = e.start_run("holder", json!({})).await;
    let child: Uuid = children_when(&e, parent, 1).await[0]["id"].as_str().unwrap().parse().unwrap();
    db.execute(
        "UPDATE workflow_runs SET status = 'SUCCEEDED', output = '{\"v\": 1}', finished_at = now() WHERE id = $1",
        &[&child],
    )
    .await
    .unwrap();
    db.execute("UPDATE task_instances SET updated_at = now() - interval '1 minute' WHERE run_id = $1", &[&parent])
        .await
        .unwrap();
    let run = e.wait_for_run(parent, T).await;
    assert_eq!((run["status"].as_str(), run["output"].clone()), (Some("SUCCEEDED"), json!({"call": {"v": 1}})));

    // The parent moved on (here: cancelled); its child was never told.
    let parent = e.start_run("holder", json!({})).await;
    let child: Uuid = children_when(&e, parent, 1).await[0]["id"].as_str().unwrap().parse().unwrap();
    db.execute("UPDATE workflow_runs SET status = 'CANCELLED', finished_at = now() WHERE id = $1", &[&parent])
        .await
        .unwrap();
    db.execute(
        "UPDATE task_instances SET state = 'CANCELLED', updated_at = now() - interval '1 minute' WHERE run_id = $1",
        &[&parent],
    )
    .await
    .unwrap();
    let run = e.wait_for_run(child, T).await;
    assert_eq!(run["status"], "CANCELLED", "{run}");
    e.stop().await;
}

/// A coordinator that commits a SUB_WORKFLOW attempt and dies before it
/// starts the child (children start after the commit, in their own
/// transaction): the recovery sweep starts it, once.
#[tokio::test]
async fn a_child_its_coordinator_died_before_starting_is_started_by_the_recovery_sweep() {
    let e = Engine::start().await;
    e.register(&json!({"name": "leaf", "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "${ .input.k }"}}]}))
        .await;
    e.register(&json!({"name": "holder", "nodes": [
        {"id": "call", "type": "SUB_WORKFLOW", "config": {"workflow": "leaf", "input": {"k": "${ .input.k }"}}}]}))
        .await;
    let parent = e.start_run("holder", json!({"k": "one"})).await;
    let first: Uuid = children_when(&e, parent, 1).await[0]["id"].as_str().unwrap().parse().unwrap();
    // As if the child had never been started: no child row, the attempt waiting.
    let db = e.db.pool().get().await.unwrap();
    db.execute("DELETE FROM task_instances WHERE run_id = $1", &[&first]).await.unwrap();
    db.execute("DELETE FROM workflow_runs WHERE id = $1", &[&first]).await.unwrap();
    db.execute("UPDATE task_instances SET updated_at = now() - interval '1 minute' WHERE run_id = $1", &[&parent])
        .await
        .unwrap();
    let kids = children_when(&e, parent, 1).await;
    assert_eq!(kids.len(), 1, "the sweep started the child");
    assert_ne!(kids[0]["id"], json!(first.to_string()));
    let (status, _) = e.post("/v1/events", &json!({"name": "go", "key": "one", "payload": {"v": 2}})).await;
    assert_eq!(status, 200);
    let run = e.wait_for_run(parent, T).await;
    assert_eq!((run["status"].as_str(), run["output"].clone()), (Some("SUCCEEDED"), json!({"call": {"w": {"v": 2}}})));
    assert_eq!(children(&e, parent).await.len(), 1, "started once");
    e.stop().await;
}

fn limited(name: &str, http: &FakeHttp, key: Option<&str>, max: u32) -> Value {
    limited_taking(name, http, key, max, 150)
}

/// [`limited`], its step taking `ms` milliseconds.
fn limited_taking(name: &str, http: &FakeHttp, key: Option<&str>, max: u32, ms: u64) -> Value {
    let mut concurrency = json!({"max": max});
    if let Some(k) = key {
        concurrency["key"] = json!(k);
    }
    json!({"name": name, "concurrency": concurrency, "nodes": [
        {"id": "work", "type": "HTTP", "config": {"method": "POST",
         "url": format!("{}/${{ .input.customer }}", http.url(&format!("/slow/{ms}"))), "body": {"n": "${ .input.n }"}}}]})
}

#[tokio::test]
async fn runs_over_a_per_key_limit_queue_and_start_oldest_first_as_runs_of_their_key_end() {
    let e = Engine::with(EngineOptions { coordinators: 2, ..Default::default() }).await;
    let http = FakeHttp::start().await;
    e.register(&limited("per_customer", &http, Some("${ .input.customer }"), 1)).await;
    let mut a = Vec::new();
    // The second right after the first (whose step takes 150 ms): it queues.
    for n in 0..2 {
        a.push(e.start_run("per_customer", json!({"customer": "a", "n": n})).await);
    }
    let status = |r: &Value| r["status"].as_str().unwrap().to_string();
    let (_, second) = e.get(&format!("/v1/runs/{}", a[1])).await;
    let (_, first) = e.get(&format!("/v1/runs/{}", a[0])).await;
    assert_eq!(status(&second), "QUEUED", "over the limit: {second}");
    assert!(["RUNNING", "SUCCEEDED"].contains(&status(&first).as_str()), "{first}");
    for n in 2..4 {
        a.push(e.start_run("per_customer", json!({"customer": "a", "n": n})).await);
    }
    let b = e.start_run("per_customer", json!({"customer": "b", "n": 9})).await;
    let (_, listed) = e.get("/v1/runs?status=QUEUED").await;
    assert!(!listed["runs"].as_array().unwrap().is_empty(), "{listed}");
    for id in a.iter().chain([&b]) {
        let run = e.wait_for_run(*id, T).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    assert_eq!(http.max_in_flight("/slow/150/a"), 1, "one run of customer a at a time");
    let order: Vec<Value> = http.requests("/slow/150/a").into_iter().map(|r| r.body["n"].clone()).collect();
    assert_eq!(order, vec![json!(0), json!(1), json!(2), json!(3)], "oldest first");
    assert_eq!(http.calls("/slow/150/b"), 1, "another key is not held up");
    e.stop().await;
}

#[tokio::test]
async fn cancelling_a_queued_run_takes_it_out_of_the_queue() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    // The first run's step holds the one slot for 2 s: the others stay
    // queued while they are cancelled and paused, however loaded the machine.
    e.register(&limited_taking("one_at_a_time", &http, None, 1, 2000)).await;
    let first = e.start_run("one_at_a_time", json!({"customer": "x", "n": 1})).await;
    let queued = e.start_run("one_at_a_time", json!({"customer": "x", "n": 2})).await;
    let last = e.start_run("one_at_a_time", json!({"customer": "x", "n": 3})).await;
    let (status, run) = e.post(&format!("/v1/runs/{queued}/cancel"), &json!({})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("CANCELLED")), "{run}");
    let (status, body) = e.post(&format!("/v1/runs/{last}/pause"), &json!({})).await;
    assert_eq!(status, 409, "a queued run has not started: {body}");
    for id in [first, last] {
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    let bodies: Vec<Value> = http.requests("/slow/2000/x").into_iter().map(|r| r.body["n"].clone()).collect();
    assert_eq!(bodies, vec![json!(1), json!(3)], "the cancelled run never ran");
    e.stop().await;
}

#[tokio::test]
async fn a_concurrency_key_the_input_cannot_give_is_a_400_and_a_bad_limit_is_refused() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    e.register(&limited("keyed", &http, Some("${ .input.customer }"), 2)).await;
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "keyed", "input": {"customer": {"a": 1}}})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("concurrency.key"), "{body}");
    let mut bad = limited("bad_limit", &http, None, 0);
    let (status, body) = e.post("/v1/workflows", &bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("concurrency.max"), "{body}");
    bad["concurrency"] = json!({"max": 1, "key": "${ .nodes.work.output }"});
    let (status, body) = e.post("/v1/workflows", &bad).await;
    assert_eq!(status, 400, "{body}");
    e.stop().await;
}

/// The coordinator that ended a run died before starting the next queued
/// one: the timer loop starts it.
#[tokio::test]
async fn a_queued_run_left_behind_by_a_dead_coordinator_is_started_by_the_timer_loop() {
    let e = Engine::start().await;
    e.register(&json!({"name": "solo", "concurrency": {"max": 1}, "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "${ .input.k }"}}]}))
        .await;
    let first = e.start_run("solo", json!({"k": "1"})).await;
    let second = e.start_run("solo", json!({"k": "2"})).await;
    let (_, run) = e.get(&format!("/v1/runs/{second}")).await;
    assert_eq!(run["status"], "QUEUED");
    let db = e.db.pool().get().await.unwrap();
    db.execute("UPDATE workflow_runs SET status = 'SUCCEEDED', finished_at = now() WHERE id = $1", &[&first])
        .await
        .unwrap();
    let run = e.wait_until(second, T, |r| r["status"] == "RUNNING").await;
    assert_eq!(run["tasks"][0]["state"], "WAITING", "started like any run: {run}");
    e.stop().await;
}

fn solo_waiting() -> Value {
    json!({"name": "solo", "concurrency": {"max": 1}, "nodes": [
        {"id": "w", "type": "WAIT_FOR_EVENT", "config": {"event": "go", "key": "${ .input.k }"}}]})
}

/// No timer loop within a test's time: only the engine starts queued runs.
fn without_sweeps() -> EngineOptions {
    EngineOptions { coordinator: |c| c.timer_interval = Duration::from_secs(3600), ..Default::default() }
}

/// When the transaction that wrote a run's history entry of `kind` began
/// (`now()`, the same for every statement of a transaction).
async fn stamp_of(e: &Engine, run: Uuid, kind: &str) -> chrono::DateTime<chrono::Utc> {
    let db = e.db.pool().get().await.unwrap();
    let sql = "SELECT created_at FROM run_events WHERE run_id = $1 AND type = $2";
    db.query_one(sql, &[&run, &kind]).await.unwrap().get(0)
}

/// A run's end hands its slot to the next queued run of its key in the
/// transaction that ends it, not in a pass after the commit.
#[tokio::test]
async fn a_slot_a_runs_end_frees_goes_to_the_next_queued_run_in_the_same_transaction() {
    let e = Engine::with(without_sweeps()).await;
    e.register(&solo_waiting()).await;
    let first = e.start_run("solo", json!({"k": "1"})).await;
    let second = e.start_run("solo", json!({"k": "2"})).await;
    let (_, run) = e.get(&format!("/v1/runs/{second}")).await;
    assert_eq!(run["status"], "QUEUED", "{run}");
    let (status, body) = e.post("/v1/events", &json!({"name": "go", "key": "1", "payload": {}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(e.wait_for_run(first, T).await["status"], "SUCCEEDED");
    let run = e.wait_until(second, T, |r| r["status"] == "RUNNING").await;
    assert_eq!(run["tasks"][0]["state"], "WAITING", "{run}");
    let (ended, started) = (stamp_of(&e, first, "RunSucceeded").await, stamp_of(&e, second, "RunStarted").await);
    assert_eq!(ended, started, "one transaction ended one and started the other");
    e.stop().await;
}

/// A hand-over that cannot take the next queued run (another transaction
/// holds its row) gives up after its lock timeout, is rolled back, and the
/// batch still applies its events; the pass after the commit starts the run
/// once the row is free.
#[tokio::test]
async fn a_hand_over_that_cannot_lock_the_queued_run_leaves_it_to_the_pass_and_the_batch_goes_on() {
    let e = Engine::with(without_sweeps()).await;
    e.register(&solo_waiting()).await;
    let first = e.start_run("solo", json!({"k": "1"})).await;
    let second = e.start_run("solo", json!({"k": "2"})).await;
    let mut client = e.db.pool().get().await.unwrap();
    let lock = composer_store::begin(&mut client).await.unwrap();
    lock.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", &[&second]).await.unwrap();
    let (status, body) = e.post("/v1/events", &json!({"name": "go", "key": "1", "payload": {}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(e.wait_for_run(first, T).await["status"], "SUCCEEDED", "the batch applied its event");
    let (_, run) = e.get(&format!("/v1/runs/{second}")).await;
    assert_eq!(run["status"], "QUEUED", "its row is held: {run}");
    lock.rollback().await.unwrap();
    let run = e.wait_until(second, T, |r| r["status"] == "RUNNING").await;
    assert_eq!(run["tasks"][0]["state"], "WAITING", "{run}");
    let (ended, started) = (stamp_of(&e, first, "RunSucceeded").await, stamp_of(&e, second, "RunStarted").await);
    assert!(started > ended, "started by the pass, after: {ended} {started}");
    e.stop().await;
}

// ---- schedules ----

fn fast_timers() -> EngineOptions {
    EngineOptions {
        coordinators: 2,
        coordinator: |c| c.timer_interval = Duration::from_millis(100),
        ..Default::default()
    }
}

/// The runs a schedule started, oldest first, with their fire times.
async fn scheduled_runs(e: &Engine, workflow: &str) -> Vec<(String, Value)> {
    let (_, page) = e.get(&format!("/v1/runs?workflow={workflow}&limit=1000")).await;
    let mut runs: Vec<(String, Value)> = Vec::new();
    for r in page["runs"].as_array().unwrap() {
        let (_, run) = e.get(&format!("/v1/runs/{}", r["id"].as_str().unwrap())).await;
        runs.push((run["trigger"]["fire_time"].as_str().unwrap_or("").to_string(), run));
    }
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    runs
}

#[tokio::test]
async fn a_schedule_is_created_read_paused_resumed_triggered_and_deleted() {
    let e = Engine::start().await;
    e.register(&json!({"name": "report", "nodes": [
        {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]}))
        .await;
    let spec = json!({"id": "nightly", "workflow": "report", "cron": "0 2 * * *", "timezone": "Europe/Paris",
                      "input": {"kind": "daily"}});
    let (status, created) = e.post("/v1/schedules", &spec).await;
    assert_eq!(status, 201, "{created}");
    let times = created["next_fire_times"].as_array().unwrap();
    assert_eq!(times.len(), 5);
    assert!(times.windows(2).all(|w| w[0].as_str() < w[1].as_str()), "{times:?}");
    assert_eq!(created["overlap"], json!(null), "defaults are not written back: {created}");
    let (status, _) = e.post("/v1/schedules", &spec).await;
    assert_eq!(status, 200, "the same schedule again");
    let (status, got) = e.get("/v1/schedules/nightly").await;
    assert_eq!((status, got["cron"].clone()), (200, json!("0 2 * * *")));
    let (_, listed) = e.get("/v1/schedules").await;
    assert_eq!(listed["schedules"].as_array().unwrap().len(), 1);

    let (status, paused) = e.post("/v1/schedules/nightly/pause", &json!({})).await;
    assert_eq!((status, paused["paused"].clone(), paused["next_fire_times"].clone()), (200, json!(true), json!([])));
    let (_, resumed) = e.post("/v1/schedules/nightly/resume", &json!({})).await;
    assert_eq!(resumed["next_fire_times"].as_array().unwrap().len(), 5);

    let (status, run) = e.post("/v1/schedules/nightly/trigger", &json!({})).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["trigger"]["schedule"], "nightly");
    let id: Uuid = run["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(e.wait_for_run(id, T).await["output"], json!({"t": {"kind": "daily"}}));
    let (_, got) = e.get("/v1/schedules/nightly").await;
    assert_eq!(got["last_run_id"], run["id"]);

    for (bad, path) in [
        (json!({"id": "x", "workflow": "report", "cron": "* *"}), "cron"),
        (json!({"id": "x", "workflow": "report", "cron": "* * * * *", "timezone": "Nowhere/City"}), "timezone"),
        (json!({"id": "x", "workflow": "report", "cron": "* * * * *", "overlap": "maybe"}), "overlap"),
    ] {
        let (status, body) = e.post("/v1/schedules", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().starts_with(path), "{bad}: {body}");
    }
    for missing in [
        json!({"id": "x", "workflow": "missing", "cron": "* * * * *"}),
        json!({"id": "x", "workflow": "report", "version": 9, "cron": "* * * * *"}),
    ] {
        let (status, body) = e.post("/v1/schedules", &missing).await;
        assert_eq!((status, body["error"]["code"].clone()), (404, json!("not_found")), "{missing}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("is not registered"), "{body}");
    }
    let (status, _) = e.delete("/v1/schedules/nightly").await;
    assert_eq!(status, 200);
    let (status, _) = e.get("/v1/schedules/nightly").await;
    assert_eq!(status, 404);
    let (_, still) = e.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(still["status"], "SUCCEEDED", "its runs stay");
    e.stop().await;
}

#[tokio::test]
async fn every_fire_time_starts_one_run_with_two_coordinators_firing() {
    let e = Engine::with(fast_timers()).await;
    e.register(&json!({"name": "tick", "nodes": [
        {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]}))
        .await;
    let (status, body) = e
        .post(
            "/v1/schedules",
            &json!({"id": "every_second", "workflow": "tick", "cron": "* * * * * *", "overlap": "allow"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // Three fire times' worth of runs (each fire time once, or a double shows).
    eventually(T, "three runs of the schedule", || async {
        let runs = scheduled_runs(&e, "tick").await;
        (runs.len() >= 3).then_some(()).ok_or(format!("{runs:?}"))
    })
    .await;
    e.post("/v1/schedules/every_second/pause", &json!({})).await;
    let runs = scheduled_runs(&e, "tick").await;
    assert!(runs.len() >= 2, "{runs:?}");
    let times: std::collections::HashSet<&String> = runs.iter().map(|(t, _)| t).collect();
    assert_eq!(times.len(), runs.len(), "one run per fire time: {runs:?}");
    for (t, run) in &runs {
        let at = chrono::DateTime::parse_from_rfc3339(t).unwrap();
        assert_eq!(chrono::Timelike::nanosecond(&at), 0, "a whole-second fire time: {t}");
        assert_eq!(run["trigger"]["schedule"], "every_second");
    }
    e.stop().await;
}

#[tokio::test]
async fn overlap_skip_starts_nothing_while_a_run_is_open_and_buffer_one_starts_one_after() {
    let e = Engine::with(fast_timers()).await;
    e.register(&json!({"name": "slow", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "2500ms"}}]}))
        .await;
    e.register(&json!({"name": "slow_too", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "2500ms"}}]}))
        .await;
    for (id, workflow, overlap) in [("skipper", "slow", "skip"), ("buffer", "slow_too", "buffer_one")] {
        let spec = json!({"id": id, "workflow": workflow, "cron": "* * * * * *", "overlap": overlap});
        assert_eq!(e.post("/v1/schedules", &spec).await.0, 201);
    }
    // A fixed span of fire times (one a second) across the runs' 2.5 s,
    // as the point is which fires did not start a run.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    for id in ["skipper", "buffer"] {
        e.post(&format!("/v1/schedules/{id}/pause"), &json!({})).await;
    }
    for workflow in ["slow", "slow_too"] {
        let runs = scheduled_runs(&e, workflow).await;
        assert!(!runs.is_empty() && runs.len() <= 2, "{workflow}: {runs:?}");
        for pair in runs.windows(2) {
            let (ended, next) = (pair[0].1["finished_at"].as_str(), pair[1].1["created_at"].as_str().unwrap());
            assert!(ended.is_some_and(|f| f <= next), "{workflow}: a run started while one was open: {runs:?}");
        }
    }
    // buffer_one: the run after the first one is for a fire time from while it ran.
    let buffered = scheduled_runs(&e, "slow_too").await;
    if buffered.len() == 2 {
        assert!(buffered[1].0.as_str() < buffered[0].1["finished_at"].as_str().unwrap(), "{buffered:?}");
    }
    e.stop().await;
}

#[tokio::test]
async fn after_downtime_fire_times_within_the_catchup_window_fire_and_older_ones_are_missed() {
    let e = Engine::with(fast_timers()).await;
    e.register(&json!({"name": "catch", "nodes": [
        {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]}))
        .await;
    let spec = json!({"id": "minutely", "workflow": "catch", "cron": "* * * * *", "overlap": "allow",
                      "catchup_window": "3m", "paused": true});
    assert_eq!(e.post("/v1/schedules", &spec).await.0, 201);
    // As if every coordinator had been down for ten minutes.
    let db = e.db.pool().get().await.unwrap();
    db.execute(
        "UPDATE schedules SET paused = false, next_fire_at = date_trunc('minute', now()) - interval '10 minutes'
          WHERE id = 'minutely'",
        &[],
    )
    .await
    .unwrap();
    let caught_up = poll_until(T, || async {
        let runs = scheduled_runs(&e, "catch").await;
        (runs.len() >= 3).then_some(runs)
    })
    .await;
    let runs = match caught_up {
        Ok(runs) => runs,
        Err(_) => scheduled_runs(&e, "catch").await,
    };
    assert!((3..=4).contains(&runs.len()), "the 3-minute window (and maybe this minute): {runs:?}");
    let (_, metrics) = e.get("/metrics").await;
    let metrics = metrics.as_str().unwrap().to_string();
    let missed = metrics
        .lines()
        .find(|l| l.starts_with("composer_schedule_fires_total{outcome=\"missed\"}"))
        .unwrap_or_else(|| panic!("no missed fires counted: {metrics}"));
    let missed: u64 = missed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((7..=8).contains(&missed), "{missed}");
    e.stop().await;
}

// ---- backfill ----

/// The last `n` whole hours before now, oldest first, and the range
/// `[first, now truncated to the hour)` that holds them.
fn past_hours(n: i64) -> (Vec<String>, String, String) {
    let hour = chrono::Utc::now().duration_trunc(chrono::Duration::hours(1)).unwrap();
    let times: Vec<String> =
        (1..=n).rev().map(|i| (hour - chrono::Duration::hours(i)).to_rfc3339_opts(SecondsFormat::Secs, true)).collect();
    let to = hour.to_rfc3339_opts(SecondsFormat::Secs, true);
    (times.clone(), times[0].clone(), to)
}

/// Waits until workflow `workflow` has `n` runs that ended (at most `T`:
/// the caller says what it needs of them); their runs by fire time.
async fn ended_runs(e: &Engine, workflow: &str, n: usize) -> Vec<(String, Value)> {
    let ended = poll_until(T, || async {
        let runs = scheduled_runs(e, workflow).await;
        (runs.iter().filter(|(_, r)| r["finished_at"].is_string()).count() >= n).then_some(runs)
    })
    .await;
    match ended {
        Ok(runs) => runs,
        Err(_) => scheduled_runs(e, workflow).await,
    }
}

#[tokio::test]
async fn a_backfill_starts_each_past_fire_time_once_however_often_it_is_asked() {
    let e = Engine::with(fast_timers()).await;
    e.register(&json!({"name": "hourly", "nodes": [
        {"id": "t", "type": "TRANSFORM", "config": {"output": "${ .input }"}}]}))
        .await;
    let spec = json!({"id": "hourly", "workflow": "hourly", "cron": "0 * * * *", "input": {"k": 1}});
    assert_eq!(e.post("/v1/schedules", &spec).await.0, 201);
    let (times, from, to) = past_hours(6);
    let ask = json!({"from": from, "to": to});
    // Two at once, on two coordinators: the fires table's key queues each fire time once.
    let (a, b) =
        tokio::join!(e.post("/v1/schedules/hourly/backfill", &ask), e.post("/v1/schedules/hourly/backfill", &ask));
    for (status, body) in [&a, &b] {
        assert_eq!(*status, 202, "{body}");
        assert_eq!(body["fire_times"], 6, "{body}");
        assert_eq!(body["overlap"], "allow", "{body}");
    }
    assert_eq!(a.1["queued"].as_u64().unwrap() + b.1["queued"].as_u64().unwrap(), 6, "{a:?} {b:?}");
    assert_eq!(a.1["first_fire_time"], json!(times[0]));
    assert_eq!(a.1["last_fire_time"], json!(times[5]));
    let runs = ended_runs(&e, "hourly", 6).await;
    let fired: Vec<&String> = runs.iter().map(|(t, _)| t).collect();
    let want: Vec<String> = times.iter().map(|t| t.replace('Z', "+00:00")).collect();
    let fired_norm: Vec<String> = fired
        .iter()
        .map(|t| chrono::DateTime::parse_from_rfc3339(t).unwrap().to_rfc3339_opts(SecondsFormat::Secs, false))
        .collect();
    assert_eq!(fired_norm, want, "one run per past fire time");
    for (_, run) in &runs {
        assert_eq!((run["status"].clone(), run["trigger"]["backfill"].clone()), (json!("SUCCEEDED"), json!(true)));
        assert_eq!(run["output"], json!({"t": {"k": 1}}), "the schedule's input");
    }
    // Asked again: nothing new. Asked again after the fires were forgotten:
    // queued, but each finds the run its fire time started.
    let (status, again) = e.post("/v1/schedules/hourly/backfill", &ask).await;
    assert_eq!((status, again["queued"].clone(), again["already"].clone()), (202, json!(0), json!(6)), "{again}");
    let db = e.db.pool().get().await.unwrap();
    db.execute("DELETE FROM schedule_fires", &[]).await.unwrap();
    let (_, forgotten) = e.post("/v1/schedules/hourly/backfill", &ask).await;
    assert_eq!(forgotten["queued"], 6, "{forgotten}");
    eventually(T, "the backfill queue to drain", || async {
        let (_, schedule) = e.get("/v1/schedules/hourly").await;
        (schedule["backfill_queued"] == 0).then_some(()).ok_or(schedule)
    })
    .await;
    assert_eq!(scheduled_runs(&e, "hourly").await.len(), 6, "no fire time started twice");

    // Refused, naming the problem; nothing queued.
    let now = chrono::Utc::now();
    let later = (now + chrono::Duration::hours(2)).to_rfc3339();
    for (bad, words) in [
        (json!({"from": from, "to": later}), "in the future"),
        (json!({"from": to, "to": from}), "not after"),
        (json!({"from": "2000-01-01T00:00:00Z", "to": to}), "schedule_max_backfill"),
    ] {
        let (status, body) = e.post("/v1/schedules/hourly/backfill", &bad).await;
        assert_eq!((status, body["error"]["code"].clone()), (400, json!("invalid_schedule")), "{bad}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(words), "{bad}: {body}");
    }
    let (status, body) = e.post("/v1/schedules/hourly/backfill", &json!({"from": from, "to": to, "x": 1})).await;
    assert!((400..500).contains(&status), "{body}");
    let (status, body) = e.post("/v1/schedules/hourly/backfill", &json!({"from": "soon", "to": to})).await;
    assert!((400..500).contains(&status), "{body}");
    let (status, _) = e.post("/v1/schedules/nowhere/backfill", &ask).await;
    assert_eq!(status, 404);
    assert_eq!(e.get("/v1/schedules/hourly").await.1["backfill_queued"], 0);
    e.stop().await;
}

#[tokio::test]
async fn buffer_all_backfills_one_at_a_time_skip_starts_one_and_a_paused_schedule_holds_its_queue() {
    let e = Engine::with(fast_timers()).await;
    for name in ["serial", "skipping"] {
        e.register(&json!({"name": name, "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "400ms"}}]}))
            .await;
        let spec = json!({"id": name, "workflow": name, "cron": "0 * * * *", "paused": true});
        assert_eq!(e.post("/v1/schedules", &spec).await.0, 201);
    }
    let (times, from, to) = past_hours(3);
    let (status, body) =
        e.post("/v1/schedules/serial/backfill", &json!({"from": from, "to": to, "overlap": "buffer_all"})).await;
    assert_eq!((status, body["paused"].clone(), body["queued"].clone()), (202, json!(true), json!(3)), "{body}");
    // An absence, so a fixed time: no run may start in this window.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(scheduled_runs(&e, "serial").await.is_empty(), "a paused schedule holds its backfill");
    assert_eq!(e.get("/v1/schedules/serial").await.1["backfill_queued"], 3);
    e.post("/v1/schedules/serial/resume", &json!({})).await;
    let runs = ended_runs(&e, "serial", 3).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    for (i, pair) in runs.windows(2).enumerate() {
        let (ended, next) = (pair[0].1["finished_at"].as_str().unwrap(), pair[1].1["created_at"].as_str().unwrap());
        assert!(ended <= next, "fire time {} started before the one before it ended: {runs:?}", i + 1);
    }
    let first = chrono::DateTime::parse_from_rfc3339(&runs[0].0).unwrap();
    assert_eq!(first, chrono::DateTime::parse_from_rfc3339(&times[0]).unwrap(), "oldest first");

    // skip: the first fire time starts, the two that find it open are
    // skipped; a later backfill may ask for those again.
    e.post("/v1/schedules/skipping/resume", &json!({})).await;
    let ask = json!({"from": from, "to": to, "overlap": "skip"});
    assert_eq!(e.post("/v1/schedules/skipping/backfill", &ask).await.1["queued"], 3);
    let runs = ended_runs(&e, "skipping", 1).await;
    // An absence, so a fixed time: the skipped fire times start nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(scheduled_runs(&e, "skipping").await.len(), 1, "{runs:?}");
    let (_, again) = e.post("/v1/schedules/skipping/backfill", &json!({"from": from, "to": to})).await;
    assert_eq!((again["queued"].clone(), again["already"].clone()), (json!(2), json!(1)), "the skipped ones: {again}");
    assert_eq!(ended_runs(&e, "skipping", 3).await.len(), 3);

    // At most 10,000 fire times wait per schedule, however many asks; a
    // schedule replaced drops what was asked of the old one.
    let spec = json!({"id": "minutely", "workflow": "serial", "cron": "* * * * *", "paused": true});
    assert_eq!(e.post("/v1/schedules", &spec).await.0, 201);
    let now = chrono::Utc::now().duration_trunc(chrono::Duration::minutes(1)).unwrap();
    let range = |from: i64, to: i64| json!({"from": (now - chrono::Duration::minutes(from)).to_rfc3339(), "to": (now - chrono::Duration::minutes(to)).to_rfc3339()});
    let (status, full) = e.post("/v1/schedules/minutely/backfill", &range(10_000, 0)).await;
    assert_eq!((status, full["queued"].clone()), (202, json!(10_000)), "{full}");
    let (status, more) = e.post("/v1/schedules/minutely/backfill", &range(10_001, 10_000)).await;
    assert_eq!(status, 400, "{more}");
    assert!(more["error"]["message"].as_str().unwrap().contains("queued already"), "{more}");
    let replaced = json!({"id": "minutely", "workflow": "serial", "cron": "0 * * * *", "paused": true});
    assert_eq!(e.post("/v1/schedules", &replaced).await.0, 200);
    assert_eq!(e.get("/v1/schedules/minutely").await.1["backfill_queued"], 0, "the old cron's fire times are dropped");
    e.stop().await;
}
