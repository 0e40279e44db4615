//! The task API (`/v1/tasks/*`): a worker with only a URL leases, heartbeats,
//! completes and fails tasks of a custom type; a worker that stops
//! heartbeating loses its task to the next poller, and its late result is
//! refused.

use std::time::Duration;

use composer_testkit::{eventually, Engine, EngineOptions};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

fn three_steps() -> Value {
    let node = |id: &str| {
        json!({"id": id, "type": "resize", "queue": "py", "config": {"size": id},
        "retry": {"max_attempts": 3, "initial_backoff": "10ms"}})
    };
    json!({"name": "pipeline", "nodes": [node("a"), node("b"), node("c")],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})
}

async fn poll(e: &Engine, worker: &str, wait: &str) -> Vec<Value> {
    let (status, body) =
        e.post("/v1/tasks/poll", &json!({"worker_id": worker, "queues": ["py"], "max": 10, "wait": wait})).await;
    assert_eq!(status, 200, "{body}");
    body["tasks"].as_array().unwrap().clone()
}

async fn poll_one(e: &Engine, worker: &str) -> Value {
    let tasks = poll(e, worker, "10s").await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    tasks[0].clone()
}

fn finish(worker: &str, task: &Value) -> Value {
    json!({"worker_id": worker, "run_id": task["run_id"], "attempt": task["attempt"]})
}

#[tokio::test]
async fn a_worker_with_only_a_url_runs_a_workflow_of_custom_steps() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&three_steps()).await;
    let run = e.start_run("pipeline", json!({"photo": "cat.png"})).await;
    let mut failed_once = false;
    for node in ["a", "b", "c"] {
        let task = poll_one(&e, "py-1").await;
        assert_eq!((task["node_id"].as_str(), task["node_type"].as_str()), (Some(node), Some("resize")), "{task}");
        assert_eq!(task["queue"], "py");
        assert_eq!(task["input"], json!({"size": node}));
        assert!(task["lease_ttl_ms"].as_u64().unwrap() > 0);
        let id = task["id"].as_str().unwrap();
        let (status, body) = e.post(&format!("/v1/tasks/{id}/heartbeat"), &finish("py-1", &task)).await;
        assert_eq!(status, 200, "{body}");
        if node == "b" && !failed_once {
            // A retryable failure: the same step comes back at attempt 2.
            failed_once = true;
            let mut fail = finish("py-1", &task);
            fail["error"] = json!("disk full");
            let (status, body) = e.post(&format!("/v1/tasks/{id}/fail"), &fail).await;
            assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
            let again = poll_one(&e, "py-1").await;
            assert_eq!((again["id"].as_str(), again["attempt"].as_i64()), (Some(id), Some(2)), "{again}");
            let mut done = finish("py-1", &again);
            done["output"] = json!({"resized": node});
            let (status, body) = e.post(&format!("/v1/tasks/{id}/complete"), &done).await;
            assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
            continue;
        }
        let mut done = finish("py-1", &task);
        done["output"] = json!({"resized": node});
        let (status, body) = e.post(&format!("/v1/tasks/{id}/complete"), &done).await;
        assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
    }
    let run = e.wait_for_run(run, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["c"], json!({"resized": "c"}), "{run}");
    // Nothing is left to lease: an empty answer, after the wait.
    assert!(poll(&e, "py-1", "100ms").await.is_empty());
    e.stop().await;
}

