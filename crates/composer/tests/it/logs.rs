//! Step logs: a worker sends lines for the attempt it holds the lease of
//! (`POST /v1/tasks/{id}/logs`); they are kept with the attempt, within a
//! budget, read back per attempt (`GET /v1/runs/{id}/tasks/{node}/logs`)
//! and shown, escaped, in the UI. The Rust worker's handlers log with
//! `ctx.log`, scrubbed of their secrets.

use std::time::Duration;

use composer_testkit::{eventually, Engine, EngineOptions};
use composer_worker::Worker;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

async fn poll_one(e: &Engine, worker: &str) -> Value {
    let (status, body) =
        e.post("/v1/tasks/poll", &json!({"worker_id": worker, "queues": ["py"], "max": 1, "wait": "10s"})).await;
    assert_eq!(status, 200, "{body}");
    let tasks = body["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{body}");
    tasks[0].clone()
}

fn lines(worker: &str, task: &Value, lines: &[&str]) -> Value {
    json!({"worker_id": worker, "run_id": task["run_id"], "attempt": task["attempt"], "lines": lines})
}

#[tokio::test]
async fn a_steps_lines_are_kept_per_attempt_within_a_budget_and_only_from_the_lease_holder() {
    let e =
        Engine::with(EngineOptions { workers: 0, coordinator: |c| c.task_log_max_bytes = 300, ..Default::default() })
            .await;
    e.register(&json!({"name": "logged", "nodes": [{"id": "step", "type": "resize", "queue": "py",
        "retry": {"max_attempts": 2, "initial_backoff": "10ms"}}]}))
        .await;
    let run = e.start_run("logged", json!({})).await;
    let first = poll_one(&e, "w1").await;
    let id = first["id"].as_str().unwrap().to_string();
    let logs = format!("/v1/tasks/{id}/logs");

    let (status, body) = e.post(&logs, &lines("w1", &first, &["starting", "half <b>way</b>"])).await;
    assert_eq!((status, &body), (200, &json!({"accepted": 2, "dropped": 0})), "{body}");
    // Another worker, a wrong attempt: the lease decides, nothing is kept.
    let (status, body) = e.post(&logs, &lines("intruder", &first, &["forged"])).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("lease_lost")), "{body}");
    let mut wrong = lines("w1", &first, &["forged"]);
    wrong["attempt"] = json!(7);
    assert_eq!(e.post(&logs, &wrong).await.0, 409);
    // No lines, too many, an unknown field: refused by name.
    for (body, names) in [
        (lines("w1", &first, &[]), "lines"),
        (lines("w1", &first, &vec!["x"; 101]), "lines"),
        (json!({"worker_id": "w1", "run_id": first["run_id"], "attempt": 1, "lines": ["a"], "level": "info"}), "level"),
    ] {
        let (status, answer) = e.post(&logs, &body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(names), "{answer}");
    }
    // Past the budget (300 bytes, each line its bytes and 64 for its row:
    // 151 used), the lines that do not fit are dropped and the log says so, once.
    let (status, body) = e.post(&logs, &lines("w1", &first, &["x".repeat(30).as_str(), "y".repeat(30).as_str()])).await;
    assert_eq!((status, &body), (200, &json!({"accepted": 1, "dropped": 1})), "{body}");
    let (_, body) = e.post(&logs, &lines("w1", &first, &["later"])).await;
    assert_eq!(body, json!({"accepted": 0, "dropped": 1}));

    let fail = json!({"worker_id": "w1", "run_id": first["run_id"], "attempt": first["attempt"], "error": "flaky"});
    assert_eq!(e.post(&format!("/v1/tasks/{id}/fail"), &fail).await.0, 200);
    // The retry's lines are its own. A NUL cannot be stored: refused by name
    // (the workers replace it before they send).
    let second = poll_one(&e, "w2").await;
    assert_eq!(second["attempt"], 2);
    let (status, body) = e.post(&logs, &lines("w2", &second, &["second try\0done"])).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("NUL"), "{body}");
    let (status, body) = e.post(&logs, &lines("w2", &second, &["second try done"])).await;
    assert_eq!((status, &body["accepted"]), (200, &json!(1)), "{body}");
    let done = json!({"worker_id": "w2", "run_id": second["run_id"], "attempt": 2, "output": {}});
    assert_eq!(e.post(&format!("/v1/tasks/{id}/complete"), &done).await.0, 200);
    assert_eq!(e.wait_for_run(run, T).await["status"], "SUCCEEDED");
    // After the step ended, nothing more is kept.
    assert_eq!(e.post(&logs, &lines("w2", &second, &["too late"])).await.0, 409);

    let (status, now) = e.get(&format!("/v1/runs/{run}/tasks/step/logs")).await;
    assert_eq!(status, 200, "{now}");
    assert_eq!(now["attempt"], 2, "the current attempt by default");
    assert_eq!(now["attempts"], json!([{"attempt": 1, "lines": 4}, {"attempt": 2, "lines": 1}]));
    assert_eq!(now["lines"][0]["line"], "second try done");
    let (_, then) = e.get(&format!("/v1/runs/{run}/tasks/step/logs?attempt=1")).await;
    let texts: Vec<&str> = then["lines"].as_array().unwrap().iter().map(|l| l["line"].as_str().unwrap()).collect();
    assert_eq!(texts[..3], ["starting", "half <b>way</b>", "x".repeat(30).as_str()]);
    assert!(texts[3].contains("size limit"), "{texts:?}");
    // Paged by seq.
    let (_, page) = e.get(&format!("/v1/runs/{run}/tasks/step/logs?attempt=1&limit=2")).await;
    assert_eq!((page["lines"].as_array().unwrap().len(), &page["next_after"]), (2, &json!(2)), "{page}");
    let (_, page) = e.get(&format!("/v1/runs/{run}/tasks/step/logs?attempt=1&after=2&limit=2")).await;
    assert_eq!(page["lines"][0]["seq"], 3, "{page}");
    for path in
        [format!("/v1/runs/{run}/tasks/nope/logs"), format!("/v1/runs/{}/tasks/step/logs", uuid::Uuid::now_v7())]
    {
        assert_eq!(e.get(&path).await.0, 404, "{path}");
    }
    for query in ["limit=5000", "attempt=0", "after=-1", "attempt=x"] {
        assert_eq!(e.get(&format!("/v1/runs/{run}/tasks/step/logs?{query}")).await.0, 400, "{query}");
    }

    // The UI lists the step's lines, escaped, one attempt at a time.
    let b = reqwest::Client::new();
    let page = b.get(format!("{}/ui/runs/{run}", e.url())).send().await.unwrap().text().await.unwrap();
    assert!(
        page.contains(&format!("/ui/runs/{run}/logs?node=step\">logs</a> (5 lines)")),
        "the run page links the log"
    );
    let page = b
        .get(format!("{}/ui/runs/{run}/logs?node=step&attempt=1", e.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("half &lt;b&gt;way&lt;/b&gt;") && !page.contains("<b>way"), "escaped: {page}");
    assert!(page.contains("<strong>attempt 1</strong>") && page.contains("attempt=2\">attempt 2</a>"), "{page}");
    e.stop().await;
}

