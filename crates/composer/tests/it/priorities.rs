//! Priorities and fairness keys on real services: higher priorities are
//! served first by the Rust worker and the task API without starving lower
//! ones, a run's priority changes while it waits (its dispatched steps
//! move), queued runs are admitted by priority and then by turns among
//! fairness keys, a fairness key keeps its steps in one lane, and child runs
//! inherit both.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use composer_testkit::{eventually, Engine, EngineOptions};
use redis::AsyncCommands;
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

/// A workflow of one custom step on queue `q`, at `priority`.
fn one_step(name: &str, q: &str, priority: u8) -> Value {
    json!({"name": name, "priority": priority, "nodes": [{"id": "job", "type": "job", "queue": q, "config": {"who": "${ .input.who }"}}]})
}

async fn start(e: &Engine, workflow: &str, input: Value, priority: Option<u8>) -> Uuid {
    let mut body = json!({"workflow": workflow, "input": input});
    if let Some(p) = priority {
        body["priority"] = json!(p);
    }
    let (status, run) = e.post("/v1/runs", &body).await;
    assert_eq!(status, 201, "{run}");
    run["id"].as_str().unwrap().parse().unwrap()
}

/// Messages waiting on each shard of `queue`'s streams at `priority`.
async fn on_streams(e: &Engine, queue: &str, priority: u8) -> Vec<usize> {
    let keys = composer_stream::Keys::new(e.prefix.clone());
    let client = redis::Client::open(e.redis_url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut out = Vec::new();
    for shard in 0..e.coordinator_config().stream_shards {
        let n: usize = c.xlen(keys.stream(queue, priority, shard)).await.unwrap();
        out.push(n);
    }
    out
}

/// Waits until `n` messages are on `queue`'s streams at `priority`.
async fn until_published(e: &Engine, queue: &str, priority: u8, n: usize) {
    let what = format!("{n} messages on the priority {priority} streams of {queue}");
    eventually(T, what, || async {
        let on: usize = on_streams(e, queue, priority).await.iter().sum();
        if on >= n {
            Ok(())
        } else {
            Err(format!("{on} there"))
        }
    })
    .await;
}

async fn poll(e: &Engine, queue: &str, max: u32) -> Vec<Value> {
    let (status, body) =
        e.post("/v1/tasks/poll", &json!({"worker_id": "w", "queues": [queue], "max": max, "wait": "2s"})).await;
    assert_eq!(status, 200, "{body}");
    body["tasks"].as_array().unwrap().clone()
}

async fn complete(e: &Engine, task: &Value) {
    let id = task["id"].as_str().unwrap();
    let body = json!({"worker_id": "w", "run_id": task["run_id"], "attempt": task["attempt"], "output": {}});
    let (status, answer) = e.post(&format!("/v1/tasks/{id}/complete"), &body).await;
    assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{answer}");
}

/// A worker of one slot on `jobs`, which runs one step at a time in the
/// order it chose, and the `who` of each step it ran, in that order.
fn one_slot_worker(e: &Engine) -> (composer_worker::Worker, Arc<Mutex<Vec<String>>>) {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut worker = composer_worker::Worker::new(e.worker_config("prio", 1));
    let seen = order.clone();
    worker.handle_on_queue("job", "jobs", move |_ctx, input: Value| {
        seen.lock().unwrap().push(input["who"].as_str().unwrap_or_default().to_string());
        async { Ok(json!({})) }
    });
    (worker, order)
}

#[tokio::test]
async fn the_rust_worker_runs_a_priority_1_step_before_a_backlog_of_priority_5() {
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("bulk", "jobs", 5)).await;
    e.register(&one_step("urgent", "jobs", 3)).await;
    for i in 0..30 {
        start(&e, "bulk", json!({"who": format!("bulk-{i}")}), None).await;
    }
    until_published(&e, "jobs", 5, 30).await;
    let urgent = start(&e, "urgent", json!({"who": "urgent"}), Some(1)).await;
    until_published(&e, "jobs", 1, 1).await;

    let (worker, order) = one_slot_worker(&e);
    e.spawn_worker(worker);
    let run = e.wait_for_run(urgent, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["priority"], 1, "the start's priority, not the definition's");
    let order = order.lock().unwrap().clone();
    assert_eq!(order.first().map(String::as_str), Some("urgent"), "the priority 1 step went first: {order:?}");
    e.stop().await;
}

