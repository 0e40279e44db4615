//! One LISTEN connection per coordinator. Notifications are wake-up hints
//! only: after every (re)connect the outbox and the limiter re-poll and run waiters re-check,
//! because notifications sent while disconnected are lost.

use std::sync::Arc;
use std::time::Duration;

use composer_store::notifications::Listener;
use composer_store::transitions::{LIMITS_CHANNEL, OUTBOX_CHANNEL, RUN_DONE_CHANNEL};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::shared::Shared;

pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listen(&shared) => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "notification listener disconnected; reconnecting");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen(shared: &Shared) -> Result<(), composer_store::Error> {
    let channels = [OUTBOX_CHANNEL, RUN_DONE_CHANNEL, LIMITS_CHANNEL];
    let mut listener = Listener::connect(&shared.config.database.url, &channels).await?;
    // Anything sent while we were not listening is lost: re-check now.
    shared.wakes.outbox.notify_one();
    shared.wakes.limits.notify_one();
    shared.runs.notify(Uuid::nil());
    while let Some(n) = listener.recv().await {
        if n.channel == OUTBOX_CHANNEL {
            shared.wakes.outbox.notify_one();
        } else if n.channel == LIMITS_CHANNEL {
            shared.wakes.limits.notify_one();
        } else if let Ok(run_id) = n.payload.parse::<Uuid>() {
            shared.runs.notify(run_id);
        }
    }
    Err(listener.closed().await)
}
