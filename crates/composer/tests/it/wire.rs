//! The dispatch message has one owner: the store writes an outbox row, the
//! enqueuer turns it into a `Dispatch` on the stream the stream crate names,
//! and a poll reads it back field for field.

use std::time::{Duration, Instant};

use composer_api::wire::Dispatch;
use composer_stream::{Keys, Streams};
use composer_testkit::{Engine, EngineOptions};
use serde_json::json;

#[tokio::test]
async fn a_dispatch_written_by_the_store_is_read_back_from_its_stream() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let spec = json!({"name": "wire", "nodes": [
        {"id": "resize", "type": "resize-image", "queue": "gpu", "config": {"width": "${ .input.w }"}}
    ]});
    let def = e.register(&spec).await;
    let run = e.start_run("wire", json!({"w": 640})).await;

    let streams = Streams::connect(&e.redis_url, Keys::new(e.prefix.clone())).await.expect("redis");
    let names: Vec<String> = (0..2).map(|shard| streams.keys().stream("gpu", 3, shard)).collect();
    for name in &names {
        streams.ensure_group(name).await.expect("consumer group");
    }
    let until = Instant::now() + Duration::from_secs(10);
    let message = 'read: loop {
        for name in &names {
            let mut read = streams.read_now("reader", name, 10).await.expect("XREADGROUP");
            if let Some(m) = read.pop() {
                assert!(read.is_empty(), "one dispatch, one message");
                break 'read m;
            }
        }
        assert!(Instant::now() < until, "no message reached the gpu streams");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let dispatch: Dispatch = serde_json::from_str(&message.payload).expect("the message is a Dispatch");
    let task = e.task(run, "resize").await;
    assert_eq!(dispatch.run_id, run);
    assert_eq!(dispatch.task_id.to_string(), task["id"].as_str().expect("task id"));
    assert_eq!(dispatch.node_id, "resize");
    assert_eq!(dispatch.node_type, "resize-image");
    assert_eq!(dispatch.attempt, 1);
    assert_eq!(dispatch.input, json!({"width": 640}));
    assert_eq!(dispatch.workflow_id.to_string(), def["id"].as_str().expect("definition id"));
    assert_eq!(dispatch.workflow_version, 1);
    e.stop().await;
}