#[tokio::test]
async fn a_priority_1_chain_keeps_its_slot_through_its_reports_ahead_of_held_priority_5_messages() {
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("bulk", "jobs", 5)).await;
    let step = |id: &str| json!({"id": id, "type": "job", "queue": "jobs", "config": {"who": format!("urgent-{id}")}});
    e.register(&json!({"name": "urgent", "nodes": [step("a"), step("b"), step("c")],
                       "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]}))
        .await;
    for i in 0..30 {
        start(&e, "bulk", json!({"who": format!("bulk-{i}")}), None).await;
    }
    until_published(&e, "jobs", 5, 30).await;
    let urgent = start(&e, "urgent", json!({}), Some(1)).await;
    until_published(&e, "jobs", 1, 1).await;

    let (worker, order) = one_slot_worker(&e);
    let stats = e.spawn_worker(worker).stats.clone();
    assert_eq!(e.wait_for_run(urgent, T).await["status"], "SUCCEEDED");
    let order = order.lock().unwrap().clone();
    assert_eq!(order[..3], ["urgent-a", "urgent-b", "urgent-c"], "{order:?}");
    // Priority-5 messages were held the whole time: b and c came with the
    // reports of a and b, not through the streams.
    assert_eq!(stats.eager(), 2, "{order:?}");
    e.stop().await;
}

/// A poll for urgent slots (`priority_at_most`) leases only work of those
/// priorities, however much else waits; a level out of range is refused by
/// name.
#[tokio::test]
async fn a_poll_at_most_priority_2_leases_only_urgent_work() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("bulk", "uq", 5)).await;
    e.register(&one_step("normal", "uq", 3)).await;
    e.register(&one_step("urgent", "uq", 2)).await;
    for i in 0..5 {
        start(&e, "bulk", json!({"who": format!("bulk-{i}")}), None).await;
    }
    start(&e, "normal", json!({"who": "normal"}), None).await;
    until_published(&e, "uq", 5, 5).await;
    until_published(&e, "uq", 3, 1).await;
    let poll_at_most = |p: Value, wait: &'static str| {
        let body = json!({"worker_id": "w", "queues": ["uq"], "max": 10, "wait": wait, "priority_at_most": p});
        let e = &e;
        async move { e.post("/v1/tasks/poll", &body).await }
    };
    let (status, body) = poll_at_most(json!(2), "200ms").await;
    assert_eq!((status, body["tasks"].as_array().map(Vec::len)), (200, Some(0)), "nothing urgent waits: {body}");

    start(&e, "urgent", json!({"who": "urgent-2"}), None).await;
    start(&e, "urgent", json!({"who": "urgent-1"}), Some(1)).await;
    until_published(&e, "uq", 2, 1).await;
    until_published(&e, "uq", 1, 1).await;
    let (status, body) = poll_at_most(json!(1), "2s").await;
    assert_eq!(status, 200, "{body}");
    let who: Vec<&str> =
        body["tasks"].as_array().unwrap().iter().map(|t| t["input"]["who"].as_str().unwrap()).collect();
    assert_eq!(who, ["urgent-1"], "{body}");
    let (_, body) = poll_at_most(json!(2), "2s").await;
    let who: Vec<&str> =
        body["tasks"].as_array().unwrap().iter().map(|t| t["input"]["who"].as_str().unwrap()).collect();
    assert_eq!(who, ["urgent-2"], "{body}");
    // The rest is still there for a poll of every priority.
    let mut rest: Vec<String> =
        poll(&e, "uq", 10).await.iter().map(|t| t["input"]["who"].as_str().unwrap().to_string()).collect();
    rest.sort();
    assert_eq!(rest, ["bulk-0", "bulk-1", "bulk-2", "bulk-3", "bulk-4", "normal"]);

    for bad in [json!(0), json!(6)] {
        let (status, body) = poll_at_most(bad.clone(), "0ms").await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.to_string().contains("priority_at_most: expected 1 to 5"), "{bad}: {body}");
    }
    for bad in [json!("2"), json!(2.5), json!(-1), json!(300)] {
        let (status, body) = poll_at_most(bad.clone(), "0ms").await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    e.stop().await;
}

