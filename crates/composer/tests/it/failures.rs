//! The failure table (docs/architecture.md, "Failures"): one test per row, named after
//! the failure, against real PostgreSQL, Redis and processes. Tests that
//! break a service get a dedicated instance of it.

use std::time::{Duration, Instant};

use composer_coord::engine::EventRequest;
use composer_core::machine::Event;
use composer_embedded::{LocalPostgres, LocalRedis, PgOptions};
use composer_store::leases::{Acquired, LeaseManager};
use composer_stream::{Keys, Streams};
use composer_testkit::{eventually, http_node, services, Engine, EngineOptions, FakeHttp, TestDb};
use composer_worker::{TaskError, Worker};
use serde_json::{json, Value};
use uuid::Uuid;

const T: Duration = Duration::from_secs(30);

fn no_workers() -> EngineOptions {
    EngineOptions { workers: 0, ..Default::default() }
}

fn task_id(run: &Value, node: &str) -> Uuid {
    run["tasks"].as_array().unwrap().iter().find(|t| t["node_id"] == node).unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn outbox_rows(e: &Engine) -> i64 {
    let pool = e.db.pool();
    let c = pool.get().await.unwrap();
    c.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0)
}

/// Stream messages the engine's coordinators read for a poll and could not
/// lease (another worker held the task, or it had moved on).
fn leases_denied(e: &Engine) -> u64 {
    e.coordinators.iter().map(|c| c.shared.task_api.leases_denied.load(std::sync::atomic::Ordering::Relaxed)).sum()
}

async fn wait_for_empty_outbox(e: &Engine) {
    eventually(T, "the outbox to drain", || async {
        let rows = outbox_rows(e).await;
        (rows == 0).then_some(()).ok_or(format!("{rows} rows"))
    })
    .await;
}

/// A worker leased the task and died.
#[tokio::test]
async fn expired_lease_is_recovered() {
    let mut e = Engine::with(no_workers()).await;
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "orphan", "nodes": [http_node("orphan", &http.url("/ok/orphan"), 1)]})).await;
    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    let task = task_id(&run, "orphan");

    let leases = LeaseManager::new(e.db.pool());
    assert!(leases.acquire(id, task, "dead-worker", Duration::from_secs(1), 1).await.unwrap().is_granted());
    assert!(
        !leases.acquire(id, task, "dead-worker", Duration::from_secs(1), 1).await.unwrap().is_granted(),
        "an owner must not re-acquire a lease it still holds"
    );

    e.wait_for_lease_expiry(task, T).await;
    composer_coord::loops::recover_tasks(&e.coordinators[0].shared).await;
    e.start_worker("survivor", 2).await;

    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(http.calls("/ok/orphan"), 1, "the orphaned task is executed exactly once");
    assert_eq!(run["tasks"][0]["attempt"], 1, "recovery re-dispatches the same attempt");
    e.stop().await;
}

/// The API coordinator runs no outbox; the other
/// polls once a minute, so only NOTIFY from the first one's commits can make
/// three dispatches happen within seconds.
#[tokio::test]
async fn outbox_is_woken_by_notify() {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut api = e.coordinator_config();
    api.run_outbox = false;
    e.start_coordinator_with(api).await;
    let mut publisher = e.coordinator_config();
    publisher.outbox_poll_interval = Duration::from_secs(60);
    e.start_coordinator_with(publisher).await;
    // The worker polls the other: a poll waiting on the API coordinator
    // would be handed the first step in its start's commit, no outbox row.
    let mut cfg = e.worker_config("w1", 2);
    cfg.options.coordinator_urls = vec![format!("http://{}", e.coordinators[1].addr)];
    e.spawn_worker(Worker::new(cfg));
    let polls = e.coordinators[1].shared.engine.idle_polls();
    eventually(T, "the worker's poll to wait on the publisher", || async { (polls.waiting() > 0).then_some(()) }).await;

    let http = FakeHttp::start().await;
    let started = Instant::now();
    let id = e
        .run(&json!({"name": "notify", "nodes": [
            http_node("a", &http.url("/ok/a"), 1), http_node("b", &http.url("/ok/b"), 1), http_node("c", &http.url("/ok/c"), 1)],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]}))
        .await;
    let run = e.wait_for_run(id, Duration::from_secs(20)).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(5), "three dispatches took {elapsed:?}; the outbox was not woken by NOTIFY");
    e.stop().await;
}