#[tokio::test]
async fn a_worker_that_stops_heartbeating_loses_its_task_and_its_late_result() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.lease_ttl = Duration::from_millis(800),
        ..Default::default()
    })
    .await;
    e.register(&three_steps()).await;
    let run = e.start_run("pipeline", json!({})).await;
    let first = poll_one(&e, "dies").await;
    let id = first["id"].as_str().unwrap().to_string();
    // Within the lease nobody else gets it.
    assert!(poll(&e, "lives", "300ms").await.is_empty());
    // Past it, the next poll takes it over, at the same attempt.
    let second = poll_one(&e, "lives").await;
    assert_eq!((second["id"].as_str(), &second["attempt"]), (Some(id.as_str()), &first["attempt"]), "{second}");
    // The first worker's heartbeat and late result are refused.
    let (status, body) = e.post(&format!("/v1/tasks/{id}/heartbeat"), &finish("dies", &first)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("lease_lost")), "{body}");
    let mut late = finish("dies", &first);
    late["output"] = json!({"from": "dies"});
    let (status, body) = e.post(&format!("/v1/tasks/{id}/complete"), &late).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("lease_lost")), "{body}");
    let mut done = finish("lives", &second);
    done["output"] = json!({"from": "lives"});
    let (status, body) = e.post(&format!("/v1/tasks/{id}/complete"), &done).await;
    assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
    let a = e.task(run, "a").await;
    assert_eq!(a["output"], json!({"from": "lives"}), "{a}");
    assert_eq!(e.history(run, "TaskCompleted").await.len(), 1, "one applied result");
    e.stop().await;
}

#[tokio::test]
async fn bad_polls_and_foreign_tasks_are_refused_by_name() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.task_poll_max_wait = Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    // A wait beyond the limit is cut to it (an hour would outlast the test).
    let (status, body) = e.post("/v1/tasks/poll", &json!({"worker_id": "w", "queues": ["py"], "wait": "3600s"})).await;
    assert_eq!((status, &body["tasks"]), (200, &json!([])), "{body}");
    let cases = [
        (json!({"worker_id": "w", "queues": []}), "queues"),
        (json!({"worker_id": "w", "queues": ["py"], "max": 0}), "max"),
        (json!({"worker_id": "w", "queues": ["py"], "max": 101}), "max"),
        (json!({"worker_id": "w", "queues": ["py"], "wait": "soon"}), "wait"),
        (json!({"worker_id": "w w", "queues": ["py"]}), "worker_id"),
        (json!({"worker_id": "w", "queues": ["no/slash"]}), "queues"),
        (json!({"worker_id": "w", "queues": ["py"], "extra": 1}), "extra"),
    ];
    for (body, mentions) in cases {
        let (status, answer) = e.post("/v1/tasks/poll", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(mentions), "{body}: {answer}");
    }
    let ghost = uuid::Uuid::now_v7();
    let lease = json!({"worker_id": "w", "run_id": uuid::Uuid::now_v7(), "attempt": 1});
    let (status, _) = e.post(&format!("/v1/tasks/{ghost}/heartbeat"), &lease).await;
    assert_eq!(status, 409);
    let mut fail = lease.clone();
    fail["error"] = json!("x");
    let (status, _) = e.post(&format!("/v1/tasks/{ghost}/fail"), &fail).await;
    assert_eq!(status, 409);
    let (status, _) = e.post("/v1/tasks/not-a-uuid/heartbeat", &lease).await;
    assert_eq!(status, 400);
    e.stop().await;
}

