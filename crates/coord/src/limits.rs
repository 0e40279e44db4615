//! The limiter: every coordinator runs this loop, and passes run one at a
//! time across them (see `composer_store::limits`). A pass admits the steps
//! their limits let go and puts them in the outbox; it then sleeps until
//! the next token or hold's end, or until a commit ends a step that held a
//! slot, holds new steps back, or an operator changes a limit (NOTIFY).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::shared::Shared;

/// Most steps one pass admits (more go at the next, at once).
pub const PASS_STEPS: i64 = 500;
/// The longest the limiter sleeps with nothing to wake it: what a resumed
/// run's held steps, or a lost notification, wait at most.
pub const IDLE: Duration = Duration::from_secs(2);

pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let next = match pass(&shared).await {
            Ok(p) => {
                if p.admitted > 0 {
                    crate::metrics::inc(composer_metrics::LIMIT_ADMITTED, &[], p.admitted as u64);
                }
                p.next_in
            }
            Err(e) => {
                tracing::warn!(error = %e, "limiter pass failed; will retry");
                Some(Duration::from_secs(1))
            }
        };
        let wait = next.unwrap_or(IDLE).min(IDLE);
        if wait.is_zero() {
            if shutdown.is_cancelled() {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = shared.wakes.limits.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn pass(shared: &Shared) -> Result<composer_store::limits::Pass, composer_store::Error> {
    let mut client = composer_store::client(&shared.pool).await?;
    let pass = composer_store::limits::admit(&mut client, shared.engine.shards(), PASS_STEPS).await?;
    if pass.admitted > 0 {
        // This process's enqueuer publishes at once (the NOTIFY reaches the others).
        shared.wakes.outbox.notify_one();
    }
    Ok(pass)
}
