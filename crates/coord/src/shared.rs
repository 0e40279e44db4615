//! What the API, the engine and the loops of one coordinator share.

use std::sync::Arc;

use uuid::Uuid;

use composer_stream::Streams;
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::Engine;

/// Shared by the API, the engine and the loops of one coordinator.
pub struct Shared {
    pub config: Config,
    pub pool: composer_store::Pool,
    pub streams: Streams,
    pub engine: Arc<Engine>,
    pub outbox_wake: Arc<Notify>,
    pub runs: RunWatch,
    /// Set when the coordinator begins to stop: `/readyz` answers 503 and
    /// long-polls answer at once, so a load balancer moves on and no request
    /// holds the stop up.
    pub draining: CancellationToken,
    /// Woken after this coordinator published, or another announced that
    /// it did: task-API long-polls read then rather than at their next idle
    /// read.
    pub published: Notify,
    /// The streams whose consumer group the task API made sure of.
    pub task_api_groups: std::sync::Mutex<std::collections::HashSet<String>>,
    /// When polls of each set of queues last looked for expired leases to
    /// take over (see `crate::tasks::lease`).
    pub takeovers_checked: std::sync::Mutex<std::collections::HashMap<Vec<String>, std::time::Instant>>,
    /// Stream messages this coordinator's polls read and could not lease
    /// (`composer_leases_denied_total`, of this coordinator alone).
    pub leases_denied: std::sync::atomic::AtomicU64,
    /// Which priority the task API's polls read first ([`composer_core::priority::Share`]).
    pub priority_share: std::sync::Mutex<composer_core::priority::Share>,
    /// The definitions starts name, read in batches and kept.
    pub definitions: crate::definitions::Definitions,
    /// Woken when a bulk job is created, so the bulk loop starts it at once.
    pub bulk_wake: Notify,
    /// Woken when a commit holds steps back by their limits or frees a slot:
    /// the limiter passes again.
    pub limits_wake: Notify,
}

/// Tells long-polling requests that a run ended. `Uuid::nil()` means "the
/// listener reconnected: re-check whatever you wait for".
#[derive(Clone)]
pub struct RunWatch {
    tx: broadcast::Sender<Uuid>,
}

impl Default for RunWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RunWatch {
    pub fn new() -> RunWatch {
        RunWatch { tx: broadcast::channel(1024).0 }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Uuid> {
        self.tx.subscribe()
    }

    pub fn notify(&self, run_id: Uuid) {
        let _ = self.tx.send(run_id);
    }
}
