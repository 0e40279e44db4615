//! Periodic work every coordinator runs: firing due timers, keeping
//! partitions ahead. Each is safe on many coordinators at once.

use std::sync::Arc;

use composer_core::machine::Event;
use composer_store::{partitions, timers, Client};
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// Creates the monthly partitions `months_ahead` ahead.
pub async fn maintain_partitions(client: &Client, months_ahead: i32) -> anyhow::Result<()> {
    let created = partitions::ensure(client, months_ahead).await?;
    if created > 0 {
        tracing::info!(created, "created run partitions");
    }
    Ok(())
}

/// Applies TimerFired to every WAITING task whose time has come (WAIT nodes
/// and retry backoffs); returns how many fired. Two coordinators may pick the
/// same timer: the state machine ignores the second firing.
pub async fn fire_due_waits(shared: &Shared) -> anyhow::Result<usize> {
    let due = {
        let client = composer_store::client(&shared.pool).await?;
        timers::due(&client, shared.config.timer_batch).await?
    };
    let mut fired = 0;
    for w in due {
        match shared
            .engine
            .handle(w.run_id, Event::TimerFired { task_id: w.task_id })
            .await
        {
            Ok(h) if h.ignored.is_none() => fired += 1,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(run_id = %w.run_id, task_id = %w.task_id, error = %e, "failed to fire timer")
            }
        }
    }
    Ok(fired)
}

pub async fn run_timers(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(shared.config.timer_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = fire_due_waits(&shared).await {
            tracing::warn!(error = %e, "firing due timers failed");
        }
    }
}