#[tokio::test]
async fn a_rust_handlers_lines_reach_its_step_before_its_result_scrubbed_of_its_secrets() {
    std::env::set_var("COMPOSER_SECRET_LOGS_TOKEN", "s3cr3t-value");
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let mut worker = Worker::new(e.worker_config("logs", 2));
    worker.handle("chatty", |ctx, input| async move {
        ctx.log(format!("calling with token {}", input["token"].as_str().unwrap_or("")));
        for i in 0..3 {
            ctx.log(format!("step {i}"));
        }
        Ok(json!({"ok": true}))
    });
    e.spawn_worker(worker);
    let id = e
        .run(&json!({"name": "chatty", "nodes": [{"id": "talk", "type": "chatty",
            "config": {"token": "${ .secrets.LOGS_TOKEN }"}}]}))
        .await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    // The lines landed before the result did: the log is whole once the run ended.
    let (_, logs) = e.get(&format!("/v1/runs/{id}/tasks/talk/logs")).await;
    let texts: Vec<&str> = logs["lines"].as_array().unwrap().iter().map(|l| l["line"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 4, "{logs}");
    assert!(!texts[0].contains("s3cr3t-value") && texts[0].starts_with("calling with token "), "{texts:?}");
    assert_eq!(texts[1..], ["step 0", "step 1", "step 2"]);
    e.stop().await;
}

#[tokio::test]
async fn a_long_handlers_lines_arrive_while_it_still_runs() {
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let mut worker = Worker::new(e.worker_config("slow-logs", 1));
    worker.handle("slow-talker", |ctx, _input| async move {
        ctx.log("working");
        // Slow work, so a fixed time: the line must arrive while it runs.
        tokio::time::sleep(Duration::from_secs(8)).await;
        Ok(json!({}))
    });
    e.spawn_worker(worker);
    let id = e.run(&json!({"name": "slow-talker", "nodes": [{"id": "talk", "type": "slow-talker"}]})).await;
    // Sent within about a second; the handler runs for eight.
    eventually(Duration::from_secs(7), "the line to arrive while the handler runs", || async {
        let (_, logs) = e.get(&format!("/v1/runs/{id}/tasks/talk/logs")).await;
        (logs["lines"][0]["line"] == "working").then_some(()).ok_or(logs)
    })
    .await;
    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(run["status"], "RUNNING", "the line arrived while the handler ran");
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    e.stop().await;
}

#[tokio::test]
async fn a_runs_logs_share_one_budget_and_a_line_that_looks_like_the_marker_closes_nothing() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            c.task_log_max_bytes = 100_000;
            c.run_log_max_bytes = 600;
        },
        ..Default::default()
    })
    .await;
    let node = |id: &str| json!({"id": id, "type": "resize", "queue": "py"});
    e.register(&json!({"name": "two", "nodes": [node("a"), node("b")]})).await;
    let run = e.start_run("two", json!({})).await;
    let (a, b) = (poll_one(&e, "w").await, poll_one(&e, "w").await);
    let engine = &e;
    let post = |task: &Value, line: &str| {
        let path = format!("/v1/tasks/{}/logs", task["id"].as_str().unwrap());
        let body = lines("w", task, &[line]);
        async move { engine.post(&path, &body).await.1 }
    };
    // The marker's text, sent as a line, is only a line.
    let spoof = composer_store::logs::DROPPED_MARKER;
    assert_eq!(post(&a, spoof).await, json!({"accepted": 1, "dropped": 0}));
    assert_eq!(post(&a, "still open").await, json!({"accepted": 1, "dropped": 0}));
    // Step b's lines count against the same run: past 600 bytes, dropped.
    let used = spoof.len() + "still open".len() + 2 * composer_store::logs::LINE_OVERHEAD;
    let fits = "b".repeat(600 - used - composer_store::logs::LINE_OVERHEAD);
    assert_eq!(post(&b, &fits).await, json!({"accepted": 1, "dropped": 0}));
    assert_eq!(post(&b, "one more").await, json!({"accepted": 0, "dropped": 1}));
    let (_, logs) = e.get(&format!("/v1/runs/{run}/tasks/b/logs")).await;
    assert_eq!(logs["lines"].as_array().unwrap().len(), 2, "its line and the marker: {logs}");
    assert_eq!(logs["lines"][0]["worker_id"], "w");
    e.stop().await;
}