#[tokio::test]
async fn duplicate_and_late_reports_are_ignored() {
    let e = Engine::with(no_workers()).await;
    // Two steps, so the run is still RUNNING when the duplicates arrive.
    let id = e
        .run(&json!({"name": "dups", "nodes": [http_node("a", "http://127.0.0.1:9/a", 3), http_node("b", "http://127.0.0.1:9/b", 3)],
                     "edges": [{"from": "a", "to": "b"}]}))
        .await;
    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    let task = task_id(&run, "a");
    let path = format!("/v1/tasks/{task}/complete");
    let report =
        |attempt: i32, out: i32| json!({"run_id": id, "attempt": attempt, "worker_id": "w", "output": {"n": out}});

    // Worker "w" holds the lease: only the holder's report is applied.
    let leases = LeaseManager::new(e.db.pool());
    assert!(leases.acquire(id, task, "w", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let (status, first) = e.post(&path, &report(1, 1)).await;
    assert_eq!((status, &first["applied"]), (200, &json!(true)), "{first}");
    let (status, dup) = e.post(&path, &report(1, 2)).await;
    assert_eq!((status, &dup["error"]["code"]), (409, &json!("lease_lost")), "the task ended: nobody holds it");
    // What gets past the lease check (a repeat racing the first report) the
    // engine ignores, saying why.
    let engine = &e.coordinators[0].shared.engine;
    let completed = |attempt: i32, n: i32| Event::TaskCompleted { task_id: task, attempt, output: json!({"n": n}) };
    let dup = engine.handle(EventRequest::new(id, completed(1, 2))).await.unwrap().ignored.unwrap();
    assert!(dup.contains("already COMPLETED"), "{dup}");
    let stale = engine.handle(EventRequest::new(id, completed(0, 3))).await.unwrap().ignored.unwrap();
    assert!(stale.contains("stale"), "{stale}");
    let late = Event::TaskFailed {
        task_id: task,
        attempt: 1,
        error: "late".into(),
        retryable: true,
        code: None,
        status: None,
        retry_after: None,
    };
    assert!(engine.handle(EventRequest::new(id, late)).await.unwrap().ignored.is_some());

    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    assert_eq!(run["tasks"][0]["output"]["n"], 1, "the first result wins");
    assert_eq!(run["tasks"][1]["state"], "PENDING", "and was routed once");
    assert_eq!(e.history(id, "EventIgnored").await.len(), 3, "ignored reports are in the history");
    assert_eq!(e.history(id, "TaskCompleted").await.len(), 1);
    e.stop().await;
}

/// The worker's own steps of the "worker is slow, not dead" row: its lease is
/// taken over, its renewal fails, it cancels and its result never lands.
#[tokio::test]
async fn a_slow_worker_loses_its_lease_and_its_result_is_discarded() {
    // No recovery sweep while the lease is expired by hand: it would put the
    // task back to PENDING before the thief takes it over.
    let mut e = Engine::with(EngineOptions {
        workers: 0,
        lease_ttl: Duration::from_millis(1500),
        coordinator: |c| c.recovery_interval = Duration::from_secs(3600),
        ..Default::default()
    })
    .await;
    let mut worker = Worker::new(e.worker_config("slow", 1));
    worker.handle("slow-step", |_ctx, _input| async {
        // Slow work, so a fixed time: it outlasts the lease (1.5 s).
        tokio::time::sleep(Duration::from_secs(4)).await;
        Ok(json!({"from": "slow"}))
    });
    let stats = e.spawn_worker(worker).stats.clone();
    let id = e.run(&json!({"name": "slowpoke", "nodes": [{"id": "s", "type": "slow-step"}]})).await;
    let run = e.wait_until(id, T, |r| r["tasks"][0]["state"] == "RUNNING").await;
    let task = task_id(&run, "s");

    // Another worker takes the lease over once it has expired.
    let pool = e.db.pool();
    pool.get()
        .await
        .unwrap()
        .execute("UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1", &[&task])
        .await
        .unwrap();
    let leases = LeaseManager::new(pool);
    assert_eq!(leases.acquire(id, task, "thief", Duration::from_secs(30), 1).await.unwrap(), Acquired::TakenOver);

    eventually(T, "the slow worker to notice it lost its lease", || async { (stats.lease_lost() > 0).then_some(()) })
        .await;
    assert_eq!(stats.reported(), 0, "a worker that lost its lease reports nothing");

    let path = format!("/v1/tasks/{task}/complete");
    let ours = json!({"run_id": id, "attempt": 1, "worker_id": "thief", "output": {"from": "thief"}});
    assert_eq!(e.post(&path, &ours).await.1["applied"], true);
    let late = json!({"run_id": id, "attempt": 1, "worker_id": "slow", "output": {"from": "slow"}});
    let (status, refused) = e.post(&path, &late).await;
    assert_eq!((status, &refused["error"]["code"]), (409, &json!("lease_lost")), "a late result is refused");
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["output"]["s"]["from"], "thief");
    e.stop().await;
}

/// The enqueuer crashed after XADD and before DELETE: the row comes back
/// after the claim timeout and is published again; the lease drops the
/// duplicate.
#[tokio::test]
async fn crash_after_xadd_before_delete_publishes_again_and_the_lease_drops_the_duplicate() {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut api = e.coordinator_config();
    api.run_outbox = false;
    e.start_coordinator_with(api).await;
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "dup-publish", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;

    // The crashed enqueuer: claim, XADD, and no DELETE.
    let pool = e.db.pool();
    let client = pool.get().await.unwrap();
    let rows = composer_store::outbox::claim(&client, 10, Duration::from_secs(1), &[]).await.unwrap();
    assert_eq!(rows.len(), 1);
    let streams = Streams::connect(&e.redis_url, Keys::new(e.prefix.clone())).await.unwrap();
    let messages = composer_coord::outbox::messages(streams.keys(), &rows).unwrap();
    streams.publish(&[(messages[0].0.as_str(), messages[0].1.as_str())]).await.unwrap();

    let mut publisher = e.coordinator_config();
    publisher.outbox_claim_timeout = Duration::from_secs(1);
    e.start_coordinator_with(publisher).await;
    wait_for_empty_outbox(&e).await;
    e.start_worker("w", 4).await;

    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    eventually(T, "the second message to be seen", || async { (leases_denied(&e) > 0).then_some(()) }).await;
    assert_eq!(http.calls("/ok/a"), 1, "published twice, executed once");
    e.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_without_persistence_loses_no_run() {
    let dir = composer_embedded::temp_dir("redis-restart").unwrap();
    let mut redis = LocalRedis::start(&dir, None).unwrap();
    let opts = EngineOptions {
        workers: 0,
        coordinator: |c| c.lost_dispatch_age = Duration::from_secs(2),
        ..Default::default()
    };
    let mut e = Engine::on(TestDb::create().await, redis.url(), opts).await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "lost", "nodes": [http_node("a", &http.url("/ok/lost"), 1)]})).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(e.start_run("lost", json!({})).await);
    }
    wait_for_empty_outbox(&e).await;

    tokio::task::block_in_place(|| redis.restart()).unwrap();
    e.start_worker("after-restart", 4).await;
    for id in ids {
        let run = e.wait_for_run(id, T).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    assert_eq!(http.calls("/ok/lost"), 5);
    assert!(composer_metrics::value(composer_metrics::RECOVERIES, &[("kind", "lost_dispatch")]) >= 5.0);
    e.stop().await;
    drop(redis);
    let _ = std::fs::remove_dir_all(dir);
}

