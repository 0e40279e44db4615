//! A namespace's quotas at work: most open runs, schedules, limits and
//! stored bytes. Each cell holds its namespace's quotas as the registry last
//! said ([`crate::cells`] reads them every 5 s) and its stored bytes as the
//! metrics loop last measured them. A start, a new schedule or a new limit
//! past its quota is a 429 naming the quota, with a `Retry-After`.
//!
//! The checks are made before the change, not in its transaction: starts
//! made at the same moment may each pass the open-runs check, so a
//! namespace may go past its quota by as many (it is a budget, not a lock),
//! and stored bytes are as the last sample measured them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::RwLock;

use composer_store::namespaces::Quotas;
use composer_store::Pool;

use crate::http::ApiError;

/// How long a start refused for its open runs is told to wait.
pub const OPEN_RUNS_RETRY_AFTER_SECS: u64 = 1;
/// How long a change refused for a count or for stored bytes is told to
/// wait: one of them must be deleted (or retention must drop a month).
pub const COUNT_RETRY_AFTER_SECS: u64 = 60;

/// One namespace's quotas and what it stores, as its cell last read them.
#[derive(Default)]
pub struct QuotaState {
    quotas: RwLock<Quotas>,
    stored_bytes: AtomicI64,
}

impl QuotaState {
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
    /// bytes and has fewer open runs than its quota.
    pub async fn may_start(&self, pool: &Pool) -> Result<(), ApiError> {
        let q = self.quotas();
        self.within_stored_bytes(&q)?;
        if let Some(most) = q.open_runs {
            let client = composer_store::client(pool).await?;
            let open = composer_store::namespaces::open_runs(&client, most).await?;
            if open >= most {
                return Err(over("open_runs", format!("{open} runs are open"), most, OPEN_RUNS_RETRY_AFTER_SECS));
            }
        }
        Ok(())
    }

    /// Whether one more schedule may be made, when there are `count`.
    pub fn may_add_schedule(&self, count: i64) -> Result<(), ApiError> {
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
    pub fn may_add_limit(&self, count: i64) -> Result<(), ApiError> {
        let q = self.quotas();
        self.within_stored_bytes(&q)?;
        match q.limits {
            Some(most) if count >= most => {
                Err(over("limits", format!("{count} limit keys have values"), most, COUNT_RETRY_AFTER_SECS))
            }
            _ => Ok(()),
        }
    }

    fn within_stored_bytes(&self, q: &Quotas) -> Result<(), ApiError> {
        match q.stored_bytes {
            Some(most) if self.stored_bytes() >= most => {
                let now = format!("it stores {} bytes", self.stored_bytes());
                Err(over("stored_bytes", now, most, COUNT_RETRY_AFTER_SECS))
            }
            _ => Ok(()),
        }
    }
}

fn over(quota: &'static str, now: String, most: i64, retry_after: u64) -> ApiError {
    ApiError::OverQuota { quota, message: format!("over this namespace's quota {quota} ({most}): {now}"), retry_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_stored_bytes_are_held_to_their_quotas_by_name() {
        let s = QuotaState::default();
        assert!(s.may_add_schedule(1_000_000).is_ok() && s.may_add_limit(1_000_000).is_ok(), "no quota, no limit");
        s.set(Quotas { schedules: Some(2), limits: Some(0), ..Quotas::default() });
        assert!(s.may_add_schedule(1).is_ok());
        let e = s.may_add_schedule(2).unwrap_err();
        assert!(e.to_string().contains("quota schedules (2)"), "{e}");
        assert!(s.may_add_limit(0).unwrap_err().to_string().contains("quota limits (0)"));
        s.set(Quotas { stored_bytes: Some(100), ..Quotas::default() });
        s.measured(99);
        assert!(s.may_add_schedule(5).is_ok());
        s.measured(100);
        let e = s.may_add_schedule(0).unwrap_err();
        assert!(matches!(e, ApiError::OverQuota { quota: "stored_bytes", retry_after: 60, .. }), "{e}");
    }
}