/// A worker's urgent slot runs a priority-1 run's steps while its one
/// ordinary slot is held by a backlog's step, and never a step of the
/// default priority.
#[tokio::test]
async fn an_urgent_slot_runs_a_priority_1_run_while_every_other_slot_is_busy() {
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("bulk", "jobs", 5)).await;
    e.register(&one_step("normal", "jobs", 3)).await;
    let step = |id: &str| json!({"id": id, "type": "job", "queue": "jobs", "config": {"who": format!("urgent-{id}")}});
    e.register(&json!({"name": "urgent", "nodes": [step("a"), step("b")], "edges": [{"from": "a", "to": "b"}]})).await;
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut config = e.worker_config("urgent-slots", 1);
    config.options.urgent_slots = 1;
    let mut worker = composer_worker::Worker::new(config);
    let (seen, held) = (order.clone(), release.clone());
    worker.handle_on_queue("job", "jobs", move |_ctx, input: Value| {
        let who = input["who"].as_str().unwrap_or_default().to_string();
        seen.lock().unwrap().push(who.clone());
        let held = held.clone();
        async move {
            if who == "bulk" {
                let _ = held.acquire().await;
            }
            Ok(json!({}))
        }
    });
    let bulk = start(&e, "bulk", json!({"who": "bulk"}), None).await;
    e.spawn_worker(worker);
    eventually(T, "the bulk step to start", || async { (!order.lock().unwrap().is_empty()).then_some(()) }).await;
    let normal = start(&e, "normal", json!({"who": "normal"}), None).await;
    let urgent = start(&e, "urgent", json!({}), Some(1)).await;
    assert_eq!(e.wait_for_run(urgent, T).await["status"], "SUCCEEDED");
    // The default priority waits for the ordinary slot: its message stays
    // on the stream however often the urgent slot's poller reads.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(order.lock().unwrap().clone(), ["bulk", "urgent-a", "urgent-b"]);
    release.add_permits(2);
    assert_eq!(e.wait_for_run(bulk, T).await["status"], "SUCCEEDED");
    assert_eq!(e.wait_for_run(normal, T).await["status"], "SUCCEEDED");
    assert_eq!(order.lock().unwrap().clone(), ["bulk", "urgent-a", "urgent-b", "normal"]);
    e.stop().await;
}

