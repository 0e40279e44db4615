//! Hostile definitions and targets against the worker, and lost dispatch
//! after Redis forgets (issue: hardening, round two). Each test is named
//! after the attack or failure it stops.

use std::time::Duration;

use composer_testkit::{Engine, EngineOptions};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_schedule_whose_cron_never_fires_is_refused() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    e.register(&json!({"name": "report", "nodes": [{"id": "t", "type": "TRANSFORM", "config": {"output": 1}}]})).await;
    for cron in ["0 0 30 2 *", "0 0 31 2,4,6,9,11 *"] {
        let (status, body) = e.post("/v1/schedules", &json!({"id": "never", "workflow": "report", "cron": cron})).await;
        assert_eq!(status, 400, "{cron}: {body}");
        assert_eq!(body["error"]["code"], "invalid_schedule", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(cron) && message.contains("never fires"), "{message}");
    }
    let (status, _) = e.get("/v1/schedules/never").await;
    assert_eq!(status, 404, "nothing was stored");
    let (status, body) =
        e.post("/v1/schedules", &json!({"id": "leap", "workflow": "report", "cron": "0 0 29 2 *"})).await;
    assert_eq!(status, 201, "29 February fires in leap years: {body}");
    e.stop().await;
}
