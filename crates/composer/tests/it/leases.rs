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
