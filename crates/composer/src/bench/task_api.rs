//! `--task-api`: the K steps served by in-process pollers speaking the
//! task API, as a worker in another language would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The queue and type of `--task-api` steps.
pub(super) const TASK_API_QUEUE: &str = "bench-task-api";

pub(super) const TASK_API_TYPE: &str = "bench-echo";

/// One task-API worker: polls for up to 32 tasks and completes each at
/// once with its input as output, until `stop`. Each completion asks for
/// the task it makes ready (`next`), which is completed the same way; a
/// coordinator that refuses `next` (an older one) is asked without it.
pub(super) async fn poll_worker(
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    id: String,
    stop: CancellationToken,
) {
    let post = |path: String, body: Value| {
        let mut req = http.post(format!("{url}{path}")).json(&body);
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let eager = AtomicBool::new(true);
    while !stop.is_cancelled() {
        let poll = json!({"worker_id": id, "queues": [TASK_API_QUEUE], "max": 32, "wait": "1s"});
        let batch: Value = match post("/v1/tasks/poll".into(), poll).await {
            Ok(r) if r.status().is_success() => r.json().await.unwrap_or(Value::Null),
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let tasks = batch["tasks"].as_array().cloned().unwrap_or_default();
        let chains = tasks.into_iter().map(|first| async {
            let mut task = first;
            loop {
                let mut body =
                    json!({"worker_id": id, "run_id": task["run_id"], "attempt": task["attempt"], "output": task["input"]});
                if eager.load(Ordering::Relaxed) {
                    body["next"] = json!({"queues": [TASK_API_QUEUE]});
                }
                let path = format!("/v1/tasks/{}/complete", task["id"].as_str().unwrap_or_default());
                let answer = match post(path.clone(), body.clone()).await {
                    Ok(r) if r.status() == reqwest::StatusCode::BAD_REQUEST && body.get("next").is_some() => {
                        eager.store(false, Ordering::Relaxed);
                        body.as_object_mut().map(|b| b.remove("next"));
                        post(path, body).await
                    }
                    r => r,
                };
                let next = match answer {
                    Ok(r) => r.json::<Value>().await.ok().and_then(|a| a["next"].get(0).cloned()),
                    Err(e) => {
                        eprintln!("task API bench worker: complete failed: {e}");
                        None
                    }
                };
                match next {
                    Some(n) => task = n,
                    None => break,
                }
            }
        });
        futures_util::future::join_all(chains).await;
    }
}
