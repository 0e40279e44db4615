//! What the API, the engine and the loops of one coordinator share, and the
//! parts an HTTP handler may take of it.
//!
//! The loops take [`Shared`] whole. The router's state is [`AppState`], which
//! hands out no `Shared`: a handler names each part it uses as a
//! `State<Part>` argument — `State<Pool>`, `State<Arc<Config>>`,
//! `State<Arc<Engine>>`, `State<Streams>`, `State<RunWatch>`,
//! `State<Draining>`, `State<Definitions>`, `State<Arc<Wakes>>`,
//! `State<Arc<TaskApi>>`, `State<Arc<Keys>>` — so what a handler can touch is in its signature.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::FromRef;
use uuid::Uuid;

use composer_store::Pool;
use composer_stream::Streams;
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::definitions::Definitions;
use crate::engine::Engine;

/// Shared by the API, the engine and the loops of one coordinator.
pub struct Shared {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub streams: Streams,
    pub engine: Arc<Engine>,
    pub runs: RunWatch,
    pub draining: Draining,
    pub wakes: Arc<Wakes>,
    /// The task API's own state (its consumer groups, takeovers, counters).
    pub task_api: Arc<TaskApi>,
    /// The definitions starts name, read in batches and kept.
    pub definitions: Definitions,
    pub keys: Arc<crate::access::Keys>,
    /// The default namespace's pool, for what is kept once for the whole
    /// cluster (the quarantine); `pool` itself in the default namespace.
    pub cluster: ClusterPool,
    /// This namespace's quotas, as its cell last read them.
    pub quotas: Arc<crate::quotas::QuotaState>,
    /// Where this namespace's expired runs are archived, if anywhere.
    pub archive: crate::archive::Archive,
}

/// The pool of what is kept once for the whole cluster ([`Shared::cluster`]).
#[derive(Clone)]
pub struct ClusterPool(pub Pool);

/// Set when the coordinator begins to stop: `/readyz` answers 503 and
/// long-polls answer at once, so a load balancer moves on and no request
/// holds the stop up.
#[derive(Clone, Default)]
pub struct Draining(CancellationToken);

impl Draining {
    /// The coordinator begins to stop.
    pub fn begin(&self) {
        self.0.cancel();
    }

    pub fn has_begun(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves when the coordinator begins to stop.
    pub async fn begun(&self) {
        self.0.cancelled().await
    }
}

/// What wakes a loop of this coordinator before its next tick.
#[derive(Default)]
pub struct Wakes {
    /// A commit wrote outbox rows: the outbox loop drains them.
    pub outbox: Arc<Notify>,
    /// This coordinator published, or another announced that it did:
    /// task-API long-polls read then rather than at their next idle read.
    pub published: Arc<Notify>,
    /// A bulk job was created: the bulk loop starts it at once.
    pub bulk: Notify,
    /// A commit held steps back by their limits or freed a slot: the
    /// limiter passes again.
    pub limits: Notify,
}

/// The task API of one coordinator: what its polls and reports use, and
/// what they remember between requests.
pub struct TaskApi {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub streams: Streams,
    pub engine: Arc<Engine>,
    pub draining: Draining,
    /// Woken when this coordinator published (shared with [`Wakes`]).
    pub published: Arc<Notify>,
    /// The streams whose consumer group the task API made sure of.
    pub groups: Mutex<HashSet<String>>,
    /// When polls of each set of queues last looked for expired leases to
    /// take over (see `crate::tasks::lease`).
    pub takeovers_checked: Mutex<HashMap<Vec<String>, Instant>>,
    /// Stream messages this coordinator's polls read and could not lease
    /// (`composer_leases_denied_total`, of this coordinator alone).
    pub leases_denied: AtomicU64,
    /// Which priority the polls read first ([`composer_core::priority::Share`]).
    pub priority_share: Mutex<composer_core::priority::Share>,
}

impl Shared {
    /// The shared state of a coordinator from its parts; the task API's
    /// state starts empty.
    pub fn new(config: Config, pool: Pool, streams: Streams, engine: Engine, outbox: Arc<Notify>) -> Shared {
        let config = Arc::new(config);
        let quotas = Arc::new(crate::quotas::QuotaState::new(streams.clone()));
        let engine = Arc::new(engine.with_quotas(quotas.clone()));
        let draining = Draining::default();
        let wakes = Arc::new(Wakes { outbox, ..Wakes::default() });
        let task_api = Arc::new(TaskApi {
            config: config.clone(),
            pool: pool.clone(),
            streams: streams.clone(),
            engine: engine.clone(),
            draining: draining.clone(),
            published: wakes.published.clone(),
            groups: Mutex::default(),
            takeovers_checked: Mutex::default(),
            leases_denied: AtomicU64::default(),
            priority_share: Mutex::default(),
        });
        let definitions = Definitions::new(pool.clone());
        let keys = Arc::new(crate::access::Keys::new(pool.clone()));
        let cluster = ClusterPool(pool.clone());
        Shared {
            config,
            pool,
            streams,
            engine,
            runs: RunWatch::new(),
            draining,
            wakes,
            task_api,
            definitions,
            keys,
            cluster,
            quotas,
            archive: crate::archive::Archive::default(),
        }
    }

    /// What an operator's action on a run takes.
    pub fn run_control(&self) -> RunControl {
        RunControl { config: self.config.clone(), pool: self.pool.clone(), engine: self.engine.clone() }
    }
}

/// The state of the HTTP router. It gives a handler the parts it names
/// (`State<Pool>`, `State<Arc<Engine>>` …), never the whole.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Arc<Shared>) -> AppState {
        AppState(shared)
    }
}

/// `impl FromRef<AppState> for Part`: the part a `State<Part>` takes.
macro_rules! parts {
    ($($part:ty => $field:ident),* $(,)?) => {$(
        impl FromRef<AppState> for $part {
            fn from_ref(state: &AppState) -> $part {
                state.0.$field.clone()
            }
        }
    )*};
}

parts! {
    Arc<Config> => config,
    Pool => pool,
    ClusterPool => cluster,
    Arc<crate::quotas::QuotaState> => quotas,
    Streams => streams,
    Arc<Engine> => engine,
    RunWatch => runs,
    Draining => draining,
    Arc<Wakes> => wakes,
    Arc<TaskApi> => task_api,
    Definitions => definitions,
    Arc<crate::access::Keys> => keys,
    crate::archive::Archive => archive,
}

/// What an operator's action on a run takes: the config names who acts,
/// the engine applies the action, the database answers with the run after.
#[derive(Clone)]
pub struct RunControl {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub engine: Arc<Engine>,
}

impl FromRef<AppState> for RunControl {
    fn from_ref(state: &AppState) -> RunControl {
        state.0.run_control()
    }
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
