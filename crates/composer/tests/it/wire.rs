//! The dispatch message has one owner: the store writes an outbox row, the
//! enqueuer turns it into a `Dispatch` on the stream the stream crate names,
//! and a poll reads it back field for field.

use std::time::Duration;

use composer_api::wire::Dispatch;
use composer_stream::{Keys, Streams};
use composer_testkit::{eventually, Engine, EngineOptions};
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
    let message = eventually(Duration::from_secs(10), "a message on the gpu streams", || async {
        for name in &names {
            let mut read = streams.read_now("reader", name, 10).await.expect("XREADGROUP");
            if let Some(m) = read.pop() {
                assert!(read.is_empty(), "one dispatch, one message");
                return Some(m);
            }
        }
        None
    })
    .await;

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

async fn heard(rx: &mut tokio::sync::mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("an announcement").unwrap()
}

/// Each publish is announced to the other publishers on the same keys (never
/// to itself), and a Redis user that may not use channels still publishes:
/// only the announcement fails.
#[tokio::test]
async fn a_publish_is_announced_to_the_others_and_a_user_without_channels_still_publishes() {
    let url = composer_testkit::services().redis_url.clone();
    let prefix = composer_testkit::unique_prefix();
    let connect = |url: String| {
        let prefix = prefix.clone();
        async move { Streams::connect(&url, Keys::new(prefix)).await.expect("redis") }
    };
    let (a, b) = (connect(url.clone()).await, connect(url.clone()).await);
    let listen = |s: &Streams| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let s = s.clone();
        let task = tokio::spawn(async move {
            s.announced(move || {
                let _ = tx.send(());
            })
            .await
        });
        (rx, task)
    };
    let ((mut heard_by_a, task_a), (mut heard_by_b, task_b)) = (listen(&a), listen(&b));
    let mut admin = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let channel = a.keys().wake_channel();
    eventually(Duration::from_secs(10), "the two publishers to subscribe", || {
        let mut admin = admin.clone();
        let channel = channel.clone();
        async move {
            let subscribed: (String, i64) =
                redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).query_async(&mut admin).await.unwrap();
            (subscribed.1 == 2).then_some(()).ok_or(format!("{} subscribed", subscribed.1))
        }
    })
    .await;
    let stream = a.keys().stream("q", 3, 0);
    a.publish(&[(stream.as_str(), "one")]).await.unwrap();
    heard(&mut heard_by_b).await;
    b.publish(&[(stream.as_str(), "two")]).await.unwrap();
    b.publish(&[(stream.as_str(), "three")]).await.unwrap();
    heard(&mut heard_by_a).await;
    heard(&mut heard_by_a).await;
    // Delivered in order: had a heard its own publish, it would be here by now.
    assert!(heard_by_a.try_recv().is_err(), "a publisher heard its own announcement");
    assert!(heard_by_b.try_recv().is_err(), "b heard its own announcements");

    // A user of this prefix's keys with no channel (Redis 7's default for a new user).
    let user = format!("composer-test-{}", uuid::Uuid::now_v7().simple());
    let _: () = redis::cmd("ACL")
        .arg(vec!["SETUSER", user.as_str(), "on", ">a-password", "resetchannels", "+@all"])
        .arg(format!("~{prefix}*"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let limited = url.replacen("redis://", &format!("redis://{user}:a-password@"), 1);
    let c = connect(limited).await;
    c.publish(&[(stream.as_str(), "four")]).await.expect("a publish without channels");
    let len: i64 = redis::cmd("XLEN").arg(&stream).query_async(&mut admin).await.unwrap();
    assert_eq!(len, 4, "every message is on the stream");
    let _: () = redis::cmd("ACL").arg("DELUSER").arg(&user).query_async(&mut admin).await.unwrap();
    let _: () = redis::cmd("DEL").arg(&stream).query_async(&mut admin).await.unwrap();
    task_a.abort();
    task_b.abort();
}