/// Work of priority 1 or 2 has a transaction loop of its own: with every
/// other loop stuck inside a batch (here the one loop, on a run row the test
/// holds locked), an urgent start still commits and its run goes on.
#[tokio::test]
async fn an_urgent_start_commits_while_every_other_engine_loop_is_inside_a_batch() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.engine_workers = 1, ..Default::default() }).await;
    e.register(&one_step("held", "stuck", 3)).await;
    e.register(&one_step("urgent", "fast", 3)).await;
    let held = start(&e, "held", json!({"who": "held"}), None).await;
    let task = poll(&e, "stuck", 1).await.pop().expect("the held run's step");

    let mut client = e.db.pool().get().await.unwrap();
    let lock = composer_store::begin(&mut client).await.unwrap();
    lock.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", &[&held]).await.unwrap();
    // A result at the default priority: the one loop takes it and waits on the row.
    let completing = tokio::spawn({
        let (url, task) = (e.url(), task.clone());
        async move {
            let id = task["id"].as_str().unwrap();
            let body = json!({"worker_id": "w", "run_id": task["run_id"], "attempt": task["attempt"], "output": {}});
            reqwest::Client::new().post(format!("{url}/v1/tasks/{id}/complete")).json(&body).send().await.unwrap()
        }
    });
    let watcher = e.db.pool().get().await.unwrap();
    let waiting_on_a_lock =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    eventually(T, "the result's batch to wait on the held row", || async {
        (watcher.query_one(waiting_on_a_lock, &[]).await.unwrap().get::<_, i64>(0) > 0).then_some(())
    })
    .await;

    let urgent = tokio::time::timeout(T, start(&e, "urgent", json!({"who": "urgent"}), Some(1)))
        .await
        .expect("an urgent start waited for the stuck batch");
    let tasks = poll(&e, "fast", 1).await;
    assert_eq!(tasks.len(), 1, "its step was dispatched: {tasks:?}");
    assert_eq!(tasks[0]["run_id"], json!(urgent));
    assert!(!completing.is_finished(), "the default-priority result still waits on the row");

    lock.rollback().await.unwrap();
    let answer: Value = completing.await.unwrap().json().await.unwrap();
    assert_eq!(answer["applied"], json!(true), "{answer}");
    assert_eq!(e.wait_for_run(held, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

/// A result's `composer-priority` orders it in the coordinator's queue and
/// nothing else: one that does not read is taken as the default level, and
/// the result is applied whatever it says.
#[tokio::test]
async fn a_reports_priority_header_never_refuses_it() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("one", "jobs", 5)).await;
    let leases = composer_store::leases::LeaseManager::new(e.db.pool());
    for header in ["1", "5", "0", "9", "high", ""] {
        let run = start(&e, "one", json!({"who": header}), None).await;
        let task: Uuid = e.task(run, "job").await["id"].as_str().unwrap().parse().unwrap();
        assert!(leases.acquire(run, task, "w1", Duration::from_secs(30), 1).await.unwrap().is_granted());
        let body = json!({"run_id": run, "attempt": 1, "worker_id": "w1", "output": {}});
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/tasks/{task}/complete", e.url()))
            .header("composer-priority", header)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!((status, &answer["applied"]), (200, &json!(true)), "{header:?}: {answer}");
        assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED", "{header:?}");
    }
    e.stop().await;
}

/// The task a result takes with its answer has its run's priority, not the
/// one the result's header claimed: a worker that says `1` gets no urgent
/// label on the next step (an urgent slot asks for more only after an
/// urgent task).
#[tokio::test]
async fn an_eager_task_has_its_runs_priority_whatever_the_report_claimed() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let step = |id: &str| json!({"id": id, "type": "job", "queue": "chain4", "config": {"who": id}});
    e.register(&json!({"name": "chain4", "priority": 4, "nodes": [step("a"), step("b")],
                       "edges": [{"from": "a", "to": "b"}]}))
        .await;
    start(&e, "chain4", json!({}), None).await;
    until_published(&e, "chain4", 4, 1).await;
    let a = poll(&e, "chain4", 1).await.remove(0);
    assert_eq!(a["priority"], 4, "{a}");
    let body = json!({"run_id": a["run_id"], "attempt": 1, "worker_id": "w", "output": {},
                      "next": {"queues": ["chain4"]}});
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/v1/tasks/{}/complete", e.url(), a["id"].as_str().unwrap()))
        .header("composer-priority", "1")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["next"][0]["node_id"], "b", "{answer}");
    assert_eq!(answer["next"][0]["priority"], 4, "{answer}");
    e.stop().await;
}