/// A TCP proxy in front of a Redis server, moved to another at once: what a
/// failover behind one address looks like to the clients (a Sentinel-aware
/// load balancer, a DNS name, a cloud endpoint).
struct Proxy {
    url: String,
    target: std::sync::Arc<std::sync::Mutex<std::net::SocketAddr>>,
    moved: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl Proxy {
    async fn start(target: std::net::SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}/", listener.local_addr().unwrap());
        let target = std::sync::Arc::new(std::sync::Mutex::new(target));
        let moved = std::sync::Arc::new(tokio::sync::watch::channel(0u64).0);
        let (to, on_move) = (target.clone(), moved.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let addr = *to.lock().unwrap();
                let mut moved = on_move.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(addr).await else { return };
                    // A move cuts every connection: clients reconnect, to the new server.
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = moved.changed() => {}
                    }
                });
            }
        });
        Proxy { url, target, moved }
    }

    fn move_to(&self, target: std::net::SocketAddr) {
        *self.target.lock().unwrap() = target;
        self.moved.send_modify(|n| *n += 1);
    }
}

fn addr_of(redis: &LocalRedis) -> std::net::SocketAddr {
    redis.url().trim_start_matches("redis://").trim_end_matches('/').parse().unwrap()
}

/// A replica that lacked the latest writes takes over (as after a primary's
/// crash with replication behind): the dispatches it never got are found
/// by the marks the coordinator publishes with them, and the runs go on
/// within 30 s with the default settings, not after
/// `COMPOSER_LOST_DISPATCH_AGE` (10 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_behind_the_primary_loses_no_run_and_resumes_within_30_s() {
    let dir = composer_embedded::temp_dir("redis-failover").unwrap();
    let primary = LocalRedis::start(&dir.join("primary"), None).unwrap();
    let replica = LocalRedis::start(&dir.join("replica"), None).unwrap();
    let replica_conn =
        || async { redis::Client::open(replica.url()).unwrap().get_multiplexed_async_connection().await.unwrap() };
    let mut r = replica_conn().await;
    let p = addr_of(&primary);
    let _: () = redis::cmd("REPLICAOF").arg(p.ip().to_string()).arg(p.port()).query_async(&mut r).await.unwrap();
    let proxy = Proxy::start(p).await;
    let mut e = Engine::on(TestDb::create().await, proxy.url.clone(), EngineOptions::default()).await;
    assert_eq!(e.coordinator_config().lost_dispatch_age, Duration::from_secs(600), "the default");
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "failover", "nodes": [http_node("a", &http.url("/ok/failover"), 1)]})).await;
    // Some runs while the replica keeps up, so it holds streams and marks.
    for _ in 0..4 {
        let id = e.start_run("failover", json!({})).await;
        assert_eq!(e.wait_for_run(id, T).await["status"], "SUCCEEDED");
    }
    eventually(T, "the replica to catch up", || {
        let mut r = r.clone();
        let primary = primary.url();
        async move {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut r).await.unwrap();
            let mut primary_conn =
                redis::Client::open(primary).unwrap().get_multiplexed_async_connection().await.unwrap();
            let theirs: String = redis::cmd("INFO").arg("replication").query_async(&mut primary_conn).await.unwrap();
            let offset = |text: &str, field: &str| {
                text.lines().find_map(|l| l.strip_prefix(field)).map(str::trim).map(String::from)
            };
            let caught_up = info.contains("master_link_status:up")
                && offset(&info, "slave_repl_offset:") == offset(&theirs, "master_repl_offset:");
            caught_up.then_some(()).ok_or(info)
        }
    })
    .await;
    for w in std::mem::take(&mut e.workers) {
        w.stop().await;
    }
    // The replica stops following: what the primary takes from now on, it lacks.
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut r).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(e.start_run("failover", json!({})).await);
    }
    wait_for_empty_outbox(&e).await;
    // The primary dies; the replica takes over at the same address.
    drop(primary);
    proxy.move_to(addr_of(&replica));
    e.start_worker("after-failover", 4).await;
    for id in ids {
        let run = e.wait_for_run(id, T).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    // (Each wait gives a run T, 30 s: before, they waited for the
    // lost-dispatch age, 10 minutes.)
    assert_eq!(http.calls("/ok/failover"), 4 + 6, "each step ran once");
    e.stop().await;
    drop(replica);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_accepts_runs_and_dispatch_resumes_when_it_returns() {
    let dir = composer_embedded::temp_dir("redis-down").unwrap();
    let mut redis = LocalRedis::start(&dir, None).unwrap();
    // No worker yet: one waiting for work would be handed the steps in
    // their starts' commits, through no stream at all.
    let mut e = Engine::on(TestDb::create().await, redis.url(), no_workers()).await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "down", "nodes": [http_node("a", &http.url("/ok/down"), 1)]})).await;

    redis.stop();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(e.start_run("down", json!({})).await);
    }
    let pool = e.db.pool();
    eventually(T, "the publishes to go to RETRY while Redis is down", || async {
        let retrying: i64 = pool
            .get()
            .await
            .unwrap()
            .query_one("SELECT count(*) FROM outbox WHERE status = 'RETRY'", &[])
            .await
            .unwrap()
            .get(0);
        (retrying == 3).then_some(()).ok_or(format!("{retrying} of 3"))
    })
    .await;
    assert_eq!(http.calls("/ok/down"), 0);

    tokio::task::block_in_place(|| redis.restart()).unwrap();
    e.start_worker("after-outage", 2).await;
    for id in ids {
        let run = e.wait_for_run(id, Duration::from_secs(60)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    assert_eq!(http.calls("/ok/down"), 3);
    e.stop().await;
    drop(redis);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_run_and_everyone_reconnects() {
    let dir = composer_embedded::temp_dir("pg-restart").unwrap();
    let mut pg =
        LocalPostgres::start(PgOptions { data_dir: dir.join("pg"), port: None, fsync: false, max_connections: 100 })
            .unwrap();
    let db = TestDb::create_on(&pg.url("postgres")).await;
    let e = Engine::on(db, services().redis_url.clone(), EngineOptions::default()).await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "pg", "nodes": [
        http_node("a", &http.url("/slow/300/a"), 3), http_node("b", &http.url("/slow/300/b"), 3), http_node("c", &http.url("/ok/c"), 3)],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]}))
        .await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(e.start_run("pg", json!({})).await);
    }
    // Restarted mid-run: once a first run is past its first step.
    eventually(T, "a first run to reach its second step", || async { (http.calls("/slow/300/b") > 0).then_some(()) })
        .await;
    tokio::task::block_in_place(|| pg.restart()).unwrap();

    for id in ids {
        let run = e.wait_for_run(id, Duration::from_secs(90)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    assert!(http.calls("/ok/c") >= 5);
    e.stop().await;
    drop(pg);
    let _ = std::fs::remove_dir_all(dir);
}

/// A task that kills every worker it runs on: each takeover of its expired
/// lease counts as a recovery of the attempt, and after
/// `COMPOSER_MAX_DISPATCHES` of them the sweep fails the attempt, so the
/// node's retry policy decides instead of the task going round for ever.
#[tokio::test]
async fn a_task_that_keeps_killing_its_workers_fails_after_max_dispatches_and_is_retried() {
    let mut e = Engine::with(EngineOptions {
        workers: 0,
        lease_ttl: Duration::from_secs(1),
        coordinator: |c| {
            c.max_dispatches = 2;
            c.recovery_interval = Duration::from_millis(200);
        },
        ..Default::default()
    })
    .await;
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "poison", "nodes": [http_node("p", &http.url("/ok/p"), 2)]})).await;

    // Workers that lease the attempt and die: the first from the stream, the
    // second by taking over its expired lease (one recovery), the third
    // likewise (two): no poll takes it over again, the sweep fails it.
    let poll = |worker: &str| json!({"worker_id": worker, "queues": ["http"], "max": 1, "wait": "5s"});
    for crasher in ["crasher1", "crasher2", "crasher3"] {
        let (status, body) = e.post("/v1/tasks/poll", &poll(crasher)).await;
        assert_eq!(status, 200, "{body}");
        let tasks = body["tasks"].as_array().unwrap();
        assert_eq!((tasks.len(), &tasks[0]["attempt"]), (1, &json!(1)), "{body}");
        e.wait_for_lease_expiry(tasks[0]["id"].as_str().unwrap().parse().unwrap(), T).await;
    }

    e.start_worker("careful", 2).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["tasks"][0]["attempt"], 2, "the poisoned attempt failed, the retry policy ran attempt 2");
    let retries = e.history(id, "TaskRetryScheduled").await;
    assert_eq!(retries.len(), 1);
    assert!(retries[0]["payload"]["error"].as_str().unwrap().contains("COMPOSER_MAX_DISPATCHES"), "{retries:?}");
    assert_eq!(http.calls("/ok/p"), 1, "the poisoned attempt never ran on a real worker");
    e.stop().await;
}

