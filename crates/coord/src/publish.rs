//! Publishing after commit: the coordinator whose transaction dispatched a
//! task puts its message on the stream itself, right after the commit,
//! instead of waking the outbox enqueuer to claim the row in a second
//! transaction first. One commit and one round trip fewer on every step's
//! way to its next task.
//!
//! The outbox row is still written in the dispatching transaction, due only
//! after `COMPOSER_OUTBOX_PUBLISH_GRACE`: it is the safety net. Once the
//! message is on its stream the row's id goes on a list that the engine's
//! next transaction deletes (or this loop, when the engine is idle). So:
//! - a coordinator that dies between commit and publish leaves a row that
//!   falls due after the grace and goes out through any enqueuer;
//! - one that dies after publishing and before the delete leaves a row that
//!   goes out again after the grace: a second message for an attempt whose
//!   lease admits one execution, as after an enqueuer's crash between XADD
//!   and DELETE;
//! - a publish Redis refuses puts the rows into the enqueuer's retry
//!   backoff at once.
//!
//! No dispatch is lost (the row outlives every failure until its message is
//! on a stream) and none runs twice (the lease), the outbox's own argument.

use std::sync::Arc;
use std::time::Duration;

use composer_store::outbox;
use tokio_util::sync::CancellationToken;

use crate::engine::publisher::{Committed, Inbox, Publisher};
use crate::shared::Shared;

/// How often rows published while the engine wrote nothing are deleted here.
const IDLE_DELETE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest wait between publish retries of one row while Redis is down (the
/// enqueuer's, which takes the rows over).
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(30);

/// Publishes what the engine committed until `shutdown`, then what is left.
pub async fn run(shared: Arc<Shared>, publisher: Arc<Publisher>, mut inbox: Inbox, shutdown: CancellationToken) {
    let mut idle = tokio::time::interval(IDLE_DELETE_INTERVAL);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            next = inbox.0.recv() => match next {
                Some(first) => {
                    let mut batch = vec![first];
                    while let Ok(more) = inbox.0.try_recv() {
                        batch.push(more);
                    }
                    publish(&shared, &publisher, batch).await;
                }
                None => break,
            },
            _ = idle.tick() => delete_published(&shared, &publisher).await,
        }
    }
    let mut rest = Vec::new();
    while let Ok(more) = inbox.0.try_recv() {
        rest.push(more);
    }
    if !rest.is_empty() {
        publish(&shared, &publisher, rest).await;
    }
    delete_published(&shared, &publisher).await;
}

/// One pipeline for every message of the batch.
async fn publish(shared: &Shared, publisher: &Publisher, batch: Vec<Committed>) {
    let keys = shared.streams.keys();
    let mut messages = Vec::new();
    let mut ids = Vec::new();
    for row in batch.iter().flat_map(|c| &c.rows) {
        let mut dispatch = row.dispatch.clone();
        dispatch.published_at_us = Some(composer_api::wire::now_us());
        match serde_json::to_string(&dispatch) {
            Ok(payload) => {
                messages.push((keys.stream(&row.queue, row.priority, row.shard as u32), payload));
                ids.push(row.id);
            }
            // Not reachable for JSON values; the enqueuer tries again after the grace.
            Err(e) => tracing::error!(task_id = %row.dispatch.task_id, error = %e, "cannot serialize a dispatch"),
        }
    }
    let pipeline: Vec<(&str, &str)> = messages.iter().map(|(s, p)| (s.as_str(), p.as_str())).collect();
    match shared.streams.publish(&pipeline).await {
        Ok(()) => {
            for c in &batch {
                let took = c.at.elapsed();
                for _ in &c.rows {
                    crate::metrics::observe(composer_metrics::STEP_STAGE, &[("stage", "commit_to_publish")], took);
                }
            }
            crate::metrics::inc(composer_metrics::DISPATCHES, &[], pipeline.len() as u64);
            shared.wakes.published.notify_waiters();
            publisher.give_back(ids);
        }
        Err(e) => {
            crate::metrics::inc(composer_metrics::OUTBOX_PUBLISH_FAILURES, &[], 1);
            tracing::warn!(error = %e, rows = ids.len(), "publishing after commit failed; the outbox retries");
            let retried = match composer_store::client(&shared.pool).await {
                Ok(client) => outbox::retry_later(&client, &ids, MAX_RETRY_BACKOFF).await.map(|_| ()),
                Err(e) => Err(e),
            };
            match retried {
                Ok(()) => shared.wakes.outbox.notify_one(),
                Err(e) => tracing::warn!(error = %e, "cannot reschedule the rows; they fall due after the grace"),
            }
        }
    }
}

/// Deletes published rows no engine transaction took.
async fn delete_published(shared: &Shared, publisher: &Publisher) {
    let ids = publisher.take_published();
    if ids.is_empty() {
        return;
    }
    let deleted = match composer_store::client(&shared.pool).await {
        Ok(client) => outbox::delete(&client, &ids).await,
        Err(e) => Err(e),
    };
    if let Err(e) = deleted {
        tracing::warn!(error = %e, "cannot delete published outbox rows; retrying");
        publisher.give_back(ids);
    }
}