#[tokio::test]
async fn the_task_api_serves_priorities_by_weight_without_starving_the_lowest() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("low", "py", 5)).await;
    e.register(&one_step("high", "py", 1)).await;
    for i in 0..70 {
        start(&e, "low", json!({"who": format!("low-{i}")}), None).await;
        start(&e, "high", json!({"who": format!("high-{i}")}), None).await;
    }
    until_published(&e, "py", 5, 70).await;
    until_published(&e, "py", 1, 70).await;

    // 62 polls of one task: a weighted share of 16 to 1 between the two
    // priorities that have work picks priority 5 at the 9th, 26th, 43rd
    // and 60th.
    let mut got = Vec::new();
    for _ in 0..62 {
        let tasks = poll(&e, "py", 1).await;
        assert_eq!(tasks.len(), 1, "{tasks:?}");
        got.push(tasks[0]["input"]["who"].as_str().unwrap().to_string());
    }
    // Each pick is exact unless a message was sent twice (the outbox and the
    // publisher may both send a dispatch when a commit is slow to be seen):
    // the copy takes a pick of its level and leases nothing, so a low task
    // may come one poll early or late after it.
    let lows: Vec<usize> = got.iter().enumerate().filter(|(_, w)| w.starts_with("low")).map(|(i, _)| i).collect();
    assert_eq!(lows.len(), 4, "{got:?}");
    for (low, want) in lows.iter().zip([8, 25, 42, 59]) {
        assert!(low.abs_diff(want) <= 1, "a low task at {low}, not near {want}: {got:?}");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_waiting_runs_priority_changes_and_its_dispatched_step_moves() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&one_step("later", "mv", 3)).await;
    let run = start(&e, "later", json!({"who": "x"}), None).await;
    until_published(&e, "mv", 3, 1).await;

    let (status, view) = e.put(&format!("/v1/runs/{run}/priority"), &json!({"priority": 1})).await;
    assert_eq!((status, &view["priority"]), (200, &json!(1)), "{view}");
    until_published(&e, "mv", 1, 1).await;
    let changed = e.history(run, "PriorityChanged").await;
    assert_eq!((changed.len(), &changed[0]["payload"]["from"]), (1, &json!(3)), "{changed:?}");

    // Either copy may be read first; the step runs once.
    let tasks = poll(&e, "mv", 10).await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    complete(&e, &tasks[0]).await;
    assert!(poll(&e, "mv", 10).await.is_empty(), "the copy left behind is refused by its lease");
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");

    let (status, body) = e.put(&format!("/v1/runs/{run}/priority"), &json!({"priority": 2})).await;
    assert_eq!(status, 409, "an ended run: {body}");
    let (status, body) = e.put(&format!("/v1/runs/{run}/priority"), &json!({"priority": 6})).await;
    assert!(status == 400 || status == 422, "{status} {body}");
    assert!(body.to_string().contains("priority"), "{body}");
    let (status, _) = e.put(&format!("/v1/runs/{}/priority", Uuid::now_v7()), &json!({"priority": 2})).await;
    assert_eq!(status, 404);
    e.stop().await;
}

#[tokio::test]
async fn queued_runs_start_by_priority_then_by_turns_among_fairness_keys() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "tenants", "concurrency": {"max": 1}, "fairness_key": "${ .input.tenant }",
        "nodes": [{"id": "job", "type": "job", "queue": "adm", "config": {"who": "${ .input.who }"}}]}))
        .await;
    let first = start(&e, "tenants", json!({"tenant": "a", "who": "a1"}), None).await;
    for who in ["a2", "a3", "a4"] {
        start(&e, "tenants", json!({"tenant": "a", "who": who}), None).await;
    }
    start(&e, "tenants", json!({"tenant": "b", "who": "b1"}), None).await;
    start(&e, "tenants", json!({"tenant": "c", "who": "c1"}), Some(1)).await;
    let (_, view) = e.get(&format!("/v1/runs/{first}")).await;
    assert_eq!(view["fairness_key"], "a", "{view}");

    // One run at a time: each completion admits the next queued one.
    let mut order = Vec::new();
    for _ in 0..6 {
        let tasks = poll(&e, "adm", 1).await;
        assert_eq!(tasks.len(), 1, "after {order:?}");
        order.push(tasks[0]["input"]["who"].as_str().unwrap().to_string());
        complete(&e, &tasks[0]).await;
    }
    // b1 and c1 are new classes: each takes the head's turn (a2's), after
    // it, not behind a's backlog.
    assert_eq!(order, ["a1", "a2", "b1", "c1", "a3", "a4"]);
    e.stop().await;
}

