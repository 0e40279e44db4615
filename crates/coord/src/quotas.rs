//! A namespace's quotas at work: most open runs, starts per second,
//! schedules, limits and stored bytes. Each cell holds its namespace's quotas as the registry last
//! said ([`crate::cells`] reads them every 5 s) and its stored bytes as the
//! metrics loop last measured them. A start, a new schedule or a new limit
//! past its quota is a 429 naming the quota, with a `Retry-After`.
//!
//! Starts through the API are checked before they are asked of the engine;
//! those of schedules and triggers by `Engine::start_run_in`, in their
//! transaction; a run's children and failure handler are not refused.
//!
//! `crates/composer/tests/it/namespaces.rs` holds a namespace to each quota.
//! The checks are made before the change, not in its transaction: starts
//! made at the same moment may each pass the open-runs check, so a
//! namespace may go past its quota by as many (it is a budget, not a lock),
//! and stored bytes are as the last sample measured them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::RwLock;

use composer_store::namespaces::Quotas;
use composer_store::Pool;

/// Why a change is refused: past a quota, or its count could not be read.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// Past quota `quota`; the caller may try again after `retry_after` seconds.
    #[error("{message}")]
    Over { quota: &'static str, message: String, retry_after: u64 },
    #[error(transparent)]
    Store(#[from] composer_store::Error),
    #[error("Redis, counting starts: {0}")]
    Redis(String),
}

/// How long a start refused for its open runs or its rate is told to wait.
pub const OPEN_RUNS_RETRY_AFTER_SECS: u64 = 1;
/// How long a change refused for a count or for stored bytes is told to
/// wait: one of them must be deleted (or retention must drop a month).
pub const COUNT_RETRY_AFTER_SECS: u64 = 60;

/// One namespace's quotas and what it stores, as its cell last read them.
pub struct QuotaState {
    quotas: RwLock<Quotas>,
    stored_bytes: AtomicI64,
    /// Where starts per second are counted.
    streams: composer_stream::Streams,
}

impl QuotaState {
    pub fn new(streams: composer_stream::Streams) -> QuotaState {
        QuotaState { quotas: RwLock::default(), stored_bytes: AtomicI64::default(), streams }
    }

    pub fn quotas(&self) -> Quotas {
        *self.quotas.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set(&self, quotas: Quotas) {
        *self.quotas.write().unwrap_or_else(|p| p.into_inner()) = quotas;
    }

    pub fn stored_bytes(&self) -> i64 {
        self.stored_bytes.load(Ordering::Relaxed)
    }

    pub fn measured(&self, bytes: i64) {
        self.stored_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Whether a run may start: the namespace stores less than its quota of
    /// bytes, has started fewer runs this second than its quota (counted in
    /// Redis, across coordinators; a refused start counts too) and has fewer
    /// open runs than its quota.
    pub async fn may_start(&self, pool: &Pool) -> Result<(), QuotaError> {
        let q = self.quotas();
        if q.stored_bytes.is_none() && q.starts_per_second.is_none() && q.open_runs.is_none() {
            return Ok(());
        }
        self.may_start_in(&composer_store::client(pool).await?).await
    }

    /// [`QuotaState::may_start`] on `client`'s connection (a transaction's,
    /// whose own starts it counts).
    pub async fn may_start_in(&self, client: &composer_store::Client) -> Result<(), QuotaError> {
        let q = self.quotas();
        self.within_stored_bytes(&q)?;
        if let Some(most) = q.starts_per_second {
            let second = crate::clock::now().timestamp();
            let count = self.streams.count_start(second).await.map_err(|e| QuotaError::Redis(e.to_string()))?;
            if count > most {
                let now = format!("{count} starts this second");
                return Err(over("starts_per_second", now, most, OPEN_RUNS_RETRY_AFTER_SECS));
            }
        }
        if let Some(most) = q.open_runs {
            let open = composer_store::namespaces::open_runs(client, most).await?;
            if open >= most {
                return Err(over("open_runs", format!("{open} runs are open"), most, OPEN_RUNS_RETRY_AFTER_SECS));
            }
        }
        Ok(())
    }

    /// Whether one more schedule may be made, when there are `count`.
    pub fn may_add_schedule(&self, count: i64) -> Result<(), QuotaError> {
        let q = self.quotas();
        self.within_stored_bytes(&q)?;
        match q.schedules {
            Some(most) if count >= most => {
                Err(over("schedules", format!("there are {count} schedules"), most, COUNT_RETRY_AFTER_SECS))
            }
            _ => Ok(()),
        }
    }

    /// Whether one more limit key may be given values, when `count` have.
    pub fn may_add_limit(&self, count: i64) -> Result<(), QuotaError> {
        let q = self.quotas();
        self.within_stored_bytes(&q)?;
        match q.limits {
            Some(most) if count >= most => {
                Err(over("limits", format!("{count} limit keys have values"), most, COUNT_RETRY_AFTER_SECS))
            }
            _ => Ok(()),
        }
    }

    fn within_stored_bytes(&self, q: &Quotas) -> Result<(), QuotaError> {
        match q.stored_bytes {
            Some(most) if self.stored_bytes() >= most => {
                let now = format!("it stores {} bytes", self.stored_bytes());
                Err(over("stored_bytes", now, most, COUNT_RETRY_AFTER_SECS))
            }
            _ => Ok(()),
        }
    }
}

fn over(quota: &'static str, now: String, most: i64, retry_after: u64) -> QuotaError {
    QuotaError::Over { quota, message: format!("over this namespace's quota {quota} ({most}): {now}"), retry_after }
}
