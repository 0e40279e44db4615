//! Hostile definitions and targets against the worker, and lost dispatch
//! after Redis forgets (issue: hardening, round two). Each test is named
//! after the attack or failure it stops.

use std::time::Duration;

use composer_testkit::{http_node, Engine, EngineOptions, FakeHttp};
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

/// Messages on the engine's streams of `queue`.
async fn queued(e: &Engine, queue: &str) -> usize {
    let mut redis =
        redis::Client::open(e.redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut n = 0;
    for shard in 0..2 {
        let len: usize =
            redis::cmd("XLEN").arg(format!("{}tasks:{queue}.{shard}", e.prefix)).query_async(&mut redis).await.unwrap();
        n += len;
    }
    n
}

/// Deletes every key of this engine (its prefix): what a Redis restarted
/// without persistence holds, without touching other tests' keys.
async fn forget_everything(e: &Engine) {
    let mut redis =
        redis::Client::open(e.redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}*", e.prefix)).query_async(&mut redis).await.unwrap();
    assert!(!keys.is_empty(), "the engine had keys to lose");
    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_redis_that_lost_everything_redispatches_at_once() {
    // The lost-dispatch age is left at its default (10 minutes).
    let mut e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    assert_eq!(e.coordinator_config().lost_dispatch_age, Duration::from_secs(600));
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "lost", "nodes": [http_node("a", &http.url("/ok/lost"), 1)]})).await;
    // Published, and its outbox row gone: only the stream holds the dispatch.
    let pool = e.db.pool();
    let db = pool.get().await.unwrap();
    let give_up = tokio::time::Instant::now() + T;
    loop {
        let outbox: i64 = db.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0);
        if outbox == 0 && queued(&e, "http").await > 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < give_up, "the task was never dispatched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // `composer dev` killed: its coordinator gone, its embedded Redis empty.
    e.coordinators.pop().unwrap().abort();
    forget_everything(&e).await;
    assert_eq!(queued(&e, "http").await, 0);
    e.start_coordinator().await;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while queued(&e, "http").await == 0 {
        assert!(tokio::time::Instant::now() < give_up, "not dispatched again within seconds");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    e.start_worker("after", 2).await;
    assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    assert_eq!(http.calls("/ok/lost"), 1, "run once");
    e.stop().await;
}