#[tokio::test]
async fn a_queued_run_lowered_goes_no_earlier_and_one_raised_goes_next() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "q", "concurrency": {"max": 1},
        "nodes": [{"id": "job", "type": "job", "queue": "mvq", "config": {"who": "${ .input.who }"}}]}))
        .await;
    start(&e, "q", json!({"who": "head"}), None).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(start(&e, "q", json!({"who": format!("r{i}")}), None).await);
    }
    // The same priority: nothing is written, nothing moves.
    let (status, _) = e.put(&format!("/v1/runs/{}/priority", ids[5]), &json!({"priority": 3})).await;
    assert_eq!(status, 200);
    assert!(e.history(ids[5], "PriorityChanged").await.is_empty(), "a change to the same priority writes nothing");
    // Lowered: r1 keeps its place or goes later, never earlier.
    let (status, _) = e.put(&format!("/v1/runs/{}/priority", ids[1]), &json!({"priority": 5})).await;
    assert_eq!(status, 200);
    // Raised: r4 goes right after the queue's head (r0).
    let (status, _) = e.put(&format!("/v1/runs/{}/priority", ids[4]), &json!({"priority": 1})).await;
    assert_eq!(status, 200);
    let mut order = Vec::new();
    for _ in 0..7 {
        let tasks = poll(&e, "mvq", 1).await;
        assert_eq!(tasks.len(), 1, "after {order:?}");
        order.push(tasks[0]["input"]["who"].as_str().unwrap().to_string());
        complete(&e, &tasks[0]).await;
    }
    assert_eq!(order, ["head", "r0", "r4", "r1", "r2", "r3", "r5"]);
    e.stop().await;
}

#[tokio::test]
async fn queued_priority_1_runs_get_sixteen_turns_to_one_of_priority_5() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "one", "concurrency": {"max": 1},
        "nodes": [{"id": "job", "type": "job", "queue": "wfq", "config": {"who": "${ .input.who }"}}]}))
        .await;
    start(&e, "one", json!({"who": "first"}), None).await;
    for i in 0..20 {
        start(&e, "one", json!({"who": format!("low-{i}")}), Some(5)).await;
    }
    for i in 0..20 {
        start(&e, "one", json!({"who": format!("high-{i}")}), Some(1)).await;
    }
    let mut order = Vec::new();
    for _ in 0..19 {
        let tasks = poll(&e, "wfq", 1).await;
        assert_eq!(tasks.len(), 1, "after {order:?}");
        order.push(tasks[0]["input"]["who"].as_str().unwrap().to_string());
        complete(&e, &tasks[0]).await;
    }
    // After the first: the head (low-0), then 16 of priority 1 per 1 of 5.
    let low = order[1..].iter().filter(|w| w.starts_with("low")).count();
    assert_eq!((order[1].as_str(), low), ("low-0", 2), "{order:?}");
    e.stop().await;
}

