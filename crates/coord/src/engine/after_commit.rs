//! What a commit owes other runs, run after it ([`Engine::follow_up`]):
//! children to start, a finished child's result for its parent, a MAP to
//! carry on, children a parent no longer waits for, queued runs a freed
//! slot lets start. Each in a transaction of its own; a crash before it is
//! covered by the recovery sweep, which finds the same work in storage.

use std::sync::Arc;

use composer_core::machine::{AfterCommit, Event};
use composer_store::runs;
use futures_util::StreamExt;
use uuid::Uuid;

use super::request::EventRequest;
use super::Engine;

/// Children started at once after a commit (each in its own transaction).
const CHILD_STARTS_AT_ONCE: usize = 8;

/// What a commit owes that is done in bulk: children to start, and the
/// children to cancel of steps and MAPs that no longer wait for them.
#[derive(Default)]
struct Owed {
    children: Vec<(Uuid, Uuid, i32, u32)>,
    holders: Vec<runs::ChildHolder>,
    maps: Vec<Uuid>,
}

impl Engine {
    /// Runs what committed transitions owe other runs, in a task of its own
    /// (the caller answers its own requests meanwhile).
    pub(super) fn follow_up(self: &Arc<Self>, owed: Vec<(Uuid, AfterCommit)>) {
        if owed.is_empty() {
            return;
        }
        let engine = self.clone();
        crate::metrics::spawn(async move {
            let mut bulk = Owed::default();
            for (run_id, effect) in owed {
                engine.owe(run_id, effect, &mut bulk).await;
            }
            engine.start_children(bulk.children).await;
            if !bulk.holders.is_empty() || !bulk.maps.is_empty() {
                engine.cancel_stale_children(&bulk.holders, &bulk.maps).await;
            }
        });
    }

    /// Does what one effect owes now, or adds it to what is done in bulk.
    async fn owe(self: &Arc<Self>, run_id: Uuid, effect: AfterCommit, bulk: &mut Owed) {
        match effect {
            AfterCommit::FreeSlot { workflow, key } => Box::pin(self.promote_freed(workflow, key)).await,
            AfterCommit::NotifyParent { parent_run, event } => {
                if let Err(e) = self.handle(EventRequest::new(parent_run, event)).await {
                    tracing::warn!(%run_id, error = %e, "reporting a child run to its parent failed; recovery will");
                }
            }
            AfterCommit::ContinueMap { task_id } => {
                if let Err(e) = self.handle(EventRequest::new(run_id, Event::ItemsLoaded { task_id })).await {
                    tracing::warn!(%run_id, %task_id, error = %e, "carrying a MAP on failed; recovery will");
                }
            }
            AfterCommit::StartChild { task_id, attempt, iteration } => {
                bulk.children.push((run_id, task_id, attempt, iteration))
            }
            AfterCommit::CancelChildren { task_id, attempt, iteration, current } => {
                let iteration = i32::try_from(iteration).unwrap_or(i32::MAX);
                bulk.holders.push(runs::ChildHolder { task_id, attempt, iteration, current })
            }
            AfterCommit::CancelItemChildren { map_task_id } => bulk.maps.push(map_task_id),
        }
    }

    /// Starts children, a few at once.
    async fn start_children(self: &Arc<Self>, children: Vec<(Uuid, Uuid, i32, u32)>) {
        futures_util::stream::iter(children)
            .for_each_concurrent(CHILD_STARTS_AT_ONCE, |(run_id, task_id, attempt, iteration)| {
                let engine = self.clone();
                async move {
                    if let Err(e) = Box::pin(engine.start_child(run_id, task_id, attempt, iteration)).await {
                        tracing::warn!(%run_id, %task_id, error = %e, "starting a child run failed; recovery will");
                    }
                }
            })
            .await;
    }

    /// Cancels the open children of steps no longer waiting for them, and of
    /// the items of MAPs that ended.
    async fn cancel_stale_children(self: &Arc<Self>, holders: &[runs::ChildHolder], maps: &[Uuid]) {
        let stale = async {
            let client = composer_store::client(&self.pool).await?;
            let mut stale = runs::stale_children(&client, holders).await?;
            stale.extend(runs::stale_item_children(&client, maps).await?);
            Ok::<_, composer_store::Error>(stale)
        };
        match stale.await {
            Ok(children) => {
                for child in children {
                    if let Err(e) = self.handle(EventRequest::new(child, Event::CancelRun)).await {
                        tracing::warn!(%child, error = %e, "cancelling a child run failed; recovery will");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "finding child runs to cancel failed; recovery will"),
        }
    }
}