#[tokio::test]
async fn two_coordinators_running_recovery_at_once_claim_disjoint_tasks() {
    let e = Engine::with(EngineOptions {
        workers: 0,
        coordinator: |c| {
            c.run_outbox = false;
            c.recovery_interval = Duration::from_secs(3600);
        },
        ..Default::default()
    })
    .await;
    e.register(&json!({"name": "many", "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]})).await;
    for _ in 0..40 {
        e.start_run("many", json!({})).await;
    }
    let pool_a = e.db.pool();
    let pool_b = e.db.pool();
    {
        let c = pool_a.get().await.unwrap();
        c.batch_execute(
            "DELETE FROM outbox;
             UPDATE task_instances SET state = 'RUNNING', lease_owner = 'dead', lease_expires_at = now() - interval '1 second'",
        )
        .await
        .unwrap();
    }
    let shards = e.coordinators[0].shared.engine.shards();
    let (ca, cb) = (pool_a.get().await.unwrap(), pool_b.get().await.unwrap());
    let (a, b) = tokio::join!(
        composer_store::recovery::requeue_expired_leases(&ca, shards, 5),
        composer_store::recovery::requeue_expired_leases(&cb, shards, 5)
    );
    assert_eq!(a.unwrap() + b.unwrap(), 40, "every expired task is claimed exactly once");
    let row = ca.query_one("SELECT count(*), count(DISTINCT task_id) FROM outbox", &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (40, 40), "nothing is dispatched twice by the sweep");
    e.stop().await;
}

#[tokio::test]
async fn a_wait_node_fires_on_time_and_a_duplicate_firing_is_ignored() {
    let e = Engine::with(no_workers()).await;
    let id = e
        .run(&json!({"name": "timer", "nodes": [
            {"id": "w", "type": "WAIT", "config": {"duration": "1s"}},
            {"id": "hold", "type": "WAIT", "config": {"duration": "1h"}}],
            "edges": [{"from": "w", "to": "hold"}]}))
        .await;
    let waiting = e.task(id, "w").await;
    assert_eq!(waiting["state"], "WAITING");
    let run = e.wait_until(id, T, |r| r["tasks"][0]["state"] == "COMPLETED").await;
    let t = &run["tasks"][0];
    let wake: chrono::DateTime<chrono::Utc> = waiting["wake_at"].as_str().unwrap().parse().unwrap();
    let done: chrono::DateTime<chrono::Utc> = t["finished_at"].as_str().unwrap().parse().unwrap();
    assert!(done >= wake, "a timer never fires early");

    let task = task_id(&run, "w");
    let again = e.coordinators[0]
        .shared
        .engine
        .handle(EventRequest::new(id, Event::TimerFired { task_id: task }))
        .await
        .unwrap();
    assert!(again.ignored.unwrap().contains("not WAITING"));
    assert_eq!(e.history(id, "TaskCompleted").await.len(), 1);
    e.stop().await;
}

#[tokio::test]
async fn partitions_exist_ahead_and_retention_drops_whole_old_months() {
    let e = Engine::with(no_workers()).await;
    let pool = e.db.pool();
    let c = pool.get().await.unwrap();
    let ahead: Vec<String> = c
        .query(
            "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i), 'YYYY_MM')
               FROM generate_series(0, 3) i",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for month in &ahead {
        for table in ["workflow_runs", "task_instances", "run_events"] {
            let name = format!("{table}_p{month}");
            let exists: bool = c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.unwrap().get(0);
            assert!(exists, "{name} should exist");
        }
    }

    // A month four months back, with a run, its task and its history.
    let old_month: String = c
        .query_one(
            "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') - interval '4 months', 'YYYY_MM')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    c.batch_execute(&format!(
        "DO $$ DECLARE m timestamp := date_trunc('month', now() AT TIME ZONE 'UTC') - interval '4 months'; t text;
         BEGIN FOREACH t IN ARRAY ARRAY['workflow_runs','task_instances','run_events'] LOOP
           EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', t || '_p{old_month}', t,
             composer_month_uuid(m AT TIME ZONE 'UTC'), composer_month_uuid((m + interval '1 month') AT TIME ZONE 'UTC'));
         END LOOP; END $$"
    ))
    .await
    .unwrap();
    let then: f64 = c
        .query_one(
            "SELECT extract(epoch FROM (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '4 months' + interval '1 day') AT TIME ZONE 'UTC')::float8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let old_run = Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, then as u64, 0));
    let (_, def) =
        e.post("/v1/workflows", &json!({"name": "old", "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]})).await;
    let def_id: Uuid = def["id"].as_str().unwrap().parse().unwrap();
    c.execute(
        "INSERT INTO workflow_runs (id, workflow_definition_id, workflow_name, workflow_version, status, input, created_at)
         VALUES ($1, $2, 'old', 1, 'RUNNING', '{}', now() - interval '120 days')",
        &[&old_run, &def_id],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO task_instances (run_id, id, node_id, node_type, queue, state, attempt, input_json)
         VALUES ($1, $1, 'a', 'HTTP', 'http', 'COMPLETED', 1, '{}')",
        &[&old_run],
    )
    .await
    .unwrap();
    c.execute("INSERT INTO run_events (run_id, type, payload) VALUES ($1, 'RunStarted', '{}')", &[&old_run])
        .await
        .unwrap();
    let new_run = e.start_run("old", json!({})).await;
    // A step's log line each: the old run's goes with its month.
    for (run, age) in [(old_run, "120 days"), (new_run, "0 days")] {
        c.execute(
            "INSERT INTO task_logs (task_id, attempt, seq, run_id, worker_id, at, line)
             VALUES ($1, 1, 1, $1, 'w', now() - $2::text::interval, 'a line')",
            &[&run, &age],
        )
        .await
        .unwrap();
        c.execute("INSERT INTO task_log_usage (task_id, attempt, run_id, lines) VALUES ($1, 1, $1, 1)", &[&run])
            .await
            .unwrap();
        c.execute("INSERT INTO run_log_usage (run_id, bytes) VALUES ($1, 70)", &[&run]).await.unwrap();
    }

    // The old run is still open (waiting on an event, say): its month stays.
    let cutoff = chrono::Utc::now() - chrono::Duration::days(30);
    let expired = composer_store::partitions::drop_before(&c, cutoff).await.unwrap();
    assert_eq!(expired.kept_open, vec![old_month.clone()], "a month with an open run is kept (and reported)");
    assert_eq!(e.get(&format!("/v1/runs/{old_run}")).await.0, 200, "its open run is still there");

    c.execute("UPDATE workflow_runs SET status = 'SUCCEEDED' WHERE id = $1", &[&old_run]).await.unwrap();
    let none = composer_coord::archive::Archive::default();
    composer_coord::loops::maintain_partitions(&pool, 3, 30, &none, &Default::default()).await.unwrap();
    assert_eq!(e.get(&format!("/v1/runs/{old_run}")).await.0, 404, "once it ends, the old month goes");
    for table in ["workflow_runs", "task_instances", "run_events"] {
        let name = format!("{table}_p{old_month}");
        let exists: bool = c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.unwrap().get(0);
        assert!(!exists, "{name} should be dropped");
    }
    let (status, run) = e.get(&format!("/v1/runs/{new_run}")).await;
    assert_eq!(status, 200);
    assert_eq!(run["tasks"].as_array().unwrap().len(), 1, "newer runs keep their tasks");
    assert!(!e.history(new_run, "RunStarted").await.is_empty(), "and their history");
    let logs: Vec<Uuid> =
        c.query("SELECT run_id FROM task_logs", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(logs, vec![new_run], "the old run's log lines went with it, the new run's stay");
    for table in ["task_log_usage", "run_log_usage"] {
        let runs: Vec<Uuid> =
            c.query(&format!("SELECT run_id FROM {table}"), &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(runs, vec![new_run], "{table}: the old run's counts went too");
    }
    e.stop().await;
}

/// Autovacuum analyzes partitions but never a partitioned table, whose
/// statistics our generic plans are made with: a coordinator analyzes one
/// that doubled since it was last analyzed, once past
/// COMPOSER_ANALYZE_MIN_ROWS, and never with 0.
#[tokio::test]
async fn tables_that_doubled_since_their_last_analyze_are_analyzed() {
    let opts = EngineOptions { workers: 0, coordinator: |c| c.analyze_min_rows = 0, ..Default::default() };
    let mut e = Engine::with(opts).await;
    let pool = e.db.pool();
    let c = pool.get().await.unwrap();
    // n tasks of one run of this month, as a MAP's items; the statistics
    // flushed when the session goes idle after the statement.
    let insert = |n: i64| {
        let c = &c;
        async move {
            c.execute(
                "INSERT INTO task_instances (run_id, id, node_id, node_type, state, attempt, input_json)
                 SELECT composer_month_uuid(now()), gen_random_uuid(), 'each', 'HTTP', 'PENDING', 1, '{}'
                   FROM generate_series(1, $1::int8)",
                &[&n],
            )
            .await
            .unwrap();
            c.query("SELECT pg_stat_force_next_flush()", &[]).await.unwrap();
        }
    };
    let reltuples = || async {
        c.query_one("SELECT reltuples FROM pg_class WHERE relname = 'task_instances'", &[])
            .await
            .unwrap()
            .get::<_, f32>(0)
    };
    let analyze = |min: i64| {
        let c = &c;
        async move { composer_store::partitions::analyze_grown(c, min).await.unwrap() }
    };

    insert(150).await;
    assert!(analyze(1000).await.is_empty(), "below the minimum");
    assert!(analyze(0).await.is_empty(), "0 analyzes nothing");
    assert_eq!(reltuples().await, -1.0, "never analyzed");
    assert_eq!(analyze(100).await, ["task_instances"], "past the minimum, never analyzed");
    assert_eq!(reltuples().await, 150.0);
    assert!(analyze(100).await.is_empty(), "not grown since");
    insert(100).await;
    assert!(analyze(100).await.is_empty(), "250 rows is not twice 150");
    insert(50).await;
    assert_eq!(analyze(100).await, ["task_instances"], "300 rows is");
    assert_eq!(reltuples().await, 300.0);

    // A role that may not analyze the table (PostgreSQL would skip it with
    // a warning) is not asked to, pass after pass.
    insert(300).await;
    let role = format!("composer_it_{}", Uuid::now_v7().simple());
    c.batch_execute(&format!("CREATE ROLE {role} NOLOGIN; SET ROLE {role}")).await.unwrap();
    let as_other_role = composer_store::partitions::analyze_grown(&c, 100).await;
    c.batch_execute(&format!("RESET ROLE; DROP ROLE {role}")).await.unwrap();
    assert!(as_other_role.unwrap().is_empty(), "a role that may not analyze it does not try");
    assert_eq!(reltuples().await, 300.0);
    assert_eq!(analyze(100).await, ["task_instances"], "its owner does");
    assert_eq!(reltuples().await, 600.0);

    // A coordinator's loop does the same.
    let mut config = e.coordinator_config();
    config.analyze_min_rows = 100;
    config.analyze_interval = Duration::from_millis(100);
    e.start_coordinator_with(config).await;
    insert(600).await;
    eventually(Duration::from_secs(30), "the coordinator to analyze the doubled table", || async {
        let rows = reltuples().await;
        (rows >= 1200.0).then_some(()).ok_or(rows)
    })
    .await;
    e.stop().await;
}

#[tokio::test]
async fn metrics_are_exported_in_prometheus_text() {
    let e = Engine::start().await;
    let http = FakeHttp::start().await;
    let id = e.run(&json!({"name": "metered", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;
    e.wait_for_run(id, T).await;
    composer_coord::loops::sample_metrics(&e.coordinators[0].shared).await.unwrap();
    let text = reqwest::get(format!("{}/metrics", e.url())).await.unwrap().text().await.unwrap();
    for name in [
        "composer_events_total{event=\"TaskCompleted\",result=\"applied\"}",
        "composer_event_duration_seconds_bucket",
        "composer_report_duration_seconds_count",
        "composer_dispatches_total",
        "composer_outbox_backlog",
        "composer_open_tasks{state=\"PENDING\"}",
        "composer_running_runs",
        "composer_due_timers",
        "composer_runs_finished_total{status=\"SUCCEEDED\"}",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    // Counters are exported from zero: these must have counted this run.
    let count = |counted: &str| {
        let line = text.lines().find(|l| l.starts_with(counted)).unwrap_or_else(|| panic!("{counted}: {text}"));
        line[counted.len()..].parse::<f64>().unwrap()
    };
    for counted in [
        "composer_events_total{event=\"TaskCompleted\",result=\"applied\"} ",
        "composer_runs_finished_total{status=\"SUCCEEDED\"} ",
    ] {
        assert!(count(counted) >= 1.0, "{counted}");
    }
    // Its one step went through a stream, or to the worker's waiting poll.
    let dispatched = count("composer_dispatches_total ") + count("composer_idle_poll_dispatches_total ");
    assert!(dispatched >= 1.0, "{text}");
    e.stop().await;
}

/// A handler that panics is a crash of the execution, not of the worker: it
/// must not take the worker down, and the lease expiry brings the task back.
#[tokio::test]
async fn a_panicking_handler_does_not_stop_the_worker() {
    let mut e =
        Engine::with(EngineOptions { workers: 0, lease_ttl: Duration::from_secs(1), ..Default::default() }).await;
    let mut worker = Worker::new(e.worker_config("w", 2));
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    worker.handle("fragile", move |_ctx, _input| {
        let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            if n == 0 {
                panic!("handler bug");
            }
            Ok::<_, TaskError>(json!({"survived": true}))
        }
    });
    e.spawn_worker(worker);
    let id = e.run(&json!({"name": "fragile", "nodes": [{"id": "f", "type": "fragile"}]})).await;
    let run = e.wait_for_run(id, T).await;
    assert_eq!(run["status"], "SUCCEEDED", "{run}");
    assert_eq!(run["output"]["f"]["survived"], true);
    e.stop().await;
}

/// The coordinator that committed a dispatch died before it published it:
/// the outbox row, due only after the publish grace, goes out through
/// another coordinator's enqueuer, once.
#[tokio::test]
async fn coordinator_dies_between_commit_and_publish_and_the_row_goes_out_after_the_grace() {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut other = e.coordinator_config();
    other.outbox_claim_timeout = Duration::from_secs(1);
    let shards = other.stream_shards;
    e.start_coordinator_with(other).await;
    let http = FakeHttp::start().await;
    e.register(&json!({"name": "unpublished", "nodes": [http_node("a", &http.url("/ok/a"), 1)]})).await;

    // The dying coordinator's engine: it commits, and its publisher is gone.
    let grace = Duration::from_secs(2);
    let (publisher, inbox) = composer_coord::engine::publisher::Publisher::new();
    drop(inbox);
    let notify = std::sync::Arc::new(tokio::sync::Notify::new());
    let pool = e.db.pool();
    let engine = std::sync::Arc::new(composer_coord::engine::Engine::new(
        pool.clone(),
        shards,
        notify,
        Some((std::sync::Arc::new(publisher), grace)),
        composer_coord::engine::Bounds::DEFAULT,
        16,
    ));
    let stop_engine = tokio_util::sync::CancellationToken::new();
    tokio::spawn(engine.clone().run_batches(composer_coord::engine::Lane::All, stop_engine.clone()));
    let client = pool.get().await.unwrap();
    let def = composer_store::definitions::by_name(&client, "unpublished", None).await.unwrap().unwrap();
    let committed = Instant::now();
    let (run, _) = engine.start_run(&def, &json!({}), Default::default()).await.unwrap();
    let due: bool = client
        .query_one("SELECT bool_and(next_attempt_at > now()) FROM outbox WHERE run_id = $1", &[&run.id])
        .await
        .unwrap()
        .get(0);
    assert!(due, "the committing coordinator's row waits for it first");

    e.start_worker("w", 4).await;
    let done = e.wait_for_run(run.id, T).await;
    assert_eq!(done["status"], "SUCCEEDED", "{done}");
    assert!(committed.elapsed() >= grace, "published before the grace: {:?}", committed.elapsed());
    wait_for_empty_outbox(&e).await;
    assert_eq!(http.calls("/ok/a"), 1);
    assert_eq!(leases_denied(&e), 0, "one message");
    stop_engine.cancel();
    e.stop().await;
}

/// The usual way: the committing coordinator publishes at once and deletes
/// the rows afterwards, in a later write or on its own when idle, before
/// the grace: no message goes out twice.
#[tokio::test]
async fn a_committing_coordinator_publishes_its_dispatches_and_deletes_their_rows_before_the_grace() {
    let mut e = Engine::with(EngineOptions { coordinators: 0, workers: 0, ..Default::default() }).await;
    let mut c = e.coordinator_config();
    // A long poll interval: the enqueuer would not publish these in time.
    c.outbox_poll_interval = Duration::from_secs(60);
    e.start_coordinator_with(c).await;
    e.start_worker("w", 8).await;
    let http = FakeHttp::start().await;
    let nodes = json!([http_node("a", &http.url("/ok/a"), 1), http_node("b", &http.url("/ok/b"), 1)]);
    e.register(&json!({"name": "direct", "nodes": nodes, "edges": [{"from": "a", "to": "b"}]})).await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(e.start_run("direct", json!({})).await);
    }
    for id in ids {
        let run = e.wait_for_run(id, Duration::from_secs(4)).await;
        assert_eq!(run["status"], "SUCCEEDED", "{run}");
    }
    wait_for_empty_outbox(&e).await;
    assert_eq!((http.calls("/ok/a"), http.calls("/ok/b")), (20, 20));
    assert_eq!(leases_denied(&e), 0, "a row was published twice");
    e.stop().await;
}