/// Eager dispatch over the task API: a result that asks for `next` gets the
/// task it made ready in its answer, leased to its worker, and one that asks
/// for another queue gets none.
#[tokio::test]
async fn a_result_that_asks_for_next_gets_the_task_it_made_ready_leased_with_the_answer() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&three_steps()).await;
    let run = e.start_run("pipeline", json!({})).await;
    let a = poll_one(&e, "py-1").await;
    let mut done = finish("py-1", &a);
    done["output"] = json!({"resized": "a"});
    done["next"] = json!({"queues": ["py"]});
    let (status, body) = e.post(&format!("/v1/tasks/{}/complete", a["id"].as_str().unwrap()), &done).await;
    assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
    let next = body["next"].as_array().expect("the answer carries b");
    assert_eq!(next.len(), 1, "{body}");
    let b = &next[0];
    assert_eq!((b["node_id"].as_str(), b["queue"].as_str(), b["attempt"].as_i64()), (Some("b"), Some("py"), Some(1)));
    assert_eq!(b["input"], json!({"size": "b"}));
    assert!(b["lease_ttl_ms"].as_u64().unwrap() > 0 && b["traceparent"].is_string(), "{b}");
    // b is this worker's: a poll of another gets nothing, its heartbeat works.
    assert!(poll(&e, "py-2", "100ms").await.is_empty(), "b never went through a stream");
    let b_id = b["id"].as_str().unwrap().to_string();
    let (status, _) = e.post(&format!("/v1/tasks/{b_id}/heartbeat"), &finish("py-1", b)).await;
    assert_eq!(status, 200);
    // A failure may ask too; a retry that waits out its backoff is not
    // ready yet, and comes through a poll.
    let mut fail = finish("py-1", b);
    fail["error"] = json!("disk full");
    fail["next"] = json!({"queues": ["py"], "max": 2});
    let (status, body) = e.post(&format!("/v1/tasks/{b_id}/fail"), &fail).await;
    assert_eq!((status, body.get("next")), (200, None), "{body}");
    let again = &poll_one(&e, "py-1").await;
    assert_eq!((again["id"].as_str(), again["attempt"].as_i64()), (Some(b_id.as_str()), Some(2)), "{again}");
    // Asking for a queue c is not on: c goes through its stream.
    let mut done = finish("py-1", again);
    done["next"] = json!({"queues": ["elsewhere"]});
    let (status, body) = e.post(&format!("/v1/tasks/{b_id}/complete"), &done).await;
    assert_eq!((status, body.get("next")), (200, None), "{body}");
    let c = poll_one(&e, "py-2").await;
    assert_eq!(c["node_id"], "c");
    let (status, _) = e.post(&format!("/v1/tasks/{}/complete", c["id"].as_str().unwrap()), &finish("py-2", &c)).await;
    assert_eq!(status, 200);
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    // What `next` may ask is checked, by name.
    let x = json!({"worker_id": "py-1", "run_id": c["run_id"], "attempt": 1});
    for (next, says) in [
        (json!({"queues": []}), "next.queues"),
        (json!({"queues": ["a b"]}), "next.queues"),
        (json!({"queues": ["py"], "max": 0}), "next.max"),
        (json!({"queues": ["py"], "max": 17}), "next.max"),
        (json!({"queues": ["py"], "wait": "1s"}), "unknown field"),
    ] {
        let mut body = x.clone();
        body["next"] = next.clone();
        let (status, answer) = e.post(&format!("/v1/tasks/{}/complete", c["id"].as_str().unwrap()), &body).await;
        assert_eq!(status, 400, "{next}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{next}: {answer}");
    }
    e.stop().await;
}

/// The failure table's row for a coordinator that dies between reading a
/// poll's message and leasing its task: the message stays unacknowledged
/// in the group, and once it has been idle for a lease the next poll claims
/// it and leases the task, instead of the lost-dispatch sweep (10 minutes).
#[tokio::test]
async fn a_message_read_by_a_poll_whose_coordinator_died_goes_to_the_next_poll_after_a_lease() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| c.lease_ttl = Duration::from_millis(800),
        ..Default::default()
    })
    .await;
    e.register(&three_steps()).await;
    e.start_run("pipeline", json!({})).await;
    // The dead coordinator's read: the message is delivered, never acked.
    let streams =
        composer_stream::Streams::connect(&e.redis_url, composer_stream::Keys::new(e.prefix.clone())).await.unwrap();
    let names = streams.keys().streams_of(["py"], e.coordinator_config().stream_shards);
    eventually(T, "a's message to reach a stream (read by the dead coordinator)", || async {
        for name in &names {
            streams.ensure_group(name).await.unwrap();
            if !streams.read_now("api:died", name, 1).await.unwrap().is_empty() {
                return Some(());
            }
        }
        None
    })
    .await;
    let a = poll_one(&e, "lives").await;
    assert_eq!((a["node_id"].as_str(), a["attempt"].as_i64()), (Some("a"), Some(1)), "{a}");
    let mut done = finish("lives", &a);
    done["output"] = json!({});
    let (status, body) = e.post(&format!("/v1/tasks/{}/complete", a["id"].as_str().unwrap()), &done).await;
    assert_eq!((status, &body["applied"]), (200, &json!(true)), "{body}");
    let pending: usize = {
        let mut n = 0;
        for name in &names {
            n += streams.consumers(name).await.unwrap().iter().map(|(_, _, p)| *p as usize).sum::<usize>();
        }
        n
    };
    assert_eq!(pending, 0, "the claimed message was acknowledged");
    e.stop().await;
}
