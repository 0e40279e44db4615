//! The lease on a task, against real PostgreSQL (docs/architecture.md, "Leases").

use std::time::Duration;

use composer_store::leases::{Acquired, LeaseManager};
use composer_testkit::{http_node, Engine, EngineOptions};
use serde_json::json;
use uuid::Uuid;

async fn one_pending_task(e: &Engine) -> (Uuid, Uuid) {
    let id = e.run(&json!({"name": "leased", "nodes": [http_node("a", "http://127.0.0.1:9/a", 1)]})).await;
    let (_, run) = e.get(&format!("/v1/runs/{id}")).await;
    let task: Uuid = run["tasks"][0]["id"].as_str().unwrap().parse().unwrap();
    (id, task)
}

#[tokio::test]
async fn an_owner_cannot_reacquire_a_lease_it_still_holds() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let (run, task) = one_pending_task(&e).await;
    let leases = LeaseManager::new(e.db.pool());
    let ttl = Duration::from_secs(1);

    assert!(!leases.acquire(run, task, "w1", ttl, 2).await.unwrap().is_granted(), "wrong attempt");
    assert_eq!(leases.acquire(run, task, "w1", ttl, 1).await.unwrap(), Acquired::Granted);
    assert!(
        !leases.acquire(run, task, "w1", ttl, 1).await.unwrap().is_granted(),
        "the owner cannot re-acquire a held lease"
    );
    assert!(!leases.acquire(run, task, "w2", ttl, 1).await.unwrap().is_granted(), "nobody else can take a held lease");
    assert!(leases.renew(run, task, "w1", ttl, 1).await.unwrap());
    assert!(!leases.renew(run, task, "w2", ttl, 1).await.unwrap(), "only the owner renews");

    e.wait_for_lease_expiry(task, Duration::from_secs(30)).await;
    assert_eq!(
        leases.acquire(run, task, "w2", ttl, 1).await.unwrap(),
        Acquired::TakenOver,
        "an expired lease can be taken over"
    );
    assert!(!leases.renew(run, task, "w1", ttl, 1).await.unwrap(), "the old owner's renewal fails");
    e.stop().await;
}

#[tokio::test]
async fn a_cancelled_task_cannot_be_leased_or_renewed() {
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let (run, task) = one_pending_task(&e).await;
    let leases = LeaseManager::new(e.db.pool());
    assert!(leases.acquire(run, task, "w1", Duration::from_secs(30), 1).await.unwrap().is_granted());
    let (status, _) = e.post(&format!("/v1/runs/{run}/cancel"), &json!({})).await;
    assert_eq!(status, 200);
    assert!(!leases.renew(run, task, "w1", Duration::from_secs(30), 1).await.unwrap(), "the holder learns at renewal");
    assert!(!leases.acquire(run, task, "w2", Duration::from_secs(30), 1).await.unwrap().is_granted());
    e.stop().await;
}

/// A poll leases a PENDING task without the run's lock. When it does so
/// after the engine read the task PENDING and before the engine's write,
/// the write must not overwrite the lease with what it decided from the
/// PENDING it read: here, recovery giving up on an at-most-once attempt
/// (`max_dispatches`) would retry it while the lease holder sends it.
#[tokio::test]
async fn a_lease_taken_while_the_engine_applies_an_event_is_not_overwritten() {
    use composer_core::machine::{codes, Event};
    let e = Engine::with(EngineOptions { workers: 0, ..Default::default() }).await;
    let mut node = http_node("a", "http://127.0.0.1:9/a", 3);
    node["delivery"] = json!("at_most_once");
    let run = e.run(&json!({"name": "pay_once", "nodes": [node]})).await;
    let (_, view) = e.get(&format!("/v1/runs/{run}")).await;
    let task: Uuid = view["tasks"][0]["id"].as_str().unwrap().parse().unwrap();
    let give_up = move || Event::TaskFailed {
        task_id: task,
        attempt: 1,
        error: "dispatched too often".into(),
        retryable: true,
        code: Some(codes::MAX_DISPATCHES.into()),
        status: None,
        retry_after: None,
    };

    // The lease, as a poll takes it, not yet committed: the engine reads
    // the task PENDING and its write waits for the row.
    let (mut db, conn) = tokio_postgres::connect(&e.db.url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let lease = db.transaction().await.unwrap();
    let leased = lease
        .execute(
            "UPDATE task_instances SET state = 'RUNNING', lease_owner = 'w1',
                    lease_expires_at = now() + interval '30 seconds'
              WHERE id = $1 AND state = 'PENDING'",
            &[&task],
        )
        .await
        .unwrap();
    assert_eq!(leased, 1);
    let engine = e.coordinators[0].shared.engine.clone();
    let request = composer_coord::engine::EventRequest::new(run, give_up());
    let applying = tokio::spawn(async move { engine.handle(request).await });
    // A window for the engine to read the task and block on its row: the
    // lease must commit between the engine's read and its write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    lease.commit().await.unwrap();
    let applied = applying.await.unwrap();
    assert!(applied.is_err(), "the write went ahead over the lease: {applied:?}");

    let task_view = e.task(run, "a").await;
    assert_eq!(task_view["state"], "RUNNING", "{task_view}");
    assert_eq!(task_view["attempt"], 1, "{task_view}");
    // Applied again, the event sees the lease: the attempt may have been
    // sent, so it waits IN_DOUBT instead of being sent again.
    let engine = e.coordinators[0].shared.engine.clone();
    engine.handle(composer_coord::engine::EventRequest::new(run, give_up())).await.unwrap();
    assert_eq!(e.task(run, "a").await["state"], "IN_DOUBT");
    e.stop().await;
}