#[tokio::test]
async fn a_fairness_key_keeps_its_steps_in_one_lane_and_child_runs_inherit_it() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "lane", "fairness_key": "${ .input.tenant }",
        "nodes": [{"id": "job", "type": "job", "queue": "lane", "config": {}}]}))
        .await;
    for _ in 0..8 {
        start(&e, "lane", json!({"tenant": "acme"}), None).await;
    }
    until_published(&e, "lane", 3, 8).await;
    let shards = on_streams(&e, "lane", 3).await;
    assert!(shards.contains(&8), "one lane holds the key's steps: {shards:?}");

    e.register(&json!({"name": "kid", "nodes": [{"id": "job", "type": "job", "queue": "kid", "config": {}}]})).await;
    e.register(&json!({"name": "parent", "fairness_key": "${ .input.tenant }", "nodes": [
        {"id": "each", "type": "MAP", "config": {"items": "${ [1, 2] }", "node":
            {"type": "SUB_WORKFLOW", "config": {"workflow": "kid"}}}}]}))
        .await;
    let parent = start(&e, "parent", json!({"tenant": "acme"}), Some(2)).await;
    until_published(&e, "kid", 2, 2).await;
    let (status, page) = e.get(&format!("/v1/runs?parent_run_id={parent}")).await;
    assert_eq!(status, 200, "{page}");
    let children = page["runs"].as_array().unwrap();
    assert_eq!(children.len(), 2, "{page}");
    for child in children {
        assert_eq!((&child["priority"], &child["fairness_key"]), (&json!(2), &json!("acme")), "{child}");
    }
    e.stop().await;
}

#[tokio::test]
async fn a_bad_priority_or_fairness_key_is_refused_by_name() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    for (spec, field) in [
        (
            json!({"name": "p", "priority": 0, "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}}]}),
            "priority",
        ),
        (
            json!({"name": "p", "priority": "high", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}}]}),
            "priority",
        ),
        (
            json!({"name": "p", "fairness_key": "${ .nodes.x }", "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}}]}),
            "fairness_key",
        ),
    ] {
        let (status, body) = e.post("/v1/workflows", &spec).await;
        assert!(status == 400 || status == 422, "{status} {body}");
        assert!(body.to_string().contains(field), "{body}");
    }
    e.register(&json!({"name": "nul", "fairness_key": "${ [97, 0] | implode }",
        "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}}]}))
        .await;
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "nul"})).await;
    assert_eq!(status, 400, "a key PostgreSQL cannot store is the caller's error: {body}");
    assert!(body.to_string().contains("NUL"), "{body}");
    e.register(&json!({"name": "fk", "fairness_key": "${ .input.tenant }",
        "nodes": [{"id": "w", "type": "WAIT", "config": {"duration": "1s"}}]}))
        .await;
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "fk", "input": {"tenant": {"an": "object"}}})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("fairness_key"), "{body}");
    let (status, body) = e.post("/v1/runs", &json!({"workflow": "fk", "priority": 9})).await;
    assert!(status == 400 || status == 422, "{status} {body}");
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_api_serves_again_after_redis_lost_its_groups() {
    let dir = composer_embedded::temp_dir("prio-redis-restart").unwrap();
    let mut redis = composer_embedded::LocalRedis::start(&dir, None).unwrap();
    let e = Engine::on(
        composer_testkit::TestDb::create().await,
        redis.url(),
        EngineOptions { workers: 0, ..Default::default() },
    )
    .await;
    e.register(&one_step("again", "rq", 2)).await;
    start(&e, "again", json!({"who": "before"}), None).await;
    let tasks = poll(&e, "rq", 1).await;
    assert_eq!(tasks.len(), 1, "the groups were made and read");
    complete(&e, &tasks[0]).await;

    // Redis comes back empty: the streams and their groups are gone, and
    // this coordinator still thinks it made the groups.
    tokio::task::block_in_place(|| redis.restart()).unwrap();
    start(&e, "again", json!({"who": "after"}), None).await;
    let until = Instant::now() + T;
    loop {
        let (status, body) =
            e.post("/v1/tasks/poll", &json!({"worker_id": "w", "queues": ["rq"], "max": 1, "wait": "1s"})).await;
        if status == 200 && body["tasks"].as_array().is_some_and(|t| !t.is_empty()) {
            assert_eq!(body["tasks"][0]["input"]["who"], "after", "{body}");
            break;
        }
        assert!(Instant::now() < until, "the task API never read the new message: {status} {body}");
    }
    e.stop().await;
    drop(redis);
    let _ = std::fs::remove_dir_all(dir);
}
