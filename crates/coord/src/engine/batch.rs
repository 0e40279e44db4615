//! The engine's queue: work waits here for a batch loop, which takes
//! whatever is queued (up to a batch) into one transaction.

use std::sync::atomic::{AtomicUsize, Ordering};

use composer_core::machine::Event;
use composer_store::definitions::DefinitionRow;
use composer_store::runs::RunRow;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::error::{EngineError, Result};

/// Most events and starts one transaction applies.
pub const MAX_BATCH: usize = 128;

/// The result of handling one event.
#[derive(Debug, Clone)]
pub struct Handled {
    pub status: composer_core::machine::RunStatus,
    /// Why the event changed nothing (duplicate, late, stale …).
    pub ignored: Option<String>,
    /// Tasks leased with the answer to the worker whose report this was
    /// (see [`By::Worker`]).
    pub next: Vec<composer_store::transitions::Given>,
}

impl Handled {
    pub fn new(status: composer_core::machine::RunStatus, ignored: Option<String>) -> Handled {
        Handled { status, ignored, next: Vec::new() }
    }
}

/// An event to apply to a run, and who sent it.
#[derive(Debug, Clone)]
pub struct Applying {
    pub run_id: Uuid,
    pub event: Event,
    pub by: By,
    /// What the event tells its task's span (only while traces are on).
    pub told: Option<crate::trace::Told>,
}

/// Who sent an event, and what that asks of the batch.
#[derive(Debug, Clone, Default)]
pub enum By {
    /// The engine itself: a timer, a child's end, recovery.
    #[default]
    Engine,
    /// A worker's report, which must hold the task's lease at the event's
    /// attempt (checked in the batch's transaction), with what it offers to
    /// run next: tasks the event makes ready, of the offer's queues, are
    /// leased to it in the same commit (eager dispatch).
    Worker(String, Option<composer_api::wire::EagerOffer>),
    /// An operator's control action: its history records who and why.
    Operator(Control),
    /// One run of a bulk job: applied at most once per (job, run), marked
    /// in the batch's transaction.
    Bulk(Control, Uuid),
}

/// Who took a control action, and why, as its history records them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The name of the token that asked (`COMPOSER_API_TOKEN_NAME`).
    pub actor: String,
    pub reason: Option<String>,
}

/// Work waiting for a batch: an event for a run, or a new run to start.
pub enum Pending {
    Event {
        applying: Applying,
        reply: oneshot::Sender<Result<Handled>>,
    },
    /// A run without an idempotency key or a concurrency limit (whose
    /// locks could make two batches wait for each other).
    Start {
        def: DefinitionRow,
        input: Value,
        tags: Option<serde_json::Map<String, Value>>,
        traceparent: Option<String>,
        priority: Option<u8>,
        reply: oneshot::Sender<Result<RunRow>>,
    },
}

impl Pending {
    /// Answers that the engine is stopping.
    pub fn refuse(self) {
        match self {
            Pending::Event { reply, .. } => {
                let _ = reply.send(Err(EngineError::Stopped));
            }
            Pending::Start { reply, .. } => {
                let _ = reply.send(Err(EngineError::Stopped));
            }
        }
    }
}

/// Takes what is queued after `first`, up to a batch.
pub fn fill(first: Pending, inbox: &mut mpsc::Receiver<Pending>) -> Vec<Pending> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match inbox.try_recv() {
            Ok(p) => batch.push(p),
            Err(_) => break,
        }
    }
    batch
}

/// Refuses new work and answers what is queued, so no request waits forever
/// while the server drains.
pub fn drain(inbox: &mut mpsc::Receiver<Pending>) {
    inbox.close();
    while let Ok(p) = inbox.try_recv() {
        p.refuse();
    }
}

/// Counts a batch loop as live while it runs, however it ends.
pub struct LiveLoop<'a>(&'a AtomicUsize);

impl<'a> LiveLoop<'a> {
    pub fn enter(count: &'a AtomicUsize) -> LiveLoop<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        LiveLoop(count)
    }
}

impl Drop for LiveLoop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
