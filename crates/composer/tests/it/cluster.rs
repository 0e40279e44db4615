//! A Redis Cluster carries dispatch: three primaries with a replica each,
//! joined by `redis-cli --cluster create`. Runs complete across shards in
//! different slots, and losing a primary (SIGKILL; its replica takes over)
//! loses no run: what the dead primary had not yet replicated is sent again
//! by the lost-dispatch sweep.

use std::time::Duration;

use composer_embedded::{temp_dir, LocalRedisCluster};
use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp, TestDb};
use serde_json::json;

fn three_steps(http: &FakeHttp) -> serde_json::Value {
    json!({"name": "clustered", "nodes": [
        http_node("a", &http.url("/ok/a"), 3), http_node("b", &http.url("/ok/b"), 3), http_node("c", &http.url("/ok/c"), 3)],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]})
}

#[tokio::test]
async fn a_redis_cluster_runs_workflows_and_survives_losing_a_primary() {
    if std::env::var_os("CLUSTER_DEBUG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("warn,composer_stream=info").try_init();
    }
    let dir = temp_dir("redis-cluster").unwrap();
    let cluster_dir = dir.clone();
    let mut cluster = tokio::task::spawn_blocking(move || LocalRedisCluster::start(&dir, 3, 1).unwrap()).await.unwrap();
    let e = Engine::on(
        TestDb::create().await,
        cluster.url(),
        EngineOptions {
            coordinators: 2,
            workers: 2,
            // Replication is asynchronous: a message written to the primary
            // just before it died may never reach its replica. Such a task
            // stays PENDING without an outbox row, and the lost-dispatch
            // sweep sends it again (10 minutes by default; 2 s here).
            coordinator: |c| {
                c.recovery_interval = Duration::from_secs(1);
                c.lost_dispatch_age = Duration::from_secs(2);
            },
            ..Default::default()
        },
    )
    .await;
    let http = FakeHttp::start().await;
    e.register(&three_steps(&http)).await;
    let mut runs = Vec::new();
    for i in 0..20 {
        runs.push(e.start_run("clustered", json!({"i": i})).await);
    }
    for id in &runs {
        let run = e.wait_for_run(*id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }

    // A reader that finds nothing is still a consumer of the default
    // priority's streams, which the queues page lists: on a cluster too,
    // where a read goes stream by stream (and an XREADGROUP that reads
    // nothing makes no consumer).
    let poll = json!({"worker_id": "idle-reader", "queues": ["HTTP"], "wait": "100ms"});
    let (status, answer) = e.post("/v1/tasks/poll", &poll).await;
    assert_eq!((status, answer["tasks"].as_array().map(Vec::len)), (200, Some(0)), "{answer}");
    let streams = &e.coordinators[0].shared.streams;
    for shard in 0..e.coordinator_config().stream_shards {
        let stream = streams.keys().stream("HTTP", 3, shard);
        let consumers = streams.consumers(&stream).await.unwrap();
        assert!(consumers.iter().any(|(name, ..)| name == "api:idle-reader"), "{stream}: {consumers:?}");
    }

    // A primary dies while runs are in flight; its replica is promoted.
    let mut more = Vec::new();
    for i in 0..20 {
        more.push(e.start_run("clustered", json!({"i": 100 + i})).await);
    }
    let killed = tokio::task::spawn_blocking(move || {
        let port = cluster.kill_a_master().unwrap();
        cluster.wait_for_failover(port, Duration::from_secs(30)).unwrap();
        (port, cluster)
    })
    .await
    .unwrap();
    for i in 0..20 {
        more.push(e.start_run("clustered", json!({"i": 200 + i})).await);
    }
    for id in &more {
        let run = e.wait_for_run(*id, Duration::from_secs(120)).await;
        assert_eq!(run["status"], "SUCCEEDED", "after primary {} died: {run}", killed.0);
    }
    e.stop().await;
    drop(killed);
    std::fs::remove_dir_all(cluster_dir).unwrap();
}
